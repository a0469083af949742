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

import json
import math
from pathlib import Path
from typing import Optional

from utils.data.corpora.common import (Found, Part, apart, audio_issue, malformed, named_files, read_lines, repeated_id,
                                      text_issue)
from utils.data.corpus import SINGLE_SPEAKER, DataConfig, DataError, Utterance

TREE = "*.json or *.jsonl manifests: audio_filepath, duration, text, speaker"
TEXT_KEYS = ("text_normalized", "normalized_text", "text")  # the first a line has is its transcript


def is_manifest(path: Path) -> bool:
    """Whether the first non-blank line of ``path`` is a JSON object with an ``audio_filepath``."""
    try:
        with open(path, encoding="utf-8-sig") as file:
            first = next((line for line in file if line.strip()), "")
        return isinstance(line := json.loads(first), dict) and "audio_filepath" in line
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False


def _manifests(root: Path) -> list[Path]:
    return [path for suffix in ("*.json", "*.jsonl") for path in root.glob(suffix) if is_manifest(path)]


def matches(root: Path) -> bool:
    """Whether ``root`` holds a NeMo manifest."""
    return bool(_manifests(root))


def _utterance(entry: dict, manifest: Path, number: int) -> Utterance:
    """The utterance of one manifest line (checked by :func:`_scan`)."""
    written = Path(entry["audio_filepath"])
    audio = manifest.parent / written  # an absolute path stays itself
    utt_id = written.stem if written.is_absolute() else "_".join(written.with_suffix("").parts)
    duration, offset = float(entry.get("duration", math.nan)), float(entry.get("offset") or 0.0)
    source = f"{audio}#t={offset},{offset + duration}" if offset else str(audio)
    speaker = entry.get("speaker", manifest.name.split("_manifest")[0] if "_manifest" in manifest.name else
                        SINGLE_SPEAKER)
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


def _scan(manifests: list[Path], first: dict[str, str]) -> Part:
    """The lines of ``manifests`` in order, good ones as utterances, bad ones as issues (``first``: where each id was
    first given, across every split)."""
    rows, issues = [], []
    for manifest in manifests:
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
            utt = _utterance(entry, manifest, number)
            if utt.id in first:
                issues.append(repeated_id(utt.id, utt.audio, manifest, number, first[utt.id]))
                continue
            first[utt.id] = f"{manifest.name} line {number}"
            audio = Path(utt.audio.split("#t=")[0])
            issue = text_issue(utt.id, utt.audio, manifest, number) if not utt.text else \
                audio_issue(utt.id, audio, manifest, number)
            if issue is not None:
                issues.append(issue)
                continue
            rows.append(utt)
    return Part(rows, issues, str(manifests[0] if len(manifests) == 1 else manifests[0].parent))


def read(root: Path, data: DataConfig) -> Found:
    """The manifests of ``data`` (see the module), each line an utterance (its id: the audio's path below the
    manifest's folder, without suffix, folders joined by ``_``; its speaker: the line's ``speaker``, else the
    manifest's name before ``_manifest`` as HiFi-TTS names them, else :data:`SINGLE_SPEAKER`). DataError: no
    manifest, one named and not found, unreadable or empty."""
    notes: list[str] = []
    if data.training_files:
        train = named_files(data.training_files, root, "training_files")
        val = named_files(data.validation_files, root, "validation_files") if data.validation_files else []
    else:
        train, val, notes = apart(_manifests(root), root)
    if not train:
        raise DataError(f"{root}: no NeMo training manifest (*.json or *.jsonl lines with an audio_filepath); name "
                        "them with data.training_files")
    first: dict[str, str] = {}
    return Found(_scan(train, first), _scan(val, first) if val else None, notes)
