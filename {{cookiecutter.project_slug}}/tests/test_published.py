"""``train.py --init-from`` with weights in other projects' published formats (utils/published.py), each written here
the way that project writes it, from this project's tiny models with the other project's key names and classes:

* NVIDIA/tacotron2: ``{"iteration", "state_dict", "optimizer", "learning_rate"}``, every layer wrapped in a
  ``ConvNorm``/``LinearNorm`` and the attention named ``attention_layer`` with a ``location_layer``;
* NVIDIA/waveglow: ``{"model": <a pickled glow.WaveGlow module>, ...}``, written with stand-in ``glow`` classes of the
  same structure (``WN`` ModuleList with ``in_layers``, ``res_skip_layers``, ``cond_layer``, ``start``, ``end``;
  ``convinv`` of ``Invertible1x1Conv`` holding ``conv``; ``upsample``) and torch's old weight norm, then loaded with
  no ``glow`` module anywhere: nothing of the file may run;
* jik876/hifi-gan: ``{"generator": state_dict}`` with ``resblocks.<i * kernels + j>.convs1/convs2`` and old weight norm.

Each must load to exactly the weights it was made from. No download: the real files are far too large for a test.
"""

import re
import sys
import types
from pathlib import Path

import pytest
import torch
from torch import nn

from conftest import ROOT, bound, finish, start_job, synth_corpus
from model import MODELS, config_schemas
from utils.checkpoint import CheckpointError
from utils.config import load_config
from utils.published import load_into, read_weights


def tiny(name: str) -> tuple[nn.Module, object]:
    cfg = load_config(str(Path(ROOT) / "config.json"), config_schemas(), tiny=True)
    torch.manual_seed(0)
    model = MODELS[name].build_model(cfg)
    with torch.no_grad():  # every weight distinct from a fresh model's (a zero-initialised layer included)
        for param in model.parameters():
            param.add_(0.01 * torch.randn_like(param))
    return model, cfg


def needs(name: str):
    return pytest.mark.skipif(name not in MODELS, reason=f"this project has no {name} model")


def old_weight_norm_names(key: str) -> str:
    return key.replace(".parametrizations.weight.original0", ".weight_g").replace(
        ".parametrizations.weight.original1", ".weight_v")


# --- NVIDIA/tacotron2 --------------------------------------------------------------------------------------------

def as_nvidia_tacotron2(key: str) -> str:
    """This project's Tacotron2 key -> NVIDIA's (the ConvNorm/LinearNorm wrappers, the attention's names)."""
    key = re.sub(r"^(encoder|postnet)\.convolutions\.(\d+)\.0\.", r"\1.convolutions.\2.0.conv.", key)
    key = re.sub(r"^decoder\.prenet\.layers\.(\d+)\.", r"decoder.prenet.layers.\1.linear_layer.", key)
    key = re.sub(r"^decoder\.attention\.(query_layer|memory_layer|v)\.", r"decoder.attention_layer.\1.linear_layer.",
                 key)
    key = key.replace("decoder.attention.location_conv.", "decoder.attention_layer.location_layer.location_conv.conv.")
    key = key.replace("decoder.attention.location_dense.",
                      "decoder.attention_layer.location_layer.location_dense.linear_layer.")
    return re.sub(r"^decoder\.(linear_projection|gate_layer)\.", r"decoder.\1.linear_layer.", key)


@needs("tacotron2")
def test_nvidias_tacotron2_checkpoint_loads_exactly(tmp_path):
    model, _ = tiny("tacotron2")
    theirs = {as_nvidia_tacotron2(key): value for key, value in model.state_dict().items()}
    assert "decoder.attention_layer.location_layer.location_conv.conv.weight" in theirs  # NVIDIA's own names
    assert "encoder.convolutions.0.0.conv.weight" in theirs and "decoder.gate_layer.linear_layer.bias" in theirs
    torch.save({"iteration": 40000, "state_dict": theirs, "optimizer": {"state": {}, "param_groups": []},
                "learning_rate": 1e-3}, tmp_path / "checkpoint_40000")
    weights = read_weights(tmp_path / "checkpoint_40000", MODELS)
    assert (weights.model_name, weights.source) == ("tacotron2", "NVIDIA/tacotron2's checkpoint")
    fresh, _ = tiny("tacotron2")
    fresh.apply(lambda m: m.reset_parameters() if hasattr(m, "reset_parameters") else None)
    assert load_into(fresh, weights, "x") == []
    for key, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key


# --- NVIDIA/waveglow ---------------------------------------------------------------------------------------------

