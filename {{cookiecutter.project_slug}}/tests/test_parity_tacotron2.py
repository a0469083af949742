"""Tacotron2 against NVIDIA/tacotron2: given the reference's weights (``conftest.formula_state``, in its key names,
read by ``Published.read``), text and mel, teacher-forced and free-running decoding compute the reference's mels,
gates and alignments (``tests/data/reference``, whose README says how it was made); its checkpoints import, bare
state dicts and ``train.py``'s dicts, zip or legacy format, with NVIDIA's text cleaners. NVIDIA's checkpoints start a
run, and the tools that ship a trained model (``scripts.export``: ONNX, release) give inference's output."""

import warnings

import pytest
import torch
from conftest import (assert_close, formula_state, import_published, mel_input, reference_config, reference_fixture,
                      reference_model, tiny_checkpoint)

import inference
from models import MODELS
from models.tacotron2.published import PUBLISHED
from models.tacotron2.network import Tacotron2
from models.tacotron2.text import text_to_sequence
from parts import PARTS

pytestmark = [pytest.mark.skipif("tacotron2" not in MODELS, reason="no Tacotron2 in this project"),
              pytest.mark.filterwarnings("error::DeprecationWarning", "error::FutureWarning")]


@pytest.mark.parametrize("variant", ["dropout", "no_prenet_dropout"])
def test_teacher_forced_and_free_running_decoding_compute_nvidias(variant):
    """In eval mode the pre-net's dropout stays on (seeded: the reference's masks, all T + 1 frames at once) or off."""
    teacher, meta = reference_fixture("net_tacotron2_tf.npz")
    free, _ = reference_fixture("net_tacotron2_fr.npz")
    cfg = reference_config(tacotron2={"max_decoder_steps": 8})
    model = reference_model("tacotron2", cfg, PUBLISHED.read(
        {"state_dict": formula_state(meta)}, cfg))
    assert text_to_sequence(meta["text"], cfg.tacotron2.text_cleaners) == teacher["text_ids"][0].tolist()
    if variant == "no_prenet_dropout":
        model.decoder.prenet.dropout = 0.0
    ids = torch.from_numpy(teacher["text_ids"])
    torch.manual_seed(1234)
    with torch.no_grad():
        out = model({"text": ids, "text_lengths": torch.tensor([ids.shape[1]]), "mel": mel_input(8),
                     "mel_lengths": torch.tensor([8])})
    for key in ("mel", "mel_postnet", "gate", "alignments"):
        assert_close(out[key], teacher[f"tf_{variant}_{key}"], f"teacher-forced {key} ({variant})")
    torch.manual_seed(1234)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # it stops at max_decoder_steps, as the reference's
        outputs = model.inference(ids)
    for key, ours in zip(("mel_postnet", "gate", "alignments"), outputs):
        assert_close(ours, free[f"fr_{variant}_{key}"], f"free-running {key} ({variant})")


def test_bare_and_train_py_state_dicts_import_with_nvidias_text_cleaners(tmp_path):
    """``tacotron2_statedict.pt`` as a bare state dict and as ``train.py`` writes it, in the legacy format: it loads,
    and the config's default text cleaners become NVIDIA's, said in the line; a cleaner the user set stays."""
    _, meta = reference_fixture("net_tacotron2_tf.npz")
    theirs = formula_state(meta)
    for saved_as in (theirs, {"state_dict": theirs, "iteration": 5, "optimizer": None, "learning_rate": 1e-3}):
        torch.save(saved_as, tmp_path / "t2.pt", _use_new_zipfile_serialization=False)
        saved, line = import_published(tmp_path, tmp_path / "t2.pt", {})
        assert torch.equal(saved["model"]["decoder.attention.location_conv.weight"],
                           theirs["decoder.attention_layer.location_layer.location_conv.conv.weight"])
        assert saved["config"]["tacotron2"]["text_cleaners"] == ["nvidia_english_cleaners"]
        assert "text cleaned as NVIDIA's: tacotron2.text_cleaners=['nvidia_english_cleaners']" in line
    saved, line = import_published(tmp_path, tmp_path / "t2.pt", {"tacotron2": {"text_cleaners": ["basic_cleaners"]}})
    assert saved["config"]["tacotron2"]["text_cleaners"] == ["basic_cleaners"] and "NVIDIA's:" not in line


# --- NVIDIA/tacotron2's checkpoints (utils.checkpoint.published, read_published) ----------------------------------

def as_nvidia_tacotron2(key: str) -> str:
    """This project's Tacotron2 key -> NVIDIA's: its ConvNorm/LinearNorm wrappers (``.conv.``, ``.linear_layer.``) and
    its attention's names (``attention_layer``, ``location_layer``)."""
    import re

    key = re.sub(r"^(encoder|postnet)\.convolutions\.(\d+)\.0\.", r"\1.convolutions.\2.0.conv.", key)
    key = re.sub(r"^decoder\.prenet\.layers\.(\d+)\.", r"decoder.prenet.layers.\1.linear_layer.", key)
    key = re.sub(r"^decoder\.attention\.(query_layer|memory_layer|v)\.", r"decoder.attention_layer.\1.linear_layer.",
                 key)
    key = key.replace("decoder.attention.location_conv.", "decoder.attention_layer.location_layer.location_conv.conv.")
    key = key.replace("decoder.attention.location_dense.",
                      "decoder.attention_layer.location_layer.location_dense.linear_layer.")
    return re.sub(r"^decoder\.(linear_projection|gate_layer)\.", r"decoder.\1.linear_layer.", key)


