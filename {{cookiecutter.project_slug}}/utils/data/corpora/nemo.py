"""NeMo manifests (HiFi-TTS: Bakhturina et al. 2021; NeMo's TTS recipes): JSON lines, one utterance each, its audio's
path relative to the manifest's folder (or absolute), its duration (seconds), transcript and speaker::

    hi_fi_tts_v0/92_manifest_clean_train.json   {"audio_filepath": "audio/92_clean/10425/x_0001.flac",
    hi_fi_tts_v0/92_manifest_clean_dev.json      "duration": 5.26, "text": "...", "text_normalized": "..."}
    hi_fi_tts_v0/audio/92_clean/10425/x_0001.flac

The manifests are ``data.training_files`` and ``data.validation_files`` (a file or a pattern such as
``*_train.json``, in ``data.dataset_path``), else the root's ``*.json``/``*.jsonl`` that hold such lines, split by
their names (``dev``/``val``: validation, ``test``: not read, the others train).
"""

from __future__ import annotations

import itertools
import json
import math
import os
from pathlib import Path
from typing import Optional

import numpy as np
import soundfile as sf

from utils.data.corpora.common import (
    Found,
    Part,
    audio_issue,
    malformed,
    read_lines,
    repeated_id,
    text_issue,
)
from utils.data.corpora.demo import DemoLayout, Line, validating, write_text
from utils.data.corpora.manifests import manifests_of
from utils.data.corpus import SINGLE_SPEAKER, Corpus, DataConfig, Strings, Utterance

TREE = "*.json or *.jsonl manifests: audio_filepath, duration, text, speaker"
TEXT_KEYS = ("text_normalized", "normalized_text", "text")  # the first a line has is its transcript


def takes_filelist(path: Path) -> bool:
    """Whether ``path`` is a NeMo manifest (its first non-blank line a JSON object with an ``audio_filepath``): a
    ``data.training_files`` that ``auto`` reads as one (``utils.data.corpora.detect``), not as a filelist."""
    try:
        with open(path, encoding="utf-8-sig") as file:
            first = next((line for line in file if line.strip()), "")
        return isinstance(line := json.loads(first), dict) and "audio_filepath" in line
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False


def _manifests(root: Path) -> list[Path]:
    return [path for suffix in ("*.json", "*.jsonl") for path in root.glob(suffix) if takes_filelist(path)]


def matches(root: Path) -> bool:
    """Whether ``root`` holds a NeMo manifest."""
    return bool(_manifests(root))


def _utterance(entry: dict, folder: str, manifest: str) -> Utterance:
    """The utterance of one line (checked by :func:`_problem`) of the manifest named ``manifest`` in ``folder``
    (strings, not paths: a million lines take seconds, not a minute)."""
    written = os.path.normpath(entry["audio_filepath"])
    audio = os.path.join(folder, written)  # an absolute path stays itself
    utt_id = os.path.splitext(os.path.basename(written) if os.path.isabs(written) else written)[0].replace(os.sep, "_")
    duration, offset = float(entry.get("duration", math.nan)), float(entry.get("offset") or 0.0)
    source = f"{audio}#t={offset},{offset + duration}" if offset else audio
    speaker = entry.get("speaker", manifest.split("_manifest")[0] if "_manifest" in manifest else SINGLE_SPEAKER)
    text = next((str(entry[key]).strip() for key in TEXT_KEYS if entry.get(key) is not None), "")
    return Utterance(utt_id, source, text, str(speaker), str(entry.get("language", entry.get("lang", ""))), duration)


def _problem(entry: object) -> Optional[str]:
    if not isinstance(entry, dict) or not isinstance(entry.get("audio_filepath"), str):
        return "expected a JSON object with an 'audio_filepath'"
    if all(entry.get(key) is None for key in TEXT_KEYS):
        return f"expected one of {', '.join(map(repr, TEXT_KEYS))}"
    if not all(isinstance(entry.get(key, 0), (int, float)) and entry.get(key, 0) >= 0 for key in ("duration", "offset")):
        return "expected a 'duration' (and 'offset') of seconds >= 0"
    return None


# A path that os.path.normpath would change, an absolute one, or a file name that begins with a dot: read line by line
UNPLAIN = r"^/|(^|/)\.|//|/$"


