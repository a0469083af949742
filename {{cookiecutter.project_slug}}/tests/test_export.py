"""After training: release checkpoints (python -m scripts.export --format release), EMA weights at inference, fine-tuning
from a full checkpoint with --init-from. Every registered model, each trained a few tiny steps by train.py (in this
process: a few seconds each)."""

import json
import subprocess
import sys

import pytest
import torch
from conftest import (ROOT, bound, flip_tensor_bytes, made_once, run_train_main, shared_corpus, tiny_checkpoint,
                      train_in_process)
from torch.utils.data import default_collate

import inference
from models import MODELS
from scripts import export
from utils.training.ema import in_modules

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


def outputs(path, name, seed=0):
    """The model of checkpoint ``path`` (as ``inference.py`` loads it) on a batch of its corpus's first validation
    utterance, in eval mode: the forward's tensors, flattened into one list."""
    _, model, cfg = inference.load_trained(path, torch.device("cpu"))
    spec = MODELS[name]
    _, val_set = spec.training.build_datasets(cfg)  # the corpus the checkpoint's config names
    batch = (spec.training.collate_fn or default_collate)([val_set[0], val_set[0]])
    torch.manual_seed(seed)  # Tacotron2's prenet keeps its dropout at inference, as NVIDIA's does
    with torch.no_grad():
        result = model(batch)
    flat = []
    stack = [result]
    while stack:
        item = stack.pop()
        if torch.is_tensor(item):
            flat.append(item)
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return flat


def test_a_release_is_smaller_loads_weights_only_and_gives_the_full_checkpoints_output(trained, corpus, tmp_path,
                                                                                      capsys):
    name, run = trained
    release = tmp_path / "release.pt"
    assert export.main(["--checkpoint", str(run / "checkpoint_last.pt"), "--format", "release",
                        "--output", str(release)]) == 0
    assert "EMA weights" in capsys.readouterr().out
    full = run / "checkpoint_last.pt"
    assert release.stat().st_size < full.stat().st_size
    loaded = torch.load(release, map_location="cpu", weights_only=True)
    assert loaded["format"] == "release" and loaded["model_name"] == name and loaded["step"] == 3
    assert not {"optimizer", "scheduler", "scaler", "rng"} & loaded.keys()
    modules = MODELS[name].inference_modules
    assert loaded["model"] and all(in_modules(key, modules) for key in loaded["model"])
    saved = torch.load(full, map_location="cpu", weights_only=True)
    assert len(loaded["model"]) == sum(in_modules(key, modules) for key in saved["model"])
    for a, b in zip(outputs(full, name), outputs(release, name), strict=True):
        assert (a - b).abs().max() <= 1e-6
    vocoder = MODELS[name].inference is not None and MODELS[name].inference.vocode is not None
    if vocoder:  # a vocoder: inference.py writes the same file from both (a text model's command line is tested with
        wavs = []  # the model)
        for source in (full, release):
            wavs.append(tmp_path / f"{source.stem}.wav")
            assert inference.main(["--checkpoint", str(source), "--device", "cpu", "--output", str(wavs[-1]),
                                   "--wav", str(sorted((corpus / "wavs").glob("*.wav"))[0])]) == 0
            assert "is run with the EMA weights of step 3" in capsys.readouterr().err
        assert wavs[0].read_bytes() == wavs[1].read_bytes()
    # an existing output is kept
    assert export.main(["--checkpoint", str(full), "--format", "release", "--output", str(release)]) == 1
    assert "exists; pass --force" in capsys.readouterr().err


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
    fields = set(MODELS[name].config_cls.model_fields)
    lr = ["--set", f"{name}.learning_rate=1e-9"] if "learning_rate" in fields else []
    code, output, errors = run_train_main(train_args(name, corpus, out, "--max-steps", "1", "--init-from",
                                                     str(run / "checkpoint_last.pt"), *lr))
    assert code == 0 and f"initialised {name} from {run / 'checkpoint_last.pt'}" in errors, errors[-3000:]
    assert "a fresh optimizer, step 0" in errors
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1]
    if lr:  # a learning rate of 1e-9: one Adam step moves a weight by about 1e-9, so the weights are the loaded ones
        before = torch.load(run / "checkpoint_last.pt", map_location="cpu", weights_only=True)["model"]
        after = torch.load(out / "checkpoint_last.pt", map_location="cpu", weights_only=True)
        assert after["step"] == 1
        params = [key for key, _ in inference.load_trained(run / "checkpoint_last.pt", torch.device("cpu"))[1]
                  .named_parameters()]  # not buffers: a training step moves BatchNorm's running statistics
        assert max((before[key] - after["model"][key]).abs().max().item() for key in params) <= 1e-6


