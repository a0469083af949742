"""Matcha-TTS's ONNX file (``models/matcha/export.py``; ``python -m scripts.export --format onnx``): the whole
text-to-mel graph with its Euler steps fixed at export computes, in ONNX Runtime, the PyTorch model's log-mel from the
same noise (an input of the file, so the two runs start from the same tensor: the comparison is exact up to float32
rounding); a bad export argument is one ``ERROR:`` line, nothing written. The generic export tests run every model,
this one's included (``tests/test_onnx_export.py``, ``tests/test_export.py``)."""

import importlib.util

import pytest
import torch
from conftest import REFERENCE, tiny_checkpoint

from inference import load_trained
from scripts import export, import_weights

pytestmark = pytest.mark.skipif(any(importlib.util.find_spec(name) is None for name in ("onnx", "onnxruntime")),
                                reason="ONNX export needs the onnx and onnxruntime packages")

TOLERANCE = 1e-4
"""Log-mel (natural log) units: float32 rounding through the encoder and 3 Euler steps gives ~1e-5 here (one ulp of
the mels' ~6 is 5e-7); 1e-4 is a 0.0004 dB level, while another step count or another noise moves the mel by > 0.01."""


def pytorch_mel(model, cfg, feed: dict, n_timesteps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The eager model's ``(log-mel (B, n_feats, max length), mel_lengths)`` of the file's inputs ``feed``."""
    out = model.synthesise(feed["x"], feed["x_lengths"], n_timesteps, float(feed["scales"][0]), feed["spks"],
                           float(feed["scales"][1]), noise=feed["noise"])
    frames = int(out["mel_lengths"].max())
    return out["decoder_out"][:, :, :frames] * cfg.matcha.mel_std + cfg.matcha.mel_mean, out["mel_lengths"]


def test_the_onnx_file_of_the_authors_checkpoint_speaks_as_pytorch_from_the_same_noise(tmp_path, capsys):
    """The authors' tiny checkpoint (3 speakers, its mel statistics), imported and exported with ``--n-timesteps 3``:
    on a padded batch of two voices ONNX Runtime gives PyTorch's mel lengths and log-mels within :data:`TOLERANCE`,
    with noise longer than the frames and with noise shorter (frames past it start at the mean, in both); the file runs
    3 steps (PyTorch with 2 differs), and its noise input and both scales are used."""
    import onnxruntime  # an optional dependency (the module is skipped without it)

    checkpoint, folder = tmp_path / "matcha.pt", tmp_path / "onnx"
    assert import_weights.main([str(REFERENCE / "matcha_tiny_lightning.ckpt"), "--output", str(checkpoint),
                                "--tiny"]) == 0
    assert export.main(["--checkpoint", str(checkpoint), "--format", "onnx", "--output", str(folder),
                        "--n-timesteps", "3"]) == 0
    said = capsys.readouterr().out
    assert "3 Euler steps" in said and "wrote 1 ONNX file(s)" in said, said
    session = onnxruntime.InferenceSession(str(folder / "text_to_mel.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["x", "x_lengths", "scales", "spks", "noise"]
    assert [o.name for o in session.get_outputs()] == ["mel", "mel_lengths"]
    _, model, cfg = load_trained(checkpoint, torch.device("cpu"))
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 40, (2, 9), generator=gen)
    ids[1, 5:] = 0
    feed = {"x": ids, "x_lengths": torch.tensor([9, 5]), "scales": torch.tensor([0.667, 1.0]),
            "spks": torch.tensor([2, 0]), "noise": torch.randn(2, model.n_feats, 400, generator=gen)}

    def onnx(**changed):
        got = session.run(None, {key: value.numpy() for key, value in {**feed, **changed}.items()})
        return tuple(torch.from_numpy(array) for array in got)

    mel, lengths = onnx()
    want, want_lengths = pytorch_mel(model, cfg, feed, 3)
    assert torch.equal(lengths, want_lengths) and lengths.min() > 4 and mel.shape == want.shape
    assert (mel - want).abs().max() < TOLERANCE
    assert (pytorch_mel(model, cfg, feed, 2)[0] - mel).abs().max() > 100 * TOLERANCE  # the steps are fixed at 3
    short = feed["noise"][:, :, :4]
    mel_short = onnx(noise=short)[0]
    assert (mel_short - pytorch_mel(model, cfg, {**feed, "noise": short}, 3)[0]).abs().max() < TOLERANCE
    assert (mel_short - mel).abs().max() > 100 * TOLERANCE  # the noise is read
    assert (onnx(scales=torch.tensor([0.2, 1.0]))[0] - mel).abs().max() > 100 * TOLERANCE  # the temperature
    assert torch.equal(onnx(scales=torch.tensor([0.667, 2.0]))[1], 2 * lengths)  # the length scale


def test_a_bad_export_argument_is_one_error_line_and_writes_nothing(tmp_path, capsys):
    """``--n-timesteps 0``, ``--n-timesteps`` with ``--format release``, and a checkpoint whose config records no mel
    statistics (its mels' scale unknown): each one ``ERROR:`` line naming what is wrong, exit status 1."""
    checkpoint = tiny_checkpoint("matcha", tmp_path / "untrained.pt")  # its config's statistics null
    output = tmp_path / "out"
    cases = {
        ("--format", "onnx", "--n-timesteps", "0"): "ERROR: --n-timesteps 0: a sampler's graph needs at least 1 step",
        ("--format", "release", "--n-timesteps", "4"): "ERROR: --n-timesteps is an option of --format onnx",
        ("--format", "onnx"): "ERROR: the checkpoint records no matcha.mel_mean or mel_std (a training run sets them)",
    }
    for args, expected in cases.items():
        assert export.main(["--checkpoint", str(checkpoint), "--output", str(output), *args]) == 1
        captured = capsys.readouterr()
        assert captured.err.startswith(expected) and captured.err.count("\n") == 1, (args, captured.err)
        assert "Traceback" not in captured.err and not output.exists(), args