def pickled_waveglow(model: nn.Module, marker: Path) -> tuple[types.ModuleType, nn.Module]:
    """A stand-in for NVIDIA's pickled ``glow.WaveGlow`` holding ``model``'s weights: modules of ``glow``'s classes
    with NVIDIA's attribute names, old weight norm (``weight_g``/``weight_v``), 1x1 convolutions as ``Conv1d``.
    Unpickling one with its class's code would create ``marker``."""
    glow = types.ModuleType("glow")

    class Module(nn.Module):
        def __setstate__(self, state):  # what running the file's classes would do: must never happen when loading
            marker.write_text("ran")
            super().__setstate__(state)

    for name in ("WaveGlow", "WN", "Invertible1x1Conv"):
        cls = type(name, (Module,), {"__module__": "glow"})
        cls.__qualname__ = name
        setattr(glow, name, cls)
    ours = model.state_dict()
    flows = sorted({int(k.split(".")[1]) for k in ours if k.startswith("flows.")})

    def conv(prefix: str, normed: bool) -> nn.Module:
        weight = ours[f"{prefix}.parametrizations.weight.original1" if normed else f"{prefix}.weight"]
        layer = nn.Conv1d(weight.shape[1], weight.shape[0], weight.shape[2], bias=f"{prefix}.bias" in ours)
        return torch.nn.utils.weight_norm(layer) if normed else layer

    whole = glow.WaveGlow()
    up = ours["upsample.weight"]
    whole.upsample = nn.ConvTranspose1d(up.shape[0], up.shape[1], up.shape[2])
    whole.WN, whole.convinv = nn.ModuleList(), nn.ModuleList()
    state = {"upsample.weight": up, "upsample.bias": ours["upsample.bias"]}
    for i in flows:
        wn = glow.WN()
        layers = sorted({int(k.split(".")[3]) for k in ours if k.startswith(f"flows.{i}.dilated.")})
        wn.in_layers = nn.ModuleList(conv(f"flows.{i}.dilated.{j}", True) for j in layers)
        wn.res_skip_layers = nn.ModuleList(conv(f"flows.{i}.res_skip.{j}", True) for j in layers)
        wn.cond_layer, wn.start = conv(f"flows.{i}.cond", True), conv(f"flows.{i}.start", True)
        wn.end = conv(f"flows.{i}.end", False)
        whole.WN.append(wn)
        inv = glow.Invertible1x1Conv()
        matrix = ours[f"convs.{i}.weight"]
        inv.conv = nn.Conv1d(matrix.shape[0], matrix.shape[0], 1, bias=False)
        whole.convinv.append(inv)
        state[f"convinv.{i}.conv.weight"] = matrix.unsqueeze(-1)
        for key, value in ours.items():
            match = re.match(rf"^flows\.{i}\.(dilated|res_skip|cond|start|end)\.(.*)$", key)
            if match:
                part = {"dilated": "in_layers", "res_skip": "res_skip_layers", "cond": "cond_layer"}.get(
                    match.group(1), match.group(1))
                state[old_weight_norm_names(f"WN.{i}.{part}.{match.group(2)}")] = value
    whole.load_state_dict(state)
    return glow, whole


@needs("waveglow")
def test_nvidias_pickled_waveglow_loads_exactly_without_running_its_code(tmp_path, monkeypatch):
    model, _ = tiny("waveglow")
    marker = tmp_path / "code_ran"
    glow, theirs = pickled_waveglow(model, marker)
    monkeypatch.setitem(sys.modules, "glow", glow)  # importable while it is written, as in NVIDIA's training
    torch.save({"model": theirs, "iteration": 580000, "optimizer": {}, "learning_rate": 1e-4}, tmp_path / "wg.pt")
    monkeypatch.delitem(sys.modules, "glow")  # and nowhere while it is read
    weights = read_weights(tmp_path / "wg.pt", MODELS)
    assert weights.source == "NVIDIA/waveglow's checkpoint (a pickled glow.WaveGlow)"
    fresh = MODELS["waveglow"].build_model(tiny("waveglow")[1])
    load_into(fresh, weights, "wg.pt")
    for key, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key
    assert not marker.exists(), "loading the file ran its code"


# --- jik876/hifi-gan ---------------------------------------------------------------------------------------------

@needs("hifigan")
def test_jik876s_generator_file_loads_exactly_and_the_discriminators_start_afresh(tmp_path):
    model, cfg = tiny("hifigan")
    kernels = len(cfg.hifigan.resblock_kernel_sizes)
    theirs = {}
    for key, value in model.state_dict().items():
        if not key.startswith("generator."):
            continue
        key = old_weight_norm_names(key[len("generator."):])
        match = re.match(r"^mrfs\.(\d+)\.blocks\.(\d+)\.(dilated|plain)\.(.*)$", key)
        if match:
            index = int(match.group(1)) * kernels + int(match.group(2))
            key = f"resblocks.{index}.convs{1 if match.group(3) == 'dilated' else 2}.{match.group(4)}"
        theirs[key] = value
    assert "conv_pre.weight_g" in theirs and "resblocks.0.convs1.0.weight_v" in theirs
    torch.save({"generator": theirs}, tmp_path / "g_02500000")
    weights = read_weights(tmp_path / "g_02500000", MODELS, hifigan_kernels=kernels)
    fresh, _ = tiny("hifigan")
    discriminator = {k: v.clone() for k, v in fresh.state_dict().items() if k.startswith("discriminator.")}
    assert load_into(fresh, weights, "g") == ["discriminator."]
    for key, value in fresh.state_dict().items():
        expected = model.state_dict()[key] if key.startswith("generator.") else discriminator[key]
        assert torch.equal(value, expected), key


