"""VCTK 0.92 (Yamagishi et al. 2019; 110 speakers, 48 kHz FLAC), the microphone chosen by ``data.vctk_mic``::

    VCTK-Corpus-0.92/speaker-info.txt
    VCTK-Corpus-0.92/txt/p225/p225_001.txt                          (one transcript a file)
    VCTK-Corpus-0.92/wav48_silence_trimmed/p225/p225_001_mic1.flac  (and _mic2.flac)

p315 ships without transcripts: a speaker whose audio has no ``txt/`` folder is left out, and said so.
"""

from __future__ import annotations

from pathlib import Path

import soundfile as sf

from utils.data.corpora.common import Found, LineIssue, Part, audio_issue, text_issue
from utils.data.corpora.demo import DemoLayout, Line, write_audio, write_text
from utils.data.corpus import DataConfig, DataError, Utterance

TREE = "txt/<speaker>/<id>.txt + wav48_silence_trimmed/<speaker>/<id>_mic1.flac"
AUDIO = "wav48_silence_trimmed"


def matches(root: Path) -> bool:
    """Whether ``root`` holds ``txt/`` and ``wav48_silence_trimmed/`` folders."""
    return (root / "txt").is_dir() and (root / AUDIO).is_dir()


def _transcript(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig").strip()
    except (UnicodeDecodeError, OSError) as err:
        raise DataError(f"cannot read the transcript {path}: {err}") from None


def read(root: Path, data: DataConfig) -> Found:
    """Every transcript ``txt/<speaker>/<id>.txt`` (speakers, then ids, sorted) with its audio
    ``wav48_silence_trimmed/<speaker>/<id>_<data.vctk_mic>.flac``; a transcript without audio, or an empty one, is an
    issue; no validation split. DataError: a speaker's ``txt/`` folder with no transcript, one unreadable."""
    rows: list[Utterance] = []
    issues: list[LineIssue] = []
    speakers = sorted(folder for folder in (root / "txt").iterdir() if folder.is_dir())
    for folder in speakers:
        texts = sorted(folder.glob("*.txt"))
        if not texts:
            raise DataError(f"VCTK speaker folder {folder} holds no transcript (<id>.txt); remove the folder, or "
                            "give its speaker's transcripts")
        for path in texts:
            audio = root / AUDIO / folder.name / f"{path.stem}_{data.vctk_mic}.flac"
            text = _transcript(path)
            issue = audio_issue(path.stem, audio, path) if text else text_issue(path.stem, str(audio), path)
            if issue is not None:
                issues.append(issue)
                continue
            rows.append(Utterance(path.stem, str(audio), text, folder.name))
    named = {folder.name for folder in speakers}
    untold = sorted(folder.name for folder in (root / AUDIO).iterdir() if folder.is_dir() and folder.name not in named)
    notes = [f"VCTK: not read: the audio of {len(untold)} speaker(s) without transcripts ({', '.join(untold)}: "
             "VCTK 0.92 ships p315 so)"] if untold else []
    return Found(Part(rows, issues, str(root / "txt")), None, notes)


def write_demo(output: Path, lines: list[Line], _: Path) -> None:
    """The demo corpus's index: ``txt/<spk>/<id>.txt``, a second microphone (``_mic2.flac``: mic1 at half the
    amplitude, so a test can tell which was read) and ``speaker-info.txt``."""
    for line in lines:
        write_text(output / "txt" / line.speaker.name / f"{line.id}.txt", line.text + "\n")
        mic1 = output / line.audio
        audio, rate = sf.read(str(mic1), dtype="float32")
        write_audio(mic1.with_name(f"{line.id}_mic2.flac"), 0.5 * audio, rate)
    speakers = dict.fromkeys(line.speaker for line in lines)
    write_text(output / "speaker-info.txt", "ID  AGE  GENDER  ACCENTS  REGION COMMENTS \n" + "".join(
        f"{s.name}  23  {s.gender}    {s.accent}  Demo  ({s.voice})\n" for s in speakers))


DEMO = DemoLayout(48000, "{spk}_{n:03d}", AUDIO + "/{spk}/{id}_mic1.flac", write_demo, ("speaker-info.txt",),
                  ("txt/*/*.txt", AUDIO + "/*/*.flac"), shows="speaker-info.txt + txt/ + wav48_silence_trimmed/",
                  corpus="VCTK", speakers=tuple((f"p{225 + k}", "") for k in range(12)))
"""VCTK 0.92's tree, its speakers ``p225``, ``p226``, ..., 48 kHz FLAC."""
