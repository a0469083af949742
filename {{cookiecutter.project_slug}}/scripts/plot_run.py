"""One picture of a training run: where it stands and what went wrong, at a glance.

    python -m scripts.plot_run output                  # writes output/run.png
    python -m scripts.plot_run output --out run.png

Panels over one step axis from ``metrics.jsonl``, ``val_metrics.jsonl`` and ``anomalies.jsonl``: loss (anomalies as
red ticks), items/s per rank (flat is right), the share of a step waiting for data (above 10% the accelerator idles),
the gradient norm before clipping (a climb often precedes an explosion), memory per rank, and each phase's named
losses. Exit status 1 with one ``ERROR:`` line when the folder holds no readable ``metrics.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def read_jsonl(path: Path) -> list[dict]:
    """The complete JSON lines of ``path`` (a running job's half-written last line is left out); ``[]`` if none.

    Raises:
        ValueError: a complete line that is not JSON (naming the file and the line number).
    """
    if not path.is_file():
        return []
    text, rows = path.read_text(encoding="utf-8"), []
    for number, line in enumerate(text[:text.rfind("\n") + 1].splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not a JSON line ({err.msg})") from None
    return rows


def series(rows: list[dict], key: str, positive: bool = False) -> tuple[list, list]:
    """``(steps, values)`` of ``row["losses"][key]`` in the rows that have it (``positive``: above zero, for a log
    axis)."""
    found = [(r["step"], r["losses"][key]) for r in rows if r.get("losses", {}).get(key) is not None
             and (not positive or r["losses"][key] > 0)]
    return [step for step, _ in found], [value for _, value in found]


def plot_loss(axis, steps: list, rows: list[dict], val: list[dict], anomalies: list[dict]) -> None:
    """The loss panel: training loss per logged step, validation loss, anomalies as red ticks."""
    axis.plot(steps, [r["loss"] for r in rows], label="train loss", linewidth=1)
    if val:
        axis.plot([v["step"] for v in val], [v["val_loss"] for v in val], "o-", label="validation loss")
    for a in anomalies:
        axis.axvline(a["step"], color="red", alpha=0.4, linewidth=1)
    if anomalies:  # one legend entry for all the ticks
        axis.plot([], [], color="red", label=f"anomalies ({len(anomalies)})")
    axis.set_ylabel("loss")
    axis.legend(loc="upper right")


def plot_throughput_and_wait(axes, steps: list, rows: list[dict]) -> None:
    """Items/s (``axes[0]``) and the data wait's share of each step, with the dashed 10% line (``axes[1]``)."""
    axes[0].plot(steps, [r.get("items_per_s", 0.0) for r in rows], linewidth=1)
    axes[0].set_ylabel("items/s")
    share = [100 * r["data_time_s"] / r["step_time_s"] if r.get("step_time_s") else 0.0 for r in rows]
    axes[1].plot(steps, share, linewidth=1)
    axes[1].axhline(10, color="gray", linestyle="--", linewidth=1)
    axes[1].set_ylabel("data wait, % of step")
    axes[1].set_ylim(0, 100)


def plot_grad_norm(axis, rows: list[dict], phase_norms: list[str]) -> None:
    """The gradient-norm panel (log scale): one line per phase (``grad_norm_<phase>``), or the one norm."""
    if phase_norms:
        for key in phase_norms:
            axis.semilogy(*series(rows, key, positive=True), linewidth=1, label=key[len("grad_norm_"):])
        axis.legend(loc="upper right")
    else:
        norms = [(r["step"], r["grad_norm"]) for r in rows if r.get("grad_norm") is not None and r["grad_norm"] > 0]
        if norms:
            axis.semilogy(*zip(*norms), linewidth=1)
    axis.set_ylabel("gradient norm")


def plot_extra_panels(axes, rows: list[dict], memory: list[dict], phase_losses: list[str], metrics: list[str]) -> None:
    """The panels after the first four, in order: memory per rank (when rows carry it), every phase's loss (when
    there are phases), one per named loss or metric."""
    axes = iter(axes)
    if memory:
        axis = next(axes)
        for rank in range(len(memory[0]["memory_gib"])):
            axis.plot([r["step"] for r in memory], [r["memory_gib"][rank] for r in memory], label=f"rank {rank}")
        axis.set_ylabel("peak memory, GiB")
        axis.legend(loc="upper right")
    if phase_losses:
        axis = next(axes)
        for key in phase_losses:
            axis.plot(*series(rows, key), linewidth=1, label=key[len("loss_"):])
        axis.set_ylabel("loss per phase")
        axis.legend(loc="upper right")
    for key, axis in zip(metrics, axes):
        axis.plot(*series(rows, key), linewidth=1)
        axis.set_ylabel(key)


def plot_run(output_dir: Path, out: Path) -> Path:
    """Draw the run in ``output_dir`` into the PNG ``out``; returns ``out``.

    Raises:
        ValueError: no ``metrics.jsonl`` rows, or a damaged line in one of the files.
    """
    rows = read_jsonl(output_dir / "metrics.jsonl")
    if not rows:
        raise ValueError(f"{output_dir / 'metrics.jsonl'}: no logged steps (is {output_dir} a train.py output "
                         "folder?)")
    val, anomalies = read_jsonl(output_dir / "val_metrics.jsonl"), read_jsonl(output_dir / "anomalies.jsonl")
    steps = [r["step"] for r in rows]
    memory = [r for r in rows if r.get("memory_gib")]
    named = list(dict.fromkeys(key for r in rows for key in r.get("losses", {})))
    phase_losses = [key for key in named if key.startswith("loss_")]
    phase_norms = [key for key in named if key.startswith("grad_norm_")]
    metrics = [key for key in named if key not in phase_losses and key not in phase_norms]
    panels = 4 + bool(memory) + bool(phase_losses) + len(metrics)
    figure = Figure(figsize=(10, 2.4 * panels))
    FigureCanvasAgg(figure)
    axes = figure.subplots(panels, 1, sharex=True)
    plot_loss(axes[0], steps, rows, val, anomalies)
    plot_throughput_and_wait(axes[1:3], steps, rows)
    plot_grad_norm(axes[3], rows, phase_norms)
    plot_extra_panels(axes[4:], rows, memory, phase_losses, metrics)
    axes[-1].set_xlabel("step")
    figure.suptitle(f"{output_dir}: {len(rows)} logged steps, last step {steps[-1]}")
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100)
    return out


def main(argv: list[str] | None = None) -> int:
    """Plot the run the command line names. Returns the exit status: 0, or 1 after one ``ERROR:`` line."""
    parser = argparse.ArgumentParser(description="Plot a train.py run (loss, throughput, data wait, gradient "
                                                 "norm, memory) into one PNG.")
    parser.add_argument("output_dir", type=Path, help="the run's --output-dir")
    parser.add_argument("--out", type=Path, help="the PNG to write (default: OUTPUT_DIR/run.png)")
    args = parser.parse_args(argv)
    out = args.out or args.output_dir / "run.png"
    if out.suffix.lower() != ".png":
        print(f"ERROR: --out {out}: give a file name ending in .png", file=sys.stderr)
        return 1
    try:
        plot_run(args.output_dir, out)
    except (ValueError, OSError) as err:
        print(f"ERROR: {err}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
