"""The rows of the data benchmarks, ``--loader``, ``--padding``, ``--plan``, ``--plan-corpus`` and ``--sources`` of
``python -m scripts.benchmark`` (its docstring says what each holds; ``python -m scripts.benchmark_data`` runs them alone)."""

from __future__ import annotations

import argparse
import itertools
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from distributed import DistInfo
from model import ModelSpec
from models import MODELS
from parts import PARTS
from scripts.benchmark_step import (BenchmarkError, make_train_step, median_step_time, progress_bar, release, skip_note,
                                    synchronize, timed_call)
from train import load_run_config
from utils.config import Config
from utils.data.audio import MelSpectrogram
from utils.data.corpora import load_splits
from utils.data.loader import batch_stream, epoch_order, make_loader, to_device
from utils.data.samplers import FrameBudgetSampler, LengthBucketSampler, padding_fraction, random_batches
from utils.data.sources import clip_samples
from utils.train_state import TrainState
from utils.training.setup import build_loaders, checked_corpus, model_datasets


def run_config(args: argparse.Namespace, name: str, tiny: bool, extra: tuple[str, ...] = ()) -> Config:
    """``train.py``'s config for model ``name`` (``train.load_run_config``): ``--config``, ``--set``, ``extra``,
    ``--dataset-path``; the tiny block with ``tiny``."""
    return load_run_config(argparse.Namespace(config=args.config, model=name, tiny=tiny, set=[*args.set, *extra],
                                              dataset_path=args.dataset_path, max_steps=None))


def loader_rows(args: argparse.Namespace, device: torch.device, models: list[str],
                emit: Callable[[dict], None]) -> list[dict]:
    """Loader throughput rows for ``models``, each passed to ``emit``: the train step on a real batch
    (``train_<model>``), then every ``--workers`` count; a dataset with a filled mel cache is timed without and with it.
    Raises BenchmarkError: a dataset too small for one batch of the configured batch size."""
    rows = []
    for name in models:
        spec = MODELS[name]
        train_set, _ = model_datasets(spec, run_config(args, name, args.tiny, ("data.num_workers=0",)), PARTS.run.datasets)
        rows.append(step_on_real_batch(spec, run_config(args, name, args.tiny, ("data.num_workers=0",)), train_set,
                                       args, device))
        emit(rows[-1])
        cache = getattr(train_set, "cache_dir", None)
        variants = [("wav", None)]
        if cache is not None and Path(cache).is_dir() and any(Path(cache).glob("*.pt")):
            variants.append(("cached_mels", cache))
        for label, cache_dir in variants:
            if cache is not None:
                train_set.cache_dir = cache_dir
            for workers in args.workers:
                rows.append(time_loader(spec, run_config(args, name, args.tiny, (f"data.num_workers={workers}",)),
                                        train_set, f"loader_{name}_{label}", args.steps, device, args.progress))
                rows[-1]["tiny"] = bool(args.tiny)
                emit(rows[-1])
    return rows


def padding_rows(args: argparse.Namespace, device: torch.device, models: list[str],
                 emit: Callable[[dict], None]) -> list[dict]:
    """``padding_<model>`` rows of the ``models`` with ``Training.variable_length`` (:func:`batching_rows` of their
    training utterances, with :func:`trained_fields` on ``device``), each passed to ``emit``; the others are skipped
    with a line saying so. Raises BenchmarkError: fewer training utterances than one batch."""
    rows = []
    for name in models:
        if not MODELS[name].training.variable_length:
            skip_note(name, "its items all have one length (ModelSpec.variable_length is not set): no padding")
            continue
        cfg = run_config(args, name, args.tiny)
        train_set, _ = model_datasets(MODELS[name], cfg, PARTS.run.datasets)
        lengths = train_set.lengths()
        if len(lengths) < cfg.section(name).batch_size:
            raise BenchmarkError(f"{len(lengths)} training utterances are too few for one batch of "
                                 f"{cfg.section(name).batch_size}; use --set {name}.batch_size=N")
        rows += batching_rows((f"padding_{name}", "padding"), lengths, cfg, name, emit, lambda batching, max_frames: (
            trained_fields(MODELS[name], run_config(args, name, args.tiny, (
                "data.num_workers=0", f"data.batching={batching}", f"data.max_frames={max_frames}")), train_set, args,
                device)))
    return rows


