"""A user's own model is first-class: the generated README's "Your own model" story, end to end.

The generated project offers two complete example model files, and each is proven here as the README tells a
user to use it, copied into ``models/`` and listed in the registry:

* ``docs/own_model_example.py``, the one-loss model ``melae`` (its own config section, an ``Optional`` field, a
  dataset over the demo corpus, an inference hook; no ``synthetic_batch``, no fast path), beside WaveGlow and
  Tacotron2 (``both``), and replacing WaveGlow (a project whose only model is the user's);
* ``docs/two_optimizer_example.py``, the two-optimizer model ``gan_vocoder`` (a small GAN vocoder: phases
  ``discriminator`` then ``generator``, two Adams, a per-epoch schedule, named losses), beside Tacotron2 and HiFi-GAN,
  with ``Training.blocks`` added to the copy as a user adds activation checkpointing (:attr:`Example.edits`).

Neither file has a ``Benchmark`` (optional, registered in ``parts.py``; checked when copied): the project's suite
must not need one.

Each project is made and its model trained on 2 processes once per session (:func:`own`), then checked by the tests
below. What each proves that no faster test does:

* the run: the copied file lints, the registry edits of the README work, a 2-process run trains it and its loss (the
  GAN: its mel L1) falls by 20%, every step logged with the model's named losses;
* inference through the model's hook, and the benchmark saying why it skips the model;
* ``gan_vocoder`` only: SIGTERM mid-run, then ``--resume auto``, ends with the uninterrupted run's weights (two
  optimizers and their schedules through a checkpoint on 2 processes; ``melae``'s stop and resume are the project
  suite's own tests, run with ``TEST_MODEL=melae`` below); its ``Inference.modules`` keep the discriminator out of
  the EMA and of the release file;
* the project's suite with ``TEST_MODEL`` naming the copied model, so its generic tests (loop, resume, DDP, bad
  input) train it: the whole suite in ``both``, the richest project; in the others only what differs (their files
  are subsets of ``both``'s and of the template's, which ``tests/test_template.py`` bakes and lints in every variant):
  everything HiFi-GAN's, the GAN's or its vocoder's on Tacotron2's mels (GTA) that is slow, and the fast tests of
  the parts' files (:data:`PART_TESTS`) but Tacotron2's own (its other fast tests run in ``tests/test_parts.py``,
  in the all-off ``tacotron2_hifigan`` with the GAN copied in the same way), and the replaced project's fast tests;
  in neither the test files that are the same in every variant (:data:`SAME_IN_EVERY_VARIANT`, checked to stay so)
  nor, but in the smallest WaveGlow project, the launch's (:data:`SAME_FOR_EVERY_MODEL`).
"""

import dataclasses
import functools
import json
import os
import random
import runpy
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import soundfile as sf
import torch

from conftest import PY, ROOT, run, stream

HOOK = runpy.run_path(str(ROOT / "hooks" / "post_gen_project.py"))
# The example models' files, as the post-generation hook lists them (removed with the model they belong to).
MODEL_FILES = HOOK["FILES"]
PART_TESTS = sorted({Path(rel).name for part in HOOK["read_table"](ROOT / "{{cookiecutter.project_slug}}" / "parts.py")
                     .values() for rel in part["files"] if rel.startswith("tests/test_")})
"""The test files of the optional parts (``parts.TABLE``): run only where every part is in."""


@dataclasses.dataclass(frozen=True)
class Example:
    """One of the generated project's complete example model files and what its runs are checked by.

    ``docs_file``: the file, relative to the project; ``name``: its model (copied to ``models/<name>.py``);
    ``settings``: extra ``--set`` values of its training runs; ``steps``: optimizer steps of a run;
    ``falling``: the ``metrics.jsonl`` value that must fall (``loss``, or a named loss under ``losses``), by
    20% from the mean of the first ``window`` rows to the mean of the last ``window`` (a GAN's losses move
    with each batch's crops, so its window is wider); ``output``: inference's ``--output``; ``named``: the
    keys every row's ``losses`` holds (none for a one-loss model: its rows have no ``losses``); ``edits``:
    ``(old, new)`` replacements made in the copy (each ``old`` found once), a user's changes to the example.
    """

    docs_file: str
    name: str
    settings: tuple[str, ...]
    steps: int
    falling: str
    window: int
    output: str
    named: frozenset[str] = frozenset()
    edits: tuple[tuple[str, str], ...] = ()

    def value(self, row: dict) -> float:
        """The row's value of :attr:`falling`."""
        return row["loss"] if self.falling == "loss" else row["losses"][self.falling]

    def fell(self, rows: list[dict]) -> bool:
        """Whether :attr:`falling` fell by 20% over ``rows`` (means of the first and last :attr:`window`)."""
        values = [self.value(row) for row in rows]
        first, last = values[:self.window], values[-self.window:]
        return sum(last) / len(last) < 0.8 * sum(first) / len(first)


