"""Hugging Face datasets saved as local parquet files (LibriTTS-R on the Hub: ``mythicinfinity/libritts_r``), read
with the ``datasets`` library: an ``Audio`` column (encoded bytes, decoded here with soundfile, never by
``datasets``), a transcript and a speaker column::

    libritts_r/data/train.clean.100-00000-of-00018.parquet    columns: audio, text_normalized, speaker_id, id, ...
    libritts_r/data/dev.clean-00000-of-00001.parquet           (validates; test.*: not read)

Every ``*.parquet`` below ``--dataset-path`` is read, split by its path's words (``dev``/``val``: validation,
``test``: not read). ``datasets`` keeps a memory-mapped Arrow copy of each file in its cache
(``HF_DATASETS_CACHE``), which the loader workers read rows from; nothing is fetched.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

import soundfile as sf

from utils.data import sources
from utils.data.corpora.common import Found, LineIssue, Part, repeated_id, text_issue
from utils.data.corpora.demo import DemoLayout, Line
from utils.data.corpora.libritts import DEMO_ID
from utils.data.corpora.manifests import apart
from utils.data.corpus import SINGLE_SPEAKER, BadClip, DataConfig, DataError, Utterance

TREE = "*.parquet of a Hugging Face dataset: audio (Audio), text_normalized, speaker_id"
TEXT = ("text_normalized", "normalized_text", "text")  # the first column present is the transcript
SPEAKER, LANGUAGE, ID = ("speaker_id", "speaker"), ("language", "lang"), ("id",)


def _files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.parquet"))


def matches(root: Path) -> bool:
    """Whether ``root`` holds a ``*.parquet`` file (at any depth)."""
    return next(root.rglob("*.parquet"), None) is not None


def columns(path: Path) -> tuple[str, Optional[str], list[str]]:
    """``(audio column, transcript column or None, every column)`` of a parquet file, from its schema alone
    (``utils.data.sources.table_columns``). DataError: not a parquet file, or no audio column."""
    audio, names = sources.table_columns(path)
    return audio, next((name for name in TEXT if name in names), None), names


def _column(table: Any, names: tuple[str, ...], default: Any) -> list:
    name = next((name for name in names if name in table.column_names), None)
    return table.column(name).to_pylist() if name is not None else [default] * table.num_rows


def _scan(path: Path, first: dict[str, str]) -> tuple[list[Utterance], list[LineIssue]]:
    audio, text, _ = columns(path)
    if text is None:
        raise DataError(f"{path} has no transcript column (one of {', '.join(TEXT)})")
    table = sources.table(path).data
    ids = [f"{path.stem}-{row}" if value is None else str(value) for row, value in enumerate(_column(table, ID, None))]
    rows, issues = [], []
    has_audio = table.column(audio).is_valid().to_pylist()
    for row, (utt_id, said, speaker, language, duration, good) in enumerate(zip(
            ids, _column(table, (text,), ""), _column(table, SPEAKER, SINGLE_SPEAKER),
            _column(table, LANGUAGE, ""), _column(table, ("duration",), None), has_audio)):
        source = f"{path}#row={row}"
        if utt_id in first:
            issues.append(repeated_id(utt_id, source, path, row, first[utt_id]))
        elif not (said or "").strip():
            issues.append(text_issue(utt_id, source, path, row))
        elif not good:
            issues.append(LineIssue(BadClip(utt_id, source, f"no audio (row {row})"),
                                    f"{path}: row {row} (utterance '{utt_id}') has no audio"))
        else:
            rows.append(Utterance(utt_id, source, said.strip(), str(speaker), str(language or ""),
                                  math.nan if duration is None else float(duration)))
        first.setdefault(utt_id, f"{path.name} row {row}")
    return rows, issues


def _part(files: list[Path], root: Path, first: dict[str, str]) -> Part:
    rows, issues = [], []
    for path in files:
        found = _scan(path, first)
        rows += found[0]
        issues += found[1]
    return Part(rows, issues, str(files[0] if len(files) == 1 else root))


def read(root: Path, data: DataConfig) -> Found:
    """Every row of the parquet files (each file's columns checked first, before any is read): its id (the ``id``
    column, else ``<file stem>-<row>``), audio ``FILE#row=N``, transcript, speaker (``speaker_id`` or ``speaker``,
    else :data:`SINGLE_SPEAKER`), language and ``duration`` where the columns are there. DataError: no parquet file,
    one unreadable, without an audio or a transcript column."""
    files = _files(root)
    for path in files:
        columns(path)
    train, val, notes = apart(files, root)
    if not train:
        raise DataError(f"{root}: no parquet file to train on")
    first: dict[str, str] = {}
    return Found(_part(train, root, first), _part(val, root, first) if val else None, notes)


def write_demo(output: Path, lines: list[Line], scratch: Path) -> None:
    """The demo corpus's index, holding its audio (the wavs in ``scratch``): a Hugging Face ``datasets`` parquet as
    LibriTTS-R's on the Hub (``clean/train.clean.100/0000.parquet``): columns ``audio`` (``Audio(sampling_rate=...)``,
    the wav's bytes and file name), ``text_normalized``, ``text_original``, ``speaker_id``, ``path``, ``chapter_id``,
    ``id`` (strings)."""
    from datasets import Audio, Dataset, Features, Value  # heavy (5 s): imported where it is used

    rate = sf.info(str(scratch / lines[0].audio)).samplerate
    values = {"audio": [{"bytes": (scratch / line.audio).read_bytes(), "path": line.audio} for line in lines],
              "text_normalized": [line.text for line in lines], "text_original": [line.text for line in lines],
              "speaker_id": [line.speaker.name for line in lines], "path": [line.audio for line in lines],
              "chapter_id": [line.speaker.chapter for line in lines], "id": [line.id for line in lines]}
    features = Features({name: Value("string") for name in values} | {
        "audio": {"bytes": Value("binary"), "path": Value("string")}})
    table = Dataset.from_dict(values, features=features).cast_column("audio", Audio(sampling_rate=rate))
    (output / "clean" / "train.clean.100").mkdir(parents=True, exist_ok=True)
    table.to_parquet(str(output / "clean" / "train.clean.100" / "0000.parquet"))


DEMO = DemoLayout(24000, DEMO_ID, "{id}.wav", write_demo, ("clean/train.clean.100/*.parquet",), needs="datasets",
                  shows="clean/train.clean.100/0000.parquet", corpus="LibriTTS", packed=True)
"""LibriTTS-R's parquet on the Hub, its audio 24 kHz wavs in the table."""
