"""An utterance's audio, whatever its layout (``Utterance.audio``): a file's path, ``PATH#t=START,END`` (seconds of
it, W3C's media-fragment form: a span of a recording), or ``FILE#row=N`` (the encoded bytes of a row of a Hugging
Face dataset's parquet file: :func:`row_bytes`). Every one is decoded by soundfile
(:func:`utils.data.audio.read_clip`); lengths come from durations and headers, never from decoded audio
(:func:`clip_samples`)."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np
import soundfile as sf
import torch

from utils.data.audio import check_wav_not_truncated, read_clip, resampled_length
from utils.data.corpus import Corpus, DataError

_FRAGMENT = re.compile(r"row=(\d+)|t=([0-9.eE+-]+),([0-9.eE+-]+)")


def parse(source: str) -> tuple[Path, Optional[int], Optional[tuple[float, float]]]:
    """``(path, parquet row or None, (start, end) seconds or None)`` of an audio source; a ``#`` that starts no
    ``row=`` or ``t=`` fragment is part of the file's name."""
    head, hash_, fragment = source.rpartition("#")
    match = _FRAGMENT.fullmatch(fragment) if hash_ else None
    if match is None:
        return Path(source), None, None
    if match[1] is not None:
        return Path(head), int(match[1]), None
    return Path(head), None, (float(match[2]), float(match[3]))


@functools.lru_cache(maxsize=64)
def table_columns(path: Path) -> tuple[str, list[str]]:
    """``(audio column, every column)`` of a parquet file, from its schema alone: the column its Hugging Face features
    call ``Audio``, else one named ``audio``. DataError: not a parquet file, or no audio column."""
    import pyarrow  # only the tables' (0.5 s): imported where it is used
    import pyarrow.parquet as pq
    try:
        schema = pq.read_schema(path)
    except (OSError, pyarrow.ArrowException) as err:
        raise DataError(f"cannot read the parquet file {path}: {err}") from None
    try:
        features = json.loads((schema.metadata or {}).get(b"huggingface", b"{}")).get("info", {}).get("features", {})
    except (json.JSONDecodeError, AttributeError):
        features = {}
    names = list(schema.names)
    audio = next((name for name, feature in features.items() if isinstance(feature, dict)
                  and feature.get("_type") == "Audio"), "audio" if "audio" in names else None)
    if audio is None:
        raise DataError(f"{path} has no audio column (a Hugging Face Audio feature, or a column named 'audio'); its "
                        f"columns: {', '.join(names)}")
    return audio, names


@functools.lru_cache(maxsize=64)
def table(path: Path) -> Any:
    """The ``datasets.Dataset`` of one parquet file (its memory-mapped Arrow copy, made once in the cache), once per
    process; forked loader workers inherit it."""
    import datasets  # heavy (4 s): imported where it is used

    datasets.disable_progress_bars()
    return datasets.Dataset.from_parquet(str(path))


def row_bytes(path: Path, row: int) -> bytes:
    """The encoded audio of row ``row`` of the parquet file ``path`` (its column: :func:`table_columns`). DataError:
    the row holds no audio bytes."""
    column, _ = table_columns(path)
    value = table(path).data.column(column)[row].as_py()
    if not isinstance(value, dict) or not value.get("bytes"):
        raise DataError(f"{path}#row={row}: no audio bytes in column '{column}' (a path alone is not read)")
    return value["bytes"]


@contextlib.contextmanager
def opened(source: str) -> Iterator[tuple[sf.SoundFile, int]]:
    """``(clip, frames)``: the sound of ``source`` open at its first sample, and how many samples it has (at the
    file's rate). Raises DataError: a file missing or a folder, a wav file cut short, a parquet row without audio;
    ``soundfile.LibsndfileError``, ``RuntimeError`` or ``OSError``: unreadable."""
    path, row, span = parse(source)
    if row is None and not path.is_file():
        raise DataError("is a folder, not a wav file" if path.is_dir() else "wav not found")
    if row is None:
        check_wav_not_truncated(path)
    with sf.SoundFile(io.BytesIO(row_bytes(path, row)) if row is not None else str(path)) as clip:
        frames = clip.frames
        if span is not None:
            first = round(span[0] * clip.samplerate)
            frames = max(0, min(clip.frames, round(span[1] * clip.samplerate)) - first)
            clip.seek(min(first, clip.frames))
        yield clip, frames


def read_audio(source: str, sampling_rate: int) -> torch.Tensor:
    """The sound of ``source`` as :func:`utils.data.audio.load_wav` reads a file: float32 ``(T,)`` in [-1, 1] at
    ``sampling_rate`` Hz, channels averaged, another rate resampled. Raises DataError naming ``source``: missing,
    unreadable, cut short, empty or non-finite."""
    try:
        with opened(source) as (clip, frames):
            return read_clip(clip, frames, sampling_rate, source)
    except (sf.LibsndfileError, RuntimeError) as err:
        raise DataError(f"cannot read audio file {source}: {err}") from None
    except OSError as err:  # no permission, an I/O error of the disk or network file system
        raise DataError(f"cannot read audio file {source}: {err.strerror or err}") from None
    except DataError as err:
        said = str(err)
        raise DataError(said if source in said else f"{source}: {said}") from None


def header(source: str) -> tuple[int, int]:
    """``(frames, rate)`` of ``source`` from its header (a span's frames: those :func:`read_audio` reads). Raises what
    :func:`opened` raises."""
    with opened(source) as (clip, frames):
        return frames, clip.samplerate


def _samples(corpus: Corpus, index: int, sampling_rate: int) -> int:
    utt = corpus[index]
    try:
        frames, rate = header(utt.audio)
    except (DataError, sf.LibsndfileError, RuntimeError, OSError) as err:
        raise DataError(f"cannot read the header of utterance '{utt.id}': {utt.audio}: {err}") from None
    return resampled_length(frames, rate, sampling_rate)


def clip_samples(corpus: Corpus, sampling_rate: int, workers: Optional[int] = None) -> np.ndarray:
    """int64 ``(N,)``: each clip's samples at ``sampling_rate`` Hz, from metadata alone: the layout's duration where it
    gives one (``round(duration * sampling_rate)``), else the header (the count :func:`read_audio` gives), headers
    read in ``workers`` threads (default 4 per core, at most 32). Mel frames: ``MelSpectrogram.num_frames`` of these
    (it takes arrays). Raises DataError naming the first utterance whose header cannot be read."""
    samples = np.rint(np.nan_to_num(corpus.duration) * sampling_rate).astype(np.int64)
    todo = np.flatnonzero(np.isnan(corpus.duration)).tolist()
    if todo:
        with ThreadPoolExecutor(max_workers=workers or min(32, 4 * (os.cpu_count() or 1))) as pool:
            samples[todo] = list(pool.map(lambda i: _samples(corpus, i, sampling_rate), todo))
    return samples
