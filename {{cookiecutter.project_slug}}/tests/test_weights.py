"""A trained checkpoint's weights in the core commands: ``inference.py`` runs its EMA weights with the mel framing it
records, ``train.py --init-from`` fine-tunes from it (a fresh optimizer, step 0) or refuses what is not a checkpoint
of this project in one line, and a damaged file is refused in one line by every core command. Every registered model,
each trained a few tiny steps by train.py (in this process: a few seconds each)."""

import json
from pathlib import Path

import pytest
import torch
from conftest import (ROOT, TEST_MODEL, flip_tensor_bytes, made_once, reframed_checkpoint, run_main, run_train_main,
                      shared_corpus, synth_corpus, tiny_checkpoint, train_in_process)

import inference
from models import MODELS
from parts import PARTS, config_schemas
from utils.checkpoint.files import CheckpointError
from utils.checkpoint.weights import read_weights
from utils.config import load_config

pytestmark = pytest.mark.skipif(TEST_MODEL is None, reason="no model is registered in models/__init__.py")
NAMES = sorted(MODELS)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return shared_corpus(tmp_path_factory, "export_corpus", 10)


@pytest.fixture(scope="module", params=NAMES)
def trained(request, corpus, tmp_path_factory):
    """``(model name, output folder)`` of 3 tiny training steps on one process with ``train.ema_decay=0.5`` (once per
    session: :func:`conftest.made_once`)."""
    name = request.param

    def run(folder):
        said = train_in_process(train_args(name, corpus, folder / "run", "--max-steps", "3", "--set",
                                           "train.ema_decay=0.5"))
        assert "validation with an EMA of the weights (decay 0.5)" in said, said[-3000:]
    return name, made_once(tmp_path_factory, f"export_trained_{name}", run)[0] / "run"


def train_args(name, corpus, out, *extra):
    return ["--config", "config.json", "--model", name, "--tiny", "--dataset-path", str(corpus), "--output-dir",
            str(out), "--set", "data.num_workers=0", *extra]


def refused_in_one_line(commands: dict) -> None:
    """Run each of ``commands`` (``{what: (module, its arguments..., start of its ERROR line)}``: ``train``, ``inference``,
    ``scripts.NAME``) through the module's ``main`` in this process (:func:`conftest.run_train_main`,
    :func:`conftest.run_main`: the code its command line runs, without an interpreter's start-up; a real process
    refusing a checkpoint in one line: ``tests/test_bad_input.py``): each exits 1 with exactly one ``ERROR:`` line,
    which starts as given, and no traceback (an exception would end the test with its own)."""
    for what, (args, said) in commands.items():
        if args[0] == "train":
            code, _, stderr = run_train_main(list(args[1:]))
        else:
            done = run_main(*args, check=False)
            code, stderr = done.returncode, done.stderr
        errors = [line for line in stderr.splitlines() if line.startswith("ERROR:")]
        assert code == 1 and len(errors) == 1 and errors[0].startswith(said), (what, stderr[-3000:])
        assert "Traceback" not in stderr, (what, stderr[-3000:])


def test_inference_runs_the_ema_weights_when_the_checkpoint_has_them(trained):
    name, run = trained
    saved = torch.load(run / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    _, model, _ = inference.load_trained(run / "checkpoint_last.pt", torch.device("cpu"))
    weights = model.state_dict()
    assert saved["ema"] and all(torch.equal(weights[key], value) for key, value in saved["ema"].items())
    assert any(not torch.equal(saved["model"][key], value) for key, value in saved["ema"].items()), "EMA == raw"


def test_fine_tuning_from_a_full_checkpoint_starts_at_step_0_with_its_weights(trained, corpus, tmp_path):
    name, run = trained
    out = tmp_path / "fine_tuned"
    code, output, errors = run_train_main(train_args(name, corpus, out, "--max-steps", "1", "--init-from",
                                                     str(run / "checkpoint_last.pt"), "--set", "optimizer.lr=1e-9"))
    assert code == 0 and f"initialised {name} from {run / 'checkpoint_last.pt'}" in errors, errors[-3000:]
    assert "a fresh optimizer, step 0" in errors
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1]
    # a learning rate of 1e-9: one Adam step moves a weight by about 1e-9, so the weights are the loaded ones
    before = torch.load(run / "checkpoint_last.pt", map_location="cpu", weights_only=True)["model"]
    after = torch.load(out / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert after["step"] == 1
    params = [key for key, _ in inference.load_trained(run / "checkpoint_last.pt", torch.device("cpu"))[1]
              .named_parameters()]  # not buffers: a training step moves BatchNorm's running statistics
    assert max((before[key] - after["model"][key]).abs().max().item() for key in params) <= 1e-6


def test_a_checkpoint_of_this_project_is_read_and_a_missing_one_is_one_line(tmp_path):
    cfg = load_config(str(Path(ROOT) / "config.json"), config_schemas(), tiny=True)
    checkpoint = tiny_checkpoint(TEST_MODEL, tmp_path / "own.pt")
    weights = read_weights(checkpoint, MODELS, cfg, formats=PARTS.formats)
    assert weights.model_name == TEST_MODEL and weights.source == f"a checkpoint of model '{TEST_MODEL}' at step 0"
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True)["model"]
    assert weights.state.keys() == saved.keys() and all(torch.equal(weights.state[key], saved[key]) for key in saved)
    with pytest.raises(CheckpointError, match="no such file or folder"):
        read_weights(tmp_path / "missing.pt", MODELS, cfg, formats=PARTS.formats)


