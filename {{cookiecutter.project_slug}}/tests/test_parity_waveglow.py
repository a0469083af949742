"""WaveGlow against NVIDIA/waveglow: given the reference's weights (``conftest.formula_state``, in its key names, read
by ``Published.read``) and inputs, the flow computes the reference's ``z`` and log-determinants, and a seeded ``infer``
its audio (``tests/data/reference``, whose README says how it was made); its published files in PyTorch's legacy
format and with 2018's per-layer conditioning read."""

import numpy as np
import pytest
import soundfile as sf
import torch
from conftest import (REFERENCE, as_records, assert_close, audio_input, formula_state, import_published, mel_input,
                      reference_config, reference_fixture, reference_model, tiny_checkpoint)

import inference
from models import MODELS
from models.waveglow.published import PUBLISHED
from parts import PARTS
from scripts import import_weights
from utils.checkpoint.weights import read_weights

pytestmark = [pytest.mark.skipif("waveglow" not in MODELS, reason="no WaveGlow in this project"),
              pytest.mark.filterwarnings("error::DeprecationWarning", "error::FutureWarning")]


def test_forward_and_seeded_infer_compute_nvidias():
    arrays, meta = reference_fixture("net_waveglow.npz")
    cfg = reference_config()  # the defaults are NVIDIA's published WaveGlow
    model = reference_model("waveglow", cfg, PUBLISHED.read(
        {"model": as_records(formula_state(meta))}, cfg))
    mel = mel_input(3)
    with torch.no_grad():
        z, log_s, log_det = model({"mel": mel, "audio": audio_input(768)})
        noise = 0.6 * torch.cat([torch.from_numpy(arrays[f"noise_{i}"]) for i in (2, 1, 0)], dim=1)
        reversed_noise = model.reverse(mel, noise)
    assert_close(z, arrays["z"], "WaveGlow z")
    assert_close(torch.stack([s.double().sum() for s in log_s]).float(), arrays["log_s_sum"], "sum log s", 1e-4)
    assert_close(torch.stack(log_det), arrays["log_det"], "log det W")
    assert_close(reversed_noise, arrays["infer_audio"], "WaveGlow reverse of the reference's noise")
    torch.manual_seed(1234)  # the reference's seed: the same draws, in its order
    audio = model.infer(mel, sigma=0.6)
    assert_close(audio, arrays["infer_audio"], "WaveGlow infer (seeded)")
    assert audio.abs().max() > 1.5, "infer is not clamped (the reference's reaches 2.0 here)"


def tiny_config(meta):
    config, wn = meta["config"], meta["config"]["WN_config"]
    return {"audio": {"n_mels": config["n_mel_channels"]}, "waveglow": {
        "n_flows": config["n_flows"], "n_group": config["n_group"], "n_early_every": config["n_early_every"],
        "n_early_size": config["n_early_size"], "wn_layers": wn["n_layers"], "wn_channels": wn["n_channels"],
        "wn_kernel_size": wn["kernel_size"]}}


def test_a_legacy_serialized_file_reads_and_computes_its_audio(tmp_path):
    """``waveglow_tiny_legacy.pt``: NVIDIA's ``glow.WaveGlow`` pickled whole in PyTorch's legacy format (as the
    published ``waveglow_256channels.pt``), its module source text a line that raises if it is ever run."""
    arrays, meta = reference_fixture("waveglow_tiny_expected.npz")
    cfg = reference_config(**tiny_config(meta))
    weights = read_weights(REFERENCE / "waveglow_tiny_legacy.pt", MODELS, cfg, formats=PARTS.formats)
    expected = PUBLISHED.read({"model": as_records(formula_state(meta))}, cfg).state
    assert weights.state.keys() == expected.keys()
    assert all(torch.equal(weights.state[key], value) for key, value in expected.items())
    model = reference_model("waveglow", cfg, weights)
    mel = mel_input(2, channels=1)
    with torch.no_grad():
        z, _, log_det = model({"mel": mel, "audio": audio_input(512)})
    assert_close(z, arrays["z"], "legacy WaveGlow z")
    assert_close(torch.stack(log_det), arrays["log_det"], "legacy WaveGlow log det W")
    torch.manual_seed(1234)
    assert_close(model.infer(mel, sigma=0.6), arrays["infer_audio"], "legacy WaveGlow infer (seeded)")
    saved, line = import_published(tmp_path, REFERENCE / "waveglow_tiny_legacy.pt", tiny_config(meta))
    assert "from NVIDIA/waveglow's checkpoint (a pickled glow.WaveGlow); audio.mel_framing=nvidia" in line
    assert torch.equal(saved["model"]["convs.1.weight"], formula_state(meta)["convinv.1.conv.weight"][:, :, 0])


