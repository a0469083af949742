"""Train-step throughput of this project's models, comparable with NVIDIA's reference harness.

    python -m scripts.benchmark                                   # every case, tf32/bf16/fp16, fast path
    python -m scripts.benchmark --model NAME --precision bf16 --json ours.json
    python -m scripts.benchmark --eager                           # the plain eager path, for comparison
    python -m scripts.benchmark --tiny --device cpu               # CPU smoke run (under a minute)
    python -m scripts.benchmark --device cpu --full-size          # full-size models on a CPU (minutes a step)
    python -m scripts.benchmark --check                           # fast path loss vs eager float32 loss
    python -m scripts.benchmark --loader --dataset-path DIR       # input pipeline items/s
    python -m scripts.benchmark --padding --dataset-path DIR      # random, buckets, frames: padding, train items/s
    python -m scripts.benchmark --plan 1000000                    # an epoch planned over a million lengths
    python -m scripts.benchmark --plan-corpus --dataset-path DIR  # a corpus read, measured and planned
    python -m scripts.benchmark --sources --dataset-path DIR --shards SHARDS [s3://BUCKET/PREFIX]  # with shards

Everything about a model comes from its ``ModelSpec``; a model that lacks what a mode needs is skipped with a line
saying so. Progress bars go to stderr (``--no-progress``), rows and tables to stdout.

**Train step** (default): per case (``Benchmark.cases``, the reference's shapes) and precision, one
``Benchmark.synthetic_batch`` (seed 0) through ``train.py``'s step, timed as NVIDIA's harness does: ``--warmup``
untimed steps, then the median of ``--steps``. Rows: ``case``, ``mode`` (``tf32``, ``amp-bf16``, ``amp-fp16``),
``step_s``, ``items_per_s`` (samples or mel frames a second), ``peak_gib``, ``path``, ``tiny``, ``params_m``,
``loss``, and with ``--compare REF.json`` ``ratio_vs_reference``. On a CPU tiny and eager are the defaults.
**Check** (``--check``): the fast path's loss and gradients against eager float32, in float32 and bf16 autocast: rows
``check-fp32`` and ``check-amp-bf16`` with ``loss_rel_diff``, ``limit`` (1e-5, 2e-2), ``ok``, ``grad_rel_diff``.
**Loader** (``--loader``): ``train.py``'s DataLoader with each ``--workers`` count: rows ``loader_<model>_wav`` (and
``_cached_mels``), then the fewest workers that keep up. **Padding** (``--padding``): per model with
``Training.variable_length``, one epoch's batches of its training utterances as ``data.batching=frames``, ``buckets``
and ``random`` make them: rows ``padding_<model>`` with ``batches``, ``items_per_batch``, ``padding_fraction``,
``plan_s``, ``plan_items_per_s`` (utterances planned a second) and ``peak_rss_mib``; then the train step (eager,
``train.precision``) on the first ``--steps`` batches of each batching's training loader, read beforehand (loading
not timed): ``train_batches``, ``train_padding_fraction`` (of those batches), ``train_step_s`` (mean),
``train_items_per_s`` (utterances a second through forward, backward and optimizer) and ``train_frames_per_s`` (their
mel frames, padding excluded); then a table. **Plan** (``--plan N``): the planning columns over ``N`` lengths spread
as LJSpeech's, no corpus read (rows ``plan_<N>``; the full-size config's batch size): the time and memory a rank
spends planning an epoch of a corpus that size. **Plan a corpus** (``--plan-corpus``): what a
rank does at start-up with the training split of ``--dataset-path``, metadata only: reader, lengths and frame-budget
plan timed apart (``read_s``, ``lengths_s``, ``plan_s``, ``total_s``), ``peak_rss_mib``, and ``worker_own_mib``, the
memory a forked loader worker makes its own reading every utterance's fields (``corpus_<N>``). **Sources**
(``--sources``, where the project reads shards: ``PARTS.run.corpus``): ``train.py``'s training loader of the first
model read from the corpus of ``--dataset-path``, then from each ``--shards`` location (``data.format=shar``; a
folder, or an ``s3://`` prefix whose endpoint and credentials are in the environment), each feeding the train step:
rows ``source_<model>_folder``, ``_shards``, ``_s3`` with ``utterances_per_s``, ``data_wait_s`` (a step's mean wait
for its batch), ``data_wait_share`` and ``step_s``, then a table of them side by side.

Exit status 0; 2 for a bad argument; 1 for a bad config or corpus, or a failed check.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

if not __package__:  # run by its path, not as python -m scripts.NAME: the project's modules would not import
    sys.exit(f"ERROR: run this tool from the project folder as: python -m scripts.{Path(__file__).stem} ...")

import torch

from models import MODELS
from parts import PARTS
from scripts.benchmark_data_rows import (corpus_plan_row, loader_rows, padding_rows, plan_rows, print_batching_table,
                                         print_loader_table, print_source_table, source_rows)
from scripts.benchmark_step import (PRECISION_MODES, BenchmarkError, bench_case, case_config, case_name, cases_for,
                                    check_case, skip_note, use_fast_path)
from utils.benchmark import BenchmarkCase
from utils.config import ConfigError
from utils.data.corpus import DataError
from utils.errors import TrainingError

PROJECT_ROOT = Path(__file__).resolve().parent.parent

CPU_TINY_NOTE = ("on a CPU a full-size train step takes minutes: using the tiny shapes (config.json's tiny "
                 "block, each case's tiny shape; rows named tiny_...); add --full-size to time full size anyway")
CPU_TINY_PADDING_NOTE = ("on a CPU: the batch sizes of config.json's tiny block; add --full-size for the full-size "
                         "ones")
CPU_FULL_SIZE_NOTE = ("--full-size on a CPU: a full-size train step of the example models takes minutes (over "
                      "100 s on 2 cores), and each case runs --warmup + --steps of them; --tiny is the CPU smoke run")


def build_parser() -> argparse.ArgumentParser:
    """The command line's options (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="all",
                        help=f"comma-separated models to run ({', '.join(MODELS)}; default: all registered)")
    parser.add_argument("--cases", default="all", help="comma-separated case names (default: all of the models')")
    parser.add_argument("--precision", default="tf32,bf16,fp16",
                        help="comma-separated precisions among fp32, tf32, bf16, fp16 (default: tf32,bf16,fp16)")
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda when available, else cpu")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--tiny", action="store_true",
                      help="config.json's tiny block and small batches (CPU smoke; the default on a CPU)")
    size.add_argument("--full-size", action="store_true",
                      help="full-size models and batches on a CPU too (minutes a step; the default on CUDA)")
    parser.add_argument("--json", dest="json_out", help="write the rows to this JSON file (after every row)")
    parser.add_argument("--steps", type=int, help="timed steps (default 20 on CUDA, 3 on the CPU; loader: batches, "
                        "default 50)")
    parser.add_argument("--warmup", type=int, help="untimed steps first (default 5 on CUDA, 1 on the CPU)")
    path = parser.add_mutually_exclusive_group()
    path.add_argument("--eager", action="store_true", help="force the plain eager path")
    path.add_argument("--fast", action="store_true", help="force the fast path (train.compile) on the CPU too")
    parser.add_argument("--backend", default="inductor",
                        help="torch.compile backend of the fast path (default inductor)")
    parser.add_argument("--compile-mode", help="torch.compile mode of the fast path (e.g. reduce-overhead, "
                        "max-autotune)")
    parser.add_argument("--check", action="store_true",
                        help="compare the fast path's loss with the eager float32 loss instead of timing")
    parser.add_argument("--compare", metavar="REF_JSON", help="reference harness rows: add ratio_vs_reference")
    parser.add_argument("--loader", action="store_true", help="time the training DataLoader instead")
    parser.add_argument("--padding", action="store_true",
                        help="each data.batching's padded share over one epoch, and the train step's items/s on "
                        "--steps of its batches")
    parser.add_argument("--plan", type=int, metavar="N",
                        help="plan an epoch of N synthetic lengths (at least the batch size) with each data.batching: "
                             "seconds, memory, padding")
    parser.add_argument("--plan-corpus", action="store_true",
                        help="read, measure and plan the training split of --dataset-path: seconds, memory")
    parser.add_argument("--dataset-path",
                        help="corpus for --loader, --padding and --plan-corpus (overrides data.dataset_path)")
    add_source_options(parser)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8],
                        help="--loader: DataLoader worker counts to time (default 1 2 4 8)")
    parser.add_argument("--config", default=str(PROJECT_ROOT / "config.json"),
                        help="config for --tiny, --loader and models without a reference case")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config value; repeatable")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars on stderr")
    return parser


