"""Filelists (NVIDIA's reference repositories, VITS, Matcha-TTS): ``data.training_files`` and
``data.validation_files`` (where neither is set: one ``filelists/*train*.txt`` and one ``*val*.txt``), UTF-8, one utterance a line, its audio's path relative to ``data.dataset_path`` (or
absolute), and its speaker where the list names one::

    wavs/LJ001-0001.wav|Printing, in the only sense with which we are at present concerned, ...
    wav48/p225/p225_001.wav|p225|Please call Stella.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from utils.data.corpora.common import Found, Part, audio_issue, malformed, read_lines
from utils.data.corpora.demo import DemoLayout, Line, validating, write_text
from utils.data.corpus import SINGLE_SPEAKER, DataConfig, DataError, Utterance

TREE = ("data.training_files and data.validation_files, or filelists/*train*.txt and *val*.txt: path|text or "
        "path|speaker|text")


def conventional(root: Path) -> Optional[tuple[Path, Path]]:
    """The training and validation lists of ``root/filelists/`` where no ``data`` key names them: one ``*train*.txt``
    and one ``*val*.txt`` (NVIDIA's ``ljs_audio_text_train_filelist.txt`` and ``..._val_filelist.txt``, the demo
    corpus's ``train.txt`` and ``val.txt``); None where there are not exactly one of each."""
    folder = root / "filelists"
    train, val = (sorted(folder.glob(pattern)) if folder.is_dir() else [] for pattern in ("*train*.txt", "*val*.txt"))
    return (train[0], val[0]) if len(train) == 1 and len(val) == 1 else None


def matches(root: Path) -> bool:
    """Whether ``root`` holds its lists where :func:`conventional` finds them."""
    return conventional(root) is not None


def find(name: str, root: Path, key: str) -> Path:
    """The list ``name`` (``data.<key>``): as given, else inside ``root``. DataError: neither is a file."""
    for path in (Path(name), root / name):
        if path.is_file():
            return path
    raise DataError(f"data.{key} not found: {Path(name)} (also looked for {root / name})")


def scan(filelist: Path, root: Path) -> Part:
    """The lines of ``filelist`` in file order (ids: the audio files' stems; speaker :data:`SINGLE_SPEAKER` where the
    line names none): good ones as utterances, bad ones (not 2 or 3 fields, an empty one, no audio file) as issues.
    DataError: the filelist is missing, empty or not UTF-8."""
    rows, issues = [], []
    for number, line in read_lines(filelist, "filelist"):
        fields = [field.strip() for field in line.split("|")]
        if len(fields) not in (2, 3) or not all(fields):
            issues.append(malformed(filelist, number, f"expected 'path|text' or 'path|speaker|text', got {line!r}"))
            continue
        audio = root / fields[0]  # an absolute path stays itself
        issue = audio_issue(audio.stem, audio, filelist, number)
        if issue is not None:
            issues.append(issue)
            continue
        speaker = fields[1] if len(fields) == 3 else SINGLE_SPEAKER
        rows.append(Utterance(audio.stem, str(audio), fields[-1], speaker))
    return Part(rows, issues, str(filelist))


def read(root: Path, data: DataConfig) -> Found:
    """Both filelists of the ``data`` section (:func:`find`, :func:`scan`), or where it names none, those
    :func:`conventional` finds. DataError: ``training_files`` without ``validation_files`` (or none, and none found), a
    list missing, empty or not UTF-8."""
    found = conventional(root) if not data.training_files and not data.validation_files else None
    if found is not None:
        return Found(scan(found[0], root), scan(found[1], root), [])
    if not data.training_files or not data.validation_files:
        raise DataError("data.format=filelist needs data.training_files and data.validation_files: give both "
                        "filelists" if not data.training_files else
                        "data.training_files is set but data.validation_files is empty: give both filelists")
    return Found(scan(find(data.training_files, root, "training_files"), root),
                 scan(find(data.validation_files, root, "validation_files"), root), [])


def write_demo(output: Path, lines: list[Line], _: Path) -> None:
    """The demo corpus's index: VITS-style filelists ``filelists/train.txt`` and ``val.txt`` (the last
    :func:`~utils.data.corpora.demo.validating` lines), ``path|speaker|text``, paths relative to the corpus folder."""
    cut = len(lines) - validating(len(lines))
    for name, part in (("train.txt", lines[:cut]), ("val.txt", lines[cut:])):
        write_text(output / "filelists" / name, "".join(f"{ln.audio}|{ln.speaker.name}|{ln.text}\n" for ln in part))


DEMO = DemoLayout(22050, "{spk}_{n:04d}", "wavs/{spk}/{id}.wav", write_demo,
                  ("filelists/train.txt", "filelists/val.txt"), ("wavs/*/*.wav",),
                  shows="filelists/train.txt and val.txt, path|speaker|text, + wavs/", corpus="LJSpeech", validates=True)
"""Filelists of a wav folder per speaker, at LJSpeech's 22.05 kHz."""
