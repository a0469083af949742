"""Start one training process per GPU: a thin front over torchrun (``torch.distributed.run``).

Usage (the whole story: docs/manual.md)::

    python multiproc.py [--nproc-per-node N] [--log-dir logs] [--max-restarts K] train.py [args...]
    python multiproc.py --nnodes 2 --node-rank R --master-addr HOST [--master-port P] train.py ...
    python multiproc.py [options] -m scripts.NAME [args...]        # a module, as python -m runs it

Rank 0 prints here, rank r > 0 into ``<log-dir>/rank_<r>.*``; a failed rank is named with its log, and its exit code
is ours. torchrun runs in a thread while the main thread passes stop signals on to every rank and waits while rank 0
saves (torchrun kills the ranks after 30 s). Source: https://pytorch.org/docs/stable/elastic/run.html
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.util
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch
from torch.distributed import DistError, TCPStore
from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing import LogsDest, LogsSpecs
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import elastic_launch

from parts import PARTS
from utils.launch import check_not_launched
from utils.run import StopForwarder, stop_exit_code
from utils.run_log import one_line

ROOT = Path(__file__).resolve().parent  # the project's folder: a script in it is imported by its dotted name
DEFAULT_STOP_TIMEOUT_S = 25.0  # grace period after a stop signal: inside Kubernetes' 30 s, with time for our own exit


class RankLogs(LogsSpecs):
    """Torchrun log layout: global rank 0 on the console, rank r > 0 in ``<log_dir>/rank_<r>.stdout.log`` and
    ``.stderr.log`` (restart k > 0: ``rank_<r>.attempt<k>.*``); error records in ``rank_<r>.error.json``."""

    def __init__(self, log_dir: str):
        super().__init__(log_dir=log_dir)
        self.paths: dict[int, str] = {}  # global rank -> its latest stderr log

    @property
    def root_log_dir(self) -> str:
        return str(self._root_log_dir)

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        """Log paths for each local rank; also sets each worker's ``TORCHELASTIC_ERROR_FILE``."""
        os.makedirs(self._root_log_dir, exist_ok=True)
        dest = LogsDest()
        for local_rank, env in envs.items():
            rank, attempt = env["RANK"], int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
            stem = os.path.join(self._root_log_dir, f"rank_{rank}" + (f".attempt{attempt}" if attempt else ""))
            dest.error_files[local_rank] = env["TORCHELASTIC_ERROR_FILE"] = stem + ".error.json"
            Path(stem + ".error.json").unlink(missing_ok=True)  # a stale one would be read as this run's
            if rank == "0":  # "" = inherit the launcher's console
                dest.stdouts[local_rank] = dest.stderrs[local_rank] = ""
            else:
                dest.stdouts[local_rank] = stem + ".stdout.log"
                dest.stderrs[local_rank] = self.paths[int(rank)] = stem + ".stderr.log"
        return dest


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line instead of usage + message
        self.exit(2, f"multiproc: ERROR: {message}\n")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """multiproc's own options, checked, those left out filled from the platform's variables (``PARTS.platforms``, where
    present), and the script's arguments verbatim; a bad option exits with one ``multiproc: ERROR:`` line."""
    p = _Parser(prog="multiproc.py", description=__doc__.split("\n")[0])
    platforms = PARTS.platforms  # the help names Kubernetes where the project runs there
    p.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=None,
                   help="processes on this node (default: visible GPUs, or 2 without CUDA)")
    p.add_argument("--nnodes", type=int, default=1, help="number of nodes (default 1)")
    p.add_argument("--node-rank", "--node_rank", type=int, default=0, help="this node's rank")
    p.add_argument("--master-addr", "--master_addr", default=None, help="host of node 0 (required with --nnodes > 1)")
    p.add_argument("--master-port", "--master_port", type=int, default=None,
                   help="rendezvous port (default: a free one; 29500 with --nnodes > 1)")
    p.add_argument("--standalone", action="store_true",
                   help="single node on localhost (the default when --nnodes is 1)")
    p.add_argument("--max-restarts", "--max_restarts", type=int, default=0,
                   help="restart the whole group up to K times after a failure (default 0)")
    p.add_argument("--log-dir", "--log_dir", default="logs", help="where ranks > 0 log (logs/)")
    p.add_argument("--rdzv-timeout", type=float, default=300.0,
                   help="seconds to wait for the other nodes (--nnodes > 1) before giving up (default 300)")
    p.add_argument("--stop-timeout", type=float, default=DEFAULT_STOP_TIMEOUT_S,
                   help="grace period: seconds the ranks get to stop (and save) after a stop signal before they are "
                        f"killed (default {DEFAULT_STOP_TIMEOUT_S:g}"
                        + (", inside Kubernetes' default 30 s)" if platforms else ")"))
    p.add_argument("--stop-exit-code", type=int, default=None,
                   help="exit code after a stop signal the ranks obeyed (default: 128 + the signal inside "
                        + ("Kubernetes, where 0 would mark the job complete" if platforms else "an orchestrator's pod")
                        + "; 0 elsewhere; 130 after Ctrl-C)")
    p.add_argument("-m", "--module", action="store_true",
                   help="the script is a module name, run as python -m does (python multiproc.py -m scripts.NAME ...)")
    p.add_argument("script", help="the training script (a .py file, or with -m a module name)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments, untouched")
    args = p.parse_args(argv)
    try:
        if platforms is None:
            check_not_launched(os.environ)
        args.platform = platforms.fill_launch_options(args, argv, os.environ) if platforms else ""
    except ValueError as err:
        p.error(str(err))
    _check_args(p, args, platforms)
    args.master_addr = args.master_addr or "127.0.0.1"  # one node: --nnodes > 1 was checked to give it
    if args.nnodes > 1:
        args.master_port = args.master_port or 29500
    return args


