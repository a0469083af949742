"""A user's own model is first-class: the generated README's "Your own model" story, end to end.

The generated project offers two complete example model files, and each is proven here as the README tells a
user to use it, copied into ``models/``:

* ``docs/own_model_example.py``, the one-loss model ``melae`` (a mel autoencoder with its own config section,
  an ``Optional`` field, a dataset over the demo corpus, an inference hook; no ``synthetic_batch``, no fast
  path), beside each example model of the first three variants, and once replacing WaveGlow;
* ``docs/two_optimizer_example.py``, the two-optimizer model ``gan_vocoder`` (a small GAN vocoder: phases
  ``discriminator`` then ``generator``, two Adams, a per-epoch schedule, named losses, an inference hook),
  beside Tacotron2 and HiFi-GAN.

Then, in that project: a 2-process run trains it (its loss, or the GAN's named mel L1, falls by 20%), a run
stopped by SIGTERM and resumed ends with the same weights as an uninterrupted one, ``inference.py`` writes
through the model's hook, the benchmark runs and says what it skips, and the project's test suite passes with
``TEST_MODEL`` naming the copied model, so its generic tests (loop, resume, DDP, bad input) train it whatever
the alphabetical order of the project's models. See the comment at the suite run for the files of
multi-process jobs, run once, in the `both` variant.
"""

import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import soundfile as sf
import torch

from conftest import PY, run


@dataclasses.dataclass(frozen=True)
class Example:
    """One of the generated project's complete example model files and what its runs are checked by.

    ``docs_file``: the file, relative to the project; ``name``: its model (copied to ``models/<name>.py``);
    ``settings``: extra ``--set`` values of its training runs; ``steps``: optimizer steps of a run;
    ``falling``: the ``metrics.jsonl`` value that must fall (``loss``, or a named loss under ``losses``), by
    20% from the mean of the first ``window`` rows to the mean of the last ``window`` (a GAN's losses move
    with each batch's crops, so its window is wider); ``output``: inference's ``--output``; ``named``: the
    keys every row's ``losses`` holds (none for a one-loss model: its rows have no ``losses``).
    """

    docs_file: str
    name: str
    settings: tuple[str, ...]
    steps: int
    falling: str
    window: int
    output: str
    named: frozenset[str] = frozenset()

    def value(self, row: dict) -> float:
        """The row's value of :attr:`falling`."""
        return row["loss"] if self.falling == "loss" else row["losses"][self.falling]

    def fell(self, rows: list[dict]) -> bool:
        """Whether :attr:`falling` fell by 20% over ``rows`` (means of the first and last :attr:`window`)."""
        values = [self.value(row) for row in rows]
        first, last = values[:self.window], values[-self.window:]
        return sum(last) / len(last) < 0.8 * sum(first) / len(first)


ONE_LOSS = Example("docs/own_model_example.py", "melae", ("melae.dropout=0.1",), 12, "loss", 1, "recon.pt")
TWO_OPTIMIZERS = Example("docs/two_optimizer_example.py", "gan_vocoder", (), 36, "mel_l1", 4, "copy.wav",
                         frozenset({"loss_discriminator", "grad_norm_discriminator", "d_real", "d_fake",
                                    "loss_generator", "grad_norm_generator", "g_adv", "mel_l1"}))
EXAMPLE_FILES = {"waveglow": ["models/waveglow", "modules/waveglow.py", "tests/test_waveglow.py"]}


def train_args(example: Example) -> list[str]:
    """``train.py``'s arguments for the example's runs (tiny config, ``example.steps`` steps, each logged)."""
    settings = ["train.log_interval=1", "train.checkpoint_interval=4", "train.keep_last=0", "train.val_interval=100",
                *example.settings]
    return ["train.py", "--config", "config.json", "--model", example.name, "--tiny", "--max-steps", str(example.steps),
            *(arg for setting in settings for arg in ("--set", setting))]


