"""Tacotron2 (text -> mel), the model's spec: Shen et al., "Natural TTS Synthesis by Conditioning WaveNet on Mel
Spectrogram Predictions" (ICASSP 2018), with NVIDIA's sizes and defaults (layers: ``modules/tacotron2.py``)."""

from model import Inference, ModelSpec, Training
from models.tacotron2.data import TextMelCollate, build_datasets, check_text, count_items, datasets_of
from models.tacotron2.inference import add_inference_args, infer, log_validation
from models.tacotron2.network import Tacotron2, Tacotron2Config, Tacotron2Loss, optimize_for_training

SPEC = ModelSpec(
    name="tacotron2",
    config_cls=Tacotron2Config,
    build_model=lambda cfg: Tacotron2(cfg.tacotron2, cfg.audio.n_mels, len(cfg.data.speakers)),
    training=Training(
        build_criterion=lambda cfg: Tacotron2Loss(),
        build_datasets=build_datasets,
        datasets_of=datasets_of,
        collate_fn=TextMelCollate(),
        count_items=count_items,
        check_text=check_text,
        data_advice="raise data.num_workers, or cache the mels once with python -m scripts.preprocess",
        variable_length=True,
        log_validation=log_validation,
        optimize_for_training=optimize_for_training,
        blocks=lambda model: [model.encoder, model.decoder, model.postnet],
        speaker_rows=("speaker_embedding.weight",),
    ),
    inference=Inference(infer=infer, add_args=add_inference_args, takes_vocoder=True),
    # NVIDIA/tacotron2: TacotronSTFT's centred frames, hparams.py's grad_clip_thresh, cudnn_benchmark, learning_rate
    # and weight_decay
    recipe={"audio.mel_framing": "nvidia", "train.grad_clip": 1.0, "train.cudnn_benchmark": False,
            "optimizer.lr": 1e-3, "optimizer.weight_decay": 1e-6},
)