def _check_args(parser: _Parser, args: argparse.Namespace, platforms) -> None:
    """Exit for the first option out of range or contradiction; fills the default ``--nproc-per-node``."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if args.nproc_per_node is None:
        args.nproc_per_node = gpus or 2
    nproc, nnodes, port, code = args.nproc_per_node, args.nnodes, args.master_port, args.stop_exit_code
    checks = [
        (nproc < 1, f"--nproc-per-node must be >= 1, got {nproc}"),
        (gpus and nproc > gpus, f"--nproc-per-node {nproc} but only {gpus} GPU(s) are visible"),
        (nnodes < 1 or not 0 <= args.node_rank < nnodes,
         f"--node-rank {args.node_rank} must be in 0..{nnodes - 1} (--nnodes {nnodes})"),
        (args.standalone and nnodes != 1, "--standalone means one node; drop --nnodes"),
        (port is not None and not 0 < port < 65536, f"--master-port must be in 1..65535, got {port}"),
        (nnodes > 1 and not args.master_addr, f"--nnodes {nnodes} needs --master-addr (the host of node 0)"
         + (f", or a platform's variable: {platforms.MASTER_ADDR_VARIABLES}; none gave it" if platforms else "")),
        (args.max_restarts < 0, f"--max-restarts must be >= 0, got {args.max_restarts}"),
        *((not 0 < seconds < float("inf"), f"--{name} must be a positive number of seconds, got {seconds}")
          for name, seconds in (("rdzv-timeout", args.rdzv_timeout), ("stop-timeout", args.stop_timeout))),
        (code is not None and not 0 <= code < 256, f"--stop-exit-code must be in 0..255, got {code}"),
        (os.path.exists(args.log_dir) and not os.path.isdir(args.log_dir),
         f"--log-dir {args.log_dir} exists and is not a directory"),
        (not args.module and not os.path.isfile(args.script), f"training script not found: {args.script}"),
        (args.module and importlib.util.find_spec(args.script.split(".")[0]) is None,
         f"module not found: {args.script} (run multiproc.py from the project's folder)")]
    for failed, message in checks:
        if failed:
            parser.error(message)


class RendezvousError(RuntimeError):
    """The nodes did not all check in, or the rendezvous port cannot be used (one line)."""


def rendezvous(args: argparse.Namespace) -> TCPStore:
    """The job's rendezvous store, multi-tenant (torchrun's static rendezvous reuses it) and held to the end so that no
    other program takes the port: node 0's (one node without ``--master-port``: a port the kernel picks, set in
    ``args``), every node checked in within ``--rdzv-timeout``; c10d's C++ trace of a failed connect silenced. Raises
    RendezvousError naming what failed."""
    where = f"{args.master_addr}:{args.master_port}"
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
        store = TCPStore(args.master_addr, args.master_port or 0, None, args.node_rank == 0,
                         datetime.timedelta(seconds=args.rdzv_timeout), wait_for_workers=False, multi_tenant=True)
    except (DistError, RuntimeError) as err:
        reason = one_line(err).strip()
        if args.nnodes == 1 and ("EADDRINUSE" in reason or "address already in use" in reason.lower()):
            raise RendezvousError(f"--master-port {args.master_port} is in use on {args.master_addr} (another job "
                                  "listens there); leave --master-port out to take a free port, or choose another one")
        if args.nnodes == 1:
            raise RendezvousError(f"cannot listen on {args.master_addr}:{args.master_port or 0}: {reason}") from err
        if args.node_rank == 0:
            raise RendezvousError(f"rendezvous on {where} failed: {reason}") from err
        raise RendezvousError(f"node {args.node_rank}: node 0 did not answer at {where} within {args.rdzv_timeout:g} s "
                              f"(start it with --node-rank 0 --master-addr {args.master_addr} --master-port "
                              f"{args.master_port}; check the address and the firewall): {reason}") from err
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    if args.nnodes == 1:
        args.master_port = store.port
        return store
    if store.add(f"multiproc/node_{args.node_rank}", 1) > 1:
        raise RendezvousError(f"rendezvous on {where}: --node-rank {args.node_rank} was given to two nodes")
    joined = store.add("multiproc/joined", 1)
    deadline = time.monotonic() + args.rdzv_timeout
    while joined < args.nnodes:
        if time.monotonic() > deadline:
            raise RendezvousError(f"rendezvous on {where}: {joined} of {args.nnodes} nodes joined within "
                                  f"{args.rdzv_timeout:g} s; start the others with --nnodes {args.nnodes} "
                                  f"--master-addr {args.master_addr} --master-port {args.master_port} and their own "
                                  "--node-rank")
        time.sleep(0.5)
        joined = store.add("multiproc/joined", 0)
    return store


def last_error_line(log_path: str | None) -> str:
    """``": <what it said>"`` from the last ``ERROR:`` line of a rank's stderr log, or ``""``."""
    try:
        lines = Path(log_path).read_text(errors="replace").splitlines() if log_path else []
    except OSError:
        return ""
    errors = [line for line in lines if line.startswith("ERROR: ")]
    return f": {errors[-1][len('ERROR: '):]}" if errors else ""