def add_own_model(project: Path, example: Example, replace: str = "") -> None:
    """Copy the project's example model file to ``models/<name>.py`` and list it in the registry
    (``models/__init__.py``: its import after the last model import, its ``SPEC`` at the end of the list), as its
    docstring says; with ``replace``, delete that example model (its files, registry lines and config sections)."""
    shutil.copy(project / example.docs_file, project / "models" / f"{example.name}.py")
    registry = project / "models" / "__init__.py"
    lines = registry.read_text().splitlines(keepends=True)
    last_import = max(i for i, line in enumerate(lines) if line.startswith("from models import "))
    lines.insert(last_import + 1, f"from models import {example.name}\n")
    end = next(i for i in range(last_import, len(lines)) if lines[i] == ")\n")
    lines.insert(end, f"    {example.name}.SPEC,\n")
    if replace:
        lines = [line for line in lines if replace not in line]
        for rel in EXAMPLE_FILES[replace]:
            shutil.rmtree(project / rel) if (project / rel).is_dir() else (project / rel).unlink()
        config = json.loads((project / "config.json").read_text())
        config.pop(replace)
        config["tiny"].pop(replace)
        (project / "config.json").write_text(json.dumps(config, indent=2))
    registry.write_text("".join(lines))


# Every optimizer step of a job started with this on PYTHONPATH takes 0.3 s more: a run slow enough to be
# signalled in the middle (a tiny model's 12 steps otherwise end before the signal lands). Numbers do not change.
SLOW_STEPS = """
import time
from torch.optim.optimizer import register_optimizer_step_pre_hook

register_optimizer_step_pre_hook(lambda optimizer, args, kwargs: time.sleep(0.3))
"""


def launch(project: Path, example: Example, corpus: Path, out: str, *extra: str,
           slow: bool = False) -> subprocess.Popen:
    """Start a 2-process training run of ``example`` (its own session, output piped); ``slow``: with
    :data:`SLOW_STEPS` planted."""
    cmd = [PY, "multiproc.py", "--nproc-per-node", "2", "--log-dir", f"{out}/logs", *train_args(example),
           "--dataset-path", str(corpus), "--output-dir", out, *extra]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if slow:
        plant = project / f"{out}-plant"
        plant.mkdir(parents=True, exist_ok=True)
        (plant / "sitecustomize.py").write_text(SLOW_STEPS)
        env["PYTHONPATH"] = os.pathsep.join([str(plant), env.get("PYTHONPATH", "")])
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


def final_weights(out: Path, example: Example) -> dict:
    """The weights of the run's last checkpoint, which must be the example's model at its last step."""
    state = torch.load(out / "checkpoint_last.pt", weights_only=True)
    assert state["step"] == example.steps and state["model_name"] == example.name
    return state["model"]