def _strings(array) -> Strings:
    """An Arrow string array's bytes and offsets as :class:`Strings` (its bytes viewed, not copied)."""
    import pyarrow
    array = array.combine_chunks() if isinstance(array, pyarrow.ChunkedArray) else array
    _, offsets, data = array.buffers()
    packed, wide = Strings(), pyarrow.types.is_large_string(array.type)
    bounds = np.frombuffer(offsets, dtype=np.int64 if wide else np.int32)[array.offset:array.offset + len(array) + 1]
    bounds = bounds.astype(np.int64)
    packed.data = np.frombuffer(data, dtype=np.uint8)[bounds[0]:bounds[-1]] if data is not None else packed.data
    packed.offsets = bounds - bounds[0]
    return packed


def _column(table, names: tuple[str, ...], kinds: tuple[str, ...], default: object, nulls: bool = False):
    """The first of ``names`` that ``table`` has, strings where ``kinds`` takes them, else ``default`` repeated.
    ValueError: a null (unless ``nulls``), or a type not in ``kinds`` (``string``, ``integer``, ``floating``)."""
    import pyarrow
    import pyarrow.types as types
    name = next((name for name in names if name in table.column_names), None)
    if name is None:
        return pyarrow.repeat(default, table.num_rows)
    column = table.column(name)
    if (column.null_count and not nulls) or not any(getattr(types, f"is_{kind}")(column.type) for kind in kinds):
        raise ValueError(name)
    return column.cast(pyarrow.string()) if "string" in kinds else column


def _all_files(audio) -> bool:
    """Whether every path of the Arrow string array ``audio`` (no ``/`` at the end) is a file, each folder listed
    once."""
    import pyarrow
    import pyarrow.compute as pc
    listed: list[str] = []
    for folder in pc.unique(pc.replace_substring_regex(audio, "/[^/]*$", "")).to_pylist():
        try:
            with os.scandir(folder or "/") as entries:
                listed += [entry.path for entry in entries if entry.is_file()]
        except OSError:
            return False
    return pc.all(pc.is_in(audio, value_set=pyarrow.array(listed, pyarrow.string()))).as_py()


def _table(manifest: Path, first: dict[str, str]) -> Optional[Corpus]:
    """The utterances of a manifest read at once by Arrow's JSON reader and its compute functions (a million lines in
    seconds, against a minute line by line); None where any line is not plainly good (not JSON or not one per line, a
    null or a value of another type, an empty transcript, a negative duration, an offset, a
    path :data:`UNPLAIN`, an id given before, missing audio): :func:`_scan` then reads it line by line and names it."""
    import pyarrow
    import pyarrow.compute as pc
    import pyarrow.json  # only this layout's (0.5 s): imported where it is used
    try:
        data = manifest.read_bytes()
        lines = data.count(b"\n") + (not data.endswith(b"\n"))
        table = pyarrow.json.read_json(pyarrow.BufferReader(data))
        del data
        paths = _column(table, ("audio_filepath",), ("string",), None)
        given = [key for key in TEXT_KEYS if key in table.column_names]  # the first a line has is its transcript
        if not given:
            return None
        text = pc.utf8_trim_whitespace(pc.coalesce(*(_column(table, (key,), ("string",), None, True) for key in given)))
        duration = _column(table, ("duration",), ("integer", "floating"), math.nan).cast(pyarrow.float64())
        speaker = _column(table, ("speaker",), ("string", "integer"),
                          manifest.name.split("_manifest")[0] if "_manifest" in manifest.name else SINGLE_SPEAKER)
        language = _column(table, ("language", "lang"), ("string",), "")
    except (pyarrow.ArrowException, OSError, ValueError):
        return None
    if table.num_rows != lines or "offset" in table.column_names or \
            text.null_count or pc.any(pc.less(duration, 0)).as_py() or pc.min(pc.utf8_length(text)).as_py() == 0 or pc.any(pc.match_substring_regex(paths, UNPLAIN)).as_py():
        return None
    ids = pc.replace_substring(pc.replace_substring_regex(paths, r"\.[^./]*$", ""), os.sep, "_")
    # the folder repeated, not a scalar: Arrow broadcasts a scalar string ten times slower
    audio = pc.binary_join_element_wise(pyarrow.repeat(str(manifest.parent).rstrip(os.sep), len(paths)), paths, os.sep)
    listed = ids.to_pylist()
    if pc.count_distinct(ids).as_py() < len(listed) or not first.keys().isdisjoint(listed) or not _all_files(audio):
        return None
    first.update(zip(listed, itertools.repeat(manifest.name)))  # a line each would take seconds
    return Corpus(*map(_strings, (ids, audio, text, speaker, language)), duration.to_numpy())


