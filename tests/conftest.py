"""Shared fixtures for the template's tests: pytest-cookies bakes from this repository, wherever pytest runs.

Work done once per session and shared: :func:`default_project` (every default answer) and :func:`demo_corpus`, made
in it by the command its README's quick start gives. A nested project suite streams its lines to the terminal as
they come (:func:`stream`): minutes of silence would hide a slow test from the person watching CI.

CI (``.ci/run``) runs these tests on two pytest-xdist workers (``--dist loadgroup``): the nested suites of the
projects in :data:`HEAVY` each hold one worker while the other takes the rest, so that no core waits on a serial step.
"""

import collections
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


HEAVY = ("beside-both", "own-variants")
"""``xdist_group`` names of the tests that share a session fixture's minutes of work (a project trained on 2
processes, then its suite), in the order they start: each group runs on one worker, and first."""


def pytest_configure(config):
    config.option.template = str(ROOT)
    config.addinivalue_line("markers", "nested: runs a generated project's suite (minutes): after the shorter tests")


@pytest.hookimpl(trylast=True)  # after pytest-randomly's shuffle, which orders each rank's tests
def pytest_collection_modifyitems(items):
    """The groups of :data:`HEAVY` first, in its order (under ``--dist loadgroup`` each starts on a worker of its
    own at once), then the shorter tests, then those marked ``nested``: a worker busy with a group is sent the next
    tests before it is free, and those should be short."""
    def rank(item):
        mark = item.get_closest_marker("xdist_group")
        name = mark and (mark.kwargs.get("name") or mark.args[0])
        return HEAVY.index(name) if name in HEAVY else len(HEAVY) + bool(item.get_closest_marker("nested"))
    items.sort(key=rank)


def run(cmd, cwd, timeout=600, check=True, env=None):
    """Run ``cmd`` (a list) in ``cwd``; on a non-zero exit with ``check``, fail showing its output; past ``timeout``
    seconds (generous: a hang guard, not a speed test) fail showing the end of what it printed."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env)
    except subprocess.TimeoutExpired as err:
        said = err.stdout.decode(errors="replace") if isinstance(err.stdout, bytes) else (err.stdout or "")
        pytest.fail(f"{' '.join(map(str, cmd))} did not finish in {timeout} s; the end of its output (the last line "
                    f"names what was running):\n{said[-3000:]}")
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}"
                    f"\n--- stderr\n{proc.stderr[-6000:]}")
    return proc


SILENCE_S = 1800
"""A nested suite run with ``-v`` prints a line as each of its tests ends, and each of those tests bounds its own jobs
by the machine's measured speed; this long without a line, the suite itself has hung."""


def stream(cmd, cwd, label: str, config, env=None) -> tuple[int, str]:
    """Run ``cmd`` in a session of its own, each output line echoed to the terminal as ``[label] line`` as it comes
    (past pytest's capture); ``(exit code, the last 400 lines)``. Fails, killing it, after :data:`SILENCE_S` seconds
    without a line."""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, start_new_session=True)
    lines, tail = queue.Queue(), collections.deque(maxlen=400)

    def pump():  # a thread, so that silence can be timed
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)
    threading.Thread(target=pump, daemon=True).start()
    capture = config.pluginmanager.getplugin("capturemanager")
    try:
        while (line := lines.get(timeout=SILENCE_S)) is not None:
            tail.append(line.rstrip("\n"))
            with capture.global_and_fixture_disabled():  # to file descriptor 2: a pytest-xdist worker's terminal too
                os.write(2, f"[{label}] {tail[-1]}\n".encode(errors="replace"))
    except queue.Empty:
        pytest.fail(f"{label}: no output for {SILENCE_S} s; its last lines:\n" + "\n".join(list(tail)[-40:]))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return proc.returncode, "\n".join(tail)


def baker(cookies):
    """``bake(**answers)``: generate a project with ``cookies`` (pytest-cookies' fixture) and the given answers; returns
    its path (fails the test if generation fails)."""
    def _bake(**answers) -> Path:
        result = cookies.bake(extra_context=answers)
        assert result.exit_code == 0, f"generation failed: {result.exception}"
        return Path(result.project_path)
    return _bake


@pytest.fixture
def bake(cookies):
    """Generate a project with the given answers; returns its path (fails the test if generation fails)."""
    return baker(cookies)


@pytest.fixture(scope="session")
def bake_once(cookies_session):
    """:func:`bake` for session fixtures (each call a new project)."""
    return baker(cookies_session)


def quick_start(project: Path) -> list[str]:
    """The commands of the project README's quick start (its first bash block), line continuations joined."""
    text = (project / "README.md").read_text().split("## Quick start", 1)[1]
    block = text.split("```bash\n", 1)[1].split("\n```", 1)[0]
    return [re.sub(r"\s+", " ", command).strip() for command in block.replace("\\\n", " ").splitlines()]


def as_written(command: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    """One quick-start command run by bash as written, in ``cwd``, with this interpreter's folder first on ``PATH``
    (its ``python`` is the one the tests run with); fails the test when it fails."""
    env = {"PATH": os.pathsep.join([str(Path(PY).parent), os.environ.get("PATH", "")])}
    return run(["bash", "-c", command], cwd=cwd, timeout=timeout, env=env)


@pytest.fixture(scope="session")
def default_project(bake_once) -> Path:
    """A project of every default answer (WaveGlow), as a new user makes it."""
    return bake_once()


@pytest.fixture(scope="session")
def demo_corpus(default_project) -> Path:
    """The demo corpus of the README's quick start, made by its command as written (``data/demo``)."""
    command = next(c for c in quick_start(default_project) if "scripts.make_demo_corpus" in c)
    as_written(command, default_project)
    return default_project / "data" / "demo"
