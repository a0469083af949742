"""What the readers of manifests and subsets share (the corpora part's NeMo, lhotse, LibriTTS and parquet
readers): which split a file's or folder's name means (:func:`split_of`), and the manifests a ``data`` section names
or a root holds (:func:`manifests_of`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Literal

from utils.data.corpus import DataConfig, DataError

SPLIT_WORDS = {"dev": "val", "val": "val", "valid": "val", "validation": "val", "test": "test"}
"""The words of a file's or folder's name that make it a validation or test split; any other name trains."""


def split_of(name: str) -> Literal["train", "val", "test"]:
    """The split a file or folder name means, by its words (split at what is not a letter or digit):
    ``dev-clean``, ``92_manifest_clean_dev.json``, ``validation-00000.parquet``: ``val``; ``test-other``: ``test``;
    anything else (``train-clean-100``, ``train.jsonl``): ``train``."""
    for word in re.split(r"[^a-z0-9]+", name.lower()):
        if word in SPLIT_WORDS:
            return SPLIT_WORDS[word]  # type: ignore[return-value]
    return "train"


def apart(files: list[Path], root: Path) -> tuple[list[Path], list[Path], list[str]]:
    """``files`` (manifests, parquet files, subsets) sorted into training and validation by :func:`split_of` of their
    paths below ``root``, and a note naming the test ones, which are not read."""
    splits: dict[str, list[Path]] = {"train": [], "val": [], "test": []}
    for path in sorted(files):
        splits[split_of(path.relative_to(root).as_posix())].append(path)
    tests = splits["test"]
    note = [f"not read: {len(tests)} test split(s) ({', '.join(p.name for p in tests[:3])}"
            f"{', ...' if len(tests) > 3 else ''})"] if tests else []
    return splits["train"], splits["val"], note


def named_files(pattern: str, root: Path, key: str) -> list[Path]:
    """The manifests ``data.<key>`` names: a pattern (``*_train.json``) matched in ``root``, or one file, as given or
    in ``root``. DataError: none is found."""
    found = sorted(root.glob(pattern)) if any(ch in pattern for ch in "*?[") else \
        [path for path in (Path(pattern), root / pattern) if path.is_file()][:1]
    if not found:
        raise DataError(f"data.{key} not found: {pattern} (looked in {root})")
    return found


def manifests_of(data: DataConfig, root: Path, find: Callable[[Path], list[Path]],
                 none: str) -> tuple[list[Path], list[Path], list[str]]:
    """The training and validation manifests: those ``data.training_files`` and ``data.validation_files`` name
    (:func:`named_files`), else ``find(root)``'s sorted by :func:`apart`; and the note :func:`apart` gives.
    DataError: one named and not found, or no training manifest (``none``: what the message says is missing)."""
    notes: list[str] = []
    if data.training_files:
        train = named_files(data.training_files, root, "training_files")
        val = named_files(data.validation_files, root, "validation_files") if data.validation_files else []
    else:
        train, val, notes = apart(find(root), root)
    if not train:
        raise DataError(f"{root}: {none}; name it with data.training_files")
    return train, val, notes