# The tiny block's optimizer.lr (0.001) is every model's in a --tiny run: melae's own rate (its recipe's) falls in 12 steps.
ONE_LOSS = Example("docs/own_model_example.py", "melae", ("melae.dropout=0.1", "optimizer.lr=0.003"), 12, "loss", 1,
                   "recon.pt")
# Training.blocks: the generator's residual blocks, which activation checkpointing may recompute (the project's
# test of it then needs a batch of a model without a Benchmark).
GAN_BLOCKS = ("        phases=Phases(names=PHASES,",
              ("        blocks=lambda model: [m for m in model.generator.layers if isinstance(m, ResidualBlock)],\n"
               "        phases=Phases(names=PHASES,"))
TWO_OPTIMIZERS = Example("docs/two_optimizer_example.py", "gan_vocoder", (), 36, "mel_l1", 4, "copy.wav",
                         frozenset({"loss_discriminator", "grad_norm_discriminator", "d_real", "d_fake",
                                    "loss_generator", "grad_norm_generator", "g_adv", "mel_l1"}), (GAN_BLOCKS,))


@dataclasses.dataclass(frozen=True)
class Variant:
    """A project: ``example_model`` answer, the example model it deletes (``replace``), the copied example, and
    ``pytest`` arguments selecting its share of the project's suite."""

    example_model: str
    replace: str
    example: Example
    selection: tuple[str, ...]


SAME_IN_EVERY_VARIANT = ("test_audio_processing.py", "test_data_utils.py", "test_demo_corpus.py", "test_parity_mel.py",
                         "test_run_log.py", "test_text.py", "test_validate.py")
"""The project's test files that read neither the registry nor ``config.json`` nor ``TEST_MODEL``: the same tests of
the same code in every project that has them, run by ``beside-both``'s whole suite and left out of the others'."""
SAME_FOR_EVERY_MODEL = ("test_distributed.py", "test_multiproc.py")
"""The project's tests of its launch (``distributed.py``, ``multiproc.py``): like :data:`SAME_IN_EVERY_VARIANT`'s they
read no registry, config or ``TEST_MODEL``, but the code they test takes another path without the cloud part; so they
run in ``beside-both``'s whole suite (every part) and in the smallest WaveGlow project's fast tier (no part), and are
left out of the others'."""
ANYWHERE_ELSE = f"not ({' or '.join(SAME_IN_EVERY_VARIANT)})"
MODEL_BOUND = f"not ({' or '.join(SAME_IN_EVERY_VARIANT + SAME_FOR_EVERY_MODEL)})"
"""``-k`` of the tests that are not the same in every variant of the same parts."""

VARIANTS = {
    "beside-both": Variant("both", "", ONE_LOSS, ()),
    # Its registry, config and README without the example models; the generic tests training melae alone.
    "replacing-waveglow": Variant("waveglow", "waveglow", ONE_LOSS, ("-m", "not slow", "-k", MODEL_BOUND)),
    # HiFi-GAN's, the GAN's and GTA's slow tests; the fast ones of the parts' files but Tacotron2's (beside-both's).
    # The other fast tests run in the all-off project with the GAN copied in (test_parts.COPIED).
    "two-optimizers-beside-tacotron2-hifigan": Variant(
        "tacotron2_hifigan", "", TWO_OPTIMIZERS,
        ("-k", f"(hifigan or gan_vocoder or gta or not slow and not tacotron2 and {ANYWHERE_ELSE}) and "
               f"(slow or gta or {' or '.join(PART_TESTS)})")),
}


def together(variant: str) -> pytest.MarkDecorator:
    """The ``xdist_group`` of the variant's tests (conftest.HEAVY): on one worker, which makes its :func:`own` once;
    ``beside-both`` (its whole suite, fast and slow) on one of its own."""
    return pytest.mark.xdist_group("beside-both" if variant == "beside-both" else "own-variants")


each_variant = pytest.mark.parametrize("variant", [pytest.param(name, marks=together(name)) for name in VARIANTS])


def train_args(example: Example) -> list[str]:
    """``train.py``'s arguments for the example's runs (tiny config, ``example.steps`` steps, each logged)."""
    settings = ["train.log_interval=1", "train.checkpoint_interval=4", "train.keep_last=0", "train.val_interval=100",
                *example.settings]
    return ["train.py", "--config", "config.json", "--model", example.name, "--tiny", "--max-steps", str(example.steps),
            *(arg for setting in settings for arg in ("--set", setting))]


