"""Shared fixtures for the template's tests: pytest-cookies bakes from this repository, wherever pytest runs."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    config.option.template = str(ROOT)


def run(cmd, cwd, timeout=600, check=True, env=None):
    """Run ``cmd`` (a list) in ``cwd``; on a non-zero exit with ``check``, fail showing its output; past ``timeout``
    seconds fail showing the end of what it printed (for a project suite run with ``-v``: the test that hung)."""
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


@pytest.fixture
def bake(cookies):
    """Generate a project with the given answers; returns its path (fails the test if generation fails)."""
    def _bake(**answers) -> Path:
        result = cookies.bake(extra_context=answers)
        assert result.exit_code == 0, f"generation failed: {result.exception}"
        return Path(result.project_path)
    return _bake


PY = sys.executable


@pytest.fixture(scope="session")
def demo_corpus(tmp_path_factory):
    """A 16-utterance LJSpeech-layout corpus spoken by flite/espeak-ng, built by a generated project's script."""
    from cookiecutter.main import cookiecutter
    out = tmp_path_factory.mktemp("corpus_project")
    project = cookiecutter(str(ROOT), no_input=True, output_dir=str(out))
    corpus = out / "corpus"
    run([PY, "-m", "scripts.make_demo_corpus", "--output", str(corpus), "--num-utterances", "16"], cwd=project)
    return corpus
