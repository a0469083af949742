"""Reading a speech corpus (an LJSpeech-layout folder or NVIDIA-style filelists) into train/validation utterances. A
problem is a one-line :class:`DataError` naming the file (and line or id), or a :class:`BadClip` collected in ``bad``
(``data.on_bad_clip=skip``)."""

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
    persistent_workers: bool = True  # the epoch reaches them in shared memory (AudioMelDataset)
    on_bad_clip: Literal["error", "skip"] = "error"  # bad clips found at start-up: stop, or train without them
    exclude: list[str] = Field(default_factory=list)  # utterance ids left out (a malformed line's: metadata.csv:LINE)


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
    A line without a usable id (malformed, an id already used) gets the id ``<file name>:<line>`` (``metadata.csv:7``)."""

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
    if wav_path.is_file():
        return None
    problem, said = ("is a folder, not a wav file",) * 2 if wav_path.is_dir() else ("wav not found", "not found")
    return _LineIssue(BadClip(utt_id, str(wav_path), f"{problem} ({path.name} line {number})"),
                      f"{path}:{number}: wav of utterance '{utt_id}' {said}: {wav_path}")


def _scan_ljspeech(root: Path) -> tuple[list[Utterance], list[_LineIssue]]:
    """The rows of ``root/metadata.csv`` (UTF-8 ``id|raw text|normalized text``, the normalized text else the raw; wav
    ``wavs/<id>.wav``) in file order, good as utterances, bad (not 2 or 3 fields, an id empty or repeated, no
    transcript, no wav file) as issues. DataError: no folder, or ``metadata.csv`` missing, empty, not UTF-8."""
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
    """The lines of a filelist, UTF-8 ``path|text`` (paths relative to ``root`` or absolute; ids the wavs' stems), in
    file order: good ones as utterances, bad ones as issues. DataError: the filelist is missing, empty or not UTF-8."""
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
    """The utterances not ``excluded``; the other issues go to ``bad``, or without ``bad`` the first is raised."""
    issues = [issue for issue in issues if issue.clip.id not in excluded]
    if bad is not None:
        bad.extend(issue.clip for issue in issues)
    elif issues:
        more = f" (and {len(issues) - 1} more bad line(s))" if len(issues) > 1 else ""
        raise DataError(f"{issues[0].message}{more}")
    return [utt for utt in utterances if utt.id not in excluded]


def _find_filelist(name: str, dataset_path: Path, key: str) -> Path:
    for path in (Path(name), dataset_path / name):
        if path.is_file():
            return path
    raise DataError(f"data.{key} not found: {Path(name)} (also looked for {dataset_path / name})")


def load_splits(data_cfg: DataConfig, bad: Optional[list[BadClip]] = None) -> tuple[list[Utterance], list[Utterance]]:
    """The ``(train, validation)`` utterances of the ``data`` section: with ``training_files`` set, both filelists (a
    relative path tried as given, then in ``dataset_path``); otherwise ``metadata.csv``, whose last
    ``min(val_size, max(1, len // 10))`` utterances validate. Ids in ``data.exclude`` are left out; other bad lines go
    to ``bad`` as :class:`BadClip` or raise.

    Raises:
        DataError: what the readers raise; ``training_files`` without ``validation_files``; under 2 utterances left
            (metadata.csv), or none on one side (filelists).
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
    utterances, issues = _scan_ljspeech(root)
    kept = _settle(utterances, issues, bad, excluded)
    if len(kept) < 2:
        gone = len(issues) + len(utterances) - len(kept)
        why = f" ({gone} bad or excluded line(s) left out)" if gone else ""
        raise DataError(f"{root / 'metadata.csv'} lists {len(kept)} usable utterance(s){why}; at least 2 are "
                        "needed (one to train on, one to validate)")
    n_val = min(data_cfg.val_size, max(1, len(kept) // 10))
    return kept[:-n_val], kept[-n_val:]