def nvidia_checkpoint(path):
    """A checkpoint laid out as NVIDIA's Tacotron2 training writes it, of a tiny model of this project; the model."""
    from conftest import perturbed_tiny_model

    model, cfg = perturbed_tiny_model("tacotron2")
    theirs = {as_nvidia_tacotron2(key): value for key, value in model.state_dict().items()}
    assert "decoder.attention_layer.location_layer.location_conv.conv.weight" in theirs  # NVIDIA's own names
    assert "encoder.convolutions.0.0.conv.weight" in theirs and "decoder.gate_layer.linear_layer.bias" in theirs
    torch.save({"iteration": 40000, "state_dict": theirs, "optimizer": {"state": {}, "param_groups": []},
                "learning_rate": 1e-3}, path)
    return model, cfg


def test_nvidias_tacotron2_checkpoint_loads_exactly(tmp_path):
    from utils.checkpoint.weights import load_into, read_weights

    model, cfg = nvidia_checkpoint(tmp_path / "checkpoint_40000")
    weights = read_weights(tmp_path / "checkpoint_40000", MODELS, cfg, formats=PARTS.formats)
    assert weights.model_name == "tacotron2" and weights.source.startswith("NVIDIA/tacotron2's checkpoint")
    fresh = Tacotron2(cfg.tacotron2, cfg.audio.n_mels)
    assert load_into(fresh, weights, "x") == []
    for key, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key


def test_published_tacotron2_weights_become_a_checkpoint_inference_reads(tmp_path, capsys):
    """scripts.import_weights: NVIDIA's checkpoint -> this project's, NVIDIA's mel framing recorded, and inference.py
    speaks from it."""
    from scripts import import_weights as script

    model, _ = nvidia_checkpoint(tmp_path / "t.pt")
    out = tmp_path / "tacotron2.pt"
    assert script.main([str(tmp_path / "t.pt"), "--output", str(out), "--tiny"]) == 0
    assert f"wrote {out}: model 'tacotron2' from NVIDIA/tacotron2's checkpoint" in capsys.readouterr().out
    state = torch.load(out, weights_only=True)
    assert state["step"] == 0 and all(torch.equal(state["model"][k], v) for k, v in model.state_dict().items())
    assert state["config"]["audio"]["mel_framing"] == "nvidia"  # Tacotron2's recipe: the frames its GTA mels have
    assert inference.main(["--checkpoint", str(out), "--text", "Hi.", "--output", str(tmp_path / "hi.wav"),
                           "--device", "cpu"]) == 0
    assert (tmp_path / "hi.wav").is_file()


@pytest.mark.slow
def test_a_run_starts_from_nvidias_tacotron2_weights(tmp_path):
    from conftest import train_from_and_infer

    nvidia_checkpoint(tmp_path / "tacotron2_statedict.pt")
    train_from_and_infer(tmp_path, "tacotron2", tmp_path / "tacotron2_statedict.pt", ["--text", "Hello."])


def test_the_onnx_decoder_loop_gives_the_mels_of_inference(tmp_path):
    """scripts.export's three Tacotron2 files (encoder, decoder step, postnet) run by ``run_onnx``'s decoder loop
    give :meth:`Tacotron2.inference`'s mels and gates (ONNX Runtime, CPU)."""
    pytest.importorskip("onnxruntime")
    from conftest import perturbed_tiny_model

    from models.tacotron2.export import run_onnx
    from utils.onnx_export import export_model

    model, cfg = perturbed_tiny_model("tacotron2")
    # Eager inference draws the pre-net's dropout masks itself; with dropout off both loops are deterministic.
    model.decoder.prenet.dropout = 0.0
    export_model("tacotron2", PARTS.exports["tacotron2"], model, cfg, tmp_path, progress=False)
    steps = 6
    model.decoder.max_decoder_steps, model.decoder.gate_threshold = steps, 1.0  # never stops early
    text = torch.randint(1, cfg.tacotron2.n_symbols, (1, 11), generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Tacotron2 decoder reached max_decoder_steps")
        mel, gate, _ = model.inference(text)
    onnx_mel, onnx_gate = run_onnx(tmp_path, text, torch.tensor([11]), cfg, max_steps=steps, gate_threshold=1.0)
    assert onnx_mel.shape == mel.shape == (1, cfg.audio.n_mels, steps)
    assert float(mel.std()) > 1e-3
    assert float((onnx_mel - mel).abs().max()) < 1e-4
    assert float((onnx_gate - gate).abs().max()) < 1e-4


def test_a_release_checkpoint_speaks_like_the_full_one(tmp_path, capsys):
    """``python -m scripts.export --format release`` of a Tacotron2 checkpoint: ``inference.py --text`` writes the
    same wav from both (same seed: the prenet's dropout and Griffin-Lim's phases are drawn alike)."""
    from scripts import export

    full = tiny_checkpoint("tacotron2", tmp_path / "full.pt")
    assert export.main(["--checkpoint", str(full), "--format", "release", "--output", str(tmp_path / "r.pt")]) == 0
    wavs = []
    for source in (full, tmp_path / "r.pt"):
        wavs.append(tmp_path / f"{source.stem}.wav")
        assert inference.main(["--checkpoint", str(source), "--device", "cpu", "--output", str(wavs[-1]),
                               "--text", "The quick brown fox."]) == 0, capsys.readouterr().err
    assert wavs[0].read_bytes() == wavs[1].read_bytes()
