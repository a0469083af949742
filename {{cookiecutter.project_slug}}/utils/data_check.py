"""The corpus check ``train.py`` runs before training: every clip readable, whole, long enough, with a transcript.

A bad clip found at step 30 000 costs a crashed run (and the same crash again after every resume); found at
start-up it costs a line. :func:`check_corpus` reads every clip's header (never its samples) in parallel
threads and finds:

* clips whose header cannot be read (not a sound file, no permission);
* truncated wavs: a ``data`` chunk that promises more bytes than the file holds (an interrupted copy);
* clips shorter than ``min_samples`` at the training sampling rate (too short for one STFT window);
* transcripts with no letter or digit (an emoji-only or empty row), and whatever the model's own check refuses
  (``ModelSpec.check_text``: a text-to-speech model refuses a transcript with no symbol of its table).

Headers are cached (:func:`default_cache_file`: outside the corpus and the run's output folder) by path,
size and modification time, so a second run over a large corpus reads only what changed.
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, NamedTuple, Optional, Sequence

import soundfile as sf
from tqdm import tqdm

from utils.data_utils import DataError, Utterance, check_wav_not_truncated


class BadClip(NamedTuple):
    """One utterance the check refused: its id, its wav, and why."""

    id: str
    path: str
    reason: str


def _header(path: Path) -> dict:
    """``{"frames", "rate"}`` of a sound file, or ``{"error": ...}`` (what :func:`check_corpus` caches)."""
    try:
        check_wav_not_truncated(path)
        info = sf.info(str(path))
    except DataError as err:  # "truncated wav file: PATH (data chunk declares ...)": the path is named apart
        return {"error": str(err).replace(f": {path}", "")}
    except (sf.LibsndfileError, RuntimeError, OSError) as err:
        return {"error": f"unreadable header ({str(err).splitlines()[0] if str(err) else type(err).__name__})"}
    return {"frames": info.frames, "rate": info.samplerate}


def _stat_key(path: Path) -> Optional[str]:
    try:
        stat = path.stat()
    except OSError:
        return None
    return f"{stat.st_size}:{stat.st_mtime_ns}"


def default_cache_file(dataset_path: str | Path) -> Path:
    """``$XDG_CACHE_HOME/clip_headers/<hash of the corpus's absolute path>.json`` (``~/.cache`` by default)."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = hashlib.sha1(str(Path(dataset_path).resolve()).encode()).hexdigest()[:16]
    return root / "clip_headers" / f"{digest}.json"


def check_corpus(utterances: Sequence[Utterance], sampling_rate: int, min_samples: int,
                 text_check: Optional[Callable[[str], Optional[str]]] = None, cache_file: Optional[Path] = None,
                 workers: Optional[int] = None, progress: bool = False) -> list[BadClip]:
    """Every clip of ``utterances`` that cannot be trained on, with the reason, in corpus order.

    Args:
        utterances: from :func:`utils.data_utils.load_splits` (both splits).
        sampling_rate: the training rate in Hz (a clip at another rate is resampled: its length is converted).
        min_samples: the fewest samples a clip may have at ``sampling_rate``.
        text_check: the model's own transcript check: ``text -> reason`` or ``None`` when the text is fine.
        cache_file: where headers are cached (JSON; read if present, rewritten; a cache that cannot be
            written is left unwritten); ``None``: no cache.
        workers: header-reading threads (default: 4 per CPU core, at most 32).
        progress: show a progress bar.

    Returns:
        the bad clips; empty when all are fine.
    """
    cache: dict = {}
    if cache_file is not None and cache_file.is_file():
        try:
            cache = json.loads(cache_file.read_text())
        except (OSError, json.JSONDecodeError):  # a damaged cache is rebuilt, never trusted
            cache = {}
    keys = {utt.id: _stat_key(utt.wav_path) for utt in utterances}
    todo = [utt for utt in utterances if keys[utt.id] is None or cache.get(str(utt.wav_path), {}).get("key")
            != keys[utt.id]]
    threads = workers or min(32, 4 * (os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=threads) as pool:
        headers = pool.map(_header, [utt.wav_path for utt in todo])
        for utt, header in tqdm(zip(todo, headers), total=len(todo), desc="checking clips", unit="clip",
                                disable=not progress or len(todo) < 1000):
            cache[str(utt.wav_path)] = {"key": keys[utt.id], **header}
    if cache_file is not None and todo:
        tmp = cache_file.with_name(f".{cache_file.name}.tmp{os.getpid()}")
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(cache))
            os.replace(tmp, cache_file)
        except OSError:  # a read-only home: the check still ran, the next run reads the headers again
            tmp.unlink(missing_ok=True)

    bad = []
    for utt in utterances:
        header = cache[str(utt.wav_path)]
        reason = header.get("error")
        if reason is None:
            samples = header["frames"] * sampling_rate // header["rate"]
            if samples < min_samples:
                reason = (f"too short: {samples} samples at {sampling_rate} Hz, fewer than {min_samples} (one STFT "
                          "window)")
        if reason is None and not any(ch.isalnum() for ch in utt.text):
            reason = f"transcript {utt.text!r} has no letter or digit"
        if reason is None and text_check is not None:
            reason = text_check(utt.text)
        if reason is not None:
            bad.append(BadClip(utt.id, str(utt.wav_path), reason))
    return bad


def describe(bad: Sequence[BadClip], shown: int = 20) -> str:
    """One line naming the first ``shown`` bad clips and how many there are: ``'SYN-0003' (path): reason; ...``."""
    named = "; ".join(f"'{clip.id}' ({clip.path}): {clip.reason}" for clip in bad[:shown])
    more = f"; and {len(bad) - shown} more" if len(bad) > shown else ""
    return f"{len(bad)} bad clip(s): {named}{more}"
