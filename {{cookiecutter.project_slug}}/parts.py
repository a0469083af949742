"""The composition root: the one module that knows which optional parts this project has, and hands each part's
objects to the code that uses them. Every other module receives objects (arguments), never a part's name, so the
import contracts (``.importlinter``) see every edge.

* :data:`TABLE`: each part's files and ``config.json`` keys, which the generator reads too (a part is declared once);
  :data:`LEFT_OUT`: the parts this project was generated without, and their keys, which a config is refused for in one
  line naming each key, its part and how to bring the part back (``utils.config.refuse_left_out``).
* Each part's modules, imported here one line each and tagged ``# part: <name>``: the generator removes a part's lines
  where it is answered no (and those of an example model not chosen).
* The sections every model shares, composed of the core's keys and the parts' (:class:`TrainConfig`,
  :class:`DataSettings`; :func:`config_schemas`).
* :data:`PARTS`: the parts' objects, each behind the small interface its user declares.

A new part: its files, its row of :data:`TABLE`, its question in ``cookiecutter.json``, its lines here.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import Any, Callable, Mapping, Optional

from model import ModelSpec
from models import MODELS
from models.hifigan import benchmark as hifigan_benchmark  # part: benchmarks
from models.hifigan import export as hifigan_export  # part: after_training_tools
from models.hifigan import published as hifigan_published  # part: after_training_tools
from models.matcha import benchmark as matcha_benchmark  # part: benchmarks
from models.matcha import export as matcha_export  # part: after_training_tools
from models.matcha import published as matcha_published  # part: after_training_tools
from models.tacotron2 import benchmark as tacotron2_benchmark  # part: benchmarks
from models.tacotron2 import export as tacotron2_export  # part: after_training_tools
from models.tacotron2 import published as tacotron2_published  # part: after_training_tools
from models.waveglow import benchmark as waveglow_benchmark  # part: benchmarks
from models.waveglow import export as waveglow_export  # part: after_training_tools
from models.waveglow import published as waveglow_published  # part: after_training_tools
from utils import platforms  # part: cloud_platforms
from utils import tracking  # part: experiment_trackers
from utils.checkpoint import published  # part: after_training_tools
from utils.checkpoint import sharded  # part: sharding
from utils.checkpoint.resume import Formats
from utils.config import Config, Section
from utils.data import mel_dir  # part: after_training_tools
from utils.data.audio import AudioConfig
from utils.data.corpus import DataConfig
from utils.data.loader import BatchingConfig
from utils.data.shar import SHAR_CORPUS, SharSettings  # part: corpora
from utils.tracking import mlflow_tracker, tensorboard, wandb_tracker  # part: experiment_trackers
from utils.training import fsdp  # part: sharding
from utils.training.optim import OptimizerConfig
from utils.training.settings import LoopSettings
from utils.training.setup import RunParts

TABLE = {
    "sharding": {
        "files": ["utils/training/fsdp.py", "utils/training/activation_checkpoint.py", "utils/checkpoint/sharded.py",
                  "utils/checkpoint/safe_dcp.py", "scripts/consolidate_checkpoint.py", "scripts/memory.py",
                  "tests/test_fsdp.py", "tests/test_sharded_checkpoint.py", "tests/test_checkpoint_folders.py",
                  "tests/test_memory.py", "tests/test_activation_checkpoint.py", "tests/test_tools_sharded.py"],
        "keys": ["train.parallelism", "train.reshard_after_forward", "train.async_checkpoint",
                 "train.activation_checkpointing", "train.activation_checkpointing_every"],
    },
    "cloud_platforms": {
        "files": ["utils/platforms.py", "scripts/kubeflow", "scripts/skypilot", "scripts/grace_period.py",
                  "requirements-launch.txt", "tests/test_platforms.py", "tests/test_launch_files.py",
                  "tests/test_launch_settings.py", "tests/test_grace_period.py"],
        "keys": [],
    },
    "after_training_tools": {
        "files": ["scripts/export.py", "utils/onnx_export.py", "scripts/import_weights.py",
                  "utils/checkpoint/published.py", "scripts/dump_gta_mels.py", "utils/data/mel_dir.py",
                  "tests/test_mel_dir.py", "models/waveglow/export.py", "models/waveglow/published.py",
                  "models/hifigan/export.py", "models/hifigan/published.py", "models/tacotron2/export.py",
                  "models/tacotron2/published.py", "tests/test_export.py", "tests/test_onnx_export.py",
                  "tests/test_published.py", "tests/test_gta.py", "tests/test_tools_sharded.py", "scripts/plot_run.py",
                  "tests/test_plot_run.py", "tests/test_parity_waveglow.py", "tests/test_parity_hifigan.py",
                  "tests/test_parity_tacotron2.py", "models/matcha/published.py",
                  "tests/test_matcha_published.py", "models/matcha/export.py",
                  "tests/test_matcha_export.py"],
        "keys": ["data.mel_dir"],
    },
    "benchmarks": {
        "files": ["utils/benchmark.py", "scripts/benchmark.py", "scripts/benchmark_step.py",
                  "scripts/benchmark_data.py", "scripts/benchmark_data_rows.py", "scripts/scaling.py",
                  "tests/test_benchmark.py", "tests/test_benchmark_hifigan.py", "tests/test_benchmark_tacotron2.py",
                  "models/waveglow/benchmark.py", "models/hifigan/benchmark.py", "models/tacotron2/benchmark.py",
                  "models/matcha/benchmark.py", "tests/test_benchmark_matcha.py"],
        "keys": [],
    },
    "experiment_trackers": {
        "files": ["utils/tracking", "requirements-trackers.txt", "tests/test_trackers.py",
                  "tests/test_trackers_outages.py", "tests/tracker_readers.py"],
        "keys": ["train.trackers", "train.tracker_project", "train.tracker_run_name", "train.tracker_start_timeout_s",
                 "train.tracker_finish_timeout_s", "train.tracker_log_checkpoint"],
    },
    "corpora": {
        "files": ["scripts/make_shards.py", "utils/data/shar.py", "utils/data/shar_store.py",
                  "utils/data/corpora/vctk.py", "utils/data/corpora/libritts.py", "utils/data/corpora/nemo.py",
                  "utils/data/corpora/parquet.py", "utils/data/corpora/lhotse.py", "utils/data/corpora/manifests.py",
                  "tests/test_corpus_layouts.py", "tests/test_shards.py", "tests/test_shards_tacotron2.py",
                  "tests/test_shards_matcha.py", "tests/test_demo_layouts.py"],
        "keys": ["data.vctk_mic", "data.max_duration", "data.shar_restart_epoch"],
    },
}
"""The parts a project may leave out at generation (cookiecutter's yes/no questions, in their order): each is whole
files and folders (its modules, tools, tests and launch files; the code keeps no line of it but its lines here) and the
``config.json`` keys it declares (``section.key``), which the generator removes with it."""
LEFT_OUT: dict[str, list[str]] = {}
"""The parts this project was generated without, and their ``config.json`` keys (written by the generator)."""


class TrainConfig(
        fsdp.ShardingSettings,  # part: sharding
        tracking.TrackerSettings,  # part: experiment_trackers
        LoopSettings):
    """The ``train`` section: the loop's keys and those of each part the project has (a part's class first: it wins)."""


class DataSettings(
        mel_dir.MelDirSettings,  # part: after_training_tools
        SharSettings,  # part: corpora
        BatchingConfig,
        DataConfig):
    """The ``data`` section: the corpus's keys, the batches', and those of each part the project has."""


SHARED_SECTIONS: dict[str, type[Section]] = {"audio": AudioConfig, "data": DataSettings, "train": TrainConfig,
                                             "optimizer": OptimizerConfig}
"""The sections of ``config.json`` every model reads (named in ``utils.config.SHARED_SECTION_NAMES``, in this
order), beside one per model (:func:`config_schemas`)."""


def config_schemas() -> dict[str, type[Section]]:
    """Section name -> its class, as ``utils.config.load_config`` takes them: the shared sections, then one per
    registered model (its ``ModelSpec.config_cls``)."""
    return {**SHARED_SECTIONS, **{name: spec.config_cls for name, spec in MODELS.items()}}


@dataclasses.dataclass(frozen=True)
class Parts:
    """The objects the optional parts hand to the code that uses them (:data:`PARTS`); each None, empty or the core's
    own where the project left its part out."""

    formats: Formats = Formats()  # the checkpoint formats read besides single files
    run: RunParts = RunParts()  # what a training run takes of the parts (utils.training.setup.build_run)
    checks: tuple[Callable[[ModelSpec, Config], None], ...] = ()  # settings a model cannot honour, refused
    data_framing: Callable[[Any], Optional[str]] = lambda data: None  # the data section's mels' recorded framing
    platforms: Optional[ModuleType] = None  # a launch platform's variables, folders and argument style
    check_environ: Optional[Callable[[Mapping[str, str]], None]] = None  # of the launch environment, before it is read
    exports: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # model name -> its export group
    benchmarks: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # model name -> its synthetic batches


FORMATS = Formats(
    folder=sharded.FOLDER,  # part: sharding
    published=published.Readers({  # part: after_training_tools
        "hifigan": hifigan_published.PUBLISHED,  # part: after_training_tools
        "matcha": matcha_published.PUBLISHED,  # part: after_training_tools
        "tacotron2": tacotron2_published.PUBLISHED,  # part: after_training_tools
        "waveglow": waveglow_published.PUBLISHED,  # part: after_training_tools
    }),  # part: after_training_tools
)
PARTS = Parts(
    formats=FORMATS,
    run=RunParts(
        formats=FORMATS,
        sharding=fsdp,  # part: sharding
        datasets=mel_dir.vocoder_datasets,  # part: after_training_tools
        writer=tracking.Backends({  # part: experiment_trackers
            "tensorboard": tensorboard.start,  # part: experiment_trackers
            "wandb": wandb_tracker.start,  # part: experiment_trackers
            "mlflow": mlflow_tracker.start,  # part: experiment_trackers
        }).open,  # part: experiment_trackers
        tensorboard_dir=platforms.tensorboard_dir,  # part: cloud_platforms
        corpus=SHAR_CORPUS,  # part: corpora
    ),
    checks=(
        fsdp.check_activation_checkpointing,  # part: sharding
        mel_dir.check_config,  # part: after_training_tools
        fsdp.check_parallelism,  # part: sharding
        lambda spec, cfg: tracking.check_trackers(cfg.train),  # part: experiment_trackers
    ),
    data_framing=mel_dir.mel_dir_framing,  # part: after_training_tools
    platforms=platforms,  # part: cloud_platforms
    check_environ=platforms.check_process_rank,  # part: cloud_platforms
    exports={
        "hifigan": hifigan_export.EXPORT,  # part: after_training_tools
        "matcha": matcha_export.EXPORT,  # part: after_training_tools
        "tacotron2": tacotron2_export.EXPORT,  # part: after_training_tools
        "waveglow": waveglow_export.EXPORT,  # part: after_training_tools
    },
    benchmarks={
        "hifigan": hifigan_benchmark.BENCHMARK,  # part: benchmarks
        "matcha": matcha_benchmark.BENCHMARK,  # part: benchmarks
        "tacotron2": tacotron2_benchmark.BENCHMARK,  # part: benchmarks
        "waveglow": waveglow_benchmark.BENCHMARK,  # part: benchmarks
    },
)
"""The project's parts, as its entry scripts hand them down."""
