"""Tacotron2 against NVIDIA/tacotron2: given the reference's weights (``conftest.formula_state``, in its key names,
read by ``Published.read``), text and mel, teacher-forced and free-running decoding compute the reference's mels,
gates and alignments (``tests/data/reference``, whose README says how it was made); its checkpoints import, bare
state dicts and ``train.py``'s dicts, zip or legacy format, with NVIDIA's text cleaners."""

import warnings

import pytest
import torch
from conftest import (assert_close, formula_state, import_published, mel_input, reference_config, reference_fixture,
                      reference_model)

from models import MODELS
from models.tacotron2.text import text_to_sequence

pytestmark = [pytest.mark.skipif("tacotron2" not in MODELS, reason="no Tacotron2 in this project"),
              pytest.mark.filterwarnings("error::DeprecationWarning", "error::FutureWarning")]


@pytest.mark.parametrize("variant", ["dropout", "no_prenet_dropout"])
def test_teacher_forced_and_free_running_decoding_compute_nvidias(variant):
    """In eval mode the pre-net's dropout stays on (seeded: the reference's masks, all T + 1 frames at once) or off."""
    teacher, meta = reference_fixture("net_tacotron2_tf.npz")
    free, _ = reference_fixture("net_tacotron2_fr.npz")
    cfg = reference_config(tacotron2={"max_decoder_steps": 8})
    model = reference_model("tacotron2", cfg, MODELS["tacotron2"].published.read(
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
