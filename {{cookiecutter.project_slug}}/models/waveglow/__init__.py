"""WaveGlow (mel -> audio), the model's spec: Prenger et al., ICASSP 2019, with NVIDIA's sizes and defaults."""

from model import Inference, ModelSpec, Training
from models.waveglow.data import build_datasets, datasets_of, mel_on_device
from models.waveglow.inference import add_inference_args, infer, log_validation, vocode
from models.waveglow.network import WaveGlow, WaveGlowConfig, WaveGlowLoss, optimize_for_training
from utils.data.datasets import collate_audio_mel

SPEC = ModelSpec(
    name="waveglow",
    config_cls=WaveGlowConfig,
    build_model=lambda cfg: WaveGlow(cfg.waveglow, cfg.audio.n_mels, cfg.audio.hop_length, cfg.audio.win_length),
    training=Training(
        build_criterion=lambda cfg: WaveGlowLoss(cfg.waveglow.sigma),
        build_datasets=build_datasets,
        datasets_of=datasets_of,
        collate_fn=collate_audio_mel,
        count_items=lambda batch: batch["audio"].numel(),
        on_device=mel_on_device,
        data_advice="raise data.num_workers, or compute the mels on the device with waveglow.mel_on_device=true",
        log_validation=log_validation,
        optimize_for_training=optimize_for_training,
        blocks=lambda model: list(model.flows),  # the WN coupling networks: nearly all weights and activations
    ),
    inference=Inference(infer=infer, add_args=add_inference_args, vocode=vocode),
    # NVIDIA/waveglow: TacotronSTFT, no clipping, config.json's Adam rate (no weight decay); the autotuner on
    # (NVIDIA's is off): one crop shape, tuned once
    recipe={"audio.mel_framing": "nvidia", "train.grad_clip": 0.0, "train.cudnn_benchmark": True,
            "optimizer.lr": 1e-4, "optimizer.weight_decay": 0.0},
)
