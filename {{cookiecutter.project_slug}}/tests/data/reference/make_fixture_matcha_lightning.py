"""A tiny Lightning checkpoint of shivammehta25/Matcha-TTS's ``MatchaTTS``, as its training writes them (the authors'
published ``matcha_ljspeech.ckpt`` and ``matcha_vctk.ckpt``), for tests/test_matcha_published.py.

Nothing of the reference is copied here: this script imports its modules from the checkout given on the command line
and calls them. The model is the reference's ``MatchaTTS`` with tiny sizes and 3 speakers, its ``hyper_parameters``
as its ``train.py`` gives them (Hydra's ``instantiate`` of ``configs/model/matcha.yaml``): omegaconf ``DictConfig``
nodes resolved from a root config (each keeps its parent), the optimizer a ``functools.partial`` of
``torch.optim.Adam``. Lightning writes the checkpoint (``Trainer.save_checkpoint``); the file pickles only tensors,
containers and those classes' names and states (no code). The expected numbers are the reference encoder's outputs
for one input, computed from the saved weights.

Command (CPU, seconds; the packages of ``make_fixtures_matcha.py``, and lightning and omegaconf)::

    python make_fixture_matcha_lightning.py --matcha Matcha-TTS --output .

Writes ``matcha_tiny_lightning.ckpt`` and ``matcha_tiny_expected.npz`` (meta JSON: the sizes, the input formula;
arrays: ``text_ids``, ``text_lengths``, ``speakers``, ``mu_x``, ``logw``, ``x_mask``).

Run-time stubs (the reference's files are not edited): those of ``make_fixtures_matcha.py``, and
``matcha.utils.utils`` (Hydra, gdown, wget, matplotlib) a module whose ``plot_tensor`` is never called.
"""

from __future__ import annotations

import argparse
import copy
import functools
import importlib
import subprocess
import sys
import types
import warnings
from pathlib import Path

import torch
from make_fixtures import save_npz
from make_fixtures_matcha import install_stubs, text_input

SIZES = {  # the root config's model section: configs/model/*.yaml with tiny sizes
    "n_vocab": 178, "n_spks": "${data.n_spks}", "spk_emb_dim": 8, "n_feats": 40,
    "data_statistics": "${data.data_statistics}", "out_size": None, "prior_loss": True,
    "use_precomputed_durations": "${data.load_durations}",
    "encoder": {"encoder_type": "RoPE Encoder",
                "encoder_params": {"n_feats": "${model.n_feats}", "n_channels": 16, "filter_channels": 32,
                                   "filter_channels_dp": 16, "n_heads": 2, "n_layers": 1, "kernel_size": 3,
                                   "p_dropout": 0.1, "spk_emb_dim": 64, "n_spks": 1, "prenet": True},
                "duration_predictor_params": {"filter_channels_dp": "${model.encoder.encoder_params.filter_channels_dp}",
                                              "kernel_size": 3, "p_dropout": "${model.encoder.encoder_params.p_dropout}"}},
    "decoder": {"channels": [8, 8], "dropout": 0.05, "attention_head_dim": 4, "n_blocks": 1, "num_mid_blocks": 1,
                "num_heads": 2, "act_fn": "snakebeta"},
    "cfm": {"name": "CFM", "solver": "euler", "sigma_min": 1e-4},
}
DATA = {"n_spks": 3, "load_durations": False, "data_statistics": {"mel_mean": -6.25, "mel_std": 2.375}}
SPEAKERS, SEED = (0, 2), 1234


def hyper_parameters(omegaconf) -> dict:
    """What Hydra's ``instantiate(cfg.model)`` hands ``MatchaTTS``: the model section copied, parented to the root,
    resolved; its nested sections ``DictConfig`` s, its optimizer a partial."""
    root = omegaconf.OmegaConf.create({"data": DATA, "model": SIZES})
    model = copy.deepcopy(root.model)
    model._set_parent(root)
    omegaconf.OmegaConf.resolve(model)
    optimizer = functools.partial(torch.optim.Adam, lr=1e-4, weight_decay=0.0)
    return {**{key: model[key] for key in SIZES}, "optimizer": optimizer, "scheduler": None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--matcha", required=True, help="checkout of shivammehta25/Matcha-TTS")
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    warnings.filterwarnings("ignore")
    install_stubs(Path(args.matcha))
    sys.modules["matcha.utils.utils"] = types.SimpleNamespace(plot_tensor=None)
    lightning, omegaconf = importlib.import_module("lightning"), importlib.import_module("omegaconf")
    torch.manual_seed(SEED)
    model = importlib.import_module("matcha.models.matcha_tts").MatchaTTS(**hyper_parameters(omegaconf)).eval()
    trainer = lightning.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                                enable_model_summary=False)
    trainer.strategy.connect(model)
    trainer.save_checkpoint(out / "matcha_tiny_lightning.ckpt")
    ids, lengths = text_input()
    speakers = torch.tensor(SPEAKERS)
    with torch.no_grad():
        mu_x, logw, x_mask = model.encoder(ids, lengths, model.spk_emb(speakers))
    commit = subprocess.run(["git", "-C", args.matcha, "rev-parse", "HEAD"], capture_output=True, text=True)
    meta = {"reference": "matcha.models.matcha_tts.MatchaTTS(**hyper_parameters).encoder(text_ids, text_lengths, "
            "spk_emb(speakers)), eval mode, the weights of matcha_tiny_lightning.ckpt",
            "model": SIZES, "data": DATA, "seed": SEED,
            "text": "ids[b, i] = (37 * i + 11 * b + 5) % 178, i < 8; lengths (8, 5); ids past a length are 0",
            "versions": {"torch": torch.__version__, "lightning": lightning.__version__,
                         "omegaconf": omegaconf.__version__},
            "shivammehta25/Matcha-TTS": commit.stdout.strip() or "unknown (not a git checkout)"}
    save_npz(out / "matcha_tiny_expected.npz", meta, text_ids=ids, text_lengths=lengths, speakers=speakers,
             mu_x=mu_x, logw=logw, x_mask=x_mask)


if __name__ == "__main__":
    main()