@needs("tacotron2")
def test_published_weights_become_a_checkpoint_inference_reads(tmp_path, capsys):
    """scripts/import_weights.py: to listen to published weights without training."""
    import importlib.util

    import inference

    model, _ = tiny("tacotron2")
    torch.save({"state_dict": {as_nvidia_tacotron2(k): v for k, v in model.state_dict().items()}}, tmp_path / "t.pt")
    spec = importlib.util.spec_from_file_location("import_weights", Path(ROOT) / "scripts" / "import_weights.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "tacotron2.pt"
    assert script.main([str(tmp_path / "t.pt"), "--output", str(out), "--tiny"]) == 0
    assert f"wrote {out}: model 'tacotron2' from NVIDIA/tacotron2's checkpoint" in capsys.readouterr().out
    assert script.main([str(tmp_path / "t.pt"), "--output", str(out), "--tiny"]) == 1  # exists: kept
    assert "exists; pass --force" in capsys.readouterr().err
    state = torch.load(out, weights_only=True)
    assert state["step"] == 0 and all(torch.equal(state["model"][k], v) for k, v in model.state_dict().items())
    assert inference.main(["--checkpoint", str(out), "--text", "Hi.", "--output", str(tmp_path / "hi.wav"),
                           "--device", "cpu"]) == 0
    assert (tmp_path / "hi.wav").is_file()


def test_a_file_of_no_known_format_is_one_line(tmp_path):
    torch.save({"weights": {"a": torch.zeros(1)}}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not a checkpoint of this project, nor one of the published formats"):
        read_weights(tmp_path / "other.pt", MODELS)
    with pytest.raises(CheckpointError, match="no such file or folder"):
        read_weights(tmp_path / "missing.pt", MODELS)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(MODELS) & {"tacotron2", "waveglow", "hifigan"}))
def test_a_run_starts_from_published_weights_and_inference_reads_its_checkpoint(tmp_path, monkeypatch, name):
    """``train.py --init-from FILE``: one step from the published weights, then ``inference.py`` on its checkpoint."""
    model, cfg = tiny(name)
    if name == "tacotron2":
        torch.save({"state_dict": {as_nvidia_tacotron2(k): v for k, v in model.state_dict().items()}},
                   tmp_path / "published.pt")
        infer = ["--text", "Hello."]
    elif name == "waveglow":
        glow, theirs = pickled_waveglow(model, tmp_path / "code_ran")
        monkeypatch.setitem(sys.modules, "glow", glow)
        torch.save({"model": theirs}, tmp_path / "published.pt")
        infer = []
    else:
        kernels = len(cfg.hifigan.resblock_kernel_sizes)
        generator = {}
        for key, value in model.state_dict().items():
            if key.startswith("generator."):
                key = old_weight_norm_names(key[len("generator."):])
                match = re.match(r"^mrfs\.(\d+)\.blocks\.(\d+)\.(dilated|plain)\.(.*)$", key)
                if match:
                    key = (f"resblocks.{int(match.group(1)) * kernels + int(match.group(2))}."
                           f"convs{1 if match.group(3) == 'dilated' else 2}.{match.group(4)}")
                generator[key] = value
        torch.save({"generator": generator}, tmp_path / "published.pt")
        infer = []
    corpus, out = synth_corpus(tmp_path / "corpus", n=10), tmp_path / "out"
    code, output = finish(start_job([sys.executable, "train.py", "--config", "config.json", "--model", name, "--tiny",
                                     "--max-steps", "1", "--init-from", str(tmp_path / "published.pt"),
                                     "--dataset-path", str(corpus), "--output-dir", str(out), "--set",
                                     "data.num_workers=0"], tmp_path, nproc=1), timeout=bound(240, 1))
    assert code == 0 and f"initialised {name} from {tmp_path / 'published.pt'}" in output, output[-3000:]
    if not infer:
        infer = ["--wav", str(sorted((corpus / "wavs").glob("*.wav"))[0])]
    code, output = finish(start_job([sys.executable, "inference.py", "--checkpoint", str(out / "checkpoint_last.pt"),
                                     "--device", "cpu", "--output", str(tmp_path / "x.wav"), *infer], tmp_path,
                                    nproc=1), timeout=bound(240, 1))
    assert code == 0 and (tmp_path / "x.wav").is_file(), output[-3000:]
