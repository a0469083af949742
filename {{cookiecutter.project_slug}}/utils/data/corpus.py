"""Reading a speech corpus: utterance lists and train/validation splits.

Two corpus descriptions are understood: the LJSpeech layout, a folder with ``metadata.csv`` (``id|raw text|normalized
text``) and ``wavs/<id>.wav``; and NVIDIA-style filelists, ``path|text`` lines, paths relative to the dataset folder (or
absolute). Every problem with the data (a missing folder or file, a malformed line, an unreadable wav) is a
:class:`DataError` whose one-line message names the file, and the line or utterance id where there is one. A problem
of one line (a malformed line, a missing wav) can instead be collected as a :class:`BadClip` (the ``bad`` argument of
the readers), so that ``train.py`` lists it with the other bad clips and, with ``data.on_bad_clip=skip``, trains without
it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, NamedTuple, Optional, Sequence, Union

from pydantic import Field

from utils.config import Section

PathLike = Union[str, Path]


class DataConfig(Section):
    """The ``data`` section: where the corpus is and how it is loaded."""

    dataset_path: str = "data/LJSpeech-1.1"  # an LJSpeech-layout folder: metadata.csv + wavs/
    # optional NVIDIA-style filelists (path|text, relative to the dataset folder); empty: metadata.csv is split and
    # its last val_size utterances validate
    training_files: str = ""
    validation_files: str = ""
    val_size: int = Field(100, ge=1)
    num_workers: int = Field(4, ge=0)  # DataLoader workers per rank, each keeping prefetch_factor batches ready
    prefetch_factor: int = Field(2, ge=1)
    # workers live for the whole run; an epoch the items depend on reaches them through datasets.SharedEpoch
    persistent_workers: bool = True
    # bad clips and lines found by the start-up check (malformed or repeated line, empty transcript, missing,
    # unreadable, truncated, silent or too short wav, transcript without a usable character): error names them all
    # and stops; skip trains without them and lists them in OUTPUT/skipped_clips.txt
    on_bad_clip: Literal["error", "skip"] = "error"
    exclude: list[str] = Field(default_factory=list)  # utterance ids left out (a malformed line's: metadata.csv:LINE)
    # random: any lengths together, padded to the longest; buckets: similar lengths together (samplers.
    # LengthBucketSampler) for a model whose items differ in length (Training.variable_length)
    batching: Literal["random", "buckets"] = "random"
    bucket_pool: int = Field(64, ge=1)  # micro-batches sorted by length together
    # mels to train a vocoder on instead of its audio's (<mel_dir>/<id>.pt, (n_mels, frames): Tacotron2's
    # teacher-forced mels from python -m scripts.dump_gta_mels); empty: mels computed from the audio
    mel_dir: str = ""


class DataError(ValueError):
    """The corpus is missing, malformed or unreadable; the message names the file (and line or id)."""


GET_DATA = ("get LJSpeech with scripts/dataset.sh data, or a small demo corpus with python -m scripts.make_demo_corpus "
            "--output data/demo, or point --dataset-path at a folder in the LJSpeech layout")
"""How to get a corpus: said where one is missing."""


class Utterance(NamedTuple):
    """One recording: its id (the wav's file stem), the wav's path, and its transcript."""

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
    lines = [(number, line.rstrip("\r")) for number, line in enumerate(text.split("\n"), start=1)]
    lines = [(number, line) for number, line in lines if line.strip()]
    if not lines:
        raise DataError(f"{what} is empty: {path}")
    return lines


class BadClip(NamedTuple):
    """One utterance (or corpus line) that cannot be trained on: its id, its wav (or the list file and line), and why.

    A line without a usable id (too few fields, an empty id, an id already used) gets the id ``<file name>:<line>``
    (``metadata.csv:7``), which ``data.exclude`` accepts like any other id.
    """

    id: str
    path: str
    reason: str


class _LineIssue(NamedTuple):
    """A corpus line :func:`read_ljspeech` / :func:`read_filelist` refused: as a :class:`BadClip`, and as the message
    raised when the caller collects none."""

    clip: BadClip
    message: str


def _wav_problem(wav_path: Path) -> Optional[str]:
    """Why ``wav_path`` is no wav file (``"wav not found"``, ``"is a folder, not a wav file"``), or ``None``."""
    if wav_path.is_file():
        return None
    if wav_path.is_dir():
        return "is a folder, not a wav file"
    return "wav not found"


def _scan_ljspeech(root: Path) -> tuple[list[Utterance], list[_LineIssue]]:
    """:func:`read_ljspeech`'s work: the good rows as utterances, the bad ones as issues, in file order."""
    if not root.is_dir():
        raise DataError(f"dataset folder not found: {root} ({GET_DATA})")
    metadata = root / "metadata.csv"
    utterances: list[Utterance] = []
    issues: list[_LineIssue] = []
    first_line: dict[str, int] = {}
    for number, line in _read_lines(metadata, "metadata file"):
        where = f"{metadata.name} line {number}"
        fields = line.split("|")
        if len(fields) not in (2, 3) or not fields[0].strip():
            expected = f"expected 'id|raw text|normalized text', got {line!r}"
            issues.append(_LineIssue(BadClip(f"{metadata.name}:{number}", f"{metadata}:{number}",
                                             f"malformed line: {expected}"), f"{metadata}:{number}: {expected}"))
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
        problem = _wav_problem(wav_path)
        if problem is not None:
            said = "not found" if problem == "wav not found" else problem
            issues.append(_LineIssue(BadClip(utt_id, str(wav_path), f"{problem} ({where})"),
                                     f"{metadata}:{number}: wav of utterance '{utt_id}' {said}: {wav_path}"))
            continue
        utterances.append(Utterance(utt_id, wav_path, text))
    return utterances, issues


def _scan_filelist(filelist: Path, root: Path) -> tuple[list[Utterance], list[_LineIssue]]:
    """:func:`read_filelist`'s work: the good lines as utterances, the bad ones as issues, in file order."""
    utterances: list[Utterance] = []
    issues: list[_LineIssue] = []
    for number, line in _read_lines(filelist, "filelist"):
        where = f"{filelist.name} line {number}"
        fields = line.split("|")
        if len(fields) != 2 or not fields[0].strip() or not fields[1].strip():
            expected = f"expected 'path|text', got {line!r}"
            issues.append(_LineIssue(BadClip(f"{filelist.name}:{number}", f"{filelist}:{number}",
                                             f"malformed line: {expected}"), f"{filelist}:{number}: {expected}"))
            continue
        wav_path = Path(fields[0].strip())
        if not wav_path.is_absolute():
            wav_path = root / wav_path
        problem = _wav_problem(wav_path)
        if problem is not None:
            said = "not found" if problem == "wav not found" else problem
            issues.append(_LineIssue(BadClip(wav_path.stem, str(wav_path), f"{problem} ({where})"),
                                     f"{filelist}:{number}: wav of utterance '{wav_path.stem}' {said}: {wav_path}"))
            continue
        utterances.append(Utterance(wav_path.stem, wav_path, fields[1].strip()))
    return utterances, issues


def _settle(issues: Sequence[_LineIssue], bad: Optional[list[BadClip]]) -> None:
    """Raise the first issue's message when the caller collects none (``bad is None``), else collect them."""
    if not issues:
        return
    if bad is None:
        more = f" (and {len(issues) - 1} more bad line(s))" if len(issues) > 1 else ""
        raise DataError(f"{issues[0].message}{more}")
    bad.extend(issue.clip for issue in issues)


def read_ljspeech(dataset_path: PathLike, bad: Optional[list[BadClip]] = None) -> list[Utterance]:
    """Utterances of an LJSpeech-layout corpus, in ``metadata.csv`` order.

    ``metadata.csv`` is UTF-8, pipe separated, without a header: ``id|raw text|normalized text`` (the third column may
    be left out). The normalized text is used when present and non-empty, else the raw text. Fields are split on ``|``
    only (no CSV quoting: transcripts may contain quotes). Blank lines are ignored. The wav of utterance ``id`` is
    ``wavs/<id>.wav``.

    A bad row is one clip, not the whole corpus: a malformed line (not 2 or 3 fields, or an empty id; listed as
    ``metadata.csv:<line>``), an id already used (the later line, as ``metadata.csv:<line>``), an empty transcript, a
    wav that is missing or is a folder. With ``bad`` given, each is appended to it as a :class:`BadClip` and left out;
    without, the first one raises.

    Args:
        dataset_path: the corpus folder.
        bad: a list collecting the bad rows, or ``None`` (raise on the first).

    Raises:
        DataError: the folder or ``metadata.csv`` is missing, ``metadata.csv`` is empty or not UTF-8; without ``bad``,
            also a bad row (the message names the line number, and the id and path where there are).
    """
    utterances, issues = _scan_ljspeech(Path(dataset_path))
    _settle(issues, bad)
    return utterances


def read_filelist(filelist_path: PathLike, dataset_path: PathLike,
                  bad: Optional[list[BadClip]] = None) -> list[Utterance]:
    """Utterances of an NVIDIA-style filelist (``path|text`` lines, UTF-8), in file order.

    A relative path is taken relative to ``dataset_path``; an absolute one is used as is. The id of each utterance is
    its wav's file stem. Blank lines are ignored.

    A bad line is one clip, not the whole list: a line that is not ``path|text`` with both parts non-empty (listed as
    ``<filelist name>:<line>``), a wav that is missing or is a folder. With ``bad`` given, each is appended to it as a
    :class:`BadClip` and left out; without, the first one raises.

    Raises:
        DataError: the filelist is missing, empty or not UTF-8; without ``bad``, also a bad line (the message names the
            line number, and the id and path where there are).
    """
    utterances, issues = _scan_filelist(Path(filelist_path), Path(dataset_path))
    _settle(issues, bad)
    return utterances


def _find_filelist(name: str, dataset_path: Path, key: str) -> Path:
    """``name`` if it exists as given, else ``dataset_path / name``; DataError naming both if neither exists."""
    given = Path(name)
    if given.is_file():
        return given
    inside = dataset_path / given
    if inside.is_file():
        return inside
    raise DataError(f"data.{key} not found: {given} (also looked for {inside})")


def load_splits(data_cfg: DataConfig,
                bad: Optional[list[BadClip]] = None) -> tuple[list[Utterance], list[Utterance]]:
    """The training and validation utterances described by the ``data`` section of the config.

    With ``data_cfg.training_files`` set, both filelists are read (:func:`read_filelist`); a relative filelist path is
    tried as given, then relative to ``dataset_path``. Otherwise ``metadata.csv`` is read (:func:`read_ljspeech`) and
    its last ``min(val_size, max(1, len // 10))`` utterances validate, which keeps at least one utterance on each side.

    Utterances whose id is in ``data_cfg.exclude`` are left out, and so are bad lines whose id is there
    (``metadata.csv:7`` for a malformed line): ``train.py`` adds the clips and lines its start-up check refused there,
    with ``data.on_bad_clip=skip``. The other bad lines (:func:`read_ljspeech`) are appended to ``bad`` when it is
    given, else the first raises.

    Args:
        data_cfg: the ``data`` section.
        bad: a list collecting the bad lines not in ``data_cfg.exclude``, or ``None`` (raise on the first).

    Returns:
        ``(train_utterances, val_utterances)``.

    Raises:
        DataError: anything :func:`read_filelist` / :func:`read_ljspeech` raise; ``training_files`` without
            ``validation_files``; ``val_size < 1``; fewer than 2 utterances left (metadata.csv), or none on one side
            (filelists).
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
            _settle([issue for issue in issues if issue.clip.id not in excluded], bad)
            kept = [utt for utt in utterances if utt.id not in excluded]
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
    _settle([issue for issue in issues if issue.clip.id not in excluded], bad)
    kept = [utt for utt in utterances if utt.id not in excluded]
    if len(kept) < 2:
        gone = len(issues) + len(utterances) - len(kept)
        why = f" ({gone} bad or excluded line(s) left out)" if gone else ""
        raise DataError(f"{root / 'metadata.csv'} lists {len(kept)} usable utterance(s){why}; at least 2 are "
                        "needed (one to train on, one to validate)")
    n_val = min(data_cfg.val_size, max(1, len(kept) // 10))
    return kept[:-n_val], kept[-n_val:]