def run_agent(config, entrypoint, cmd_args: list[str], stop: StopForwarder):
    """torchrun's ``elastic_launch`` in a thread while the main thread handles stop signals; returns or raises as it."""
    outcome: dict = {}

    def agent() -> None:
        try:
            outcome["result"] = elastic_launch(config=config, entrypoint=entrypoint)(*cmd_args)
        except Exception as err:  # noqa: BLE001 - handed to the main thread, which reports or re-raises it
            outcome["error"] = err
    # torchrun warns that it installs no signal handlers off the main thread: StopForwarder does that work.
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(
        lambda record: "child thread" not in record.getMessage())
    thread = threading.Thread(target=agent, name="torchrun-agent", daemon=True)
    stop.install()
    thread.start()
    while thread.is_alive():
        thread.join(0.2)
        stop.enforce()
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("result")


def preflight(script: str, script_args: list[str], module: bool = False) -> str | None:
    """The script's own check of its command line (a top-level ``def check_command_line``): its error line, or
    ``None``. Imported, never run; a file outside this project, or without that function, is not imported."""
    if module:
        name = script
    else:
        path = Path(script).resolve()
        if "\ndef check_command_line(" not in path.read_text(errors="replace") or not path.is_relative_to(ROOT):
            return None
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    checker = getattr(importlib.import_module(name), "check_command_line", None)  # noqa: TID251 - the command line's
    return checker(list(script_args)) if callable(checker) else None


def torchrun_config(args: argparse.Namespace):
    """torchrun's ``(config, entrypoint, arguments)`` from its own parser, and the :class:`RankLogs` in the config; sets
    the variables the ranks read. torchrun's own log records go to ``<log-dir>/launcher.log``, not the console."""
    torchrun_argv = ["--nnodes", str(args.nnodes), "--node-rank", str(args.node_rank), "--nproc-per-node",
                     str(args.nproc_per_node), "--rdzv-backend", "static", "--master-addr", args.master_addr,
                     "--master-port", str(args.master_port), "--max-restarts", str(args.max_restarts), "--log-dir",
                     args.log_dir, *(["--module"] if args.module else []), args.script, *args.script_args]
    if args.nproc_per_node > 1:  # what torchrun does anyway, without its warning banner
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ["MULTIPROC_PID"] = str(os.getpid())  # the ranks check it (utils.launch.die_with_launcher)
    os.environ["MULTIPROC_STOP_TIMEOUT"] = f"{args.stop_timeout:g}"  # train.py warns when a save cannot fit
    config, entrypoint, cmd_args = torchrun.config_from_args(torchrun.parse_args(torchrun_argv))
    os.makedirs(args.log_dir, exist_ok=True)
    handler = logging.FileHandler(os.path.join(args.log_dir, "launcher.log"))
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger("torch.distributed.elastic").addHandler(handler)
    logging.getLogger("torch.distributed.elastic").propagate = False
    config.logs_specs = logs = RankLogs(args.log_dir)
    return config, entrypoint, cmd_args, logs