def test_a_2018_file_with_a_cond_layer_per_wn_layer_reads_as_the_fused_one():
    """NVIDIA's WN before August 2019 had ``cond_layers.<i>`` (its ``convert_model.py`` fuses them): the same weights
    as one ``cond_layer`` of the layers' outputs in order."""
    _, meta = reference_fixture("waveglow_tiny_expected.npz")
    fused = formula_state(meta)
    split = {key: value for key, value in fused.items() if ".cond_layer." not in key}
    for key, value in fused.items():
        if ".cond_layer." in key:
            for i, part in enumerate(value.chunk(meta["config"]["WN_config"]["n_layers"])):
                split[key.replace(".cond_layer.", f".cond_layers.{i}.")] = part
    cfg = reference_config(**tiny_config(meta))
    ours, old = (PUBLISHED.read({"model": as_records(state)}, cfg).state for state in (fused, split))
    assert ours.keys() == old.keys() and all(torch.equal(ours[key], old[key]) for key in ours)


def test_infer_draws_the_remaining_channels_first_then_each_early_output_from_the_last():
    """The noise of a seeded ``infer`` is NVIDIA's draws, in its order, laid out as ``reverse`` reads them."""
    cfg = reference_config(**tiny_config(reference_fixture("waveglow_tiny_expected.npz")[1]))
    model = MODELS["waveglow"].build_model(cfg).eval()
    mel = mel_input(2, channels=1)
    torch.manual_seed(0)
    remaining, last_early = torch.randn(1, 6, 64), torch.randn(1, 2, 64)
    torch.manual_seed(0)
    assert torch.equal(model.infer(mel, sigma=0.5), model.reverse(mel, 0.5 * torch.cat([last_early, remaining], 1)))


# --- NVIDIA/waveglow's checkpoints: a pickled module, read without running it --------------------------------------

def nvidia_pickled_waveglow(path, marker):
    """A checkpoint as NVIDIA's WaveGlow training writes it (``{"model": <the pickled glow.WaveGlow>, ...}``), of a tiny
    model of this project: stand-in ``glow`` classes with NVIDIA's structure (``upsample``; ``WN``, a ModuleList of
    ``WN`` with ``in_layers``, ``res_skip_layers``, ``cond_layer``, ``start``, ``end``; ``convinv`` of
    ``Invertible1x1Conv`` holding a 1x1 ``Conv1d`` ``conv``), torch's old weight norm. ``glow`` is importable only while
    it is written; unpickling with its classes' code would write ``marker``. Returns the model."""
    import re
    import sys
    import types
    import warnings

    from conftest import old_weight_norm_names, perturbed_tiny_model
    from torch import nn

    model, cfg = perturbed_tiny_model("waveglow")
    glow = types.ModuleType("glow")

    class Module(nn.Module):
        def __setstate__(self, state):  # what running the file's classes would do: never, when it is loaded
            marker.write_text("ran")
            super().__setstate__(state)

    for name in ("WaveGlow", "WN", "Invertible1x1Conv"):
        cls = type(name, (Module,), {"__module__": "glow"})
        cls.__qualname__ = name
        setattr(glow, name, cls)
    ours = model.state_dict()

    def conv(prefix: str, normed: bool) -> nn.Module:
        weight = ours[f"{prefix}.parametrizations.weight.original1" if normed else f"{prefix}.weight"]
        layer = nn.Conv1d(weight.shape[1], weight.shape[0], weight.shape[2], bias=f"{prefix}.bias" in ours)
        if not normed:
            return layer
        with warnings.catch_warnings():  # NVIDIA's file holds torch's old weight norm: made with it, on purpose
            warnings.simplefilter("ignore", FutureWarning)
            return nn.utils.weight_norm(layer)

    whole = glow.WaveGlow()
    whole.upsample = nn.ConvTranspose1d(*ours["upsample.weight"].shape[:2], ours["upsample.weight"].shape[2])
    whole.WN, whole.convinv = nn.ModuleList(), nn.ModuleList()
    state = {"upsample.weight": ours["upsample.weight"], "upsample.bias": ours["upsample.bias"]}
    parts = {"dilated": "in_layers", "res_skip": "res_skip_layers", "cond": "cond_layer"}
    for i in sorted({int(k.split(".")[1]) for k in ours if k.startswith("flows.")}):
        wn = glow.WN()
        layers = sorted({int(k.split(".")[3]) for k in ours if k.startswith(f"flows.{i}.dilated.")})
        wn.in_layers = nn.ModuleList(conv(f"flows.{i}.dilated.{j}", True) for j in layers)
        wn.res_skip_layers = nn.ModuleList(conv(f"flows.{i}.res_skip.{j}", True) for j in layers)
        wn.cond_layer, wn.start, wn.end = conv(f"flows.{i}.cond", True), conv(f"flows.{i}.start", True), \
            conv(f"flows.{i}.end", False)
        whole.WN.append(wn)
        inv = glow.Invertible1x1Conv()
        inv.conv = nn.Conv1d(ours[f"convs.{i}.weight"].shape[0], ours[f"convs.{i}.weight"].shape[0], 1, bias=False)
        whole.convinv.append(inv)
        state[f"convinv.{i}.conv.weight"] = ours[f"convs.{i}.weight"].unsqueeze(-1)
        for key, value in ours.items():
            match = re.match(rf"^flows\.{i}\.(dilated|res_skip|cond|start|end)\.(.*)$", key)
            if match:
                state[old_weight_norm_names(f"WN.{i}.{parts.get(match.group(1), match.group(1))}.{match.group(2)}")] = \
                    value
    whole.load_state_dict(state)
    sys.modules["glow"] = glow  # importable while it is written, as in NVIDIA's training ...
    try:
        torch.save({"model": whole, "iteration": 580000, "optimizer": {}, "learning_rate": 1e-4}, path)
    finally:
        del sys.modules["glow"]  # ... and nowhere while it is read
    return model, cfg


