"""A run's life outside the loop: stop signals (the ranks' and the launcher's side), the output folder (writable, one
run at a time), the grace period a stop must fit, the git commit, this process's children."""

from __future__ import annotations

import contextlib
import fcntl
import gc
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

from utils.config import ConfigError
from utils.errors import CheckpointError


class GracePeriod:
    """Whether a checkpoint fits the grace period after a stop signal (``multiproc.py --stop-timeout``, given to the
    ranks as ``MULTIPROC_STOP_TIMEOUT``; without it nothing is checked): warned once, from an estimate or a save."""

    def __init__(self, environ):
        value = environ.get("MULTIPROC_STOP_TIMEOUT", "").strip()
        self.seconds, self.warned = float(value) if value else None, False

    def _advice(self, need_s: float) -> str:
        self.warned = True
        return (f"the grace period after a stop signal is {self.seconds:g} s (multiproc.py --stop-timeout): a stop "
                "would be killed before its checkpoint is durable; give --stop-timeout, and the platform's grace "
                f"period above it (Kubernetes: terminationGracePeriodSeconds), more than {need_s:.0f} s")

    def check_estimate(self, nbytes: int, folder: Path) -> Optional[str]:
        """The warning for a checkpoint of ``nbytes`` written into ``folder``, or ``None`` when it fits, from a test
        write of ``nbytes`` (at most 64 MiB), fsync'ed. Raises CheckpointError when the test write fails (a full disk)."""
        if self.seconds is None:
            return None
        size = max(1, min(int(nbytes), 64 << 20))
        probe, data = folder / f".write_speed.tmp{os.getpid()}", os.urandom(size)  # not compressible, not sparse
        start = time.perf_counter()
        try:
            with open(probe, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            speed = size / max(time.perf_counter() - start, 1e-6)
        except OSError as err:
            raise CheckpointError(f"cannot write a checkpoint into {folder}: {err.strerror or err} (a test write of "
                                  f"{size / 1e6:.1f} MB, for a checkpoint of {nbytes / 1e6:.1f} MB, "
                                  "failed); free space there, or train into another --output-dir") from None
        finally:
            probe.unlink(missing_ok=True)
        if (save_s := nbytes / speed) <= self.seconds:
            return None
        return (f"warning: a checkpoint takes ~{save_s:.1f} s ({nbytes / 1e6:.1f} MB at {speed / 1e6:.0f} MB/s into "
                f"{folder}); " + self._advice(1.5 * save_s + 5))

    def check_save(self, step: int, save_s: float, step_s: float) -> Optional[str]:
        """The warning (once) after a save of ``save_s`` seconds following a step of ``step_s``, or ``None``."""
        if self.seconds is None or self.warned or save_s + step_s <= self.seconds:
            return None
        return (f"warning: step {step}: the checkpoint took {save_s:.1f} s after a step of {step_s:.1f} s; "
                + self._advice(1.5 * (save_s + step_s) + 5))


def check_output_dir(path: Path) -> None:
    """Create the output folder and make sure it is writable. Raises ConfigError naming it."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write_test_{time.time_ns()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise ConfigError(f"output folder {path} is not writable: {err.strerror or err}") from None


def git_commit() -> str | None:
    """The project's git commit, when it is a git checkout (provenance for checkpoints)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)  # a scheduler's (SLURM, Kubernetes) and Ctrl-C


class StopRequest:
    """Remembers a stop signal (:data:`STOP_SIGNALS`) instead of dying of it: the loop finishes its step, the ranks
    agree, rank 0 saves and the run exits. The third Ctrl-C raises ``KeyboardInterrupt`` (stops at once, unsaved)."""

    def __init__(self):
        self.signal_name: str | None = None
        self.interrupts = 0
        if threading.current_thread() is threading.main_thread():  # Python's handlers: the main thread's only (Ray)
            for sig in STOP_SIGNALS:
                signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGINT:
            self.interrupts += 1
            if self.interrupts >= 3:
                raise KeyboardInterrupt
        self.signal_name = self.signal_name or signal.Signals(signum).name


def end_dataloader_workers() -> list[int]:
    """End this process's DataLoader workers still running (after an error the traceback holds their iterators, and
    Python's exit would wait for them forever); returns the pids it had to kill (SIGKILL)."""
    killed, children = [], multiprocessing.active_children()
    if children:  # the usual end has none: no collection (0.2 s of CPU in a large process)
        gc.collect()  # lets PyTorch shut them down its way
    for child in children:
        child.join(timeout=0.5)
        if child.is_alive():
            child.kill()
            child.join(timeout=5)
            killed.append(child.pid)
    return killed


def ignore_stop_signals(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: a worker leaves stop signals to its rank (those blocked since its start drop)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


@contextlib.contextmanager
def stop_signals_blocked():
    """Hold stop signals back (delivered on leaving) while DataLoader workers start."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def take_output_dir(output_dir: Path, lock: RunLock) -> None:
    """Rank 0: create the output folder and hold its :class:`RunLock`. Raises ConfigError (not writable) or
    CheckpointError (another run holds it)."""
    check_output_dir(output_dir)
    if note := lock.acquire():
        print(note, file=sys.stderr, flush=True)


LOCK_NAME = ".run.lock"


class RunLock:
    """One run per output folder: rank 0 holds an exclusive ``flock`` on ``OUTPUT/.run.lock`` (naming pid, host and
    start), which the kernel drops when the process ends, however it ends (NFSv4 too)."""

    def __init__(self, output_dir: str | Path):
        self.path = Path(output_dir) / LOCK_NAME
        self.handle = None

    def acquire(self) -> Optional[str]:
        """Take the lock; returns a note when a dead run's lock file was taken over, else ``None``. Raises
        CheckpointError when another living run holds the folder (named), or the lock file cannot be opened."""
        while True:
            try:
                handle = open(self.path, "a+")
            except OSError as err:
                raise CheckpointError(f"cannot open {self.path}: {err.strerror or err}") from None
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "a process that has not written its name yet"
                handle.close()
                raise CheckpointError(f"{self.path.parent} is in use by another run ({holder}); wait for it or "
                                      "stop it, or train into another --output-dir") from None
            with contextlib.suppress(FileNotFoundError):
                if os.stat(self.path).st_ino == os.fstat(handle.fileno()).st_ino:
                    break
            handle.close()  # the holder removed the file between our open and our lock: lock the new one
        handle.seek(0)
        previous = handle.read().strip()
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        self.handle = handle
        if previous:
            return f"note: {self.path} was left by a run that is no longer running ({previous}); taken over"
        return None

    def release(self) -> None:
        """Remove the lock file and drop the lock (idempotent): a finished run leaves no trace of it."""
        if self.handle is None:
            return
        self.path.unlink(missing_ok=True)
        self.handle.close()  # closing the last descriptor drops the flock
        self.handle = None


def stop_exit_code(signal_name: str, chosen: int | None, environ) -> int:
    """The exit code after a stop signal every rank obeyed: ``chosen`` when given; 130 after SIGINT; inside Kubernetes
    (``KUBERNETES_SERVICE_HOST``) 128 + the signal (a pod exiting 0 would end its Job as complete); elsewhere 0."""
    if chosen is not None:
        return chosen
    if signal_name == "SIGINT":
        return 130
    return 128 + int(signal.Signals[signal_name]) if environ.get("KUBERNETES_SERVICE_HOST") else 0


def child_pids(program: Optional[str] = None) -> list[int]:
    """Pids of this process's children, found in /proc (none off Linux); with ``program``, only those running it (the
    base name of their ``argv[0]``: a library's helper process)."""
    found, wanted = [], None if program is None else os.fsencode(program)
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, IndexError, ValueError):  # the process ended meanwhile
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) != os.getpid():
                continue
            if wanted is None or os.path.basename((entry / "cmdline").read_bytes().split(b"\0")[0]) == wanted:
                found.append(int(entry.name))
    return found