def _scan(manifests: list[Path], first: dict[str, str]) -> Part:
    """The lines of ``manifests`` in order, good ones as utterances, bad ones as issues (``first``: where each id was
    first given, across every split: a manifest's name and line, its name alone where it was read at once); a
    manifest whose lines are all good is read at once (:func:`_table`)."""
    tables, issues = [], []
    for manifest in manifests:
        if (table := _table(manifest, first)) is not None:
            tables.append(table)
            continue
        rows = []
        for number, line in read_lines(manifest, "NeMo manifest"):
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as err:
                entry, problem = None, f"not JSON ({err.msg})"
            else:
                problem = _problem(entry)
            if problem is not None:
                issues.append(malformed(manifest, number, f"{problem}, got {line[:200]!r}"))
                continue
            utt = _utterance(entry, str(manifest.parent), manifest.name)
            if utt.id in first:
                issues.append(repeated_id(utt.id, utt.audio, manifest, number, first[utt.id]))
                continue
            first[utt.id] = f"{manifest.name} line {number}"
            audio = utt.audio.split("#t=")[0]
            if not utt.text or not os.path.isfile(audio):
                issues.append(text_issue(utt.id, utt.audio, manifest, number) if not utt.text else
                              audio_issue(utt.id, Path(audio), manifest, number))
                continue
            rows.append(utt)
        tables.append(Corpus.of(rows))
    return Part(Corpus.join(tables), issues, str(manifests[0] if len(manifests) == 1 else manifests[0].parent))


def read(root: Path, data: DataConfig) -> Found:
    """The manifests of ``data`` (see the module), each line an utterance (its id: the audio's path below the
    manifest's folder, without suffix, folders joined by ``_``; its speaker: the line's ``speaker``, else the
    manifest's name before ``_manifest`` as HiFi-TTS names them, else :data:`SINGLE_SPEAKER`). DataError: no
    manifest, one named and not found, unreadable or empty."""
    train, val, notes = manifests_of(data, root, _manifests, "no NeMo training manifest (*.json or *.jsonl lines with an audio_filepath)")
    first: dict[str, str] = {}
    return Found(_scan(train, first), _scan(val, first) if val else None, notes)


def write_demo(output: Path, lines: list[Line], _: Path) -> None:
    """The demo corpus's index: HiFi-TTS's manifests, a speaker's split each (``<spk>_manifest_clean_train.json``,
    ``..._dev.json``: the last :func:`~utils.data.corpora.demo.validating` lines), one JSON object a line:
    ``audio_filepath`` (relative to the corpus folder), ``duration`` (seconds), ``text`` and ``text_normalized``, and
    the ``speaker`` NeMo's multi-speaker recipes add (the reader's id, an integer)."""
    cut = len(lines) - validating(len(lines))
    manifests: dict[str, list[str]] = {}
    for number, line in enumerate(lines):
        name = f"{line.speaker.name}_manifest_clean_{'train' if number < cut else 'dev'}.json"
        manifests.setdefault(name, []).append(json.dumps({
            "audio_filepath": line.audio, "duration": sf.info(str(output / line.audio)).duration, "text": line.text,
            "text_normalized": line.text, "speaker": int(line.speaker.name)}) + "\n")
    for name, rows in manifests.items():
        write_text(output / name, "".join(rows))


DEMO = DemoLayout(44100, "{spk}_{n:04d}", "audio/{spk}_clean/{chapter}/{id}.flac", write_demo,
                  ("*_manifest_clean_*.json",), ("audio/*/*/*.flac",),
                  shows="<speaker>_manifest_clean_train.json and _dev.json + audio/", corpus="HiFi-TTS", validates=True)
"""HiFi-TTS's tree, NeMo manifests, 44.1 kHz FLAC."""
