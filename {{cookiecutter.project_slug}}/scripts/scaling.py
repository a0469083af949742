"""More processes, more speed? The same short training on 1, 2, ... N processes, side by side.

    python -m scripts.scaling --model NAME --dataset-path data/LJSpeech-1.1             # 1, 2, 4, ... GPUs
    python -m scripts.scaling --model NAME --dataset-path DIR --procs 1 2 --tiny --steps 20  # CPU try

Per process count P, ``multiproc.py --nproc-per-node P train.py`` runs into ``OUT/procs_P``; items/s after ``--skip``
steps are averaged (weak scaling). Prints items/s, speed-up and efficiency, writes ``OUT/scaling.json`` and
``OUT/scaling.png``. Far below 100%? See ``collective_wait_s`` and ``data_wait_s`` per rank in ``metrics.jsonl``.
A failed run: one ``ERROR:`` line, exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

if not __package__:  # run by its path, not as python -m scripts.NAME: the project's modules would not import
    sys.exit(f"ERROR: run this tool from the project folder as: python -m scripts.{Path(__file__).stem} ...")

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from tqdm import tqdm

from utils.run_log import bar_options

ROOT = Path(__file__).resolve().parents[1]

POLL_S = 0.5  # seconds between two looks at a running job's metrics.jsonl (for the progress bar)
REDRAW_S = 10.0  # seconds without a new step after which the bar is drawn again anyway (its clock moves)


def logged_rows(metrics: Path, offset: int) -> list[dict]:
    """The complete JSON lines of ``metrics`` after byte ``offset`` (a line still being written is left out)."""
    if not metrics.is_file():
        return []
    with open(metrics, "rb") as handle:
        handle.seek(offset)
        text = handle.read().decode("utf-8", errors="replace")
    return [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines() if line.strip()]


def measure(procs: int, args: argparse.Namespace, out: Path) -> float:
    """Items/s of one run on ``procs`` processes (mean over the logged steps after ``args.skip``), its output in
    ``out/launcher.log``, a tqdm bar following its steps. Raises RuntimeError: the run failed, or logged no step after
    ``args.skip``."""
    cmd = [sys.executable, str(ROOT / "multiproc.py"), "--nproc-per-node", str(procs), "--log-dir",
           str(out / "logs"), str(ROOT / "train.py"), "--config", args.config, "--model", args.model,
           "--dataset-path", args.dataset_path, "--output-dir", str(out), "--max-steps", str(args.steps),
           "--resume", "none", "--set", "train.log_interval=1", "--set", f"train.checkpoint_interval={args.steps}",
           "--set", f"train.val_interval={args.steps}", *(["--tiny"] if args.tiny else []),
           *(x for s in args.set for x in ("--set", s))]
    out.mkdir(parents=True, exist_ok=True)
    metrics, log = out / "metrics.jsonl", out / "launcher.log"
    offset = metrics.stat().st_size if metrics.is_file() else 0
    with (open(log, "w") as handle,
          tqdm(total=args.steps, desc=f"{procs} process(es)", unit="step", **bar_options(leave=False)) as bar):
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            finished, drawn = False, time.monotonic()
            while not finished:  # one last look after the job ends: the steps it logged since the one before
                finished = proc.poll() is not None
                new_steps = max([r["step"] for r in logged_rows(metrics, offset)], default=0) - bar.n
                if new_steps > 0:
                    bar.update(new_steps)
                    drawn = time.monotonic()
                elif time.monotonic() - drawn >= REDRAW_S:  # a slow start (compilation) still shows the clock
                    bar.refresh()
                    drawn = time.monotonic()
                if not finished:
                    time.sleep(POLL_S)
        finally:
            if proc.poll() is None:  # interrupted: the launcher stops its ranks on SIGTERM
                proc.terminate()
                proc.wait()
    if proc.returncode != 0:
        print("\n".join(log.read_text(errors="replace").strip().splitlines()[-5:]), file=sys.stderr)
        raise RuntimeError(f"the run on {procs} process(es) exited {proc.returncode} (its last lines are above; "
                           f"all of it: {log})")
    timed = [r["items_per_s"] for r in logged_rows(metrics, offset) if r["step"] > args.skip]
    if not timed:
        raise RuntimeError(f"the run on {procs} process(es) logged no step after --skip {args.skip}")
    return sum(timed) / len(timed)


def plot(results: list[dict], path: Path) -> None:
    """items/s against processes, with the ideal line, into the PNG ``path``."""
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
    axes.set(xlabel="processes", ylabel="items/s (all processes)", xticks=procs)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    """Run the runs the command line asks for, print and write their items/s. Returns the exit status."""
    parser = argparse.ArgumentParser(description="Items/s and scaling efficiency of train.py on 1..N processes.")
    parser.add_argument("--model", required=True, help="a registered model (models/__init__.py)")
    parser.add_argument("--dataset-path", required=True)
    parser.add_argument("--config", default=str(ROOT / "config.json"))
    parser.add_argument("--procs", type=int, nargs="+", help="process counts (default: 1, 2, 4, ... GPUs)")
    parser.add_argument("--steps", type=int, default=50, help="optimizer steps per run (default 50)")
    parser.add_argument("--skip", type=int, default=10, help="first steps left out of the average (default 10)")
    parser.add_argument("--tiny", action="store_true", help="the config's tiny block (a CPU try)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--out", type=Path, default=Path("scaling"), help="output folder (default: scaling)")
    args = parser.parse_args(argv)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0  # default: 1, 2, 4, ... and every GPU
    procs = sorted(set(args.procs or ([1, 2] if gpus < 2 else [*(2 ** i for i in range(gpus.bit_length())), gpus])))
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
