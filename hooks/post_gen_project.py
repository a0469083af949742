"""Remove what belongs to example models that were not chosen. No network, no questions.

Whole files go by the table below. Inside a file, lines between ``# >>> NAME`` and ``# <<< NAME``
(``<!-- >>> NAME -->`` in Markdown) stay only when model NAME was chosen; the marker lines always go.
``config.json`` loses the sections (and ``tiny`` overrides) of models not chosen.
"""

import json
import re
import shutil
import sys
from pathlib import Path

CHOICE = "{{ cookiecutter.example_model }}"
CHOSEN = {"waveglow", "tacotron2"} if CHOICE == "both" else {CHOICE}

FILES = {
    "waveglow": ["modules/waveglow.py", "tests/test_waveglow.py"],
    "tacotron2": ["modules/layers.py", "modules/attention.py", "modules/tacotron2.py", "utils/text",
                  "utils/text_mel_data.py", "utils/plotting.py", "scripts/preprocess.py",
                  "tests/test_tacotron2.py", "tests/test_text.py"],
}
MARKER = re.compile(r"^\s*(?:#|<!--)\s*(>>>|<<<)\s*(\w+)")
TEXT_SUFFIXES = {".py", ".md", ".txt", ".sh", ".cfg", ".toml", ".yaml", ".yml", ""}


def strip_blocks(text: str, path: Path) -> str:
    """Drop the marker lines and the blocks of models not chosen."""
    out, dropping = [], None
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        match = MARKER.match(line)
        if match:
            kind, name = match.groups()
            if kind == ">>>":
                if dropping is None and name not in CHOSEN:
                    dropping = name
            elif dropping == name:
                dropping = None
            continue
        if dropping is None:
            out.append(line)
    if dropping is not None:
        raise SystemExit(f"ERROR: {path}: block '# >>> {dropping}' is never closed")
    return "".join(out)


def prune_config(path: Path) -> None:
    """Remove the config sections of models not chosen, top level and ``tiny`` block alike."""
    config = json.loads(path.read_text())
    unchosen = set(FILES) - CHOSEN
    for block in (config, config.get("tiny", {})):
        for name in unchosen:
            block.pop(name, None)
    path.write_text(json.dumps(config, indent=2) + "\n")


def main() -> None:
    root = Path.cwd()
    for cache in [*root.rglob("__pycache__"), *root.rglob(".pytest_cache")]:  # left by a template checkout's test runs
        shutil.rmtree(cache, ignore_errors=True)
    for name, paths in FILES.items():
        if name in CHOSEN:
            continue
        for rel in paths:
            target = root / rel
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in TEXT_SUFFIXES and path.name != "LICENSE":
            text = path.read_text()
            if ">>>" in text:
                path.write_text(strip_blocks(text, path))
    prune_config(root / "config.json")
    for path in ("scripts/dataset.sh", "scripts/make_demo_corpus.py", "scripts/preprocess.py"):
        if (root / path).exists():
            (root / path).chmod(0o755)


if __name__ == "__main__":
    main()
    sys.exit(0)