def signal_children(sig: int) -> None:
    """Send ``sig`` to this process's living children (torchrun's workers); nothing off Linux."""
    for pid in child_pids():
        with contextlib.suppress(OSError):  # ended meanwhile
            os.kill(pid, sig)


class StopForwarder:
    """Passes stop signals (:data:`STOP_SIGNALS`) on to every rank, and SIGKILLs the ranks that outstay
    ``stop_timeout`` seconds from the first. :attr:`signal_name`: the first, or None."""

    def __init__(self, stop_timeout: float):
        self.stop_timeout, self.killed = stop_timeout, False
        self.signal_name: str | None = None
        self.deadline: float | None = None

    def install(self) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.signal_name is None:
            self.signal_name, self.deadline = name, time.monotonic() + self.stop_timeout
            print(f"multiproc: {name}: every rank finishes its step and rank 0 saves a checkpoint (ranks still "
                  f"running in {self.stop_timeout:g} s are killed)", file=sys.stderr, flush=True)
        signal_children(signum)

    def enforce(self) -> None:
        """SIGKILL the ranks once the deadline has passed (called while waiting for them)."""
        if self.deadline is not None and not self.killed and time.monotonic() > self.deadline:
            self.killed = True
            print(f"multiproc: the ranks did not stop within {self.stop_timeout:g} s of {self.signal_name}; "
                  "killing them", file=sys.stderr, flush=True)
            signal_children(signal.SIGKILL)