def failed_rank_status(err: ChildFailedError, logs: RankLogs) -> int:
    """Say which rank failed, with its ``ERROR:`` line (recorded by :func:`utils.launch.record_failure`, else its log's
    last) and its log, and return its exit code (1 for a signal). Ranks torchrun stopped (SIGTERM, SIGKILL) are not
    causes; a rank that merely lost a peer in a collective is named with the first cause's error."""
    records = {r: err.failures[r].error_file_data for r in sorted(err.failures)}
    said = {r: f": {record['message']}" if "lost_peer" in record else last_error_line(logs.paths.get(r))
            for r, record in records.items()}
    # A rank that recorded an error of its own (lost_peer None) is a cause, even if torchrun stopped it in its teardown.
    killed = (-signal.SIGTERM, -signal.SIGKILL)
    causes = [r for r, record in records.items()
              if err.failures[r].exitcode not in killed or record.get("lost_peer", 0) is None]
    stopped = [r for r in sorted(err.failures) if r not in causes]
    first = [r for r in causes if not records[r].get("lost_peer")]
    for rank in causes or stopped:
        if records[rank].get("lost_peer") and first:
            said[rank] = f": it lost its peer in {records[rank]['lost_peer']} when rank {first[0]} failed" + said[first[0]]
        print(f"multiproc: rank {rank} failed (exit code {err.failures[rank].exitcode}){said[rank]}; its "
              f"log: {logs.paths.get(rank, 'the console above')}", file=sys.stderr, flush=True)
    if causes and stopped:
        print(f"multiproc: stopped the other rank(s): {stopped}", file=sys.stderr, flush=True)
    exitcode = err.failures[(first or causes or stopped)[0]].exitcode
    return exitcode if 0 < exitcode < 256 else 1


def main(argv: list[str] | None = None) -> int:
    """Run the job; returns 0 (after a stop signal :func:`stop_exit_code`), the failed rank's exit code, 128 + the
    signal when the ranks had to be killed, or 1 when the check or the rendezvous fails."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if (problem := preflight(args.script, args.script_args, args.module)) is not None:
        print(f"multiproc: ERROR: {problem}", file=sys.stderr, flush=True)
        return 1
    world = args.nnodes * args.nproc_per_node
    where = f"node {args.node_rank} of {args.nnodes}, " if args.nnodes > 1 else ""
    where += f"options from {args.platform}, " if args.platform else ""
    print(f"multiproc: {where}{args.nproc_per_node} process{'es' * (args.nproc_per_node != 1)} (world size {world}), "
          f"logs of ranks 1.. in {os.path.join(args.log_dir, '')}", flush=True)
    try:
        _store = rendezvous(args)  # kept alive for the run
    except RendezvousError as err:
        print(f"multiproc: ERROR: {err}", file=sys.stderr, flush=True)
        return 1
    config, entrypoint, cmd_args, logs = torchrun_config(args)
    stop = StopForwarder(args.stop_timeout)
    try:
        run_agent(config, entrypoint, cmd_args, stop)
    except ChildFailedError as err:
        return failed_rank_status(err, logs)
    except DistError as err:  # the launcher's own rendezvous store: port taken, master unreachable, timeout
        print(f"multiproc: ERROR: rendezvous on {args.master_addr}:{args.master_port} failed: "
              f"{one_line(err).strip()}", file=sys.stderr, flush=True)
        return 1
    if stop.killed:
        return 128 + int(signal.Signals[stop.signal_name])
    return stop_exit_code(stop.signal_name, args.stop_exit_code, os.environ) if stop.signal_name else 0


if __name__ == "__main__":
    code = main()
    gc.freeze()  # objects left for Python's exit are not collected again: torch's take 0.7 s of CPU to walk
    sys.exit(code)
