"""Train-step throughput of this project's models, comparable with NVIDIA's reference harness.

    python -m scripts.benchmark                                   # every case, tf32/bf16/fp16, fast path
    python -m scripts.benchmark --model NAME --precision bf16 --json ours.json
    python -m scripts.benchmark --eager                           # the plain eager path, for comparison
    python -m scripts.benchmark --tiny --device cpu               # CPU smoke run (under a minute)
    python -m scripts.benchmark --device cpu --full-size          # full-size models on a CPU (minutes a step)
    python -m scripts.benchmark --check                           # fast path loss vs eager float32 loss
    python -m scripts.benchmark --loader --dataset-path DIR       # input pipeline items/s
    python -m scripts.benchmark --padding --dataset-path DIR      # padded share of batches: random vs buckets

Everything about a model comes from its ``ModelSpec`` (``model.py``); a model that lacks what a mode
needs is skipped with a line saying so.

**Train step** (default). For each case and precision: build the model with ``build_model`` (seed 0), its
loss with ``Training.build_criterion``, one batch from ``Benchmark.synthetic_batch`` (seed 0) on the device, and
time the step ``train.py`` runs: for each of the model's optimizers (one, or one per ``Phases.names``, e.g. a
GAN's discriminator then generator) ``utils.training.step.forward_backward`` (forward and loss under autocast, backward
through the GradScaler, unscale, gradient-norm clipping) and that optimizer's step; then the scaler update.
The per-step all-reduce, checks and logging of ``train.py`` are left out. Timing as NVIDIA's reference
harness times its models (the harness is not part of this project): ``--warmup`` untimed steps, then
``--steps`` steps each timed with CUDA events (``time.perf_counter`` on the CPU), and the median (the upper
one for an even count). One JSON row per case and precision: ``case``, ``mode`` (``tf32``, ``amp-bf16``, ``amp-fp16``: the
reference's names), ``step_s``, ``items_per_s`` (``Training.count_items`` per second: audio samples or mel frames
for the examples, as NVIDIA's tables), ``peak_gib`` (``torch.cuda.max_memory_allocated``, model and
optimizer included; ``null`` on the CPU), plus ``path`` (``fast``/``eager``), ``tiny`` (true for the
small shapes below), ``items_per_step``, ``params_m``, ``loss``. ``--compare REF.json`` adds
``ratio_vs_reference`` (our items/s over the reference's, same case and mode).

Cases are each model's ``Benchmark.cases`` (the example models carry the names and shapes of the
reference); their settings are the config dataclasses' defaults (NVIDIA's published LJSpeech models,
which the reference runs) plus the case's own keys, and ``--set`` changes them. ``--tiny`` takes
``config.json`` with its ``tiny`` block instead and each case's smaller ``tiny`` shape, for a smoke run on a
CPU. A model with a ``synthetic_batch`` but no cases gets one, ``<name>_b<batch_size>``, from
``config.json``.

**Tiny rows are named after their tiny shape**, never after the full-size case they stand in for:
``tiny_<model>_b<batch size>`` plus ``_<first letter of the key><value>`` for each integer keyword of
``synthetic_batch`` (``tiny_waveglow_b2_s2048``: batch 2 of 2048-sample crops), or ``tiny_<name>`` when
the case's ``tiny`` shape has a name of its own. Such rows carry ``"tiny": true`` and ``full_size_case``, the
name of the full-size case. ``--cases`` takes either name.

**On a CPU, tiny is the default.** A full-size train step takes minutes on a CPU, so without ``--tiny`` and
without ``--full-size`` a CPU run uses the tiny shapes and says so in one line; ``--full-size`` times the
full-size models anyway, after one line saying what that costs. On CUDA, full size is the default.

**Progress.** Every timed case and every loader measurement shows a tqdm bar on stderr (steps or batches
done, seconds each); JSON rows and tables go to stdout. ``--no-progress`` hides the bars.

The fast path is ``Training.optimize_for_training`` (what ``train.compile=true`` selects). It is the
default on CUDA; on the CPU the default is the eager path (compilation there takes minutes for the
whole table) and ``--fast`` asks for it.

**Check** (``--check``): for each case, the fast path's loss and gradients on the same weights (seed 0,
then every parameter moved by ``N(0, 0.01)`` so that zero-initialised layers take part) and batch, in
float32 (TF32 off) and in bf16 autocast, against the eager float32 loss. Rows: ``case``, ``mode``
(``check-fp32``, ``check-amp-bf16``), ``loss_rel_diff``, ``limit`` (1e-5, 2e-2), ``ok``,
``grad_rel_diff`` (for information). Inductor's random numbers fall back to eager's here, so dropout
draws the same masks in both paths. The exit status is 1 when a row is not ok.

**Loader** (``--loader --dataset-path DIR``): first the train step on the corpus's first real batch
(row ``train_<model>``: items/s the loader must keep up with on this device), then the training dataset and
DataLoader exactly as ``train.py`` builds them (``train.load_run_config``, ``utils.data.loader.make_loader``, pinned
memory on CUDA) with each ``--workers`` count (1, 2, 4, 8), iterated for ``--steps`` batches after the first one
(worker start-up, reported apart as ``first_batch_s``). Items are ``Training.count_items``. Rows
``loader_<model>_wav`` (audio decoded, mels computed) and, when the dataset reads a mel cache (a
``cache_dir`` attribute) that holds mels, ``loader_<model>_cached_mels``. A table ends the run: loader
items/s per worker count beside the train step's, and the fewest workers that keep up (per process: with
N GPUs on a node, each rank runs its own workers).

**Padding** (``--padding --dataset-path DIR``): for each model whose items differ in length
(``Training.variable_length``), the share of a padded batch that is padding over one epoch of the training
dataset (``lengths()``, e.g. Tacotron2's mel frames), with ``data.batching=random`` and ``buckets``
(:class:`utils.data.samplers.LengthBucketSampler`): rows ``padding_<model>`` with ``batching``, ``batch_size``,
``utterances``, ``batches`` and ``padding_fraction``. Nothing is loaded but the wav headers, and the batch
size is the config's full-size one unless ``--tiny`` is given.

Exit status 0; 1 for a bad argument or config, or a failed check.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

import torch

from model import BenchmarkCase
from models import MODELS
from scripts.benchmark_data import loader_rows, padding_rows, print_loader_table
from scripts.benchmark_step import (PRECISION_MODES, BenchmarkError, bench_case, case_config, case_name, cases_for,
                                    check_case, skip_note, use_fast_path)
from utils.config import ConfigError
from utils.data.corpus import DataError
from utils.training.guards import TrainingError

PROJECT_ROOT = Path(__file__).resolve().parent.parent

CPU_TINY_NOTE = ("on a CPU a full-size train step takes minutes: using the tiny shapes (config.json's tiny "
                 "block, each case's tiny shape; rows named tiny_...); add --full-size to time full size anyway")
"""The line a CPU run without ``--tiny`` or ``--full-size`` prints before it starts."""

CPU_FULL_SIZE_NOTE = ("--full-size on a CPU: a full-size train step of the example models takes minutes (over "
                      "100 s on 2 cores), and each case runs --warmup + --steps of them; --tiny is the CPU smoke run")
"""The line a CPU run with ``--full-size`` prints before it starts: what it will cost."""


def build_parser() -> argparse.ArgumentParser:
    """The command line's options (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="all",
                        help=f"comma-separated models to run ({', '.join(MODELS)}; default: all registered)")
    parser.add_argument("--cases", default="all", help="comma-separated case names (default: all of the models')")
    parser.add_argument("--precision", default="tf32,bf16,fp16",
                        help="comma-separated precisions among fp32, tf32, bf16, fp16 (default: tf32,bf16,fp16)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None,
                        help="default: cuda when available, else cpu")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--tiny", action="store_true",
                      help="config.json's tiny block and small batches (CPU smoke; the default on a CPU)")
    size.add_argument("--full-size", action="store_true",
                      help="full-size models and batches on a CPU too (minutes a step; the default on CUDA)")
    parser.add_argument("--json", dest="json_out", help="write the rows to this JSON file (after every row)")
    parser.add_argument("--steps", type=int, default=None,
                        help="timed steps (default 20 on CUDA, 3 on the CPU; loader: batches, default 50)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 5 on CUDA, 1 on the CPU)")
    path = parser.add_mutually_exclusive_group()
    path.add_argument("--eager", action="store_true", help="force the plain eager path")
    path.add_argument("--fast", action="store_true", help="force the fast path (train.compile) on the CPU too")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend of the fast path (default inductor)")
    parser.add_argument("--compile-mode", default=None,
                        help="torch.compile mode of the fast path (e.g. reduce-overhead, max-autotune)")
    parser.add_argument("--check", action="store_true",
                        help="compare the fast path's loss with the eager float32 loss instead of timing")
    parser.add_argument("--compare", metavar="REF_JSON", help="reference harness rows: add ratio_vs_reference")
    parser.add_argument("--loader", action="store_true", help="time the training DataLoader instead")
    parser.add_argument("--padding", action="store_true",
                        help="the padded share of batches over one epoch, random vs length-bucketed (no model runs)")
    parser.add_argument("--dataset-path", help="corpus for --loader and --padding (overrides data.dataset_path)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8],
                        help="--loader: DataLoader worker counts to time (default 1 2 4 8)")
    parser.add_argument("--config", default=str(PROJECT_ROOT / "config.json"),
                        help="config for --tiny, --loader and models without a reference case")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config value; repeatable")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars on stderr")
    return parser


