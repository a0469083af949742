"""shivammehta25/Matcha-TTS's Lightning checkpoints (``models/matcha/published.py``): a tiny one as its training writes
them (``tests/data/reference/matcha_tiny_lightning.ckpt``, made by ``make_fixture_matcha_lightning.py``; its
``hyper_parameters`` omegaconf nodes and a partial) imported by ``scripts.import_weights`` to the reference encoder's
outputs, its settings in the checkpoint's config; a file that would run code refused in one line, nothing run; a run
started from it with ``--init-from`` on its speakers and statistics."""

import functools
import json
import os

import pytest
import torch
from conftest import REFERENCE, ROOT, demo_corpus, reference_fixture, train_in_process

from models import MODELS
from parts import config_schemas
from scripts import import_weights
from utils.config import config_from_dict

FIXTURE = REFERENCE / "matcha_tiny_lightning.ckpt"
SETTINGS = {"n_channels": 16, "filter_channels": 32, "filter_channels_dp": 16, "n_layers": 1, "decoder_channels": [8, 8],
            "attention_head_dim": 4, "num_mid_blocks": 1, "spk_emb_dim": 8, "mel_mean": -6.25, "mel_std": 2.375}
"""What the fixture's ``hyper_parameters`` set (``make_fixture_matcha_lightning.py``'s ``SIZES`` and ``DATA``)."""


def test_the_authors_checkpoint_imports_to_the_reference_encoders_outputs(tmp_path, capsys):
    """Its sizes, statistics and 3 speakers land in the written checkpoint's config (its map ``"0"``..``"2"``: the
    authors' speaker ids); the model built from that config computes the reference's ``mu_x``, ``logw`` and mask."""
    out = tmp_path / "matcha.pt"
    assert import_weights.main([str(FIXTURE), "--output", str(out), "--tiny"]) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"wrote {out}: model 'matcha' from shivammehta25/Matcha-TTS's Lightning checkpoint "
                           "(3 speakers); its settings: matcha.n_channels=16"), said
    saved = torch.load(out, weights_only=True)
    assert {key: saved["config"]["matcha"][key] for key in SETTINGS} == SETTINGS
    assert saved["config"]["data"]["speakers"] == ["0", "1", "2"] and saved["speakers"] == {"0": 0, "1": 1, "2": 2}
    model = MODELS["matcha"].build_model(config_from_dict(saved["config"], config_schemas()))
    model.load_state_dict(saved["model"])
    arrays, _ = reference_fixture("matcha_tiny_expected.npz")
    with torch.no_grad():
        mu_x, logw, mask, _ = model.eval().encode(*(torch.from_numpy(arrays[key]) for key in (
            "text_ids", "text_lengths", "speakers")))
    for name, ours in (("mu_x", mu_x), ("logw", logw), ("x_mask", mask)):
        torch.testing.assert_close(ours, torch.from_numpy(arrays[name]), rtol=1e-5, atol=1e-5)


class RunsAShell:
    """A pickled payload: unpickling it runs ``touch marker`` (``os.system``)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_lightning_file_that_would_run_code_is_refused_in_one_line(tmp_path, capsys):
    """Only the names the authors' files pickle read, as inert records: the optimizer's ``functools.partial`` reads,
    its function ``os.system`` is refused (as a call of it in place of an omegaconf node would be); nothing runs."""
    marker = tmp_path / "ran"
    hyper_parameters = {"optimizer": functools.partial(os.system, f"touch {marker}"), "encoder": RunsAShell(marker)}
    torch.save({"state_dict": {"encoder.encoder.attn_layers.0.conv_q.weight": torch.zeros(1)},
                "hyper_parameters": hyper_parameters, "pytorch-lightning_version": "2.0"}, tmp_path / "evil.ckpt")
    assert import_weights.main([str(tmp_path / "evil.ckpt"), "--output", str(tmp_path / "x.pt"), "--tiny"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"ERROR: the weights file {tmp_path / 'evil.ckpt'}: cannot load it "
                                               "safely: refused by weights_only=True, nothing was run"), err
    assert "system" in err[0] and "functools.partial" not in err[0], err
    assert not marker.exists() and not (tmp_path / "x.pt").exists()


def test_settings_this_model_cannot_honour_are_one_line_naming_the_file(tmp_path, capsys):
    """The fixture's 40 mel bands with the full config's 80: the option to give."""
    assert import_weights.main([str(FIXTURE), "--output", str(tmp_path / "x.pt")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"ERROR: the weights file {FIXTURE}: its n_feats is 40, the config's audio.n_mels 80: "
                   "--set audio.n_mels=40"] and not (tmp_path / "x.pt").exists()


@pytest.mark.slow
def test_a_run_from_the_authors_checkpoint_trains_its_speakers_on_its_statistics(tmp_path_factory, tmp_path):
    """``train.py --init-from`` the file: its settings and statistics set (and recorded as the settings its first
    weights set, which a restart keeps), its speakers first in the run's map, the corpus's appended (their rows
    new)."""
    corpus = demo_corpus(tmp_path_factory, "filelist", speakers=2, n=4)
    out = tmp_path / "out"
    said = train_in_process(["--config", os.path.join(ROOT, "config.json"), "--model", "matcha", "--tiny",
                             "--max-steps", "1", "--dataset-path", str(corpus), "--output-dir", str(out),
                             "--init-from", str(FIXTURE), "--set", "data.num_workers=0", "--set", "data.val_size=2",
                             "--set", "train.val_interval=1000"])
    assert f"initialised matcha from {FIXTURE}, shivammehta25/Matcha-TTS's Lightning checkpoint (3 speakers)" in said
    assert "computed over the" not in said  # the file's statistics normalise the corpus: none computed
    saved = torch.load(out / "checkpoint_last.pt", weights_only=True)
    assert {key: saved["config"]["matcha"][key] for key in SETTINGS} == SETTINGS
    recorded = saved["weights_settings"]["matcha"]  # those that differ from the tiny config's
    assert {"n_channels", "mel_mean", "mel_std"} <= set(recorded) and all(SETTINGS[k] == v for k, v in recorded.items())
    assert json.loads((out / "speakers.json").read_text()) == {"0": 0, "1": 1, "2": 2, "19": 3, "26": 4}
    assert saved["model"]["speakers.weight"].shape == (5, 8)