def add_own_model(project: Path, example: Example, replace: str = "") -> None:
    """Copy the project's example model file to ``models/<name>.py`` with ``example.edits`` made and list it in the
    registry (``models/__init__.py``: its import after the last model import, its ``SPEC`` at the end of the list), as
    its docstring says; with ``replace``, delete that example model (its files, registry lines, the tagged lines of
    ``parts.py`` that name it and its config sections), as the manual's "Replacing an example model" says."""
    text = (project / example.docs_file).read_text()
    assert "Benchmark(" not in text, f"{example.docs_file} has a Benchmark: the suite is proven on models without one"
    for old, new in example.edits:
        assert text.count(old) == 1, f"{example.docs_file}: {old!r} found {text.count(old)} times"
        text = text.replace(old, new)
    (project / "models" / f"{example.name}.py").write_text(text)
    registry = project / "models" / "__init__.py"
    lines = registry.read_text().splitlines(keepends=True)
    last_import = max(i for i, line in enumerate(lines) if line.startswith("from models import "))
    lines.insert(last_import + 1, f"from models import {example.name}\n")
    end = next(i for i in range(last_import, len(lines)) if lines[i] == ")\n")
    lines.insert(end, f"    {example.name}.SPEC,\n")
    if replace:
        lines = [line for line in lines if replace not in line]
        for rel in MODEL_FILES[replace]:
            path = project / rel
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        root = project / "parts.py"  # its groups of the parts (exports, weight readers, benchmarks): tagged lines
        root.write_text("".join(line for line in root.read_text().splitlines(keepends=True)
                                if not (replace in line and "# part: " in line)))
        config = json.loads((project / "config.json").read_text())
        config.pop(replace)
        config["tiny"].pop(replace)
        (project / "config.json").write_text(json.dumps(config, indent=2))
    registry.write_text("".join(lines))


# Every optimizer step of a job started with this on PYTHONPATH takes 0.3 s more: a run slow enough to be
# signalled in the middle (a tiny model's steps otherwise end before the signal lands). Numbers do not change.
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


def finish(proc: subprocess.Popen, timeout: float = 900) -> tuple[int, str]:
    """(exit code, output) of a launched job; past ``timeout`` (a hang guard: a tiny run takes well under a minute)
    fail showing what still runs, and kill it."""
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


@dataclasses.dataclass(frozen=True)
class Own:
    """A variant's project with its example model copied in, and its first 2-process run (``out``)."""

    project: Path
    example: Example
    lint: subprocess.CompletedProcess
    code: int
    output: str


@pytest.fixture(scope="session")
def own(bake_once, demo_corpus):
    """``own(variant)``: the variant's :class:`Own`, made on first use and shared by every test of the session."""
    @functools.cache
    def make(variant: str) -> Own:
        spec = VARIANTS[variant]
        project = bake_once(example_model=spec.example_model)
        add_own_model(project, spec.example, spec.replace)
        lint = run(["ruff", "check", "--no-cache", f"models/{spec.example.name}.py", "models/__init__.py",
                    spec.example.docs_file], cwd=project, check=False)
        code, output = finish(launch(project, spec.example, demo_corpus, "out"))
        return Own(project, spec.example, lint, code, output)
    return make


@each_variant
def test_the_copied_model_lints_and_trains_on_two_processes_and_its_loss_falls(own, variant):
    done = own(variant)
    example = done.example
    assert done.lint.returncode == 0, done.lint.stdout + done.lint.stderr
    assert done.code == 0, done.output
    rows = metrics(done.project / "out")
    assert [r["step"] for r in rows] == list(range(1, example.steps + 1))
    assert example.fell(rows), [example.value(r) for r in rows]
    assert all(set(r.get("losses", {})) == example.named for r in rows), rows[0]
    if example.named:  # several optimizers: "loss" is the last phase's
        assert all(r["loss"] == pytest.approx(r["losses"]["loss_generator"]) for r in rows), rows[0]


@each_variant
def test_inference_writes_through_the_models_hook_and_the_benchmark_says_why_it_skips_it(own, variant, demo_corpus):
    done = own(variant)
    example, project = done.example, done.project
    assert done.code == 0, done.output
    wav = sorted((demo_corpus / "wavs").glob("*.wav"))[0]
    said = run([PY, "inference.py", "--checkpoint", "out/checkpoint_last.pt", "--wav", str(wav), "--output",
                example.output], cwd=project)
    assert f"wrote {example.output}" in said.stdout
    written = project / example.output
    if written.suffix == ".wav":  # the GAN vocoder: the wav's mel vocoded, hop_length samples per mel frame
        audio, rate = sf.read(written, dtype="float32")
        source = sf.info(str(wav))
        assert rate == source.samplerate == 22050 and audio.ndim == 1 and audio.size % 256 == 0
        assert abs(audio.size - source.frames) < 256 and 0 < abs(audio).max() <= 1
    else:  # the autoencoder: the wav's mel, reconstructed
        n_mels = json.loads((project / "out" / "config.json").read_text())["audio"]["n_mels"]
        assert torch.load(written, weights_only=True).shape[0] == n_mels

    said = run([PY, "-m", "scripts.benchmark", "--device", "cpu", "--model", example.name], cwd=project)
    assert f"skipping {example.name}: parts.py registers no Benchmark of it" in said.stdout, said.stdout


