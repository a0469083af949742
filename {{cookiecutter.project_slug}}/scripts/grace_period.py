"""How long a stop takes: SIGTERM to a running job, then the seconds until its checkpoint is durable and until it
has exited. Set the platform's grace period (Kubernetes' ``terminationGracePeriodSeconds``, 30 s by default) and
``multiproc.py --stop-timeout`` from these numbers.

    python -m scripts.grace_period [--after-steps 5] [--json FILE] [-- launcher options] -- train.py's arguments
    python -m scripts.grace_period -- --config config.json --model NAME --dataset-path data/LJSpeech-1.1
    python -m scripts.grace_period --launcher="--nproc-per-node 2" -- --config config.json --tiny

Runs ``python multiproc.py [launcher options] train.py ARGS`` into a temporary ``--output-dir``, sends the launcher
SIGTERM once ``--after-steps`` steps are logged, and times until ``checkpoint_last`` is in place and every process is
gone. Exits 1 when the job failed, was killed, printed a traceback, or saved nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def logged_steps(output_dir: Path) -> int:
    """The last step in ``metrics.jsonl`` (0 before the first row)."""
    try:
        lines = (output_dir / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return 0
    return max((json.loads(line)["step"] for line in lines if line.strip().endswith("}")), default=0)


def durable_checkpoint(output_dir: Path, newer_than: float) -> Path | None:
    """The run's last checkpoint when put in place after ``newer_than`` (wall-clock seconds), else ``None``."""
    for path in (output_dir / "checkpoint_last", output_dir / "checkpoint_last.pt"):
        try:
            if os.lstat(path).st_mtime >= newer_than and path.exists():
                return path
        except FileNotFoundError:
            continue
    return None


def size_of(path: Path) -> int:
    """Bytes of a checkpoint file, or of every file of a sharded checkpoint's folder."""
    path = path.resolve()
    return path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def measure(train_args: list[str], launcher: list[str], output_dir: Path, after_steps: int, timeout_s: float) -> dict:
    """Run the job, SIGTERM it after ``after_steps`` logged steps and time the stop. Raises RuntimeError: the job ended
    before ``after_steps``, or did not reach it or stop within ``timeout_s``."""
    cmd = [sys.executable, "multiproc.py", *launcher, "train.py", *train_args, "--output-dir", str(output_dir),
           "--set", "train.log_interval=1", "--set", "train.checkpoint_interval=1000000000"]
    print("running:", shlex.join(cmd), flush=True)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout_s
    try:
        while logged_steps(output_dir) < after_steps:
            if proc.poll() is not None:
                reader.join(5)
                raise RuntimeError(f"the job ended (exit code {proc.returncode}) before step {after_steps}:\n"
                                   + "".join(output[-30:]))
            if time.monotonic() > deadline:
                raise RuntimeError(f"step {after_steps} not reached within {timeout_s:g} s")
            time.sleep(0.05)
        sent_wall, sent = time.time(), time.monotonic()
        proc.send_signal(signal.SIGTERM)
        durable_s = None
        while proc.poll() is None or durable_s is None:
            if durable_s is None and durable_checkpoint(output_dir, sent_wall - 1.0) is not None:
                durable_s = time.monotonic() - sent
            if proc.poll() is not None and durable_s is None:
                break
            if time.monotonic() > sent + timeout_s:
                raise RuntimeError(f"the job had not stopped {timeout_s:g} s after SIGTERM")
            time.sleep(0.02)
        exit_s = time.monotonic() - sent
        reader.join(10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = "".join(output)
    stopped = [line for line in text.splitlines() if "stopped at step" in line]
    checkpoint = durable_checkpoint(output_dir, 0.0)
    result = {"train_args": train_args, "launcher": launcher, "after_steps": after_steps,
              "stopped_at_step": int(stopped[-1].split("stopped at step")[1].split()[0]) if stopped else None,
              "sigterm_to_durable_s": None if durable_s is None else round(durable_s, 2),
              "sigterm_to_exit_s": round(exit_s, 2), "exit_code": proc.returncode,
              "checkpoint_bytes": size_of(checkpoint) if checkpoint is not None else None,
              "traceback": "Traceback" in text}
    if durable_s is not None:
        result["suggested_stop_timeout_s"] = int(1.5 * exit_s + 5)
        result["suggested_grace_period_s"] = result["suggested_stop_timeout_s"] + 5
    result["output_tail"] = text.splitlines()[-5:]
    return result


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage
        self.exit(2, f"grace_period: ERROR: {message}\n")


def main(argv: list[str] | None = None) -> int:
    """Time a stop of the job the command line describes. Returns the exit status (see the module; 2 without ``--``)."""
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    parser = _Parser(prog="python -m scripts.grace_period", description=__doc__.split("\n\n")[0],
                     usage="%(prog)s [options] -- train.py's arguments")
    parser.add_argument("--after-steps", type=int, default=5, help="steps logged before the SIGTERM (default 5)")
    parser.add_argument("--launcher", default="",
                        help="multiproc.py's options, one quoted string: --launcher=\"--nproc-per-node 2\"")
    parser.add_argument("--output-dir", help="the job's output folder (default: a temporary one, removed after)")
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="seconds to wait for the steps, and again for the stop (default 1800)")
    parser.add_argument("--json", type=Path, help="write the result here (its folder must exist)")
    args = parser.parse_args(argv[:split])  # --help: printed, exit 0
    if "--" not in argv:
        print("grace_period: ERROR: give train.py's arguments after --, e.g. -- --config config.json --model NAME",
              file=sys.stderr)
        return 2
    if args.after_steps < 1:
        parser.error(f"--after-steps must be >= 1, got {args.after_steps}")
    if args.json is not None and (not args.json.parent.is_dir() or args.json.is_dir()):  # before minutes of measuring
        parser.error(f"--json {args.json}: " + ("a folder, not a file" if args.json.is_dir() else
                                                f"the folder {args.json.parent} does not exist"))
    with tempfile.TemporaryDirectory(prefix="grace_period.") as tmp:
        output_dir = Path(args.output_dir or Path(tmp) / "run").resolve()
        try:
            result = measure(argv[split + 1:], shlex.split(args.launcher), output_dir, args.after_steps, args.timeout)
        except RuntimeError as err:
            print(f"grace_period: ERROR: {err}", file=sys.stderr)
            return 1
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    if result["sigterm_to_durable_s"] is None or result["traceback"]:
        print(f"grace_period: ERROR: after SIGTERM at step {result['stopped_at_step']} the job "
              f"{'printed a traceback' if result['traceback'] else 'saved no checkpoint'} (exit code "
              f"{result['exit_code']}):\n" + "\n".join(result["output_tail"]), file=sys.stderr)
        return 1
    print(f"SIGTERM after step {args.after_steps}: stopped at step {result['stopped_at_step']}, checkpoint durable "
          f"after {result['sigterm_to_durable_s']:.1f} s ({result['checkpoint_bytes'] / 1e6:.1f} MB), every process "
          f"gone after {result['sigterm_to_exit_s']:.1f} s, exit code {result['exit_code']}; give multiproc.py "
          f"--stop-timeout {result['suggested_stop_timeout_s']} and the platform's grace period "
          f"{result['suggested_grace_period_s']} s or more")
    return 0 if result["exit_code"] in (0, 128 + signal.SIGTERM) else 1


if __name__ == "__main__":
    sys.exit(main())
