"""Remove the files of example models that were not chosen, and of the parts answered no. No network, no questions,
idempotent.

Each example model is a set of whole files (its package in ``models/``, its layers, its tests); the table below lists
them, and a second one the files that need two of them (Tacotron2 and a vocoder). ``config.json`` loses the sections
(and ``tiny`` overrides) of models not chosen, and the registry ``models/__init__.py`` the lines that name them (its
``from models import <name>`` and ``<name>.SPEC,`` lines). Only paths of these tables, ``config.json`` and the
registry are touched: never ``.git`` or a user's own files, so regenerating over an existing project (``cookiecutter
-f``, ``cruft update``) is safe.
"""

import json
import re
import shutil
import sys
from pathlib import Path

CHOICE = "{{ cookiecutter.example_model }}"
CHOSEN = {"both": {"tacotron2", "waveglow"}, "tacotron2_hifigan": {"tacotron2", "hifigan"}}.get(CHOICE, {CHOICE})

REF = "tests/data/reference/"
FILES = {
    "waveglow": ["models/waveglow", "modules/waveglow.py", "tests/test_waveglow.py", "tests/test_parity_waveglow.py",
                 REF + "net_waveglow.npz", REF + "waveglow_tiny_legacy.pt", REF + "waveglow_tiny_expected.npz",
                 REF + "make_legacy_fixture.py"],
    "hifigan": ["models/hifigan", "modules/hifigan.py", "tests/test_hifigan.py", "tests/test_parity_hifigan.py",
                "tests/test_benchmark_hifigan.py",
                *(f"{REF}net_hifigan_v{n}.npz" for n in (1, 2, 3))],
    "tacotron2": ["models/tacotron2", "modules/layers.py", "modules/attention.py", "modules/tacotron2.py",
                  "scripts/preprocess.py", "tests/test_tacotron2.py", "tests/test_text.py",
                  "tests/test_parity_tacotron2.py", "tests/test_benchmark_tacotron2.py", REF + "net_tacotron2_tf.npz",
                  REF + "net_tacotron2_fr.npz", REF + "text_nvidia.json"],
}
TOGETHER = {
    "scripts/dump_gta_mels.py": [{"tacotron2"}, {"waveglow", "hifigan"}],
    "tests/test_gta.py": [{"tacotron2"}, {"waveglow", "hifigan"}],
}
"""Files that need several models: kept when every set names a chosen model (Tacotron2 and a vocoder)."""

ANSWERS = {"sharding": "{{ cookiecutter.sharding }}", "cloud_platforms": "{{ cookiecutter.cloud_platforms }}",
           "after_training_tools": "{{ cookiecutter.after_training_tools }}", "benchmarks": "{{ cookiecutter.benchmarks }}",
           "experiment_trackers": "{{ cookiecutter.experiment_trackers }}"}
