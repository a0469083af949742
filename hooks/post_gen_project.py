"""Remove the files of example models that were not chosen. No network, no questions, idempotent.

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
                *(f"{REF}net_hifigan_v{n}.npz" for n in (1, 2, 3))],
    "tacotron2": ["models/tacotron2", "modules/layers.py", "modules/attention.py", "modules/tacotron2.py",
                  "scripts/preprocess.py", "tests/test_tacotron2.py", "tests/test_text.py",
                  "tests/test_parity_tacotron2.py", REF + "net_tacotron2_tf.npz", REF + "net_tacotron2_fr.npz",
                  REF + "text_nvidia.json"],
}
TOGETHER = {
    "scripts/dump_gta_mels.py": [{"tacotron2"}, {"waveglow", "hifigan"}],
    "tests/test_gta.py": [{"tacotron2"}, {"waveglow", "hifigan"}],
}
"""Files that need several models: kept when every set names a chosen model (Tacotron2 and a vocoder)."""
EXECUTABLE = ["scripts/dataset.sh", "scripts/mpirun.sh", "scripts/slurm/train.sbatch"]


def prune_config(path: Path) -> None:
    """Remove the config sections of models not chosen, top level and ``tiny`` block alike."""
    config = json.loads(path.read_text())
    unchosen = set(FILES) - CHOSEN
    for block in (config, config.get("tiny", {})):
        for name in unchosen:
            block.pop(name, None)
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