@pytest.mark.slow  # real processes: the fast tier keeps one 2-process smoke run
def test_a_checkpoint_with_64_bytes_flipped_is_refused_in_one_line_by_every_command(corpus, tmp_path):
    """Bytes changed inside a tensor (a disk's or a copy's damage) read without complaint by torch.load: the zip
    archive's CRC-32 of the record finds them before any command uses the weights or writes anything."""
    name = NAMES[0]
    path = tiny_checkpoint(name, tmp_path / "model.pt")
    damaged = f"{path} is damaged (its record {flip_tensor_bytes(path)} fails its CRC-32 check: its bytes changed"
    train = ["train.py", "--config", "config.json", "--model", name, "--tiny", "--dataset-path", str(corpus),
             "--set", "data.num_workers=0", "--max-steps", "1"]
    commands = {"export": (["-m", "scripts.export", "--checkpoint", str(path), "--format", "release", "--output",
                            str(tmp_path / "release.pt")], f"ERROR: {damaged}"),
                "inference": (["inference.py", "--checkpoint", str(path), "--output", str(tmp_path / "x.wav")],
                              f"ERROR: {damaged}"),
                "resume": ([*train, "--output-dir", str(tmp_path / "resumed"), "--resume", str(path)],
                           f"ERROR: rank 0: --resume {path}: the file is damaged (its record "),
                "init-from": ([*train, "--output-dir", str(tmp_path / "tuned"), "--init-from", str(path)],
                              f"ERROR: rank 0: --init-from {damaged}"),
                "import": (["-m", "scripts.import_weights", str(path), "--tiny", "--output", str(tmp_path / "i.pt")],
                           f"ERROR: the weights file {damaged}")}
    for what, (args, said) in commands.items():
        done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=bound(120, 1))
        errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR:")]
        assert done.returncode == 1 and len(errors) == 1 and errors[0].startswith(said), (what, done.stderr[-3000:])
        assert "Traceback" not in done.stderr, (what, done.stderr[-3000:])
    assert not any((tmp_path / name).exists() for name in ("release.pt", "x.wav", "i.pt"))
    assert not list(tmp_path.glob("*/checkpoint_*")), "nothing trained on the damaged weights"


def test_an_export_to_a_place_that_cannot_be_written_names_it_and_onnx_needs_its_packages_first(
        trained, tmp_path, capsys, monkeypatch):
    name, run = trained
    assert export.main(["--checkpoint", str(run / "checkpoint_last.pt"), "--format", "release", "--output",
                        "/proc/x.pt"]) == 1
    err = capsys.readouterr().err
    assert err.endswith("ERROR: [Errno 2] No such file or directory: '/proc/x.pt'\n") and ".tmp" not in err, err
    monkeypatch.setitem(sys.modules, "onnx", None)  # not installed: its import fails
    target = tmp_path / "onnx"
    assert export.main(["--checkpoint", str(run / "checkpoint_last.pt"), "--format", "onnx", "--output",
                        str(target)]) == 1
    assert capsys.readouterr().err.startswith("ERROR: ONNX export needs the onnx and onnxruntime packages")
    assert not target.exists(), "nothing is created"