def test_nvidias_pickled_waveglow_loads_exactly_without_running_its_code(tmp_path):
    from utils.checkpoint.weights import load_into, read_weights

    marker = tmp_path / "code_ran"
    model, cfg = nvidia_pickled_waveglow(tmp_path / "wg.pt", marker)
    weights = read_weights(tmp_path / "wg.pt", MODELS, cfg, formats=PARTS.formats)
    assert weights.source == "NVIDIA/waveglow's checkpoint (a pickled glow.WaveGlow)"
    fresh = MODELS["waveglow"].build_model(cfg)
    load_into(fresh, weights, "wg.pt")
    for key, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key
    assert not marker.exists(), "loading the file ran its code"


@pytest.mark.slow
def test_a_run_starts_from_nvidias_waveglow_weights(tmp_path):
    from conftest import train_from_and_infer

    nvidia_pickled_waveglow(tmp_path / "waveglow_256channels.pt", tmp_path / "code_ran")
    train_from_and_infer(tmp_path, "waveglow", tmp_path / "waveglow_256channels.pt", [])
    assert not (tmp_path / "code_ran").exists()


def test_an_imported_waveglow_vocodes_a_wav_to_as_many_samples_as_the_checkpoint_it_came_from(tmp_path, capsys):
    """``scripts.import_weights`` of NVIDIA's WaveGlow file and of this project's WaveGlow checkpoint records NVIDIA's
    framing (WaveGlow's recipe): ``inference.py --wav`` of a 0.5 s clip then vocodes ``1 + T // hop`` frames, as
    NVIDIA's ``TacotronSTFT`` and the checkpoint itself do: 11,264 samples (jik876's frames: 11,008)."""
    nvidia_pickled_waveglow(tmp_path / "nvidia.pt", tmp_path / "code_ran")
    tiny_checkpoint("waveglow", tmp_path / "own.pt")
    clip = tmp_path / "clip.wav"
    sf.write(clip, 0.1 * np.sin(np.arange(11025) / 10.0).astype(np.float32), 22050, subtype="PCM_16")
    samples = {}
    for name in ("nvidia", "own"):
        assert import_weights.main([str(tmp_path / f"{name}.pt"), "--output", str(tmp_path / f"{name}_imported.pt"),
                                    "--tiny"]) == 0, capsys.readouterr().err
        saved = torch.load(tmp_path / f"{name}_imported.pt", weights_only=True)
        assert saved["config"]["audio"]["mel_framing"] == "nvidia", name
    for name in ("own", "own_imported", "nvidia_imported"):
        assert inference.main(["--checkpoint", str(tmp_path / f"{name}.pt"), "--device", "cpu", "--wav", str(clip),
                               "--output", str(tmp_path / f"{name}.wav")]) == 0, capsys.readouterr().err
        samples[name] = sf.info(str(tmp_path / f"{name}.wav")).frames
    assert samples == {"own": 11264, "own_imported": 11264, "nvidia_imported": 11264}