def add_source_options(parser: argparse.ArgumentParser) -> None:
    """``--sources`` and ``--shards`` where the project reads a corpus of its own (``PARTS.run.corpus``: shards);
    elsewhere neither is an option, and ``args.sources`` is False, ``args.shards`` empty."""
    if PARTS.run.corpus is None:
        parser.set_defaults(sources=False, shards=[])
        return
    parser.add_argument("--sources", action="store_true",
                        help="the training loader from --dataset-path and each --shards location side by side")
    parser.add_argument("--shards", nargs="+", default=[], metavar="LOCATION",
                        help="--sources: folders or s3://BUCKET/PREFIX of the same corpus's shards")


def settle_names(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``args.models`` and ``args.precisions``; ``parser.error`` (exit 2) for an unknown name."""
    args.models = list(MODELS) if args.model == "all" else args.model.split(",")
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        parser.error(f"--model {', '.join(unknown)}: not in models.MODELS ({', '.join(MODELS)})")
    args.precisions = args.precision.split(",")
    bad = [p for p in args.precisions if p not in PRECISION_MODES]
    if bad:
        parser.error(f"--precision {', '.join(bad)}: choose among {', '.join(PRECISION_MODES)}")


def settle_device_and_size(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The device, the shapes (tiny by default on a CPU: ``args.size_note`` says so, or what ``--full-size`` costs;
    ``args.explicit_tiny``: ``--tiny`` was given) and the step counts' defaults."""
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available (use --device cpu)")
    args.explicit_tiny, cpu, args.size_note = args.tiny, args.device == "cpu", ""
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
    for mode in ("loader", "padding", "plan_corpus", "sources"):
        if getattr(args, mode) and not args.dataset_path:
            parser.error(f"--{mode.replace('_', '-')} needs --dataset-path")
    if sum(map(bool, (args.loader, args.padding, args.plan is not None, args.plan_corpus, args.sources))) > 1:
        parser.error("--loader, --padding, --plan and --plan-corpus are separate runs"
                     + (" (--sources too)" if PARTS.run.corpus else "") + ": give one")
    if args.plan is not None and args.plan < 1:
        parser.error(f"--plan {args.plan}: plan at least 1 length")
    mode = "--padding" if args.padding else "--plan" if args.plan else "--plan-corpus" if args.plan_corpus else None
    if mode and not any(MODELS[name].training.variable_length for name in args.models):
        parser.exit(2, f"ERROR: {mode} measures models whose items differ in length (ModelSpec.variable_length): "
                       f"{', '.join(args.models)} {'has' if len(args.models) == 1 else 'have'} items of one length\n")
    if any(w < 0 for w in args.workers):
        parser.error("--workers counts must be >= 0")


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """The command line, checked and completed (models, precisions, device, shapes, step counts); exit 2 if bad."""
    parser = build_parser()
    args = parser.parse_args(argv)
    settle_names(parser, args)
    settle_device_and_size(parser, args)
    check_modes(parser, args)
    return args


def print_table(rows: list[dict]) -> None:
    """The timed rows as a Markdown table."""
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
    """The rows as they are measured: each printed as a JSON line, all rewritten to ``--json`` after every row, with
    ``ratio_vs_reference`` (items/s over the ``--compare`` row's of the same case and mode) where there is one."""

    def __init__(self, json_out: Optional[str], compare: Optional[str]):
        self.json_out, self.rows = json_out, []
        self.reference = {(r["case"], r["mode"]): r for r in json.loads(Path(compare).read_text())
                          if "items_per_s" in r} if compare else {}

    def __call__(self, row: dict) -> None:
        ref = self.reference.get((row["case"], row["mode"]))
        if ref and "items_per_s" in row:
            row["ratio_vs_reference"] = round(row["items_per_s"] / ref["items_per_s"], 3)
        self.rows.append(row)
        print(json.dumps(row), flush=True)
        if self.json_out:
            Path(self.json_out).write_text(json.dumps(self.rows, indent=1))


def chosen_cases(args: argparse.Namespace) -> list[tuple[str, BenchmarkCase]]:
    """The ``(model, case)`` pairs to run: every case of ``--model``'s models, or those ``--cases`` names.

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
    ok = sum(r["ok"] for r in emit.rows)
    print(f"check: {ok} of {len(emit.rows)} rows within their limits", flush=True)
    return 1 if ok < len(emit.rows) else 0


def run(args: argparse.Namespace, device: torch.device, emit: Rows) -> int:
    """The mode the command line asks for (padding, loader, check, or timing the train step); its exit status."""
    if args.padding or args.plan:
        print_batching_table(padding_rows(args, device, args.models, emit) if args.padding else
                             plan_rows(args, args.models, emit))
        return 0
    if args.plan_corpus:
        row = corpus_plan_row(args, args.models, emit)
        print(f"\n{row['utterances']:,} utterances: read {row['read_s']} s, lengths {row['lengths_s']} s, planned "
              f"{row['plan_s']} s (total {row['total_s']} s); peak RSS {row['peak_rss_mib']:,} MiB; a forked worker "
              f"reading every utterance's fields makes {row['worker_own_mib']} MiB its own")
        return 0
    if args.loader:
        print_loader_table(loader_rows(args, device, args.models, emit))
        return 0
    if args.sources:
        print_source_table(source_rows(args, device, args.models, emit))
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
    """Run the benchmark the command line asks for. Returns the exit status (see the module docstring)."""
    args = parse_args(argv)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device: {name} torch {torch.__version__}; threads {torch.get_num_threads()}", flush=True)
    note = (CPU_TINY_PADDING_NOTE if args.size_note == CPU_TINY_NOTE else "") if args.padding else \
        "" if args.plan or args.plan_corpus else args.size_note
    if note:
        print(note, flush=True)
    emit = Rows(args.json_out, args.compare)
    try:
        return run(args, device, emit)
    except (ConfigError, DataError, BenchmarkError, TrainingError) as err:
        print(f"ERROR: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
