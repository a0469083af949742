"""After training: release checkpoints (python -m scripts.export --format release) and what the tools refuse. Every
registered model, each trained a few tiny steps by train.py (the runs of ``tests/test_weights.py``, which tests them
in the core commands: EMA weights at inference, fine-tuning with --init-from)."""

import sys

import pytest
import torch
from conftest import flip_tensor_bytes, tiny_checkpoint
from test_weights import NAMES, corpus, refused_in_one_line, trained  # noqa: F401 (fixtures)
from torch.utils.data import default_collate

import inference
from models import MODELS
from scripts import export
from utils.training.ema import in_modules


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


def test_a_release_is_smaller_loads_weights_only_and_gives_the_full_checkpoints_output(
        trained, corpus, tmp_path, capsys):  # noqa: F811
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


@pytest.mark.slow  # each tool's start-up
def test_a_checkpoint_with_64_bytes_flipped_is_refused_in_one_line_by_the_tools(tmp_path):
    """Bytes changed inside a tensor, found by the zip archive's CRC-32 before a tool writes anything (the core
    commands on such a file: ``tests/test_weights.py``)."""
    path = tiny_checkpoint(NAMES[0], tmp_path / "model.pt")
    damaged = f"{path} is damaged (its record {flip_tensor_bytes(path)} fails its CRC-32 check: its bytes changed"
    refused_in_one_line({
        "export": (["scripts.export", "--checkpoint", str(path), "--format", "release", "--output",
                    str(tmp_path / "release.pt")], f"ERROR: {damaged}"),
        "import": (["scripts.import_weights", str(path), "--tiny", "--output", str(tmp_path / "i.pt")],
                   f"ERROR: the weights file {damaged}")})
    assert not any((tmp_path / name).exists() for name in ("release.pt", "i.pt"))


def test_an_export_to_a_place_that_cannot_be_written_names_it_and_onnx_needs_its_packages_first(
        trained, tmp_path, capsys, monkeypatch):  # noqa: F811
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


def test_n_timesteps_is_refused_in_one_line_for_a_model_without_a_sampler_and_below_1_step(tmp_path, capsys):
    """``--n-timesteps`` fixes the steps of a sampler in the ONNX graph (a flow-matching decoder's Euler steps): on a model whose
    config has no ``n_timesteps``, or 0 on one that has, one ``ERROR:`` line naming it and nothing written."""
    for name in NAMES:
        sampler = "n_timesteps" in MODELS[name].config_cls.model_fields
        path, output = tiny_checkpoint(name, tmp_path / f"{name}.pt"), tmp_path / f"{name}_onnx"
        assert export.main(["--checkpoint", str(path), "--format", "onnx", "--output", str(output),
                            "--n-timesteps", "0" if sampler else "3"]) == 1
        err = capsys.readouterr().err
        expected = ("ERROR: --n-timesteps 0: a sampler's graph needs at least 1 step" if sampler else
                    f"ERROR: --n-timesteps 3: model '{name}' runs no sampler (its config has no {name}.n_timesteps)")
        assert err.startswith(expected) and err.count("\n") == 1 and not output.exists(), err