def test_inference_frames_as_the_checkpoint_records_and_an_early_import_as_its_models_reference(tmp_path, capsys):
    """``inference.load_trained``'s mel framing: the checkpoint's (here not its model's reference); jik876
    where it records none (made before the setting existed), a release of such a checkpoint (``source``, step 3, null)
    too; the model's reference framing (its ``ModelSpec.recipe``'s, else the project's), with one note, for a file of
    an earlier ``scripts.import_weights``, which recorded null (``source``, step 0)."""
    reference = MODELS[TEST_MODEL].recipe.get("audio.mel_framing", "jik876")
    other = {"nvidia": "jik876", "jik876": "nvidia"}[reference]
    own = tiny_checkpoint(TEST_MODEL, tmp_path / "own.pt")
    cases = {"trained": (other, {}), "before the setting": (..., {}),
             "release of one before": (None, {"source": "out/checkpoint_3.pt", "step": 3}),
             "early import": (None, {"source": "waveglow_256channels.pt", "step": 0})}
    for what, (framing, entries) in cases.items():
        path = reframed_checkpoint(own, tmp_path / "case.pt", framing, entries)
        capsys.readouterr()
        cfg = inference.load_trained(path, torch.device("cpu"))[2]
        notes = capsys.readouterr().err.splitlines()
        expected = {"trained": other, "before the setting": "jik876", "release of one before": "jik876",
                    "early import": reference}
        assert cfg.audio.framing == expected[what], what
        assert notes == ([f"note: {path} records no audio.mel_framing (an import of an earlier version): its mels are "
                          f"framed as {TEST_MODEL}'s reference frames them, {reference} (ModelSpec.recipe)"]
                         if what == "early import" else []), (what, notes)


def test_init_from_a_file_that_is_no_checkpoint_of_this_project_is_one_error_line_naming_it(tmp_path):
    """A ``torch.save`` of a plain dict (another project's weights): refused before any training, in one line that
    names the file; it speaks of published formats only where the project reads them (utils.checkpoint.published)."""
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": {"a": torch.zeros(1)}}, foreign)
    corpus, out = synth_corpus(tmp_path / "corpus", n=4), tmp_path / "out"
    code, _, errors = run_train_main(train_args(TEST_MODEL, corpus, out, "--max-steps", "1", "--init-from",
                                                str(foreign)))
    lines = [line for line in errors.splitlines() if line.startswith("ERROR:")]
    assert code == 1 and len(lines) == 1 and "Traceback" not in errors, errors[-3000:]
    assert str(foreign) in lines[0] and "not a checkpoint of this project" in lines[0], lines
    assert ("published" in lines[0]) == (PARTS.formats.published is not None), lines
    assert not list(out.glob("checkpoint_*")), "nothing was trained"


@pytest.mark.slow
def test_init_from_another_model_is_refused_and_a_folder_with_its_own_checkpoint_resumes(tmp_path):
    corpus, out = synth_corpus(tmp_path / "corpus", n=10), tmp_path / "out"

    def train(*extra):  # in this process: what is proven is --init-from and --resume, not the launch
        code, out_text, err = run_train_main(["--config", "config.json", "--model", TEST_MODEL, "--tiny",
                                              "--dataset-path", str(corpus), "--output-dir", str(out), "--set",
                                              "data.num_workers=0", *extra])
        return code, out_text + err
    others = [name for name in MODELS if name != TEST_MODEL]
    if others:
        other = tiny_checkpoint(others[0], tmp_path / "other.pt")
        code, output = train("--max-steps", "1", "--init-from", str(other))
        assert code == 1 and f"holds a '{others[0]}' model; this run trains '{TEST_MODEL}'" in output, output[-2000:]
    code, output = train("--max-steps", "1", "--init-from", str(tiny_checkpoint(TEST_MODEL, tmp_path / "own.pt")))
    assert code == 0 and f"initialised {TEST_MODEL} from {tmp_path / 'own.pt'}" in output, output[-2000:]
    code, output = train("--max-steps", "2", "--init-from", str(tmp_path / "own.pt"))
    assert code == 0 and "is not used" in output and "resumed from" in output, output[-2000:]


@pytest.mark.slow  # every core command's start-up, three times
def test_a_checkpoint_with_64_bytes_flipped_is_refused_in_one_line_by_every_command(corpus, tmp_path):
    """Bytes changed inside a tensor (a disk's or a copy's damage) read without complaint by torch.load: the zip
    archive's CRC-32 of the record finds them before any command uses the weights or writes anything."""
    name = NAMES[0]
    path = tiny_checkpoint(name, tmp_path / "model.pt")
    damaged = f"{path} is damaged (its record {flip_tensor_bytes(path)} fails its CRC-32 check: its bytes changed"
    train = ["train", "--config", "config.json", "--model", name, "--tiny", "--dataset-path", str(corpus),
             "--set", "data.num_workers=0", "--max-steps", "1"]
    refused_in_one_line({
        "inference": (["inference", "--checkpoint", str(path), "--output", str(tmp_path / "x.wav")],
                      f"ERROR: {damaged}"),
        "resume": ([*train, "--output-dir", str(tmp_path / "resumed"), "--resume", str(path)],
                   f"ERROR: rank 0: --resume {path}: the file is damaged (its record "),
        "init-from": ([*train, "--output-dir", str(tmp_path / "tuned"), "--init-from", str(path)],
                      f"ERROR: rank 0: --init-from {damaged}")})
    assert not (tmp_path / "x.wav").exists()
    assert not list(tmp_path.glob("*/checkpoint_*")), "nothing trained on the damaged weights"
