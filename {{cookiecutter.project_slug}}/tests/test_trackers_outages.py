"""No tracker keeps a job alive, and a failing one costs the console one line: tiny runs whose W&B server never answers
or answers HTTP 500, whose W&B service stops answering mid-run, or is killed while MLflow's store fills. Each must end
within its bounds (``train.tracker_start_timeout_s``, ``train.tracker_finish_timeout_s``, its own work), say what
happened in one warning line per tracker (the libraries' own words in ``<output_dir>/trackers.log``), and leave no
process behind: a job's processes are found by a marker in their environment (:data:`MARKER`), which every process it
starts inherits, W&B's service too, whatever session it leads. The servers listen on 127.0.0.1 only, for the test's
length."""

import contextlib
import http.server
import os
import re
import signal
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Iterator, Optional

import pytest

from conftest import TEST_MODEL, alive, bound, shared_corpus, start_up_wait
from test_trackers import job, warnings_of
from test_train import wait_for_step
from tracker_readers import mlflow_env, wandb_env
from utils.tracking import LOG_NAME

MARKER = "TRACKER_TEST_JOB"
SLOW_OPTIMIZER_STEPS = """
import time
from torch.optim.optimizer import register_optimizer_step_pre_hook

register_optimizer_step_pre_hook(lambda optimizer, args, kwargs: time.sleep(0.3))
"""
"""Planted in a 1-process run: each optimizer step 0.3 s longer, time for a test to act between steps
(``test_train.SLOW_STEPS`` slows DDP, which one process does without)."""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return shared_corpus(tmp_path_factory, "trackers_corpus", 16)


@pytest.fixture
def marker() -> Iterator[str]:
    """A value of :data:`MARKER` for one job's environment; the processes still carrying it after the test are killed
    (a test that failed leaves none behind)."""
    value = uuid.uuid4().hex
    yield value
    for pid in marked(value):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def marked(value: str, program: Optional[str] = None) -> list[int]:
    """The living processes whose environment holds ``MARKER=value``; with ``program``, those running it (the base
    name of their ``argv[0]``: ``wandb-core``)."""
    found, needle = [], f"{MARKER}={value}".encode()
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            if program is None or os.path.basename((entry / "cmdline").read_bytes().split(b"\0")[0]) == program.encode():
                found.append(int(entry.name))
        except OSError:  # ended meanwhile
            continue
    return alive(found)


def finish_marked(proc: subprocess.Popen, value: str, timeout: float) -> tuple[int, str]:
    """``(exit code, output)`` of the job started as ``proc`` with ``MARKER=value``. Past ``timeout`` seconds, fails the
    test naming the job's processes still running, once every one is killed (``conftest.finish`` kills the launcher's
    session, and would then wait for ever for the pipe that a rank or W&B's service, each leading a session of its own,
    holds open)."""
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        running = {}
        for pid in marked(value):
            with contextlib.suppress(OSError):  # ended meanwhile
                running[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:100].decode()
                os.kill(pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"job not finished after {timeout:.0f} s; its processes: {running}\noutput:\n{output[-6000:]}")
    return proc.returncode, output