def trained_fields(spec: ModelSpec, cfg: Config, train_set, args: argparse.Namespace, device: torch.device) -> dict:
    """The train step (:func:`make_train_step`: eager, ``train.precision``, one model of seed 0) on the first ``--steps``
    batches of ``train.py``'s training loader with ``cfg`` (its ``data.batching``; epoch 0, then 1, ... as needed),
    all read before the first step (data loading excluded, the copy to ``device`` included), each stepped once and
    timed; ``--warmup`` untimed steps on the first batch before. Fields: ``train_batches``,
    ``train_padding_fraction`` (padded mel frames' share of those batches), ``train_step_s`` (mean seconds a step),
    ``train_items_per_s`` (utterances a second through forward, backward and optimizer step, to 4 significant
    digits: a slow step's fraction of one too) and ``train_frames_per_s`` (their mel frames a second, padding
    excluded). Raises BenchmarkError: the dataset is too small for one batch."""
    loader, lengths = training_loader(spec, cfg, train_set, device), train_set.lengths()
    sampler, indices, epoch = epoch_order(loader)[0], [], 0
    while len(indices) < args.steps:
        sampler.set_epoch(epoch)
        indices += itertools.islice(loader.batch_sampler, args.steps - len(indices))
        epoch += 1
    batches = [loader.collate_fn([train_set[i] for i in batch]) for batch in indices]
    torch.manual_seed(0)
    step = make_train_step(spec.build_model(cfg).to(device), spec.training.build_criterion(cfg), batches[0], cfg, spec,
                           cfg.train.precision, device)
    for _ in range(args.warmup):
        step()
    synchronize(device)
    seconds = 0.0
    with progress_bar(len(batches), f"train_{spec.name} ({cfg.data.batching})", "step", args.progress) as bar:
        for batch in batches:
            seconds += timed_call(lambda: step(batch), device)
            bar.update()
    release(device)
    items = [i for batch in indices for i in batch]
    return {"train_batches": len(batches), "train_padding_fraction": round(padding_fraction(indices, lengths), 4),
            "train_step_s": round(seconds / len(batches), 4), "train_items_per_s": float(f"{len(items) / seconds:.4g}"),
            "train_frames_per_s": round(sum(lengths[i] for i in items) / seconds)}


def plan_rows(args: argparse.Namespace, models: list[str], emit: Callable[[dict], None]) -> list[dict]:
    """``plan_<count>`` rows (:func:`batching_rows`) of ``--plan`` lengths drawn as :func:`ljspeech_like_lengths`, with
    the full-size config (``--tiny``: its tiny block) of the first of ``models`` with ``Training.variable_length``;
    what a rank does at each epoch's start, with the corpus's metadata only. Raises BenchmarkError: ``--plan`` is
    fewer lengths than one batch of the model's ``batch_size`` (``buckets`` and ``random`` keep full batches only)."""
    name = next(name for name in models if MODELS[name].training.variable_length)
    cfg = run_config(args, name, args.explicit_tiny)
    batch_size = cfg.section(name).batch_size
    if args.plan < batch_size:
        raise BenchmarkError(f"--plan {args.plan}: fewer lengths than one batch of {batch_size} ({name}.batch_size; "
                             f"data.batching buckets and random keep full batches only): plan at least {batch_size}, "
                             f"or use --set {name}.batch_size=N")
    return batching_rows((f"plan_{args.plan}", "plan"), ljspeech_like_lengths(args.plan), cfg, name, emit)


