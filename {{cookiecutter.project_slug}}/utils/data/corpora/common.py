"""What the layouts' readers share: the lines of a text file, a refused line (:class:`LineIssue`), what a reader finds
(:class:`Found`), and which split a file's name means (:func:`split_of`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Literal, NamedTuple, Optional, Union

from utils.data.corpus import BadClip, Corpus, DataConfig, DataError, Utterance


class LineIssue(NamedTuple):
    """A corpus line refused: as a :class:`BadClip`, and as the message raised when the caller collects none."""

    clip: BadClip
    message: str


class Part(NamedTuple):
    """A split as a reader found it: its good utterances in corpus order (a :class:`Corpus` where the reader makes
    the columns at once), the lines it refused, and the file or folder the messages name (``metadata.csv``'s path, a
    filelist's, a subset's)."""

    rows: Union[list[Utterance], Corpus]
    issues: list[LineIssue]
    where: str


class Found(NamedTuple):
    """What a layout's reader returns: the training split, the validation split (``None``: the layout has none, so the
    last ``data.val_size`` training utterances validate), and notes for rank 0's first lines (what was not read)."""

    train: Part
    val: Optional[Part]
    notes: list[str]


def read_lines(path: Path, what: str) -> list[tuple[int, str]]:
    """Non-blank lines of a UTF-8 text file as ``(line number, line)``; DataError if missing/empty/not UTF-8."""
    if not path.is_file():
        raise DataError(f"{what} not found: {path}")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise DataError(f"{path} is not UTF-8 text ({err})") from None
    except OSError as err:  # no permission, a folder named like the file, an I/O error
        raise DataError(f"cannot read {what} {path}: {err.strerror or err}") from None
    # Lines end at "\n" only (str.splitlines would also split a transcript at U+2028, U+0085, ...).
    lines = [(number, line.rstrip("\r")) for number, line in enumerate(text.split("\n"), start=1) if line.strip()]
    if not lines:
        raise DataError(f"{what} is empty: {path}")
    return lines


def malformed(path: Path, number: int, expected: str) -> LineIssue:
    """Line ``number`` of ``path`` is not what the layout expects (``expected``: what it should be, what it is)."""
    return LineIssue(BadClip(f"{path.name}:{number}", f"{path}:{number}", f"malformed line: {expected}"),
                     f"{path}:{number}: {expected}")


def audio_issue(utt_id: str, audio: Path, path: Path, number: Optional[int] = None) -> Optional[LineIssue]:
    """``None`` if ``audio`` is a file; else why not, named by the list ``path`` (and its line ``number``) or, without
    one, by the transcript file ``path`` that names the utterance."""
    if audio.is_file():
        return None
    problem, said = ("is a folder, not a wav file",) * 2 if audio.is_dir() else ("wav not found", "not found")
    where = f"{path.name} line {number}" if number is not None else f"transcript {path.name}"
    return LineIssue(BadClip(utt_id, str(audio), f"{problem} ({where})"),
                     f"{path}:{number}: wav of utterance '{utt_id}' {said}: {audio}" if number is not None else
                     f"{path}: the audio of utterance '{utt_id}' {said}: {audio}")


def text_issue(utt_id: str, audio: str, path: Path, number: Optional[int] = None) -> LineIssue:
    """Utterance ``utt_id`` has an empty transcript (in ``path``, at line ``number`` where it is a list)."""
    where = f"{path.name} line {number}" if number is not None else path.name
    return LineIssue(BadClip(utt_id, audio, f"empty transcript ({where})"),
                     f"{path}{f':{number}' if number is not None else ''}: utterance '{utt_id}' has no text")


def repeated_id(utt_id: str, audio: str, path: Path, number: int, first: str) -> LineIssue:
    """Line ``number`` of ``path`` gives utterance id ``utt_id`` again (``first``: where it was given first)."""
    return LineIssue(BadClip(f"{path.name}:{number}", audio,
                             f"utterance id '{utt_id}' appears twice (first on {first}; {path.name} line {number})"),
                     f"{path}:{number}: utterance id '{utt_id}' appears twice")


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
