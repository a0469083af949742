"""LJSpeech's layout (Ito & Johnson 2017), one speaker (:data:`~utils.data.corpus.SINGLE_SPEAKER`)::

    LJSpeech-1.1/metadata.csv       LJ001-0001|raw text|normalized text   (UTF-8, one utterance a line)
    LJSpeech-1.1/wavs/LJ001-0001.wav
"""

from __future__ import annotations

from pathlib import Path

from utils.data.corpora.common import Found, Part, audio_issue, malformed, read_lines, repeated_id, text_issue
from utils.data.corpora.demo import DemoLayout, Line, write_text
from utils.data.corpus import DataConfig, Utterance

TREE = "metadata.csv + wavs/<id>.wav"


def matches(root: Path) -> bool:
    """Whether ``root`` holds a ``metadata.csv``."""
    return (root / "metadata.csv").is_file()


def read(root: Path, data: DataConfig) -> Found:
    """The rows of ``root/metadata.csv`` (``id|raw text|normalized text``, the normalized text else the raw; audio
    ``wavs/<id>.wav``) in file order, good as utterances, bad (not 2 or 3 fields, an id empty or repeated, no
    transcript, no wav file) as issues; no validation split. DataError: ``metadata.csv`` missing, empty, not UTF-8."""
    metadata = root / "metadata.csv"
    rows, issues, first_line = [], [], {}
    for number, line in read_lines(metadata, "metadata file"):
        fields = line.split("|")
        if len(fields) not in (2, 3) or not fields[0].strip():
            issues.append(malformed(metadata, number, f"expected 'id|raw text|normalized text', got {line!r}"))
            continue
        utt_id = fields[0].strip()
        wav = root / "wavs" / f"{utt_id}.wav"
        text = fields[2].strip() if len(fields) == 3 and fields[2].strip() else fields[1].strip()
        if utt_id in first_line:
            issues.append(repeated_id(utt_id, str(wav), metadata, number, f"line {first_line[utt_id]}"))
            continue
        first_line[utt_id] = number
        issue = text_issue(utt_id, str(wav), metadata, number) if not text else audio_issue(utt_id, wav, metadata,
                                                                                             number)
        if issue is not None:
            issues.append(issue)
            continue
        rows.append(Utterance(utt_id, str(wav), text))
    return Found(Part(rows, issues, str(metadata)), None, [])


def write_demo(output: Path, lines: list[Line], _: Path) -> None:
    """The demo corpus's index: ``metadata.csv``, ``id|text|normalized text`` (the same text twice)."""
    write_text(output / "metadata.csv", "".join(f"{line.id}|{line.text}|{line.text}\n" for line in lines))


DEMO = DemoLayout(22050, "LJ_DEMO_{i:04d}", "wavs/{id}.wav", write_demo, ("metadata.csv",), ("wavs/LJ_DEMO_*.wav",),
                  shows="metadata.csv + wavs/", corpus="LJSpeech", single="metadata.csv names none")
"""LJSpeech-1.1's tree, one speaker, 22.05 kHz wavs."""
