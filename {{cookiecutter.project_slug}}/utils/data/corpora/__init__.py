"""The readers of the layouts corpora ship in, one module each (``data.format``): ``ljspeech``, ``filelist``,
``vctk``, ``libritts``, ``nemo``, ``parquet``, ``lhotse``. Each has ``TREE`` (its layout in a line), ``matches(root)``
(whether a folder is in it) and ``read(root, data) -> Found``; :func:`load_splits` turns what a reader found into the
training and validation :class:`~utils.data.corpus.Corpus`."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import AbstractSet, Optional

from utils.data.corpora import filelist, lhotse, libritts, ljspeech, nemo, parquet, vctk
from utils.data.corpora.common import Part
from utils.data.corpus import GET_DATA, BadClip, Corpus, DataConfig, DataError

READERS: dict[str, ModuleType] = {"ljspeech": ljspeech, "filelist": filelist, "vctk": vctk, "nemo": nemo,
                                  "lhotse": lhotse, "libritts": libritts, "parquet": parquet}
"""``data.format`` -> its reader, in the order ``auto`` tries them (``filelist`` aside: data.training_files, else
last), those that look at the root's own files first, those that search its tree last."""


def detect(data: DataConfig) -> tuple[str, Optional[str]]:
    """The layout ``data.format`` names, or ``auto``'s: ``filelist`` (or ``nemo`` for JSON lines) where
    ``data.training_files`` is set, else the first of :data:`READERS` whose ``matches`` the root (``filelist`` last); and the line that
    says what ``auto`` found (None where ``data.format`` named it). DataError: no root folder (but for filelists,
    whose paths may be absolute), a root in no layout, or not in the one named, a format no reader here has (a part's
    that training reads)."""
    root = Path(data.dataset_path)
    if data.format not in READERS and data.format != "auto":
        raise DataError(f"data.format={data.format}: {root} is read by train.py alone; this reads a corpus layout "
                        f"({', '.join(READERS)}): point --dataset-path at the corpus the {data.format} folder was made "
                        "from")
    if data.format == "filelist" or (data.format == "auto" and data.training_files):
        given = next((path for path in (Path(data.training_files), root / data.training_files) if path.is_file()), None)
        name = "nemo" if data.format == "auto" and given is not None and nemo.is_manifest(given) else "filelist"
    elif not root.is_dir():
        raise DataError(f"dataset folder not found: {root} ({GET_DATA})")
    elif data.format != "auto":
        name = data.format
        if name != "ljspeech" and not READERS[name].matches(root):  # LJSpeech's reader names the missing file
            raise DataError(f"{root} is not in the {name} layout ({READERS[name].TREE}); point --dataset-path at the "
                            "corpus's root, or set data.format (auto: detected)")
    else:
        name = next((name for name, reader in READERS.items() if name != "filelist" and reader.matches(root)),
                    "filelist" if filelist.matches(root) else "")
    if not name:
        trees = "; ".join(f"{name}: {reader.TREE}" for name, reader in READERS.items())
        raise DataError(f"{root} is in no layout data.format=auto knows ({trees}); point --dataset-path at the "
                        "corpus's root, or set data.format")
    return name, (f"data.format=auto: found the {name} layout in {root} ({READERS[name].TREE})"
                  if data.format == "auto" else None)


def _settle(part: Part, bad: Optional[list[BadClip]], excluded: AbstractSet[str]) -> Corpus:
    """The utterances of ``part`` not ``excluded``; its other issues go to ``bad``, or without ``bad`` the first is
    raised."""
    issues = [issue for issue in part.issues if issue.clip.id not in excluded]
    if bad is not None:
        bad.extend(issue.clip for issue in issues)
    elif issues:
        more = f" (and {len(issues) - 1} more bad line(s))" if len(issues) > 1 else ""
        raise DataError(f"{issues[0].message}{more}")
    rows = part.rows if isinstance(part.rows, Corpus) else Corpus.of(part.rows)
    if not excluded:
        return rows
    return rows.take([i for i, utt_id in enumerate(rows.ids.tolist()) if utt_id not in excluded])


def load_splits(data: DataConfig, bad: Optional[list[BadClip]] = None,
                notes: Optional[list[str]] = None) -> tuple[Corpus, Corpus]:
    """The ``(train, validation)`` corpora of the ``data`` section, read by its layout's reader (:func:`detect`). Where
    the layout has no validation split, the last ``min(val_size, max(1, len // 10))`` utterances validate. Ids in
    ``data.exclude`` are left out; other bad lines go to ``bad`` as :class:`BadClip` or raise; ``notes`` gets the
    lines rank 0 says (what ``auto`` found, what was not read).

    Raises:
        DataError: what :func:`detect` and the readers raise; under 2 utterances left (no validation split), or none
            on one side.
    """
    name, found_line = detect(data)
    found = READERS[name].read(Path(data.dataset_path), data)
    if notes is not None:
        notes += ([found_line] if found_line else []) + found.notes
    excluded = set(data.exclude)
    splits = []
    for split, part in (("training", found.train), ("validation", found.val)):
        kept = _settle(part, bad, excluded) if part is not None else None
        if kept is not None and not kept and found.val is not None:
            why = (f"all {len(part.rows)} of its utterances are in data.exclude (where data.on_bad_clip=skip adds "
                   "the bad clips)" if part.rows else "it has no usable line")
            raise DataError(f"no {split} utterance left in {part.where}: {why}")
        splits.append(kept)
    train, val = splits
    if val is None:
        if len(train) < 2:
            gone = len(found.train.issues) + len(found.train.rows) - len(train)
            why = f" ({gone} bad or excluded line(s) left out)" if gone else ""
            raise DataError(f"{found.train.where} lists {len(train)} usable utterance(s){why}; at least 2 are needed "
                            "(one to train on, one to validate)")
        n_val = min(data.val_size, max(1, len(train) // 10))
        train, val = train.take(range(len(train) - n_val)), train.take(range(len(train) - n_val, len(train)))
    return train, val