def left_behind(value: str) -> list[int]:
    """:func:`marked` once the job's last processes had a few seconds to end: what is left."""
    deadline = time.monotonic() + bound(5, starts=0)
    while (left := marked(value)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def wait_for(condition, proc, what: str, timeout: float):
    """``condition()``'s first true value, asked every 0.1 s while ``proc`` runs, within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert proc.poll() is None and time.monotonic() < deadline, f"no {what} within {timeout:.0f} s"
        time.sleep(0.1)
    return found


class Outage(http.server.BaseHTTPRequestHandler):
    """W&B's server during an outage: HTTP 500 to every request."""

    def fail(self) -> None:
        self.send_response(500)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = do_PUT = do_HEAD = fail

    def log_message(self, format, *args) -> None:  # noqa: A002 - BaseHTTPRequestHandler's name
        pass


@contextlib.contextmanager
def server(kind: str) -> Iterator[str]:
    """The URL of a server on 127.0.0.1 while the context lasts: ``"never answers"``, a listening socket nobody accepts
    on (the kernel completes each handshake, as a proxy or firewall that drops does), or ``"answers HTTP 500"``."""
    if kind == "never answers":
        with socket.socket() as silent:
            silent.bind(("127.0.0.1", 0))
            silent.listen(64)
            yield f"http://127.0.0.1:{silent.getsockname()[1]}"
        return
    outage = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Outage)
    threading.Thread(target=outage.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{outage.server_address[1]}"
    finally:
        outage.shutdown()
        outage.server_close()


@pytest.mark.slow
@pytest.mark.parametrize("kind, nproc", [("never answers", 2), ("answers HTTP 500", 1)])
def test_a_wandb_server_that_never_answers_or_fails_costs_the_start_up_wait_and_leaves_no_process(corpus, tmp_path,
                                                                                                     marker, kind,
                                                                                                     nproc):
    """W&B online, with a key, at a server that takes connections and never answers (2 processes through the
    launcher), or answers HTTP 500 (1 process): W&B's start gives up within ``train.tracker_start_timeout_s`` with one
    warning and logs offline, the job exits 0 within that and its own time, and none of its processes is left, W&B's
    service included."""
    pytest.importorskip("wandb")
    wait = start_up_wait()  # W&B's import, its server check (at most 5 s) and its offline start
    with server(kind) as url:
        env = {**wandb_env(tmp_path), "WANDB_MODE": "online", "WANDB_BASE_URL": url, "WANDB_API_KEY": "x" * 40,
               MARKER: marker}
        began = time.monotonic()
        proc = job(tmp_path, corpus, TEST_MODEL, 'train.trackers=["tensorboard", "wandb"]',
                   f"train.tracker_start_timeout_s={wait}", nproc=nproc, env=env, args=["--max-steps", "2"])
        code, output = finish_marked(proc, marker, timeout=wait + bound(60, starts=nproc + 1))
        took = time.monotonic() - began
    assert code == 0 and "done: 2 steps" in output, output
    warnings = warnings_of(output)
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: wandb: W&B's server {url} "), output
    said = "did not answer an HTTP request within" if kind == "never answers" else "answers HTTP 500"
    assert said in warnings[0] and "; logging offline in " in warnings[0], output
    assert took < wait + bound(30, starts=nproc + 1), took
    assert not left_behind(marker), f"left running after the launcher: {left_behind(marker)}"


@pytest.mark.slow
def test_a_service_that_stops_answering_is_abandoned_after_the_finish_timeout(corpus, tmp_path, marker):
    """W&B's service stops answering mid-run (SIGSTOP: as one waiting for a server that no longer answers, W&B's
    ``finish`` would wait for ever): the run ends ``train.tracker_finish_timeout_s`` after its last step, with one
    warning line, and W&B's service is killed, not left behind."""
    pytest.importorskip("wandb")
    wait, finish_s = start_up_wait(), 2
    proc = job(tmp_path, corpus, TEST_MODEL, 'train.trackers=["tensorboard", "wandb"]',
               f"train.tracker_start_timeout_s={wait}", f"train.tracker_finish_timeout_s={finish_s}", nproc=1,
               env={**wandb_env(tmp_path), MARKER: marker}, plant=SLOW_OPTIMIZER_STEPS, args=["--max-steps", "4"])
    wait_for_step(tmp_path / "run", 2, proc, timeout=bound(120))
    (service,) = marked(marker, "wandb-core")
    os.kill(service, signal.SIGSTOP)
    stopped = time.monotonic()
    code, output = finish_marked(proc, marker, timeout=bound(60))
    took = time.monotonic() - stopped
    assert code == 0 and "done: 4 steps" in output, output
    assert warnings_of(output) == [f"warning: wandb did not end its run within train.tracker_finish_timeout_s="
                                   f"{finish_s} s (is its server reachable?) and is abandoned"], output
    assert took < finish_s + bound(20, starts=1), took  # two steps, a checkpoint, the wait and the exit
    assert not left_behind(marker), f"left running: {left_behind(marker)}"


@pytest.mark.slow
def test_a_tracker_killed_or_out_of_disk_mid_run_costs_one_console_line(corpus, tmp_path, marker):
    """Mid-run, W&B's service is killed and MLflow's store fills (its ``train/loss`` file then on /dev/full: every
    write fails with ENOSPC): each tracker is dropped with one warning line and nothing else on the console (not W&B's
    exit traceback, not MLflow's tracebacks of every failed batch: they are in ``trackers.log``); training finishes,
    and no process is left."""
    for library in ("wandb", "mlflow"):
        pytest.importorskip(library)
    sets = ('train.trackers=["tensorboard", "wandb", "mlflow"]', f"train.tracker_start_timeout_s={start_up_wait()}")
    proc = job(tmp_path, corpus, TEST_MODEL, *sets, nproc=1, env={**wandb_env(tmp_path), **mlflow_env(tmp_path),
                                                                 MARKER: marker},
               plant=SLOW_OPTIMIZER_STEPS, args=["--max-steps", "12"])
    wait_for_step(tmp_path / "run", 2, proc, timeout=bound(120))
    (loss,) = wait_for(lambda: list((tmp_path / "mlruns").glob("*/*/metrics/train/loss")), proc, "MLflow metric file",
                       bound(30, starts=0))
    (service,) = marked(marker, "wandb-core")
    os.kill(service, signal.SIGKILL)
    full = loss.with_name("loss.full")
    full.symlink_to("/dev/full")
    full.replace(loss)
    code, output = finish_marked(proc, marker, timeout=bound(120))
    assert code == 0 and "done: 12 steps" in output, output
    said = [line for line in output.splitlines() if re.search("wandb|mlflow|traceback|error", line, re.IGNORECASE)]
    dropped = {found[1]: line for line in said
               if (found := re.match(r"warning: (wandb|mlflow) failed( to end its run)? \(.+\)", line))}
    assert len(said) == 2 and dropped.keys() == {"wandb", "mlflow"}, output
    assert "No space left on device" in dropped["mlflow"], said
    log = (tmp_path / "run" / LOG_NAME).read_text()
    assert "ERROR mlflow." in log and "No space left on device" in log, log[-3000:]
    assert not left_behind(marker), f"left running: {left_behind(marker)}"
