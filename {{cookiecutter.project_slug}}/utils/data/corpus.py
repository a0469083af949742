"""Reading a speech corpus (an LJSpeech-layout folder or NVIDIA-style filelists) into utterances and train/validation
splits. A problem is a one-line :class:`DataError` naming the file, and the line or utterance id where there is one; a
problem of one line (malformed, a missing wav) can instead be collected as a :class:`BadClip` (the readers' ``bad``), so
that ``train.py`` lists it with the other bad clips and, with ``data.on_bad_clip=skip``, trains without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import AbstractSet, Literal, NamedTuple, Optional, Sequence, Union

from pydantic import Field

from utils.config import Section

PathLike = Union[str, Path]


class DataConfig(Section):
    """The ``data`` section: where the corpus is and how it is loaded."""

    dataset_path: str = "data/LJSpeech-1.1"  # an LJSpeech-layout folder: metadata.csv + wavs/
    # optional NVIDIA-style filelists (path|text); empty: the last val_size utterances of metadata.csv validate
    training_files: str = ""
    validation_files: str = ""
    val_size: int = Field(100, ge=1)
    num_workers: int = Field(4, ge=0)  # DataLoader workers per rank, each keeping prefetch_factor batches ready
    prefetch_factor: int = Field(2, ge=1)
    persistent_workers: bool = True  # the epoch reaches them through datasets.SharedEpoch
    on_bad_clip: Literal["error", "skip"] = "error"  # bad clips found at start-up: stop, or train without them
    exclude: list[str] = Field(default_factory=list)  # utterance ids left out (a malformed line's: metadata.csv:LINE)
    batching: Literal["random", "buckets"] = "random"  # buckets: similar lengths together (LengthBucketSampler)
    bucket_pool: int = Field(64, ge=1)  # micro-batches sorted by length together
    mel_dir: str = ""  # mels to train a vocoder on (<id>.pt, from scripts.dump_gta_mels); empty: from the audio


class DataError(ValueError):
    """The corpus is missing, malformed or unreadable; the message names the file (and line or id)."""


GET_DATA = ("get LJSpeech with scripts/dataset.sh data, or a small demo corpus with python -m scripts.make_demo_corpus "
            "--output data/demo, or point --dataset-path at a folder in the LJSpeech layout")  # where one is missing


class Utterance(NamedTuple):
    """One recording: its id (the wav's file stem), the wav's path and its transcript."""

    id: str
    wav_path: Path
    text: str


def _read_lines(path: Path, what: str) -> list[tuple[int, str]]:
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


class BadClip(NamedTuple):
    """One utterance (or corpus line) that cannot be trained on: its id, its wav (or the list file and line), and why.
    A line without a usable id (malformed, an id already used) gets the id ``<file name>:<line>`` (``metadata.csv:7``),
    which ``data.exclude`` accepts like any other."""

    id: str
    path: str
    reason: str


class _LineIssue(NamedTuple):
    """A corpus line refused: as a :class:`BadClip`, and as the message raised when the caller collects none."""

    clip: BadClip
    message: str


def _malformed(path: Path, number: int, expected: str) -> _LineIssue:
    return _LineIssue(BadClip(f"{path.name}:{number}", f"{path}:{number}", f"malformed line: {expected}"),
                      f"{path}:{number}: {expected}")


def _wav_issue(utt_id: str, wav_path: Path, path: Path, number: int) -> Optional[_LineIssue]:
    """The issue of line ``number`` of ``path`` if its wav is missing or a folder, else ``None``."""
    if wav_path.is_file():
        return None
    problem, said = ("is a folder, not a wav file",) * 2 if wav_path.is_dir() else ("wav not found", "not found")
    return _LineIssue(BadClip(utt_id, str(wav_path), f"{problem} ({path.name} line {number})"),
                      f"{path}:{number}: wav of utterance '{utt_id}' {said}: {wav_path}")


def _scan_ljspeech(root: Path) -> tuple[list[Utterance], list[_LineIssue]]:
    """:func:`read_ljspeech`'s work: the good rows as utterances, the bad ones as issues, in file order."""
    if not root.is_dir():
        raise DataError(f"dataset folder not found: {root} ({GET_DATA})")
    metadata = root / "metadata.csv"
    utterances, issues, first_line = [], [], {}
    for number, line in _read_lines(metadata, "metadata file"):
        where = f"{metadata.name} line {number}"
        fields = line.split("|")
        if len(fields) not in (2, 3) or not fields[0].strip():
            issues.append(_malformed(metadata, number, f"expected 'id|raw text|normalized text', got {line!r}"))
            continue
        utt_id = fields[0].strip()
        wav_path = root / "wavs" / f"{utt_id}.wav"
        text = fields[2].strip() if len(fields) == 3 and fields[2].strip() else fields[1].strip()
        if utt_id in first_line:
            issues.append(_LineIssue(
                BadClip(f"{metadata.name}:{number}", str(wav_path),
                        f"utterance id '{utt_id}' appears twice (first on line {first_line[utt_id]}; {where})"),
                f"{metadata}:{number}: utterance id '{utt_id}' appears twice"))
            continue
        first_line[utt_id] = number
        if not text:
            issues.append(_LineIssue(BadClip(utt_id, str(wav_path), f"empty transcript ({where})"),
                                     f"{metadata}:{number}: utterance '{utt_id}' has no text"))
            continue
        issue = _wav_issue(utt_id, wav_path, metadata, number)
        if issue is not None:
            issues.append(issue)
            continue
        utterances.append(Utterance(utt_id, wav_path, text))
    return utterances, issues


def _scan_filelist(filelist: Path, root: Path) -> tuple[list[Utterance], list[_LineIssue]]:
    """:func:`read_filelist`'s work: the good lines as utterances, the bad ones as issues, in file order."""
    utterances, issues = [], []
    for number, line in _read_lines(filelist, "filelist"):
        fields = line.split("|")
        if len(fields) != 2 or not fields[0].strip() or not fields[1].strip():
            issues.append(_malformed(filelist, number, f"expected 'path|text', got {line!r}"))
            continue
        wav_path = root / fields[0].strip()  # an absolute path stays itself
        issue = _wav_issue(wav_path.stem, wav_path, filelist, number)
        if issue is not None:
            issues.append(issue)
            continue
        utterances.append(Utterance(wav_path.stem, wav_path, fields[1].strip()))
    return utterances, issues


def _settle(utterances: list[Utterance], issues: Sequence[_LineIssue], bad: Optional[list[BadClip]],
            excluded: AbstractSet[str] = frozenset()) -> list[Utterance]:
    """The utterances whose id is not ``excluded``; the issues whose id is not either are collected in ``bad``, or
    without ``bad`` the first is raised."""
    issues = [issue for issue in issues if issue.clip.id not in excluded]
    if bad is not None:
        bad.extend(issue.clip for issue in issues)
    elif issues:
        more = f" (and {len(issues) - 1} more bad line(s))" if len(issues) > 1 else ""
        raise DataError(f"{issues[0].message}{more}")
    return [utt for utt in utterances if utt.id not in excluded]


def read_ljspeech(dataset_path: PathLike, bad: Optional[list[BadClip]] = None) -> list[Utterance]:
    """Utterances of an LJSpeech-layout corpus, in ``metadata.csv`` order.

    ``metadata.csv``: UTF-8, no header, ``id|raw text|normalized text`` split on ``|`` only (no CSV quoting; the
    normalized text if non-empty, else the raw one), blank lines ignored; the wav of ``id`` is ``wavs/<id>.wav``. A bad
    row (not 2 or 3 fields or an empty id, an id already used: listed as ``metadata.csv:<line>``; an empty transcript; a
    wav missing or a folder) is appended to ``bad`` as a :class:`BadClip` and left out, or without ``bad`` raises.

    Raises:
        DataError: the folder or ``metadata.csv`` is missing, empty or not UTF-8; without ``bad``, a bad row (the
            message names the line, and the id and path where there are).
    """
    return _settle(*_scan_ljspeech(Path(dataset_path)), bad)


def read_filelist(filelist_path: PathLike, dataset_path: PathLike,
                  bad: Optional[list[BadClip]] = None) -> list[Utterance]:
    """Utterances of an NVIDIA-style filelist (UTF-8 ``path|text`` lines, paths relative to ``dataset_path`` or
    absolute; ids are the wavs' file stems), in file order. A bad line (not ``path|text`` with both parts non-empty:
    listed as ``<filelist name>:<line>``; a wav missing or a folder) is appended to ``bad`` or raises, as in
    :func:`read_ljspeech`.

    Raises:
        DataError: the filelist is missing, empty or not UTF-8; without ``bad``, a bad line.
    """
    return _settle(*_scan_filelist(Path(filelist_path), Path(dataset_path)), bad)


def _find_filelist(name: str, dataset_path: Path, key: str) -> Path:
    """``name`` if it exists as given, else ``dataset_path / name``; DataError naming both if neither exists."""
    for path in (Path(name), dataset_path / name):
        if path.is_file():
            return path
    raise DataError(f"data.{key} not found: {Path(name)} (also looked for {dataset_path / name})")


def load_splits(data_cfg: DataConfig, bad: Optional[list[BadClip]] = None) -> tuple[list[Utterance], list[Utterance]]:
    """The ``(train, validation)`` utterances the ``data`` section describes.

    With ``training_files`` set, both filelists are read (:func:`read_filelist`; a relative path is tried as given, then
    in ``dataset_path``); otherwise ``metadata.csv`` (:func:`read_ljspeech`), whose last ``min(val_size, max(1, len //
    10))`` utterances validate. Utterances and bad lines whose id is in ``data.exclude`` (where ``train.py`` puts what
    its start-up check refused, with ``data.on_bad_clip=skip``) are left out; other bad lines go to ``bad`` or raise.

    Raises:
        DataError: what the readers raise; ``training_files`` without ``validation_files``; ``val_size < 1``; fewer
            than 2 utterances left (metadata.csv), or none on one side (filelists).
    """
    root = Path(data_cfg.dataset_path)
    excluded = set(data_cfg.exclude)
    if data_cfg.training_files:
        if not data_cfg.validation_files:
            raise DataError("data.training_files is set but data.validation_files is empty: give both filelists")
        splits = []
        for key in ("training_files", "validation_files"):
            filelist = _find_filelist(getattr(data_cfg, key), root, key)
            utterances, issues = _scan_filelist(filelist, root)
            kept = _settle(utterances, issues, bad, excluded)
            if not kept:
                split = "training" if key == "training_files" else "validation"
                why = (f"all {len(utterances)} of its utterances are in data.exclude (where "
                       "data.on_bad_clip=skip adds the bad clips)" if utterances else "it has no usable line")
                raise DataError(f"no {split} utterance left in {filelist}: {why}")
            splits.append(kept)
        return splits[0], splits[1]
    if data_cfg.val_size < 1:
        raise DataError(f"data.val_size must be at least 1, got {data_cfg.val_size}")
    utterances, issues = _scan_ljspeech(root)
    kept = _settle(utterances, issues, bad, excluded)
    if len(kept) < 2:
        gone = len(issues) + len(utterances) - len(kept)
        why = f" ({gone} bad or excluded line(s) left out)" if gone else ""
        raise DataError(f"{root / 'metadata.csv'} lists {len(kept)} usable utterance(s){why}; at least 2 are "
                        "needed (one to train on, one to validate)")
    n_val = min(data_cfg.val_size, max(1, len(kept) // 10))
    return kept[:-n_val], kept[-n_val:]