@together("two-optimizers-beside-tacotron2-hifigan")
def test_the_gan_stopped_by_sigterm_resumes_to_the_uninterrupted_runs_weights(own, demo_corpus):
    done = own("two-optimizers-beside-tacotron2-hifigan")
    example, project = done.example, done.project
    assert done.code == 0, done.output
    proc = launch(project, example, demo_corpus, "stopped", slow=True)
    while not any(r["step"] >= 3 for r in metrics(project / "stopped")):
        assert proc.poll() is None, proc.stdout.read()
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


@together("two-optimizers-beside-tacotron2-hifigan")
def test_the_gans_ema_and_release_file_hold_its_generator_alone(own, demo_corpus):
    """``Inference.modules`` of the example: a run with ``train.ema_decay`` averages the generator's weights only, and
    ``scripts/export.py --format release`` ships only them (the discriminator is training's alone)."""
    done = own("two-optimizers-beside-tacotron2-hifigan")
    example, project = done.example, done.project
    assert done.code == 0, done.output
    args = train_args(example)
    args[args.index("--max-steps") + 1] = "2"  # one process, 2 steps
    run([PY, *args, "--dataset-path", str(demo_corpus), "--output-dir", "ema", "--set", "train.ema_decay=0.5", "--set",
         "data.num_workers=0"], cwd=project)
    state = torch.load(project / "ema" / "checkpoint_last.pt", weights_only=True)
    assert any(key.startswith("discriminator.") for key in state["model"])  # the checkpoint trains both networks
    assert "generator.layers.0.weight" in state["ema"], sorted(state["ema"])
    assert all(key.startswith("generator.") for key in state["ema"]), sorted(state["ema"])
    said = run([PY, "-m", "scripts.export", "--checkpoint", "ema/checkpoint_last.pt", "--format", "release", "--output",
                "release.pt"], cwd=project)
    release = torch.load(project / "release.pt", weights_only=True)
    assert release["ema_weights"] and release["model"], said.stdout
    assert all(key.startswith("generator.") for key in release["model"]), sorted(release["model"])


def test_the_files_only_beside_both_runs_read_nothing_a_variant_changes():
    """What makes a project differ from ``both``: its registry (``MODELS``, ``config_schemas``), ``config.json`` and
    ``TEST_MODEL``; the files of :data:`SAME_IN_EVERY_VARIANT` and :data:`SAME_FOR_EVERY_MODEL` name none of them and
    are not templated."""
    tests = ROOT / "{{cookiecutter.project_slug}}" / "tests"
    for group, names in (("SAME_IN_EVERY_VARIANT", SAME_IN_EVERY_VARIANT), ("SAME_FOR_EVERY_MODEL", SAME_FOR_EVERY_MODEL)):
        for name in names:
            text = (tests / name).read_text()
            for word in ("MODELS", "config_schemas", "config.json", "TEST_MODEL", "{%", "{{"):
                assert word not in text, f"tests/{name} names {word}: run it in every variant (take it out of {group})"


@each_variant
@pytest.mark.timeout(0)  # minutes, more under load: a nested suite is bounded by its silence (conftest.SILENCE_S)
def test_the_projects_suite_passes_with_its_generic_tests_training_the_copied_model(own, variant, request):
    done, selection = own(variant), VARIANTS[variant].selection
    # In a random order (pytest-randomly); the seed is chosen here so that a failure says how to repeat it. Two
    # pytest-xdist workers, as the project's README runs it (-n auto): its tests hold under it, and most of their
    # time is waiting on the processes they start.
    seed = random.randrange(2**32)
    code, said = stream([PY, "-m", "pytest", "-v", "-n", "2", "--dist", "worksteal", "-p", "no:cacheprovider",
                         f"--randomly-seed={seed}",
                         *selection, "tests"], done.project, variant, request.config,
                        env={"TEST_MODEL": done.example.name})
    last = said.splitlines()[-1] if said else ""
    assert code == 0 and " passed" in last and " failed" not in last, \
        f"--randomly-seed={seed} {' '.join(selection)} repeats this run\n{said[-3000:]}"
