"""Reference numbers for the Matcha-TTS parity tests, computed by running shivammehta25/Matcha-TTS's own modules.

Nothing of the reference is copied here: this script imports its modules from the checkout given on the command line
and calls them; it stores only numbers (and the provenance that made them). The weights are the formula weights of
``make_fixtures.py`` (its ``FORMULA``), beside this file.

Reference (clone, then check out the commit these fixtures were made with)::

    git clone https://github.com/shivammehta25/Matcha-TTS && git -C Matcha-TTS checkout COMMIT

Command (CPU, about a minute; needs torch, numpy, einops, diffusers 0.25 with huggingface_hub < 0.26, conformer 0.3.2,
Cython and a C compiler for the reference's ``monotonic_align/core.pyx``)::

    python make_fixtures_matcha.py --matcha Matcha-TTS --output fixtures

Writes ``mas_matcha.npz`` (the Cython alignment search on random scores), ``net_matcha_ljspeech.npz`` and
``net_matcha_vctk.npz`` (the model of ``configs/model/matcha.yaml`` with 1 speaker and with 109) and
``provenance_matcha.json``. Load with ``np.load(path, allow_pickle=False)``; each ``meta`` is JSON.

Run-time stubs (the reference's files are not edited): ``matcha.utils`` (whose ``__init__`` imports Hydra, Lightning
and rich) is a bare package over the checkout's ``matcha/utils`` folder, and ``matcha.utils.pylogger`` (Lightning) a
module whose ``get_pylogger`` is ``logging.getLogger``. The Cython search is compiled by ``pyximport``.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib
import importlib.metadata
import json
import logging
import math
import platform
import subprocess
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import torch
from make_fixtures import FORMULA, save_npz, set_formula_weights

MAS_CASES = [  # (batch, text frames, mel frames, text lengths, mel lengths, whole-number scores)
    (1, 1, 1, [1], [1], False), (1, 1, 7, [1], [7], False), (1, 5, 5, [5], [5], False), (1, 6, 23, [6], [23], False),
    (3, 9, 40, [9, 4, 7], [40, 11, 7], False), (4, 17, 96, [17, 12, 3, 17], [96, 50, 80, 17], False),
    (3, 9, 40, [9, 4, 7], [40, 11, 7], True), (2, 6, 30, [6, 5], [30, 21], True)]
"""The alignment search's cases: equal text and mel lengths, one token, padding on either axis; whole-number scores
(-2 .. 2) make ties, which the search must break as the reference does."""
CONFIGS = {  # configs/model/matcha.yaml with encoder/decoder/cfm default.yaml; data: ljspeech.yaml, vctk.yaml
    "ljspeech": {"n_spks": 1, "mel_mean": -5.536622, "mel_std": 2.116101},
    "vctk": {"n_spks": 109, "mel_mean": -6.630575, "mel_std": 2.482914}}
MODEL = {"n_vocab": 178, "spk_emb_dim": 64, "n_feats": 80,
         "encoder": {"encoder_type": "RoPE Encoder", "n_feats": 80, "n_channels": 192, "filter_channels": 768,
                     "filter_channels_dp": 256, "n_heads": 2, "n_layers": 6, "kernel_size": 3, "p_dropout": 0.1,
                     "spk_emb_dim": 64, "prenet": True},
         "duration_predictor": {"filter_channels_dp": 256, "kernel_size": 3, "p_dropout": 0.1},
         "decoder": {"channels": [256, 256], "dropout": 0.05, "attention_head_dim": 64, "n_blocks": 1,
                     "num_mid_blocks": 2, "num_heads": 2, "act_fn": "snakebeta"},
         "cfm": {"name": "CFM", "solver": "euler", "sigma_min": 1e-4}}
TEXT = "ids[b, i] = (37 * i + 11 * b + 5) % 178, i < 8; lengths (8, 5); ids past a length are 0"
STEPS, TEMPERATURE, LENGTH_SCALE, SEED = 3, 0.667, 1.0, 1234
OVERRIDES = {"encoder.proj_w.proj.bias": 1.55}
"""Entries set to a constant after the formula weights: the duration predictor's bias, so that the predicted durations
(about ``exp(1.55 + 0.05 .. 0.14)``) round up to 5 or 6 frames, not all to 2."""


def install_stubs(checkout: Path) -> None:
    """``matcha`` importable from ``checkout`` without Hydra, Lightning or rich (see the module's docstring)."""
    sys.path.insert(0, str(checkout.resolve()))
    utils = types.ModuleType("matcha.utils")
    utils.__path__ = [str(checkout.resolve() / "matcha" / "utils")]
    utils.get_pylogger = logging.getLogger
    pylogger = types.ModuleType("matcha.utils.pylogger")
    pylogger.get_pylogger = logging.getLogger
    sys.modules.update({"matcha.utils": utils, "matcha.utils.pylogger": pylogger})
    import pyximport
    pyximport.install(setup_args={"include_dirs": np.get_include()}, language_level=3)


def mas_fixture(out: Path) -> None:
    maximum_path = importlib.import_module("matcha.utils.monotonic_align").maximum_path
    generator, arrays = torch.Generator().manual_seed(SEED), {}
    for k, (batch, t_x, t_y, x_lengths, y_lengths, whole) in enumerate(MAS_CASES):
        value = (torch.randint(-2, 3, (batch, t_x, t_y), generator=generator).float() if whole
                 else 3.0 * torch.randn(batch, t_x, t_y, generator=generator) - 50.0)
        mask = ((torch.arange(t_x)[None, :, None] < torch.tensor(x_lengths)[:, None, None])
                & (torch.arange(t_y)[None, None, :] < torch.tensor(y_lengths)[:, None, None])).float()
        arrays.update({f"value_{k}": value, f"mask_{k}": mask, f"path_{k}": maximum_path(value, mask)})
    generate_path = importlib.import_module("matcha.utils.model").generate_path
    durations = torch.tensor([[3.0, 1, 4, 1, 5, 0, 2], [2, 7, 1, 8, 0, 0, 0]])
    mask = torch.ones(2, 7, 30) * (torch.arange(7)[None, :, None] < torch.tensor([7, 4])[:, None, None])
    arrays.update({"durations": durations, "durations_mask": mask, "durations_path": generate_path(durations, mask)})
    meta = {"reference": "matcha.utils.monotonic_align.maximum_path(value, mask) (Cython core.pyx)",
            "cases": MAS_CASES, "value": f"3 * torch.randn(B, T_text, T_mel, generator) - 50, or whole numbers "
            "torch.randint(-2, 3, (B, T_text, T_mel), generator).float(); generator = "
            f"torch.Generator().manual_seed({SEED}), drawn case after case",
            "mask": "1 inside each item's text length x mel length corner",
            "durations_path": "matcha.utils.model.generate_path(durations, durations_mask)"}
    save_npz(out / "mas_matcha.npz", meta, **arrays)


def reference_model(n_spks: int) -> torch.nn.Module:
    """The reference's ``TextEncoder``, ``CFM`` and speaker table under the names ``MatchaTTS`` gives them."""
    text_encoder = importlib.import_module("matcha.models.components.text_encoder")
    flow_matching = importlib.import_module("matcha.models.components.flow_matching")
    ns = types.SimpleNamespace
    model = torch.nn.Module()
    if n_spks > 1:
        model.spk_emb = torch.nn.Embedding(n_spks, MODEL["spk_emb_dim"])
    model.encoder = text_encoder.TextEncoder(MODEL["encoder"]["encoder_type"], ns(**MODEL["encoder"]),
                                             ns(**MODEL["duration_predictor"]), MODEL["n_vocab"], n_spks,
                                             MODEL["spk_emb_dim"])
    model.decoder = flow_matching.CFM(in_channels=2 * MODEL["n_feats"], out_channel=MODEL["n_feats"],
                                      cfm_params=ns(**MODEL["cfm"]), decoder_params=MODEL["decoder"], n_spks=n_spks,
                                      spk_emb_dim=MODEL["spk_emb_dim"])
    return model.eval()


def text_input() -> tuple[torch.Tensor, torch.Tensor]:
    b, i = torch.arange(2)[:, None], torch.arange(8)[None, :]
    lengths = torch.tensor([8, 5])
    return ((37 * i + 11 * b + 5) % 178) * (i < lengths[:, None]), lengths


def synthesis(model, ids, lengths, spks, stats) -> dict:
    """``MatchaTTS.synthesise`` step by step (its code, with the noise given and each Euler step kept)."""
    mu_x, logw, x_mask = model.encoder(ids, lengths, spks)
    util = importlib.import_module("matcha.utils.model")
    w_ceil = torch.ceil(torch.exp(logw) * x_mask) * LENGTH_SCALE
    y_lengths = torch.clamp_min(torch.sum(w_ceil, [1, 2]), 1).long()
    y_max = util.fix_len_compatibility(y_lengths.max())
    y_mask = util.sequence_mask(y_lengths, y_max).unsqueeze(1).to(x_mask.dtype)
    attn = util.generate_path(w_ceil.squeeze(1), (x_mask.unsqueeze(-1) * y_mask.unsqueeze(2)).squeeze(1))
    mu_y = torch.matmul(attn.transpose(1, 2), mu_x.transpose(1, 2)).transpose(1, 2)
    noise = torch.randn(mu_y.shape, generator=torch.Generator().manual_seed(SEED + 1))
    steps = []
    hook = model.decoder.estimator.register_forward_hook(lambda module, args, output: steps.append(args[0].clone()))
    out = model.decoder.solve_euler(noise * TEMPERATURE, t_span=torch.linspace(0, 1, STEPS + 1), mu=mu_y, mask=y_mask,
                                    spks=spks, cond=None)
    hook.remove()
    mel = util.denormalize(out[:, :, :int(y_lengths.max())], stats["mel_mean"], stats["mel_std"])
    return {"mu_x": mu_x, "logw": logw, "w_ceil": w_ceil, "y_lengths": y_lengths, "attn": attn, "mu_y": mu_y,
            "noise": noise, "euler_x": torch.stack([*steps, out]), "mel": mel}


def training_losses(model, ids, lengths, spks) -> dict:
    """``MatchaTTS.forward`` (``out_size`` None, prior loss on; eval mode: no dropout): its three losses on a target
    mel, with ``t`` and the noise drawn as ``CFM.compute_loss`` draws them after ``torch.manual_seed``."""
    util = importlib.import_module("matcha.utils.model")
    monotonic_align = importlib.import_module("matcha.utils.monotonic_align")
    frames, y_lengths = 40, torch.tensor([40, 26])
    c, t = torch.arange(80.0)[:, None], torch.arange(frames)[None, :]
    y = torch.stack([torch.sin(0.21 * c + 0.9 * t + 0.5 + b) * torch.cos(0.05 * c * (t + 1)) for b in (0, 1)])
    y = y * (t < y_lengths[:, None, None])
    mu_x, logw, x_mask = model.encoder(ids, lengths, spks)
    y_mask = util.sequence_mask(y_lengths, frames).unsqueeze(1).to(x_mask)
    attn_mask = x_mask.unsqueeze(-1) * y_mask.unsqueeze(2)
    factor = -0.5 * torch.ones(mu_x.shape)
    log_prior = (torch.matmul(factor.transpose(1, 2), y ** 2) - torch.matmul(2.0 * (factor * mu_x).transpose(1, 2), y)
                 + torch.sum(factor * (mu_x ** 2), 1).unsqueeze(-1) - 0.5 * math.log(2 * math.pi) * 80)
    attn = monotonic_align.maximum_path(log_prior, attn_mask.squeeze(1))
    logw_ = torch.log(1e-8 + torch.sum(attn.unsqueeze(1), -1)) * x_mask
    dur_loss = util.duration_loss(logw, logw_, lengths)
    mu_y = torch.matmul(attn.squeeze(1).transpose(1, 2), mu_x.transpose(1, 2)).transpose(1, 2)
    torch.manual_seed(SEED + 2)
    diff_loss, _ = model.decoder.compute_loss(x1=y, mask=y_mask, mu=mu_y, spks=spks)
    torch.manual_seed(SEED + 2)
    t_drawn = torch.rand([2, 1, 1])
    z_drawn = torch.randn(y.shape)
    prior_loss = torch.sum(0.5 * ((y - mu_y) ** 2 + math.log(2 * math.pi)) * y_mask) / (torch.sum(y_mask) * 80)
    return {"y": y, "y_lengths_train": y_lengths, "log_prior": log_prior, "attn_train": attn, "t": t_drawn,
            "z": z_drawn, "dur_loss": dur_loss, "prior_loss": prior_loss, "diff_loss": diff_loss}


def network_fixture(name: str, out: Path) -> None:
    stats = CONFIGS[name]
    model = reference_model(stats["n_spks"])
    keys = set_formula_weights(model)
    with torch.no_grad():
        for key, value in OVERRIDES.items():
            model.get_parameter(key).fill_(value)
    ids, lengths = text_input()
    speakers = torch.tensor([3, 100]) if stats["n_spks"] > 1 else None
    with torch.no_grad():
        spks = model.spk_emb(speakers) if speakers is not None else None
        arrays = {**synthesis(model, ids, lengths, spks, stats), **training_losses(model, ids, lengths, spks)}
    meta = {"reference": "matcha.models.components TextEncoder and CFM (and MatchaTTS's spk_emb) under MatchaTTS's "
            "state_dict names, eval mode; MatchaTTS.synthesise and MatchaTTS.forward followed step by step",
            "model": MODEL, "data": stats, "formula": FORMULA, "keys": keys, "overrides": OVERRIDES, "text": TEXT,
            "speakers": "(3, 100)" if speakers is not None else None,
            "synthesis": f"n_timesteps {STEPS}, temperature {TEMPERATURE}, length_scale {LENGTH_SCALE}; noise: "
                         f"torch.randn(mu_y.shape, Generator().manual_seed({SEED + 1})), given to solve_euler times "
                         "the temperature; euler_x: the estimator's input at each step, then the last step's output",
            "training": "y[b, c, t] = sin(0.21 c + 0.9 t + 0.5 + b) cos(0.05 c (t + 1)), zero past y_lengths_train; "
                        f"torch.manual_seed({SEED + 2}) before compute_loss: t = torch.rand(2, 1, 1), "
                        "z = torch.randn_like(y)"}
    save_npz(out / f"net_matcha_{name}.npz", meta, text_ids=ids, text_lengths=lengths,
             **({"speakers": speakers} if speakers is not None else {}), **arrays)


def provenance(args, out: Path) -> None:
    commit = subprocess.run(["git", "-C", str(args.matcha), "rev-parse", "HEAD"], capture_output=True, text=True)
    versions = {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__}
    for name in ("diffusers", "einops", "conformer", "Cython"):
        versions[name] = importlib.metadata.version(name)
    files = {p.name: {"bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
             for p in sorted(out.glob("*matcha*.npz"))}
    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": "python make_fixtures_matcha.py " + " ".join(sys.argv[1:]),
           "references": {"shivammehta25/Matcha-TTS": commit.stdout.strip() or "unknown (not a git checkout)"},
           "versions": versions, "platform": platform.platform(), "files": files}
    (out / "provenance_matcha.json").write_text(json.dumps(doc, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--matcha", required=True, help="checkout of shivammehta25/Matcha-TTS")
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)
    warnings.filterwarnings("ignore")
    install_stubs(Path(args.matcha))
    mas_fixture(out)
    for name in CONFIGS:
        network_fixture(name, out)
    provenance(args, out)


if __name__ == "__main__":
    main()