def corpus_plan_row(args: argparse.Namespace, models: list[str], emit: Callable[[dict], None]) -> dict:
    """The ``corpus_<N>`` row (``--plan-corpus``), passed to ``emit``: what a rank does with the training corpus of
    ``--dataset-path`` at start-up, metadata only, for the first of ``models`` with ``Training.variable_length``: read
    it (``data.format``'s reader: ``read_s``), its lengths in mel frames (durations, else headers: ``lengths_s``), the
    first epoch's frame-budget plan for all ranks (``plan_s``; ``data.max_frames``, or where it is 0 ``batch_size`` x
    the longest), ``total_s``, ``peak_rss_mib`` (this process, imports included) and ``worker_own_mib``: the memory a
    process forked from it (as a loader worker is) makes its own reading every utterance's fields in the plan's order
    (Linux's ``Private_Dirty``; None elsewhere). Raises DataError: what the reader raises."""
    name = next(name for name in models if MODELS[name].training.variable_length)
    cfg = run_config(args, name, args.explicit_tiny)
    begin = time.perf_counter()
    train_set = load_splits(cfg.data)[0]
    read = time.perf_counter()
    lengths = MelSpectrogram(cfg.audio).num_frames(clip_samples(train_set, cfg.audio.sampling_rate))
    measured = time.perf_counter()
    max_frames = cfg.data.max_frames or cfg.section(name).batch_size * int(lengths.max())
    order, ends = FrameBudgetSampler(lengths, max_frames, seed=cfg.train.seed, pool=cfg.data.bucket_pool,
                                     max_items=cfg.data.max_items, quadratic=cfg.data.quadratic_frames).plan()
    planned = time.perf_counter()
    row = {"case": f"corpus_{len(train_set)}", "mode": "plan_corpus", "utterances": len(train_set),
           "max_frames": max_frames, "batches": len(ends), "read_s": round(read - begin, 3),
           "lengths_s": round(measured - read, 3), "plan_s": round(planned - measured, 3),
           "total_s": round(planned - begin, 3),
           "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
           "worker_own_mib": worker_own_mib(lambda: all(map(train_set.__getitem__, order)))}
    emit(row)
    return row


def private_dirty_mib() -> Optional[float]:
    """This process's ``Private_Dirty`` memory in MiB (pages written since a fork: its own), None without Linux's
    ``/proc/self/smaps_rollup``."""
    try:
        with open("/proc/self/smaps_rollup") as file:
            return next(int(line.split()[1]) for line in file if line.startswith("Private_Dirty:")) / 1024
    except (OSError, StopIteration, ValueError):
        return None


def worker_own_mib(work: Callable[[], object]) -> Optional[float]:
    """MiB that a process forked from this one makes its own (:func:`private_dirty_mib`, after less before) doing
    ``work``; None where it cannot be measured (no fork, no smaps_rollup)."""
    if not hasattr(os, "fork") or private_dirty_mib() is None:
        return None
    readable, writable = os.pipe()
    child = os.fork()
    if child == 0:  # the child: measure, say it through the pipe, exit without running the parent's cleanup
        before = private_dirty_mib()
        work()
        os.write(writable, f"{private_dirty_mib() - before:.1f}".encode())
        os._exit(0)
    os.close(writable)
    with os.fdopen(readable) as said:
        own = said.read()
    os.waitpid(child, 0)
    return float(own) if own else None


def ljspeech_like_lengths(count: int, seed: int = 0) -> np.ndarray:
    """Mel frames ``(count,)`` int64 of clips spread as LJSpeech's (1 to 10.1 s, most 5 to 9 s, 86 frames a second)."""
    seconds = np.clip(np.random.default_rng(seed).normal(6.6, 2.2, count), 1.0, 10.1)
    return (seconds * 86).astype(np.int64)


