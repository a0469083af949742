"""What the layouts' readers share: the lines of a text file, a refused line (:class:`LineIssue`), what a reader finds
(:class:`Found`)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple, Optional, Union

from utils.data.corpus import BadClip, Corpus, DataError, Utterance


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
