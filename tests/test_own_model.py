"""A user's own model is first-class: the generated README's "Your own model" story, end to end.

Each variant gets a third model, ``tests/fixtures/melae.py`` (a mel autoencoder with its own config section,
an ``Optional`` field, a dataset over the demo corpus, an inference hook; no ``synthetic_batch``, no fast
path), copied to ``models/melae.py`` as the README tells a user to. Then, in that project: a 2-process run
trains it, a run stopped by SIGTERM and resumed ends with the same weights as an uninterrupted one,
``inference.py`` writes through the model's hook, the benchmark runs and says what it skips, and the
project's test suite passes (its generic tests train ``melae``, the first model alphabetically; see the
comment at the suite run for the two files of multi-process jobs, run once, in the `both` variant).
The last case replaces the example model instead of adding beside it.
"""

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from conftest import PY, run

FIXTURE = Path(__file__).parent / "fixtures" / "melae.py"
STEPS = 12
TRAIN = ["train.py", "--config", "config.json", "--model", "melae", "--tiny", "--max-steps", str(STEPS),
         "--set", "train.log_interval=1", "--set", "train.checkpoint_interval=4", "--set", "train.keep_last=0",
         "--set", "train.val_interval=100", "--set", "melae.dropout=0.1"]
EXAMPLE_FILES = {"waveglow": ["models/waveglow.py", "modules/waveglow.py", "tests/test_waveglow.py"]}


def add_own_model(project: Path, replace: str = "") -> None:
    """Copy the fixture to models/melae.py; with ``replace``, delete that example model as the README says."""
    shutil.copy(FIXTURE, project / "models" / "melae.py")
    if replace:
        for rel in EXAMPLE_FILES[replace]:
            (project / rel).unlink()
        config = json.loads((project / "config.json").read_text())
        config.pop(replace)
        config["tiny"].pop(replace)
        (project / "config.json").write_text(json.dumps(config, indent=2))


def launch(project: Path, corpus: Path, out: str, *extra: str) -> subprocess.Popen:
    cmd = [PY, "multiproc.py", "--nproc-per-node", "2", "--log-dir", f"{out}/logs", *TRAIN, "--dataset-path",
           str(corpus), "--output-dir", out, *extra]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(cmd, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    """(exit code, output) of a launched job; past ``timeout`` fail showing what still runs, and kill it."""
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        tree = subprocess.run(["ps", "-o", "pid,ppid,stat,etime,args", "--sid", str(proc.pid)],
                              capture_output=True, text=True).stdout
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"job not finished after {timeout} s; its processes:\n{tree}\noutput:\n{output[-6000:]}")
    return proc.returncode, output


def metrics(out: Path) -> list[dict]:
    text = (out / "metrics.jsonl").read_text() if (out / "metrics.jsonl").exists() else ""
    return [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines()]


def final_weights(out: Path) -> dict:
    state = torch.load(out / "checkpoint_last.pt", weights_only=True)
    assert state["step"] == STEPS and state["model_name"] == "melae"
    return state["model"]


@pytest.mark.parametrize("variant, replace", [("waveglow", ""), ("tacotron2", ""), ("both", ""),
                                              ("waveglow", "waveglow")],
                         ids=["beside-waveglow", "beside-tacotron2", "beside-both", "replacing-waveglow"])
def test_own_model_end_to_end(bake, demo_corpus, variant, replace):
    project = bake(example_model=variant)
    add_own_model(project, replace)
    run(["ruff", "check", "models/melae.py"], cwd=project)

    # Trains on 2 processes, the loss falls.
    code, output = finish(launch(project, demo_corpus, "out"))
    assert code == 0, output
    rows = metrics(project / "out")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert rows[-1]["loss"] < 0.8 * rows[0]["loss"], [r["loss"] for r in rows]

    # SIGTERM to the launcher mid-run, then --resume auto: the same final weights.
    proc = launch(project, demo_corpus, "stopped")
    deadline = time.monotonic() + 120
    while not any(r["step"] >= 3 for r in metrics(project / "stopped")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else "slow"
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGTERM)
    code, output = finish(proc)
    assert code == 0 and "stopped at step" in output and "Traceback" not in output, output
    stopped_at = torch.load(project / "stopped" / "checkpoint_last.pt", weights_only=True)["step"]
    assert 3 <= stopped_at < STEPS
    code, output = finish(launch(project, demo_corpus, "stopped", "--resume", "auto"))
    assert code == 0 and f"resumed from stopped/checkpoint_last.pt at step {stopped_at}" in output, output
    reference, resumed = final_weights(project / "out"), final_weights(project / "stopped")
    assert reference.keys() == resumed.keys()
    for key in reference:
        assert torch.equal(reference[key], resumed[key]), key

    # Inference through the model's own hook.
    wav = sorted((demo_corpus / "wavs").glob("*.wav"))[0]
    done = run([PY, "inference.py", "--checkpoint", "out/checkpoint_last.pt", "--wav", str(wav), "--output",
                "recon.pt"], cwd=project)
    assert "wrote recon.pt" in done.stdout
    assert torch.load(project / "recon.pt", weights_only=True).shape[0] == 80

    # The benchmark runs what it can and says what it skips.
    done = run([PY, "scripts/benchmark.py", "--tiny", "--device", "cpu", "--steps", "1", "--warmup", "0",
                "--precision", "tf32"], cwd=project, timeout=600)
    assert "skipping melae: its ModelSpec has no synthetic_batch" in done.stdout, done.stdout

    # The project's whole test suite, whose generic tests now train melae. Its two files of multi-process
    # training jobs (about 4 of the suite's 6 minutes) are byte-identical in every variant and train the same
    # model, melae, in each: they run once, in the `both` variant, and are left out of the other three to keep
    # CI under 30 minutes (every other test runs in every variant).
    once = [] if variant == "both" and not replace else ["--ignore", "tests/test_train.py", "--ignore",
                                                         "tests/test_hang.py"]
    done = run([PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests", *once], cwd=project, timeout=1500)
    assert " passed" in done.stdout.splitlines()[-1] and " failed" not in done.stdout.splitlines()[-1], \
        done.stdout[-3000:]
