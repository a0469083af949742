"""Matcha-TTS (text -> mel by optimal-transport conditional flow matching), the model's spec: Mehta, Tu, Beskow,
Székely and Henter, "Matcha-TTS: A fast TTS architecture with conditional flow matching" (ICASSP 2024), with
shivammehta25/Matcha-TTS's sizes and defaults (layers: ``modules/matcha.py``, ``modules/matcha_decoder.py``; text:
``models/matcha/text.py``)."""

from model import BatchFrames, Inference, ModelSpec, Training
from models.matcha.data import MatchaCollate, build_datasets, count_items, datasets_of
from models.matcha.inference import add_inference_args, infer
from models.matcha.network import MatchaConfig, MatchaLoss, blocks, build_matcha
from models.matcha.validation import log_validation

SPEC = ModelSpec(
    name="matcha",
    config_cls=MatchaConfig,
    build_model=build_matcha,
    training=Training(
        build_criterion=lambda cfg: MatchaLoss(),
        build_datasets=build_datasets,
        datasets_of=datasets_of,
        collate_fn=MatchaCollate(),
        count_items=count_items,
        variable_length=True,
        blocks=blocks,  # the encoder's layers, the duration predictor, the decoder's levels (network.blocks)
        speaker_rows=("speakers.weight",),
        log_validation=log_validation,
        val_vocoder="val_vocoder",  # its audio through a vocoder checkpoint (matcha.val_vocoder), else Griffin-Lim's
    ),
    inference=Inference(infer=infer, add_args=add_inference_args, takes_vocoder=True),
    # shivammehta25/Matcha-TTS: jik876's frames (its mel_spectrogram), configs/trainer/default.yaml's gradient_clip_val,
    # configs/model/optimizer/adam.yaml's lr and weight_decay; frame budgets in place of its fixed batches: the padded
    # frames of batch_size clips of LJSpeech's longest (10.1 s: 870 frames); ours: an EMA of the weights (the authors
    # keep none; train.ema_decay=0 is their recipe), 0.999: about 1000 steps, half a validation interval; the average
    # starts at the initial weights with no warm-up, so 0.9999's would still hold 0.9999 ** 20000 = 13% of them at
    # step 20000
    recipe={"audio.mel_framing": "jik876", "train.grad_clip": 5.0, "train.cudnn_benchmark": False,
            "optimizer.lr": 1e-4, "optimizer.weight_decay": 0.0, "data.batching": "frames",
            "data.max_frames": BatchFrames(870), "train.ema_decay": 0.999},
)
