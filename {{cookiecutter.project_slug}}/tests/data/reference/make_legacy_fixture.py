"""A tiny NVIDIA WaveGlow checkpoint in PyTorch's legacy (pre-1.6) serialization, for tests/test_parity_waveglow.py.

Saved the way NVIDIA/waveglow's ``train.py`` saves (``save_checkpoint``: a fresh ``glow.WaveGlow`` loaded with the
weights, pickled whole in a dict), in the legacy format its published ``waveglow_256channels.pt`` has::

    torch.save({"model": model_for_saving, "iteration": ..., "optimizer": None, "learning_rate": ...}, f,
               _use_new_zipfile_serialization=False)

The weights come from make_fixtures.py's formula (reproducible from the key list), so the expected state_dict need
not be stored. The legacy format pickles each module class as ('module', cls, source_file, source): here the source
text is replaced by a line of ours that raises if ever executed (shim of ``torch.serialization.
get_source_lines_and_file`` during the save), so the file carries none of NVIDIA's or PyTorch's code.

    python make_legacy_fixture.py --waveglow waveglow --output .   (waveglow: NVIDIA/waveglow @ 8afb643d)

Writes ``waveglow_tiny_legacy.pt`` and ``waveglow_tiny_expected.npz`` (meta JSON: config, keys, formula, input
formulas; arrays: z, log_s_sum, log_det, noise_0.., infer_audio).
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import warnings
from pathlib import Path

import torch

from make_fixtures import (AUDIO_INPUT, FORMULA, MEL_INPUT, WAVEGLOW_SEED, WAVEGLOW_SIGMA, audio_input, mel_input,
                           reference, run_waveglow, save_npz, set_formula_weights)

CONFIG = {"n_mel_channels": 1, "n_flows": 2, "n_group": 8, "n_early_every": 1, "n_early_size": 2,
          "WN_config": {"n_layers": 2, "n_channels": 4, "kernel_size": 3}}
SOURCE_PLACEHOLDER = "raise RuntimeError('the source text of a pickled module must never be executed')\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--waveglow", required=True)
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    mel, audio = mel_input(2, channels=CONFIG["n_mel_channels"]), audio_input(512)
    with reference(args.waveglow):
        glow = importlib.import_module("glow")
        model = glow.WaveGlow(**CONFIG).eval()
        keys = set_formula_weights(model)
        model_for_saving = glow.WaveGlow(**CONFIG)  # as train.py's save_checkpoint
        model_for_saving.load_state_dict(model.state_dict())
        checkpoint = {"model": model_for_saving, "iteration": 1234, "optimizer": None, "learning_rate": 1e-4}
        original = torch.serialization.get_source_lines_and_file
        torch.serialization.get_source_lines_and_file = lambda obj, error_msg=None: (
            [SOURCE_PLACEHOLDER], 0, f"{obj.__module__}.py (source text replaced)")
        try:
            with open(out / "waveglow_tiny_legacy.pt", "wb") as f:
                torch.save(checkpoint, f, _use_new_zipfile_serialization=False)
        finally:
            torch.serialization.get_source_lines_and_file = original
        sigma, seed = WAVEGLOW_SIGMA, WAVEGLOW_SEED
        arrays = run_waveglow(model, mel, audio)
    commit = subprocess.run(["git", "-C", args.waveglow, "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    meta = {"reference": f"NVIDIA/waveglow @ {commit.strip()} glow.WaveGlow(**config), eval mode",
            "config": CONFIG, "formula": FORMULA, "keys": keys, "torch": torch.__version__,
            "checkpoint": "waveglow_tiny_legacy.pt: {'model': <glow.WaveGlow>, 'iteration': 1234, 'optimizer': None, "
                          "'learning_rate': 0.0001}, torch.save(..., _use_new_zipfile_serialization=False); module "
                          f"source text replaced by {SOURCE_PLACEHOLDER.strip()!r}",
            "mel": MEL_INPUT + " (channels = 1, frames = 2)", "audio": AUDIO_INPUT + " (N = 512)",
            "forward": "z, log_s_list, log_det_W_list = model((mel, audio)); log_s_sum[k] = log_s_list[k].sum()",
            "infer": f"torch.manual_seed({seed}); infer_audio = model.infer(mel, sigma={sigma}); noise_i: its draws "
                     "in order (noise_0 (B, n_remaining_channels, T) first, then one (B, n_early_size, T) per early "
                     "output, k descending); equivalent z = sigma * cat([noise_<last>, ..., noise_1, noise_0], 1)",
            "shapes": {key: list(value.shape) for key, value in arrays.items() if key.startswith("noise_")}}
    save_npz(out / "waveglow_tiny_expected.npz", meta, **arrays)
    print(json.dumps({p.name: p.stat().st_size for p in sorted(out.iterdir())}))


if __name__ == "__main__":
    main()
