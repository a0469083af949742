"""HiFi-GAN (mel -> audio; two optimizers), the model's spec: Kong, Kim and Bae, "HiFi-GAN: Generative Adversarial
Networks for Efficient and High Fidelity Speech Synthesis" (NeurIPS 2020), with jik876/hifi-gan's sizes and defaults
(layers: ``modules/hifigan.py``)."""

from model import Inference, ModelSpec, Phases, Training
from models.hifigan.data import build_datasets, datasets_of, mel_on_device
from models.hifigan.inference import add_inference_args, infer, log_validation, vocode
from models.hifigan.network import (PHASES, HiFiGAN, HiFiGANConfig, MelL1Loss, blocks, build_optimizer, build_scheduler,
                                    loss_audio, networks, train_step)
from utils.data.datasets import collate_audio_mel

SPEC = ModelSpec(
    name="hifigan",
    config_cls=HiFiGANConfig,
    build_model=lambda cfg: HiFiGAN(cfg.hifigan, cfg.audio),
    training=Training(
        build_criterion=lambda cfg: MelL1Loss(loss_audio(cfg.hifigan, cfg.audio)),
        build_datasets=build_datasets,
        datasets_of=datasets_of,
        collate_fn=collate_audio_mel,
        count_items=lambda batch: batch["audio"].numel(),
        build_optimizer=build_optimizer,
        on_device=mel_on_device,
        data_advice="raise data.num_workers, or compute the mels on the device with hifigan.mel_on_device=true",
        log_validation=log_validation,
        blocks=blocks,
        phases=Phases(names=PHASES, networks=networks, train_step=train_step, build_scheduler=build_scheduler),
    ),
    inference=Inference(infer=infer, add_args=add_inference_args, vocode=vocode, modules=("generator",)),
    # jik876: meldataset.py's frames, no clipping, train.py's cudnn.benchmark; the paper's AdamW (Section 3)
    recipe={"audio.mel_framing": "jik876", "train.grad_clip": 0.0, "train.cudnn_benchmark": True,
            "optimizer.lr": 2e-4, "optimizer.weight_decay": 0.01},
)
