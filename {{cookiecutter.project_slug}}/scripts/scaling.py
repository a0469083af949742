"""More processes, more speed? The same short training on 1, 2, ... N processes, side by side.

    python scripts/scaling.py --model NAME --dataset-path data/LJSpeech-1.1             # 1, 2, 4, ... GPUs
    python scripts/scaling.py --model NAME --dataset-path DIR --procs 1 2 --tiny --steps 20  # CPU try

For each process count, ``multiproc.py --nproc-per-node P train.py --max-steps STEPS`` runs into
``OUT/procs_P`` (``--resume none``: every run starts fresh), then the items/s of its logged steps after the
first ``--skip`` (start-up, compilation, the first batches) are averaged. Each process keeps the model
section's batch size, so the global batch grows with P (weak scaling, as data parallelism is used).

Prints one row per process count: items/s, speed-up over the smallest count, and scaling efficiency
(items/s / (P x items/s per process of the smallest count); 100% is perfect), writes ``OUT/scaling.json``
and ``OUT/scaling.png`` (items/s against processes, with the ideal line). Where efficiency falls far below
100%, look at the run's ``collective_wait_s`` and ``data_wait_s`` per rank (``scripts/plot_run.py``).

Exit status 1 with one ``ERROR:`` line when a run fails (its last output lines are shown above it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def default_procs() -> list[int]:
    """1, 2, 4, ... up to the visible GPUs (and that count itself); ``[1, 2]`` without CUDA."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < 2:
        return [1, 2]
    counts = [1]
    while counts[-1] * 2 <= gpus:
        counts.append(counts[-1] * 2)
    return counts if counts[-1] == gpus else [*counts, gpus]


def measure(procs: int, args: argparse.Namespace, out: Path) -> float:
    """Items/s of one run on ``procs`` processes (mean over the logged steps after ``args.skip``).

    Raises:
        RuntimeError: the run failed, or logged no step after ``args.skip``.
    """
    cmd = [sys.executable, str(ROOT / "multiproc.py"), "--nproc-per-node", str(procs), "--log-dir",
           str(out / "logs"), str(ROOT / "train.py"), "--config", args.config, "--model", args.model,
           "--dataset-path", args.dataset_path, "--output-dir", str(out), "--max-steps", str(args.steps),
           "--resume", "none", "--set", "train.log_interval=1", "--set", f"train.checkpoint_interval={args.steps}",
           "--set", f"train.val_interval={args.steps}", *(["--tiny"] if args.tiny else []),
           *(x for s in args.set for x in ("--set", s))]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if done.returncode != 0:
        print("\n".join((done.stdout + done.stderr).strip().splitlines()[-5:]), file=sys.stderr)
        raise RuntimeError(f"the run on {procs} process(es) exited {done.returncode} (its last lines are above; "
                           f"all of it: {out})")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    timed = [r["items_per_s"] for r in rows if r["step"] > args.skip]
    if not timed:
        raise RuntimeError(f"the run on {procs} process(es) logged no step after --skip {args.skip}")
    return sum(timed) / len(timed)


def plot(results: list[dict], path: Path) -> None:
    """items/s against processes, with the ideal line, into the PNG ``path``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 4))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    procs = [r["procs"] for r in results]
    base = results[0]["items_per_s"] / results[0]["procs"]
    axes.plot(procs, [base * p for p in procs], "--", color="gray", label="ideal (linear)")
    axes.plot(procs, [r["items_per_s"] for r in results], "o-", label="measured")
    for r in results:
        axes.annotate(f"{100 * r['efficiency']:.0f}%", (r["procs"], r["items_per_s"]), textcoords="offset points",
                      xytext=(4, -12))
    axes.set_xlabel("processes")
    axes.set_ylabel("items/s (all processes)")
    axes.set_xticks(procs)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Items/s and scaling efficiency of train.py on 1..N processes.")
    parser.add_argument("--model", required=True, help="a model registered in model.py")
    parser.add_argument("--dataset-path", required=True)
    parser.add_argument("--config", default=str(ROOT / "config.json"))
    parser.add_argument("--procs", type=int, nargs="+", help="process counts (default: 1, 2, 4, ... GPUs)")
    parser.add_argument("--steps", type=int, default=50, help="optimizer steps per run (default 50)")
    parser.add_argument("--skip", type=int, default=10, help="first steps left out of the average (default 10)")
    parser.add_argument("--tiny", action="store_true", help="the config's tiny block (a CPU try)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--out", type=Path, default=Path("scaling"), help="output folder (default: scaling)")
    args = parser.parse_args(argv)
    procs = sorted(set(args.procs or default_procs()))
    if procs[0] < 1 or args.steps <= args.skip or args.skip < 0:
        print(f"ERROR: need process counts >= 1 and 0 <= --skip < --steps (got {procs}, --skip {args.skip}, "
              f"--steps {args.steps})", file=sys.stderr)
        return 1
    results = []
    print(f"{'procs':>5}  {'items/s':>12}  {'speed-up':>8}  {'efficiency':>10}")
    try:
        for p in procs:
            items = measure(p, args, args.out / f"procs_{p}")
            first = results[0] if results else {"procs": p, "items_per_s": items}
            row = {"procs": p, "items_per_s": items, "speedup": items / first["items_per_s"],
                   "efficiency": items / (first["items_per_s"] / first["procs"] * p)}
            results.append(row)
            print(f"{p:>5}  {items:>12.1f}  {row['speedup']:>7.2f}x  {100 * row['efficiency']:>9.0f}%", flush=True)
    except RuntimeError as err:
        print(f"ERROR: {err}", file=sys.stderr)
        return 1
    (args.out / "scaling.json").write_text(json.dumps(results, indent=2))
    plot(results, args.out / "scaling.png")
    print(f"wrote {args.out / 'scaling.json'} and {args.out / 'scaling.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