@pytest.mark.parametrize("variant, replace, example", [
    ("both", "", ONE_LOSS), ("waveglow", "waveglow", ONE_LOSS), ("tacotron2_hifigan", "", TWO_OPTIMIZERS),
], ids=["beside-both", "replacing-waveglow", "two-optimizers-beside-tacotron2-hifigan"])
# The variants' files are subsets of these three projects': the waveglow variant runs its suite in
# "replacing-waveglow" (less models/waveglow.py), the tacotron2 one in "two-optimizers-beside-tacotron2-hifigan"
# (plus models/hifigan.py) and in "beside-both"; tests/test_template.py bakes and lints every variant.
def test_own_model_end_to_end(bake, demo_corpus, variant, replace, example):
    project = bake(example_model=variant)
    add_own_model(project, example, replace)
    run(["ruff", "check", "--no-cache", f"models/{example.name}.py", "models/__init__.py", example.docs_file],
        cwd=project)

    # Trains on 2 processes; its loss (the GAN: its mel L1) falls, and the named losses are logged.
    code, output = finish(launch(project, example, demo_corpus, "out"))
    assert code == 0, output
    rows = metrics(project / "out")
    assert [r["step"] for r in rows] == list(range(1, example.steps + 1))
    assert example.fell(rows), [example.value(r) for r in rows]
    assert all(set(r.get("losses", {})) == example.named for r in rows), rows[0]
    if example.named:  # several optimizers: "loss" is the last phase's
        assert all(r["loss"] == pytest.approx(r["losses"]["loss_generator"]) for r in rows), rows[0]

    # SIGTERM to the launcher mid-run, then --resume auto: the same final weights.
    proc = launch(project, example, demo_corpus, "stopped", slow=True)
    deadline = time.monotonic() + 120
    while not any(r["step"] >= 3 for r in metrics(project / "stopped")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else "slow"
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGTERM)
    code, output = finish(proc)
    assert code == 0 and "stopped at step" in output and "Traceback" not in output, output
    stopped_at = torch.load(project / "stopped" / "checkpoint_last.pt", weights_only=True)["step"]
    assert 3 <= stopped_at < example.steps
    code, output = finish(launch(project, example, demo_corpus, "stopped", "--resume", "auto"))
    assert code == 0 and f"resumed from stopped/checkpoint_last.pt at step {stopped_at}" in output, output
    reference, resumed = final_weights(project / "out", example), final_weights(project / "stopped", example)
    assert reference.keys() == resumed.keys()
    for key in reference:
        assert torch.equal(reference[key], resumed[key]), key

    # Inference through the model's own hook.
    wav = sorted((demo_corpus / "wavs").glob("*.wav"))[0]
    done = run([PY, "inference.py", "--checkpoint", "out/checkpoint_last.pt", "--wav", str(wav), "--output",
                example.output], cwd=project)
    assert f"wrote {example.output}" in done.stdout
    written = project / example.output
    if written.suffix == ".wav":  # the GAN vocoder: the wav's mel vocoded, hop_length samples per mel frame
        audio, rate = sf.read(written, dtype="float32")
        source = sf.info(str(wav))
        assert rate == source.samplerate == 22050 and audio.ndim == 1 and audio.size % 256 == 0
        assert abs(audio.size - source.frames) < 256 and 0 < abs(audio).max() <= 1
    else:
        assert torch.load(written, weights_only=True).shape[0] == 80

    # The benchmark runs what it can and says what it skips.
    done = run([PY, "-m", "scripts.benchmark", "--tiny", "--device", "cpu", "--steps", "1", "--warmup", "0",
                "--precision", "tf32"], cwd=project, timeout=600)
    assert f"skipping {example.name}: its ModelSpec has no synthetic_batch" in done.stdout, done.stdout

    # The project's whole test suite, whose generic tests train the copied model (TEST_MODEL). Its files of
    # multi-process training jobs (most of the suite's time) and of launchers and launch files are byte-identical in
    # every variant: they run once, in the `both` variant, with melae (FSDP: melae, waveglow and tacotron2; a stop
    # within the grace period: melae, tacotron2 and waveglow), and are left out of the other variants to keep CI
    # well under 30 minutes (every other test runs in every variant).
    heavy = ("test_train.py", "test_hang.py", "test_failures.py", "test_fsdp.py", "test_memory.py", "test_platforms.py",
             "test_grace_period.py", "test_multiproc.py", "test_distributed.py", "test_launch_files.py")
    once = [] if variant == "both" and not replace else [arg for name in heavy for arg in ("--ignore", f"tests/{name}")]
    # In a random order (pytest-randomly); the seed is chosen here so that a failure says how to repeat it. Two
    # pytest-xdist workers, as the project's README runs it (-n auto): its tests hold under it, and most of their
    # time is waiting on the processes they start.
    seed = random.randrange(2**32)
    done = run([PY, "-m", "pytest", "-v", "-n", "2", "-p", "no:cacheprovider", f"--randomly-seed={seed}", "tests",
                *once], cwd=project, timeout=1500, env={"TEST_MODEL": example.name})
    assert " passed" in done.stdout.splitlines()[-1] and " failed" not in done.stdout.splitlines()[-1], \
        f"--randomly-seed={seed} repeats this order\n{done.stdout[-3000:]}"