def settle_names(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``args.models`` and ``args.precisions`` from ``--model`` and ``--precision``; ``parser.error`` (exit 2) for a
    name that is not registered or not a precision."""
    args.models = list(MODELS) if args.model == "all" else args.model.split(",")
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        parser.error(f"--model {', '.join(unknown)}: not in models.MODELS ({', '.join(MODELS)})")
    args.precisions = args.precision.split(",")
    bad = [p for p in args.precisions if p not in PRECISION_MODES]
    if bad:
        parser.error(f"--precision {', '.join(bad)}: choose among {', '.join(PRECISION_MODES)}")


def settle_device_and_size(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The device (cuda when available), the shapes (tiny by default on a CPU: ``args.size_note`` says so, or what
    ``--full-size`` costs there; ``args.explicit_tiny``: ``--tiny`` was given) and the step counts' defaults."""
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available (use --device cpu)")
    args.explicit_tiny = args.tiny
    cpu = args.device == "cpu"
    args.size_note = ""
    if cpu and not args.tiny and not args.full_size:
        args.tiny, args.size_note = True, CPU_TINY_NOTE
    elif cpu and args.full_size:
        args.size_note = CPU_FULL_SIZE_NOTE
    if args.steps is None:
        args.steps = 50 if args.loader else (3 if cpu else 20)
    if args.warmup is None:
        args.warmup = 1 if cpu else 5


def check_modes(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``parser.error`` (exit 2) for step counts, modes and worker counts that do not go together."""
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be >= 1 and --warmup >= 0")
    for mode in ("loader", "padding"):
        if getattr(args, mode) and not args.dataset_path:
            parser.error(f"--{mode} needs --dataset-path")
    if args.loader and args.padding:
        parser.error("--loader and --padding are separate runs: give one")
    if any(w < 0 for w in args.workers):
        parser.error("--workers counts must be >= 0")


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """The command line, checked and completed (models, precisions, device, shapes, step counts).

    Raises:
        SystemExit: 2 after argparse's usage line for a bad argument.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    settle_names(parser, args)
    settle_device_and_size(parser, args)
    check_modes(parser, args)
    return args


def print_table(rows: list[dict]) -> None:
    """The timed rows as a Markdown table, like NVIDIA's."""
    print("\n| case | mode | path | step s | items/s | peak GiB | vs reference |\n|---|---|---|---|---|---|---|")
    for row in rows:
        if "error" in row:
            print(f"| {row['case']} | {row['mode']} | {row['path']} | error: {row['error'][:60]} | | | |")
            continue
        peak = "n/a" if row["peak_gib"] is None else f"{row['peak_gib']:.2f}"
        ratio = f"{row['ratio_vs_reference']:.2f}x" if row.get("ratio_vs_reference") else ""
        print(f"| {row['case']} | {row['mode']} | {row['path']} | {row['step_s']:.4f} | {row['items_per_s']:,} "
              f"| {peak} | {ratio} |")


class Rows:
    """The rows of a run as they are measured: each printed as one JSON line on stdout, all of them rewritten to
    ``--json`` after every row, with ``ratio_vs_reference`` (our items/s over the ``--compare`` row's of the same
    case and mode) where the reference has the row."""

    def __init__(self, json_out: Optional[str], compare: Optional[str]):
        self.json_out = json_out
        self.reference = {}
        if compare:
            self.reference = {(r["case"], r["mode"]): r for r in json.loads(Path(compare).read_text())
                              if "items_per_s" in r}
        self.rows: list[dict] = []

    def __call__(self, row: dict) -> None:
        ref = self.reference.get((row["case"], row["mode"]))
        if ref and "items_per_s" in row:
            row["ratio_vs_reference"] = round(row["items_per_s"] / ref["items_per_s"], 3)
        self.rows.append(row)
        print(json.dumps(row), flush=True)
        if self.json_out:
            Path(self.json_out).write_text(json.dumps(self.rows, indent=1))


def chosen_cases(args: argparse.Namespace) -> list[tuple[str, BenchmarkCase]]:
    """The ``(model, case)`` pairs to run: every case of ``--model``'s models, or those ``--cases`` names (by the
    case's own name or by its row's name).

    Raises:
        BenchmarkError: ``--cases`` names none of them.
    """
    cases = cases_for(args.models)
    if args.cases != "all":
        wanted = args.cases.split(",")
        cases = [(name, case) for name, case in cases
                 if case.name in wanted or case_name(name, case, case_config(name, case, args)[1], args.tiny)
                 in wanted]
        if not cases:
            raise BenchmarkError(f"--cases {args.cases}: none of them belongs to {', '.join(args.models)}")
    return cases


def run_checks(cases: list[tuple[str, BenchmarkCase]], args: argparse.Namespace, device: torch.device,
               emit: Rows) -> int:
    """``--check``: the check rows of every case whose model has a fast path, then one line of how many are within
    their limits. Returns the exit status: 1 when a row is not."""
    for name, case in cases:
        if MODELS[name].training.optimize_for_training is None:
            skip_note(name, "its ModelSpec has no optimize_for_training (fast path) to check")
            continue
        for row in check_case(name, case, args, device):
            emit(row)
    rows = emit.rows
    failed = [r for r in rows if not r["ok"]]
    print(f"check: {len(rows) - len(failed)} of {len(rows)} rows within their limits", flush=True)
    return 1 if failed else 0


def run(args: argparse.Namespace, device: torch.device, emit: Rows) -> int:
    """The mode the command line asks for (padding, loader, check, or timing the train step); its exit status."""
    if args.padding:
        padding_rows(args, args.models, emit)
        return 0
    if args.loader:
        print_loader_table(loader_rows(args, device, args.models, emit))
        return 0
    cases = chosen_cases(args)
    if args.check:
        return run_checks(cases, args, device, emit)
    for name, case in cases:
        if use_fast_path(args, device) and MODELS[name].training.optimize_for_training is None:
            skip_note(f"{name}'s fast path", "its ModelSpec has no optimize_for_training; timing the eager path")
        for precision in args.precisions:
            emit(bench_case(name, case, precision, args, device))
    print_table(emit.rows)
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    """Run the benchmark the command line asks for. Returns the exit status: 0; 1 after one ``ERROR:`` line for a
    bad config or corpus, or a benchmark that cannot run, or for a failed check."""
    args = parse_args(argv)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device: {name} torch {torch.__version__}; threads {torch.get_num_threads()}", flush=True)
    if args.size_note and not args.padding:
        print(args.size_note, flush=True)
    emit = Rows(args.json_out, args.compare)
    try:
        return run(args, device, emit)
    except (ConfigError, DataError, BenchmarkError, TrainingError) as err:
        print(f"ERROR: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