PARTS: dict[str, dict[str, list[str]]] = {
    "sharding": {"files": ["utils/training/fsdp.py", "utils/training/activation_checkpoint.py",
                           "utils/checkpoint/sharded.py", "utils/checkpoint/safe_dcp.py",
                           "scripts/consolidate_checkpoint.py", "scripts/memory.py", "tests/test_fsdp.py",
                           "tests/test_sharded_checkpoint.py", "tests/test_checkpoint_folders.py", "tests/test_memory.py",
                           "tests/test_activation_checkpoint.py", "tests/test_tools_sharded.py"],
                 "keys": ["train.parallelism", "train.reshard_after_forward", "train.async_checkpoint",
                          "train.activation_checkpointing", "train.activation_checkpointing_every"]},
    "cloud_platforms": {"files": ["utils/platforms.py", "scripts/kubeflow", "scripts/skypilot", "scripts/grace_period.py",
                                  "requirements-launch.txt", "tests/test_platforms.py", "tests/test_launch_files.py",
                                  "tests/test_grace_period.py"], "keys": []},
    "after_training_tools": {"files": ["scripts/export.py", "utils/onnx_export.py", "scripts/import_weights.py",
                                       "utils/checkpoint/published.py", "scripts/dump_gta_mels.py",
                                       "utils/data/mel_dir.py", "tests/test_mel_dir.py",
                                       *(f"models/{name}/{tool}.py" for name in FILES for tool in ("export", "published")),
                                       "tests/test_export.py", "tests/test_onnx_export.py", "tests/test_published.py",
                                       "tests/test_gta.py", "tests/test_tools_sharded.py", "scripts/plot_run.py",
                                       "tests/test_plot_run.py",
                                       *(f"tests/test_parity_{name}.py" for name in FILES)],
                             "keys": ["data.mel_dir"]},
    "benchmarks": {"files": ["scripts/benchmark.py", "scripts/benchmark_step.py", "scripts/benchmark_data.py",
                             "scripts/scaling.py", "tests/test_benchmark.py", "tests/test_benchmark_hifigan.py",
                             "tests/test_benchmark_tacotron2.py", *(f"models/{name}/benchmark.py" for name in FILES)],
                   "keys": []},
    "experiment_trackers": {"files": ["utils/tracking", "requirements-trackers.txt", "tests/test_trackers.py",
                                      "tests/test_trackers_outages.py", "tests/tracker_readers.py"],
                            "keys": [f"train.{key}" for key in ("trackers", "tracker_project", "tracker_run_name",
                                                                "tracker_start_timeout_s", "tracker_finish_timeout_s",
                                                                "tracker_log_checkpoint")]},
}
"""The parts a project may leave out (cookiecutter's yes/no questions): each is whole files (its modules, tools, tests
and launch files; the code keeps no line of it: the core reaches it through ``utils.parts``) and the ``config.json``
keys it declares (``section.key``, removed from the top level and the ``tiny`` block). Its docs sections and
requirements are rendered out by their templates."""
LEFT_OUT = [part for part, answer in ANSWERS.items() if answer == "no"]
EXECUTABLE = ["scripts/dataset.sh", "scripts/mpirun.sh", "scripts/slurm/train.sbatch"]


def prune_config(path: Path) -> None:
    """Remove the config sections of models not chosen, top level and ``tiny`` block alike."""
    config = json.loads(path.read_text())
    unchosen = set(FILES) - CHOSEN
    for block in (config, config.get("tiny", {})):
        for name in unchosen:
            block.pop(name, None)
        for part in LEFT_OUT:
            for key in PARTS[part]["keys"]:
                section, name = key.split(".")
                block.get(section, {}).pop(name, None)
    path.write_text(json.dumps(config, indent=2) + "\n")


def prune_registry(path: Path) -> None:
    """Remove the lines of the registry that name a model not chosen (``from models import <name>``, ``<name>.SPEC,``)."""
    unchosen = set(FILES) - CHOSEN
    kept = [line for line in path.read_text().splitlines(keepends=True)
            if not any(re.search(rf"\b{name}\b", line) for name in unchosen)]
    path.write_text("".join(kept))


def main() -> None:
    root = Path.cwd()
    unchosen = [paths for name, paths in FILES.items() if name not in CHOSEN]
    unchosen += [[rel] for rel, needs in TOGETHER.items() if not all(CHOSEN & need for need in needs)]
    unchosen += [PARTS[part]["files"] for part in LEFT_OUT]
    for paths in unchosen:
        for rel in paths:
            target = root / rel
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
    for cache in ("__pycache__", ".pytest_cache", ".ruff_cache", ".import_linter_cache", ".benchmarks"):  # left by test runs in the template checkout
        for path in [root / cache, *(found for folder in ("models", "modules", "utils", "scripts", "tests")
                                     for found in (root / folder).rglob(cache))]:
            shutil.rmtree(path, ignore_errors=True)
    prune_config(root / "config.json")
    prune_registry(root / "models" / "__init__.py")
    for rel in EXECUTABLE:
        if (root / rel).exists():
            (root / rel).chmod(0o755)


if __name__ == "__main__":
    main()
    sys.exit(0)