def batching_rows(case: tuple[str, str], lengths: Sequence[int], cfg: Config, name: str, emit: Callable[[dict], None],
                  more: Callable[[str, int], dict] = lambda batching, max_frames: {}) -> list[dict]:
    """Rows of ``case`` (its name and mode), each passed to ``emit``: one epoch's batches of ``lengths`` (mel frames)
    as each ``data.batching`` makes them with ``cfg``, frame budgets first (within ``data.max_frames``, or where it is
    0 within model ``name``'s ``batch_size`` x the longest length, what a fixed batch may pad to): ``batches``,
    ``items_per_batch``, ``padding_fraction``, ``plan_s`` (seconds to plan the epoch for all ranks, as every rank
    does), ``plan_items_per_s`` (utterances planned a second, not trained), ``peak_rss_mib`` (this process's peak
    resident memory so far, imports included), then the fields ``more(batching, max_frames)`` gives. ``lengths``: at
    least one ``batch_size`` of them (the callers check), else ``buckets`` and ``random`` make no batch."""
    data, batch_size, seed = cfg.data, cfg.section(name).batch_size, cfg.train.seed
    max_frames = data.max_frames or batch_size * int(max(lengths))
    plans = {"frames": lambda: FrameBudgetSampler(lengths, max_frames, seed=seed, pool=data.bucket_pool,
                                                  max_items=data.max_items,
                                                  quadratic=data.quadratic_frames).epoch_batches(),
             "buckets": lambda: LengthBucketSampler(lengths, batch_size, seed=seed, pool=data.bucket_pool).epoch_batches(),
             "random": lambda: random_batches(len(lengths), batch_size, seed)}
    rows = []
    for batching, plan in plans.items():
        begin = time.perf_counter()
        batches = plan()
        seconds = time.perf_counter() - begin
        rows.append({"case": case[0], "mode": case[1], "batching": batching, "batch_size": batch_size,
                     **({"max_frames": max_frames} if batching == "frames" else {}), "utterances": len(lengths),
                     "batches": len(batches), "items_per_batch": round(sum(map(len, batches)) / len(batches), 2),
                     "padding_fraction": round(padding_fraction(batches, lengths), 4), "plan_s": round(seconds, 4),
                     "plan_items_per_s": round(len(lengths) / seconds),
                     "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)})
        rows[-1].update(more(batching, max_frames))
        emit(rows[-1])
    return rows


def print_batching_table(rows: list[dict]) -> None:
    """The batching rows side by side: the epoch's plan, then (rows with :func:`trained_fields`) the train step's."""
    trained = all("train_batches" in r for r in rows)
    print("\n| case | batching | utterances | batches | items a batch | padding | plan s | plan items/s | peak RSS MiB |"
          + (" trained batches | their padding | train items/s | train frames/s |" if trained else "") + "\n"
          + "|---" * (13 if trained else 9) + "|")
    for r in rows:
        print(f"| {r['case']} | {r['batching']} | {r['utterances']:,} | {r['batches']:,} | {r['items_per_batch']} | "
              f"{100 * r['padding_fraction']:.1f}% | {r['plan_s']} | {r['plan_items_per_s']:,} | {r['peak_rss_mib']:,} |"
              + (f" {r['train_batches']} | {100 * r['train_padding_fraction']:.1f}% | {r['train_items_per_s']:,} | "
                 f"{r['train_frames_per_s']:,} |" if trained else ""))


def training_loader(spec: ModelSpec, cfg: Config, train_set, device: torch.device):
    """``train.py``'s training DataLoader over ``train_set`` for one process. Raises BenchmarkError: the dataset is too
    small for one batch."""
    batch_size = cfg.section(spec.name).batch_size
    loader = make_loader(train_set, spec, cfg, DistInfo(rank=0, local_rank=0, world_size=1, device=device, backend=None),
                         train=True)
    if len(loader) == 0:
        raise BenchmarkError(f"{len(train_set)} training utterances are too few for one batch of {batch_size}; "
                             f"use --tiny or --set {spec.name}.batch_size=N")
    return loader


def step_on_real_batch(spec: ModelSpec, cfg: Config, train_set, args: argparse.Namespace,
                       device: torch.device) -> dict:
    """Items/s of ``train.py``'s step (eager, ``train.precision``) on the first real batch of ``train_set``. Raises
    BenchmarkError: the dataset is too small for one batch."""
    name, batch_size = spec.name, cfg.section(spec.name).batch_size
    batch = next(iter(training_loader(spec, cfg, train_set, device)))
    items = spec.training.count_items(batch)
    torch.manual_seed(0)
    model = spec.build_model(cfg).to(device)
    step = make_train_step(model, spec.training.build_criterion(cfg), to_device(batch, device), cfg, spec,
                           cfg.train.precision, device)
    seconds = median_step_time(step, args.warmup, min(args.steps, 5 if device.type == "cpu" else 20), device,
                               f"train_{name} ({cfg.train.precision}, batch {batch_size})", args.progress)
    release(device)
    return {"case": f"train_{name}", "mode": "train", "precision": cfg.train.precision, "batch_size": batch_size,
            "step_s": round(seconds, 4), "items_per_s": round(items / seconds), "tiny": bool(args.tiny)}


def print_loader_table(rows: list[dict]) -> None:
    """Loader items/s per worker count beside the train step's, and how many workers keep up."""
    step = {r["case"][len("train_"):]: r["items_per_s"] for r in rows if r["mode"] == "train"}
    loaders: dict[str, dict[int, int]] = {}
    for r in rows:
        if r["mode"] == "loader":
            loaders.setdefault(r["case"], {})[r["workers"]] = r["items_per_s"]
    counts = sorted({w for by_workers in loaders.values() for w in by_workers})
    print("\n| loader | " + " | ".join(f"{w} workers" for w in counts) + " | train step | workers needed |")
    print("|---" * (len(counts) + 3) + "|")
    for case, by_workers in loaders.items():
        model = next(name for name in step if case.startswith(f"loader_{name}_"))
        enough = [w for w in counts if by_workers.get(w, 0) >= step[model]]
        needed = str(enough[0]) if enough else f"more than {counts[-1]}"
        print(f"| {case} | " + " | ".join(f"{by_workers.get(w, 0):,}" for w in counts)
              + f" | {step[model]:,} | {needed} |")


def time_loader(spec: ModelSpec, cfg: Config, train_set, label: str, batches: int, device: torch.device,
                progress: bool = True) -> dict:
    """Items/s of ``train.py``'s training DataLoader over ``train_set``, ``batches`` batches after the first one
    (:func:`utils.data.loader.batch_stream`), moved to ``device``; ``progress``: a tqdm bar on stderr. Raises
    BenchmarkError: the dataset is too small for one batch."""
    stream = batch_stream(training_loader(spec, cfg, train_set, device), TrainState())
    with progress_bar(batches + 1, f"{label} ({cfg.data.num_workers} workers)", "batch", progress) as bar:
        begin = time.perf_counter()
        to_device(next(stream), device)
        first = time.perf_counter() - begin
        bar.update()
        items, begin = 0, time.perf_counter()
        for _ in range(batches):
            batch = next(stream)
            items += spec.training.count_items(batch)
            to_device(batch, device)
            bar.update()
        synchronize(device)
        seconds = time.perf_counter() - begin
    return {"case": label, "mode": "loader", "workers": cfg.data.num_workers,
            "batch_size": cfg.section(spec.name).batch_size, "batches": batches, "items_per_s": round(items / seconds),
            "batches_per_s": round(batches / seconds, 2), "first_batch_s": round(first, 3),
            "utterances": len(train_set)}


def source_kind(location: str) -> str:
    """``s3`` for an ``s3://`` prefix, else ``shards`` (a local folder of them)."""
    return "s3" if str(location).startswith("s3://") else "shards"


def source_rows(args: argparse.Namespace, device: torch.device, models: list[str],
                emit: Callable[[dict], None]) -> list[dict]:
    """``source_<model>_<kind>`` rows (``--sources``), each passed to ``emit``: ``train.py``'s training loader of the
    first of ``models`` (its config, ``data.num_workers`` workers) read from each source in turn, ``--dataset-path``
    (the corpus in its layout: ``folder``), then each ``--shards`` location (``data.format=shar``: a folder,
    ``shards``; an ``s3://`` prefix, ``s3``), feeding the train step (eager, ``train.precision``) as training does
    (:func:`time_source`). Raises ConfigError, DataError: what ``train.py`` raises
    for that source (a ``data.max_duration`` missing for shards, a bucket that does not exist, ...)."""
    rows, spec = [], MODELS[models[0]]
    for kind, location in [("folder", args.dataset_path), *((source_kind(path), path) for path in args.shards)]:
        extra = () if kind == "folder" else ("data.format=shar",)
        cfg = load_run_config(argparse.Namespace(config=args.config, model=spec.name, tiny=args.tiny,
                                                 set=[*args.set, *extra], dataset_path=location, max_steps=None))
        with tempfile.TemporaryDirectory(prefix="sources-") as out:  # the corpus check's output folder
            cfg.data.speakers = checked_corpus(cfg, spec, Path(out), PARTS.run.corpus)[1]
        dist = DistInfo(rank=0, local_rank=0, world_size=1, device=device, backend=None)
        loader = build_loaders(spec, cfg, dist, PARTS.run.datasets, PARTS.run.corpus)[0]
        rows.append({"case": f"source_{spec.name}_{kind}", "mode": "source", "source": str(location),
                     "workers": cfg.data.num_workers, **time_source(spec, cfg, loader, args, device)})
        emit(rows[-1])
    return rows


def time_source(spec: ModelSpec, cfg: Config, loader, args: argparse.Namespace, device: torch.device) -> dict:
    """The train step of a model of seed 0 on ``loader``'s batches (:func:`utils.data.loader.batch_stream`),
    ``--warmup`` untimed steps on the first, then ``--steps``: ``steps``, ``utterances_per_s`` (utterances through the loader and the step a second),
    ``data_wait_s`` (mean seconds a step waited for its batch), ``step_s`` (mean seconds of the step) and
    ``data_wait_share`` (the wait's share of both, as the run log measures it)."""
    stream = batch_stream(loader, TrainState())
    first = to_device(next(stream), device)
    torch.manual_seed(0)
    step = make_train_step(spec.build_model(cfg).to(device), spec.training.build_criterion(cfg), first, cfg, spec,
                           cfg.train.precision, device)
    for _ in range(args.warmup):
        step(first)
    wait = busy = 0.0
    utterances = 0
    with progress_bar(args.steps, f"source {cfg.data.dataset_path}", "step", args.progress) as bar:
        for _ in range(args.steps):
            begin = time.perf_counter()
            batch = to_device(next(stream), device)
            wait += time.perf_counter() - begin
            busy += timed_call(lambda: step(batch), device)
            utterances += len(batch.get("ids", []))
            bar.update()
    release(device)
    return {"steps": args.steps, "utterances_per_s": round(utterances / (wait + busy), 2),
            "data_wait_s": round(wait / args.steps, 4), "step_s": round(busy / args.steps, 4),
            "data_wait_share": round(wait / (wait + busy), 4)}


def print_source_table(rows: list[dict]) -> None:
    """The sources side by side: utterances/s and the data wait, per step and as a share of it."""
    print("\n| source | " + " | ".join(r["case"].rsplit("_", 1)[1] for r in rows) + " |\n" + "|---" * (len(rows) + 1)
          + "|")
    for label, key, shown in (("utterances/s", "utterances_per_s", "{:,}"), ("data wait s a step", "data_wait_s", "{}"),
                              ("data wait share", "data_wait_share", "{:.1%}"), ("step s", "step_s", "{}")):
        print(f"| {label} | " + " | ".join(shown.format(r[key]) for r in rows) + " |")
