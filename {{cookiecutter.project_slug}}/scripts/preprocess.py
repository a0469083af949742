"""Compute the log-mel of every utterance once and cache it for Tacotron2 training.

    python -m scripts.preprocess --config config.json [--dataset-path DIR] [--workers N] [--overwrite]

Writes ``<dataset_path>/<tacotron2.mel_cache_dir>/<id>.pt``, the ``(n_mels, frames)`` float32 of
:class:`utils.data.audio.MelSpectrogram` for every utterance of both splits, which the dataset loads instead of
decoding the wav: resumable (``--overwrite`` recomputes), atomic, on ``--workers`` processes. The audio settings go to
``<cache>/_audio_config.json``; a cache of others is refused. Unreadable wavs: reported, the others written, exit
status 1. The config's null settings take Tacotron2's recipe, as ``train.py --model tacotron2`` does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from multiprocessing import Pool
from pathlib import Path
from typing import Optional, Sequence

if not __package__:  # run by its path, not as python -m scripts.NAME: the project's modules would not import
    sys.exit(f"ERROR: run this tool from the project folder as: python -m scripts.{Path(__file__).stem} ...")

import torch
from tqdm import tqdm

from models import MODELS
from models.tacotron2.data import CACHE_SETTINGS_FILE, check_cache_settings, mel_cache_path
from parts import LEFT_OUT, PARTS, config_schemas
from utils.config import Config, ConfigError, load_config
from utils.data.audio import AudioConfig, MelSpectrogram
from utils.data.corpora import load_splits
from utils.data.corpus import DataError
from utils.data.sources import read_audio
from utils.framing import recorded_audio
from utils.training.recipe import apply_recipe

_worker_mel: Optional[MelSpectrogram] = None
_worker_rate: int = 0


def _init_worker(audio_cfg: AudioConfig, threads: Optional[int]) -> None:
    """Build the mel transform once per process (pool initializer)."""
    global _worker_mel, _worker_rate
    if threads is not None:
        torch.set_num_threads(threads)
    _worker_mel = MelSpectrogram(audio_cfg)
    _worker_rate = audio_cfg.sampling_rate


def _write_mel(job: tuple[str, str, str]) -> tuple[str, Optional[str]]:
    """Compute and atomically save one mel. Returns ``(id, None)`` or ``(id, error message)``."""
    utt_id, source, out_path = job
    out = Path(out_path)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with torch.no_grad():
            torch.save(_worker_mel(read_audio(source, _worker_rate)).contiguous(), tmp)
        os.replace(tmp, out)
    except (DataError, ValueError, OSError, RuntimeError) as err:
        tmp.unlink(missing_ok=True)
        return utt_id, f"{utt_id}: {err}"
    return utt_id, None


def _write_all(jobs: list[tuple[str, str, str]], cfg: Config, workers: int, progress: bool, cache_dir: Path,
               counts: dict[str, int]) -> list[str]:
    """Do ``jobs`` (``(id, wav path, mel path)``) on ``workers`` processes (in this one for one worker or job) with a
    tqdm bar, counting ``written`` and ``failed`` in ``counts``; returns the error lines."""
    errors, pool = [], None
    bar = tqdm(total=len(jobs), unit="utt", desc=f"mels -> {cache_dir}", disable=not progress)
    if workers == 1 or len(jobs) <= 1:
        _init_worker(cfg.audio, None)
        results = map(_write_mel, jobs)
    else:
        pool = Pool(workers, initializer=_init_worker, initargs=(cfg.audio, 1))
        results = pool.imap_unordered(_write_mel, jobs, chunksize=4)
    try:
        for _, error in results:
            counts["written" if error is None else "failed"] += 1
            if error is not None:
                errors.append(error)
            bar.update()
    finally:
        bar.close()
        if pool is not None:
            pool.close()
            pool.join()
    return errors


def preprocess(cfg: Config, workers: Optional[int] = None, overwrite: bool = False,
               progress: bool = True) -> dict[str, int]:
    """Fill the mel cache of ``cfg`` (see the module docstring) on ``workers`` processes (``None``: every core; 1: in
    this process). Returns ``{"total": n, "written": n, "skipped": n, "failed": n}``. Raises ConfigError:
    ``tacotron2.mel_cache_dir`` is empty or ``workers < 1``; DataError: the corpus cannot be listed, the cache holds
    mels made with other audio settings and ``overwrite`` is false, or the cache folder cannot be written (a read-only
    dataset folder)."""
    cache_dir = mel_cache_path(cfg.data.dataset_path, cfg.tacotron2.mel_cache_dir)
    if cache_dir is None:
        raise ConfigError("tacotron2.mel_cache_dir is empty: set the folder (inside dataset_path) to cache mels in")
    if workers is None:
        workers = os.cpu_count() or 1
    if workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    train_utts, val_utts = load_splits(cfg.data)
    utterances = {utt.id: utt for utt in list(train_utts) + list(val_utts)}
    if not overwrite:
        check_cache_settings(cache_dir, cfg.audio)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        (cache_dir / CACHE_SETTINGS_FILE).write_text(json.dumps(recorded_audio(cfg.audio.model_dump()), indent=2)
                                                     + "\n")
    except OSError as err:  # a read-only dataset folder, a file in the cache folder's place, a full disk
        raise DataError(f"cannot write the mel cache folder {cache_dir}: {err.strerror or err} (set "
                        "tacotron2.mel_cache_dir to a writable folder: an absolute path is taken as it is)") from None
    jobs = [(utt.id, utt.audio, str(cache_dir / f"{utt.id}.pt")) for utt in utterances.values()
            if overwrite or not (cache_dir / f"{utt.id}.pt").is_file()]
    counts = {"total": len(utterances), "written": 0, "skipped": len(utterances) - len(jobs), "failed": 0}
    for error in _write_all(jobs, cfg, workers, progress, cache_dir, counts):
        print(f"ERROR: {error}", file=sys.stderr)
    return counts


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Fill the mel cache of the config the command line names. Returns the exit status."""
    parser = argparse.ArgumentParser(description="Cache the log-mel of every utterance for Tacotron2 training.")
    parser.add_argument("--config", required=True, help="config.json (audio and data sections are used)")
    parser.add_argument("--dataset-path", help="override data.dataset_path")
    parser.add_argument("--workers", type=int, default=None, help="processes (default: all CPU cores)")
    parser.add_argument("--overwrite", action="store_true", help="recompute mels that are already cached")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--tiny", action="store_true", help="the tiny block's audio settings: mels for --tiny runs")
    args = parser.parse_args(argv)
    overrides = [f"data.dataset_path={args.dataset_path}"] if args.dataset_path else []
    try:
        cfg = load_config(args.config, config_schemas(), tiny=args.tiny, overrides=overrides, left_out=LEFT_OUT)
        apply_recipe(MODELS["tacotron2"], cfg, PARTS.data_framing(cfg.data))
        counts = preprocess(cfg, args.workers, args.overwrite, progress=not args.no_progress)
    except (ConfigError, DataError) as err:
        print(f"ERROR: {err}", file=sys.stderr)
        return 1
    print(f"{counts['total']} utterances: {counts['written']} mels written, {counts['skipped']} already cached, "
          f"{counts['failed']} failed")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
