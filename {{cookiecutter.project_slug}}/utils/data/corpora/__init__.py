"""The readers of the layouts corpora ship in, one module each (``data.format``): the core's ``ljspeech`` and
``filelist`` (:data:`READERS`), and those a part adds (``DataConfig.layouts``: :func:`readers`). Each has ``TREE``
(its layout in a line), ``matches(root)`` (whether a folder is in it) and ``read(root, data) -> Found``, and may have
``takes_filelist(path)`` (whether a ``data.training_files`` that ``auto`` reads is its own, not a filelist);
:func:`load_splits` turns what a reader found into the training and validation :class:`~utils.data.corpus.Corpus`."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import AbstractSet, Optional

from utils.data.corpora import filelist, ljspeech
from utils.data.corpora.common import Part
from utils.data.corpus import GET_DATA, BadClip, Corpus, DataConfig, DataError

READERS: dict[str, ModuleType] = {"ljspeech": ljspeech, "filelist": filelist}
"""The core's layouts: ``data.format`` -> its reader."""


def readers(data: DataConfig) -> dict[str, ModuleType]:
    """``data.format`` -> its reader, of the core and of the parts (``type(data).layouts``), in the order ``auto``
    tries them: LJSpeech's first, then the parts' (those that look at the root's own files before those that search
    its tree), ``filelist`` last (but where ``data.training_files`` is set: :func:`detect`)."""
    return {"ljspeech": READERS["ljspeech"], **type(data).layouts, "filelist": READERS["filelist"]}


def _given_list(data: DataConfig, root: Path, layouts: dict[str, ModuleType]) -> str:
    """The layout of ``data.training_files``: that of the first reader whose ``takes_filelist`` takes it under
    ``auto``, else ``filelist``."""
    given = next((path for path in (Path(data.training_files), root / data.training_files) if path.is_file()), None)
    if data.format != "auto" or given is None:
        return "filelist"
    return next((name for name, reader in layouts.items()
                 if getattr(reader, "takes_filelist", None) is not None and reader.takes_filelist(given)), "filelist")


def detect(data: DataConfig) -> tuple[str, Optional[str]]:
    """The layout ``data.format`` names, or ``auto``'s: ``filelist`` (or the layout whose reader takes the list, as
    NeMo's its manifests) where ``data.training_files`` is set, else the first of :func:`readers` whose ``matches``
    the root (``filelist`` last); and the line that says what ``auto`` found (None where ``data.format`` named it).
    DataError: no root folder (but for filelists, whose paths may be absolute), a root in no layout (the layouts this
    project reads listed), or not in the one named, a format no reader here has (a part's that training reads)."""
    root, layouts = Path(data.dataset_path), readers(data)
    if data.format not in layouts and data.format != "auto":
        raise DataError(f"data.format={data.format}: {root} is read by train.py alone; this reads a corpus layout "
                        f"({', '.join(layouts)}): point --dataset-path at the corpus the {data.format} folder was made "
                        "from")
    if data.format == "filelist" or (data.format == "auto" and data.training_files):
        name = _given_list(data, root, layouts)
    elif not root.is_dir():
        raise DataError(f"dataset folder not found: {root} ({GET_DATA})")
    elif data.format != "auto":
        name = data.format
        if name != "ljspeech" and not layouts[name].matches(root):  # LJSpeech's reader names the missing file
            raise DataError(f"{root} is not in the {name} layout ({layouts[name].TREE}); point --dataset-path at the "
                            "corpus's root, or set data.format (auto: detected)")
    else:
        name = next((name for name, reader in layouts.items() if name != "filelist" and reader.matches(root)),
                    "filelist" if filelist.matches(root) else "")
    if not name:
        trees = "; ".join(f"{name}: {reader.TREE}" for name, reader in layouts.items())
        raise DataError(f"{root} is in no layout data.format=auto knows ({trees}); point --dataset-path at the "
                        "corpus's root, or set data.format")
    return name, (f"data.format=auto: found the {name} layout in {root} ({layouts[name].TREE})"
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
    found = readers(data)[name].read(Path(data.dataset_path), data)
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
