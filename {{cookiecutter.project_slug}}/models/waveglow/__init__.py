"""WaveGlow (mel -> audio), the model's spec: Prenger, Valle and Catanzaro, "WaveGlow: a flow-based generative network
for speech synthesis" (ICASSP 2019), with NVIDIA's sizes and defaults (layers: ``modules/waveglow.py``)."""

from model import Benchmark, BenchmarkCase, Export, Inference, ModelSpec, Published, Training
from models.waveglow.data import build_datasets, mel_on_device, synthetic_batch
from models.waveglow.inference import add_inference_args, infer, log_validation, vocode
from models.waveglow.network import WaveGlow, WaveGlowConfig, WaveGlowLoss, optimize_for_training
from utils.data.datasets import collate_audio_mel
from utils.parts import optional_part

export = optional_part("models.waveglow.export")  # after-training tools: None where the project left them out
published = optional_part("models.waveglow.published")

_TINY = ("waveglow.n_flows=4", "waveglow.n_early_every=2", "waveglow.wn_layers=2")
BENCHMARK_CASES = (  # NVIDIA's published shapes (those of its reference benchmark harness)
    BenchmarkCase("waveglow256_b12_s16000", ("waveglow.wn_channels=256", "waveglow.segment_length=16000"), 12,
                  {"segment_length": 16000},
                  tiny=BenchmarkCase("", _TINY + ("waveglow.wn_channels=16", "waveglow.segment_length=2048"), 2,
                                     {"segment_length": 2048})),
    BenchmarkCase("waveglow512_b10_s8000", ("waveglow.wn_channels=512", "waveglow.segment_length=8000"), 10,
                  {"segment_length": 8000},
                  tiny=BenchmarkCase("", _TINY + ("waveglow.wn_channels=32", "waveglow.segment_length=1024"), 2,
                                     {"segment_length": 1024})),
)

SPEC = ModelSpec(
    name="waveglow",
    config_cls=WaveGlowConfig,
    build_model=lambda cfg: WaveGlow(cfg.waveglow, cfg.audio.n_mels, cfg.audio.hop_length, cfg.audio.win_length),
    training=Training(
        build_criterion=lambda cfg: WaveGlowLoss(cfg.waveglow.sigma),
        build_datasets=build_datasets,
        collate_fn=collate_audio_mel,
        count_items=lambda batch: batch["audio"].numel(),
        on_device=mel_on_device,
        data_advice="raise data.num_workers, or compute the mels on the device with waveglow.mel_on_device=true",
        log_validation=log_validation,
        optimize_for_training=optimize_for_training,
        blocks=lambda model: list(model.flows),  # the WN coupling networks: nearly all weights and activations
    ),
    inference=Inference(infer=infer, add_args=add_inference_args, vocode=vocode),
    export=Export(parts=export.export_parts) if export else None,
    published=Published(read=published.read_published, pickled_classes=published.PICKLED_CLASSES) if published else None,
    benchmark=Benchmark(synthetic_batch=synthetic_batch, cases=BENCHMARK_CASES),
    # NVIDIA/waveglow: TacotronSTFT, no clipping; the autotuner on (NVIDIA's is off): one crop shape, tuned once
    recipe={"audio.mel_framing": "nvidia", "train.grad_clip": 0.0, "train.cudnn_benchmark": True},
)
