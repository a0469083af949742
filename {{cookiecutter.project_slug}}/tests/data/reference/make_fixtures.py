"""Reference numbers for ddtemplate's parity tests, computed by running the reference implementations.

Nothing of the references is copied here: this script imports their modules from the checkouts given on the
command line and calls them; it stores only numbers (and the provenance that made them).

References (clone, then check out the commit these fixtures were made with)::

    git clone https://github.com/NVIDIA/tacotron2  && git -C tacotron2 checkout 185cd24e046cc1304b4f8e564734d2498c6e2e6f
    git clone https://github.com/NVIDIA/waveglow   && git -C waveglow  checkout 8afb643df59265016af6bd255c7516309d675168
    git clone https://github.com/jik876/hifi-gan   && git -C hifi-gan  checkout 4769534d45265d52a904b850da5a622601885777

Command (CPU, about a minute; needs torch, numpy, librosa, scipy, matplotlib, inflect, unidecode)::

    python make_fixtures.py --tacotron2 tacotron2 --waveglow waveglow --hifigan hifi-gan --output fixtures \\
        [--project PATH/TO/GENERATED/PROJECT]   # adds that project's text ids to text_nvidia.json

Writes ``mel_nvidia.npz``, ``mel_hifigan.npz``, ``mel_sweep.npz``, ``net_hifigan_v{1,2,3}.npz``, ``net_waveglow.npz``,
``net_tacotron2_tf.npz`` (teacher-forced), ``net_tacotron2_fr.npz`` (free-running), ``text_nvidia.json`` and
``provenance.json``. Each ``.npz`` holds float32/int64 arrays and a ``meta`` string (JSON: what each array is, the
formulas, the reference's state_dict keys); load with ``np.load(path, allow_pickle=False)``. Network inputs are
not stored: regenerate them from their formulas (``meta["mel"]``, ``meta["audio"]``; :func:`mel_input`,
:func:`audio_input`).

Run-time shims (the references' files are not edited): librosa's keyword-only ``filters.mel``/``util.pad_center``
called positionally; a stub ``tensorflow`` with ``contrib.training.HParams``; ``torch.stft`` without
``return_complex``; ``torch.cuda.*Tensor`` constructors on the CPU (WaveGlow's noise, Tacotron2's mask); for the
``no_prenet_dropout`` runs, ``F.dropout`` as the identity in tacotron2's ``model.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import importlib
import importlib.metadata
import json
import math
import platform
import subprocess
import sys
import types
import warnings
import zlib
from pathlib import Path

import numpy as np
import torch

SR = 22050
SIGNAL = {"formula": "x[n] = 0.5*sin(2*pi*(f0*t + (f1 - f0)*t**2/(2*D))) + 0.1*sin(2*pi*f2*t), t = n/sr, "
                     "n = 0 .. N-1, N = round(D*sr); computed in float64, then cast to float32; batch of one (1, N)",
          "sr": SR, "D": 0.3, "f0": 100.0, "f1": 4000.0, "f2": 1234.5}
SWEEP = {"formula": "x[n] = 0.5*a(t)*sin(2*pi*(f0*t + (f1 - f0)*t**2/(2*D))), t = n/sr, n = 0 .. N-1, N = round(D*sr); "
                    "a(t) = quiet[2] for quiet[0] <= t < quiet[1] (seconds), 0 for silent[0] <= t < silent[1], else 1; "
                    "computed in float64, then cast to float32; batch of one (1, N)",
         "sr": SR, "D": 2.0, "f0": 50.0, "f1": 8000.0, "quiet": [0.7, 1.0, 6e-4], "silent": [1.0, 1.3]}
MEL_INPUT = "mel[c, t] = -5 + 3*sin(0.21*c + 0.9*t + 0.5)*cos(0.05*c*(t + 1)), c = 0..channels-1 (80), " \
            "t = 0..frames-1; float64 then float32, shape (1, channels, frames)"
AUDIO_INPUT = "audio[n] = 0.5*sin(2*pi*220*n/22050) + 0.2*sin(2*pi*1000*n/22050 + 1); float64 then float32, (1, N)"
FORMULA = {
    "seed": "seed(key) = zlib.crc32(key.encode('utf-8'))  (key: the reference's state_dict key)",
    "r": "x[i] = (seed(key) << 32) + i as uint64, i = 0 .. numel-1 in C (row-major) order; splitmix64 finaliser "
         "(all arithmetic mod 2**64): x ^= x >> 30; x *= 0xBF58476D1CE4E5B9; x ^= x >> 27; x *= 0x94D049BB133111EB; "
         "x ^= x >> 31; r[i] = 2 * (x >> 11) / 2**53 - 1 (float64, uniform in [-1, 1))",
    "rules (first that applies; float64, then cast to the tensor's dtype)": [
        "integer tensors (num_batches_tracked): 0",
        "key matches '(^|.)convinv.<k>.conv.weight' (WaveGlow invertible 1x1 conv, shape (c, c, 1)): "
        "eye(c)[:, :, None] + (0.5 / c) * r  (det > 0: the perturbation's Frobenius norm is < 0.5)",
        "key matches '(^|.)WN.<k>.end.weight' (WaveGlow coupling output conv; NVIDIA initialises it to 0): "
        "0.1 * r * sqrt(3 / fan_in), fan_in = numel / shape[0]  (keeps exp(log s) moderate)",
        "key ends with 'gate_layer.linear_layer.bias' (Tacotron2 stop gate): -1 + 0.1 * r  (a gate far from "
        "firing, so free-running decoding runs to max_decoder_steps)",
        "key ends with 'running_var': 1 + 0.25 * r",
        "key ends with 'weight_g' (old-style weight norm magnitude): 1 + 0.1 * r",
        "1-D tensor whose key ends with 'weight' (batch norm scale): 1 + 0.1 * r",
        "other 1-D tensors (biases, running_mean): 0.1 * r",
        "other tensors (weights, weight_v, embeddings, LSTM matrices): r * sqrt(3 / fan_in), "
        "fan_in = numel / shape[0] (standard deviation 1 / sqrt(fan_in))"]}
SENTENCES = [
    "Dr. Smith paid $3.50 for 2 apples on the 2nd of May.", "Mr. and Mrs. Jones live on 101st Street.",
    "It cost £12, not $1,000,000.", "In 1999, 2000, 2001, 2010 and 2100.", "Pi is 3.14159 and e is about 2.718.",
    "Café Müller serves crème brûlée in Zürich.", "HELLO WORLD! This Is Mixed CASE.",
    "Turn left on {HH AW1 S T AH0 N} Street.", "{HH AH0 L OW1} there.", "Say {HH AH0 L OW1}{W ER1 L D} twice.",
    "Wait... what?! (Really) -- yes; no: maybe.", 'She said "hi" and left.', "$0.99, $1, $1.01, $.50 and $3.50.5",
    "1st, 2nd, 3rd, 4th, 11th, 21st, 22nd, 112th, 1,000th.", "Gen. Lee, Capt. Smith, Lt. Col. Jones at Ft. Worth.",
    "St. Louis Co. Ltd., John Jr., Esq., Rev. Sgt. Maj. Hon. Drs.", "Numbers: 0, 7, 13, 100, 1200, 3000, 10000.",
    "Tab\tand   spaces\nnew line.", "Naïve façade, jalapeño, Øresund, Łódź, Straße.",
    "100% sure & more \x231 @home ~ _under_ [x] <y>",  # \x23: "#"
    "\u201cCurly quotes\u201d and \u2018apostrophes\u2019 \u2014 em dash\u2026",
    "It's 5:30 p.m. on 12/25/2023.", "  Leading and trailing spaces  ", "Line one\n{HH AH0 L OW1} two.",
    "Lower {hh ah0} and unknown {XX Y1} phones.", "The 1860s, the '90s, 1.5m and 3-4 cats."]


def formula_r(key: str, numel: int) -> np.ndarray:
    """Uniform [-1, 1) values for a key's elements (FORMULA["r"]; exact integer arithmetic)."""
    x = (np.uint64(zlib.crc32(key.encode("utf-8"))) << np.uint64(32)) + np.arange(numel, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return 2.0 * (x >> np.uint64(11)).astype(np.float64) / 2.0 ** 53 - 1.0


def formula_value(key: str, shape, dtype=torch.float32) -> torch.Tensor:
    """The deterministic value of a parameter or buffer from its key, shape and element index (FORMULA)."""
    shape = tuple(int(d) for d in shape)
    numel, parts = math.prod(shape), key.split(".")
    if not dtype.is_floating_point:
        return torch.zeros(shape, dtype=dtype)
    r = formula_r(key, numel).reshape(shape)
    if len(parts) >= 4 and parts[-4] == "convinv" and parts[-2:] == ["conv", "weight"]:
        value = np.eye(shape[0])[:, :, None] + (0.5 / shape[0]) * r
    elif len(parts) >= 4 and parts[-4] == "WN" and parts[-2:] == ["end", "weight"]:
        value = 0.1 * r * math.sqrt(3.0 / (numel / shape[0]))
    elif key.endswith("gate_layer.linear_layer.bias"):
        value = -1.0 + 0.1 * r
    elif key.endswith("running_var"):
        value = 1.0 + 0.25 * r
    elif key.endswith("weight_g") or (len(shape) == 1 and key.endswith("weight")):
        value = 1.0 + 0.1 * r
    elif len(shape) == 1:
        value = 0.1 * r
    else:
        value = r * math.sqrt(3.0 / (numel / shape[0]))
    return torch.from_numpy(np.ascontiguousarray(value)).to(dtype)


def set_formula_weights(module: torch.nn.Module) -> list[list]:
    """Overwrite every state_dict entry with :func:`formula_value`; return ``[[key, shape, dtype], ...]`` in order."""
    listing = []
    with torch.no_grad():
        for key, tensor in module.state_dict().items():
            tensor.copy_(formula_value(key, tensor.shape, tensor.dtype))
            listing.append([key, list(tensor.shape), str(tensor.dtype).replace("torch.", "")])
    return listing


def signal() -> torch.Tensor:
    t = np.arange(round(SIGNAL["D"] * SR)) / SR
    x = 0.5 * np.sin(2 * np.pi * (SIGNAL["f0"] * t + (SIGNAL["f1"] - SIGNAL["f0"]) * t ** 2 / (2 * SIGNAL["D"])))
    return torch.from_numpy((x + 0.1 * np.sin(2 * np.pi * SIGNAL["f2"] * t)).astype(np.float32))[None]


def sweep() -> torch.Tensor:
    t = np.arange(round(SWEEP["D"] * SR)) / SR
    quiet, silent = SWEEP["quiet"], SWEEP["silent"]
    a = np.where((quiet[0] <= t) & (t < quiet[1]), quiet[2], np.where((silent[0] <= t) & (t < silent[1]), 0.0, 1.0))
    x = 0.5 * a * np.sin(2 * np.pi * (SWEEP["f0"] * t + (SWEEP["f1"] - SWEEP["f0"]) * t ** 2 / (2 * SWEEP["D"])))
    return torch.from_numpy(x.astype(np.float32))[None]


def mel_input(frames: int, channels: int = 80) -> torch.Tensor:
    c, t = np.arange(channels)[:, None], np.arange(frames)[None, :]
    mel = -5 + 3 * np.sin(0.21 * c + 0.9 * t + 0.5) * np.cos(0.05 * c * (t + 1))
    return torch.from_numpy(mel.astype(np.float32))[None]


def audio_input(samples: int) -> torch.Tensor:
    n = np.arange(samples)
    x = 0.5 * np.sin(2 * np.pi * 220 * n / SR) + 0.2 * np.sin(2 * np.pi * 1000 * n / SR + 1)
    return torch.from_numpy(x.astype(np.float32))[None]


# --- shims: old reference code on current libraries (nothing of the references is edited) -----------------------

def install_import_shims() -> None:
    """librosa >= 0.10 made ``filters.mel`` and ``util.pad_center`` keyword-only (the references pass positionally);
    tacotron2's ``hparams.py`` needs ``tensorflow.contrib.training.HParams`` (a stub: ``types.SimpleNamespace``)."""
    import librosa
    if not getattr(librosa.filters.mel, "shim", False):
        mel, pad_center = librosa.filters.mel, librosa.util.pad_center
        librosa.filters.mel = lambda sr, n_fft, n_mels=128, fmin=0.0, fmax=None, **kw: mel(
            sr=sr, n_fft=n_fft, n_mels=n_mels, fmin=fmin, fmax=fmax, **kw)
        librosa.filters.mel.shim = True
        librosa.util.pad_center = lambda data, size, **kw: pad_center(data, size=size, **kw)
    tf = sys.modules.setdefault("tensorflow", types.ModuleType("tensorflow"))
    tf.contrib = types.SimpleNamespace(training=types.SimpleNamespace(HParams=types.SimpleNamespace))


@contextlib.contextmanager
def legacy_stft():
    """``torch.stft`` without ``return_complex`` (hifi-gan) as before torch 2.0: real output ``(..., 2)``."""
    original = torch.stft
    torch.stft = lambda *a, **kw: (original(*a, **kw) if "return_complex" in kw
                                   else torch.view_as_real(original(*a, return_complex=True, **kw)))
    try:
        yield
    finally:
        torch.stft = original


@contextlib.contextmanager
def cuda_constructors_on_cpu(made: list):
    """``torch.cuda.{Float,Long,Half}Tensor(*size)`` -> CPU ``torch.empty(*size)``, each appended to ``made`` (the
    references allocate WaveGlow's noise and Tacotron2's mask index with them)."""
    names = {"FloatTensor": torch.float32, "LongTensor": torch.int64, "HalfTensor": torch.float16}
    saved = {name: getattr(torch.cuda, name, None) for name in names}

    def constructor(dtype):
        return lambda *size: made.append(torch.empty(*size, dtype=dtype)) or made[-1]

    for name, dtype in names.items():
        setattr(torch.cuda, name, constructor(dtype))
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(torch.cuda, name, value)


@contextlib.contextmanager
def reference(path):
    """Import from the checkout at ``path``; forget its modules afterwards (the references share names)."""
    path = str(Path(path).resolve())
    sys.path.insert(0, path)
    try:
        yield
    finally:
        sys.path.remove(path)
        for name, module in list(sys.modules.items()):
            if str(getattr(module, "__file__", None) or "").startswith(path + "/"):
                del sys.modules[name]


def save_npz(path: Path, meta: dict, **arrays) -> None:
    arrays = {k: v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v) for k, v in arrays.items()}
    np.savez_compressed(path, meta=np.array(json.dumps(meta, ensure_ascii=False)), **arrays)


# --- fixtures ---------------------------------------------------------------------------------------------------

def mel_fixtures(args, out: Path) -> None:
    y = signal()
    common = {"signal": SIGNAL, "input_shape": list(y.shape)}
    with reference(args.tacotron2):
        layers = importlib.import_module("layers")
        stft = layers.TacotronSTFT(filter_length=1024, hop_length=256, win_length=1024, n_mel_channels=80,
                                   sampling_rate=SR, mel_fmin=0.0, mel_fmax=8000.0)
        mel = stft.mel_spectrogram(y)
    save_npz(out / "mel_nvidia.npz", {**common, "call": "layers.TacotronSTFT(filter_length=1024, hop_length=256, "
             "win_length=1024, n_mel_channels=80, sampling_rate=22050, mel_fmin=0.0, mel_fmax=8000.0)"
             ".mel_spectrogram(signal)", "frames": mel.shape[-1], "log_mel": "natural log, (1, 80, frames) float32"},
             log_mel=mel)
    with reference(args.hifigan), legacy_stft():
        meldataset = importlib.import_module("meldataset")
        mel = meldataset.mel_spectrogram(y, 1024, 80, SR, 256, 1024, 0, 8000, center=False)
        loss = meldataset.mel_spectrogram(y, 1024, 80, SR, 256, 1024, 0, None, center=False)
    save_npz(out / "mel_hifigan.npz", {**common, "call": "meldataset.mel_spectrogram(signal, n_fft=1024, num_mels=80, "
             "sampling_rate=22050, hop_size=256, win_size=1024, fmin=0, fmax=8000, center=False); log_mel_loss: the "
             "same with fmax=None (config fmax_for_loss)", "frames": mel.shape[-1]}, log_mel=mel, log_mel_loss=loss)
    y = sweep()
    with reference(args.tacotron2):
        stft = importlib.import_module("layers").TacotronSTFT(1024, 256, 1024, 80, SR, 0.0, 8000.0)
        nvidia = stft.mel_spectrogram(y)
    with reference(args.hifigan), legacy_stft():
        meldataset = importlib.import_module("meldataset")
        mel = meldataset.mel_spectrogram(y, 1024, 80, SR, 256, 1024, 0, 8000, center=False)
        loss = meldataset.mel_spectrogram(y, 1024, 80, SR, 256, 1024, 0, None, center=False)
    save_npz(out / "mel_sweep.npz", {"signal": SWEEP, "input_shape": list(y.shape), "call": "nvidia: as mel_nvidia.npz; "
             "jik876, jik876_loss: as mel_hifigan.npz's log_mel and log_mel_loss", "frames": {
                 "nvidia": nvidia.shape[-1], "jik876": mel.shape[-1]}}, nvidia=nvidia, jik876=mel, jik876_loss=loss)


def hifigan_fixtures(args, out: Path) -> None:
    mel = mel_input(6)
    with reference(args.hifigan):
        models, env = importlib.import_module("models"), importlib.import_module("env")
        for version in ("v1", "v2", "v3"):
            config = json.loads((Path(args.hifigan) / f"config_{version}.json").read_text())
            generator = models.Generator(env.AttrDict(config)).eval()
            keys = set_formula_weights(generator)
            with torch.no_grad():
                audio = generator(mel)
            meta = {"reference": f"jik876/hifi-gan models.Generator(AttrDict(config_{version}.json)), eval mode, "
                    "weight norm kept (weight_g/weight_v)", "config": {k: config[k] for k in (
                        "resblock", "upsample_rates", "upsample_kernel_sizes", "upsample_initial_channel",
                        "resblock_kernel_sizes", "resblock_dilation_sizes")},
                    "formula": FORMULA, "keys": keys, "mel": MEL_INPUT + " (frames = 6)", "audio": "generator(mel)"}
            save_npz(out / f"net_hifigan_{version}.npz", meta, audio=audio)


WAVEGLOW_SIGMA, WAVEGLOW_SEED = 0.6, 1234
"""The reference WaveGlow's inference noise scale and the seed set before its draws."""


def run_waveglow(model, mel: torch.Tensor, audio: torch.Tensor) -> dict[str, torch.Tensor]:
    """A reference WaveGlow (eval mode) on ``mel``/``audio``: ``z``, ``log_s_sum`` (one per flow), ``log_det``, and
    ``infer_audio`` of ``model.infer(mel, sigma=WAVEGLOW_SIGMA)`` after ``torch.manual_seed(WAVEGLOW_SEED)`` with its
    noise draws ``noise_0``, ``noise_1``, ... in the order drawn."""
    drawn = []
    with torch.no_grad():
        z, log_s, log_det = model((mel, audio))
        torch.manual_seed(WAVEGLOW_SEED)
        with cuda_constructors_on_cpu(drawn):
            inferred = model.infer(mel, sigma=WAVEGLOW_SIGMA)
    return {"z": z, "log_s_sum": torch.stack([s.double().sum() for s in log_s]).float(),
            "log_det": torch.stack(log_det), "infer_audio": inferred, **{f"noise_{i}": t for i, t in enumerate(drawn)}}


def waveglow_fixture(args, out: Path) -> None:
    config = json.loads((Path(args.waveglow) / "config.json").read_text())["waveglow_config"]
    mel, audio = mel_input(3), audio_input(768)
    with reference(args.waveglow):
        glow = importlib.import_module("glow")
        model = glow.WaveGlow(**config).eval()
        keys = set_formula_weights(model)
        sigma, seed = WAVEGLOW_SIGMA, WAVEGLOW_SEED
        arrays = run_waveglow(model, mel, audio)
    noise = {key: value for key, value in arrays.items() if key.startswith("noise_")}
    meta = {"reference": "NVIDIA/waveglow glow.WaveGlow(**config.json waveglow_config), eval mode", "config": config,
            "formula": FORMULA, "keys": keys, "mel": MEL_INPUT + " (frames = 3)", "audio": AUDIO_INPUT + " (N = 768)",
            "forward": "z, log_s_list, log_det_W_list = model((mel, audio)); log_s_sum[k] = log_s_list[k].sum(), "
                       "log_det[k] = log_det_W_list[k]",
            "infer": f"torch.manual_seed({seed}); infer_audio = model.infer(mel, sigma={sigma}) (not clamped)",
            "noise": "infer's draws in order, as drawn (before * sigma): noise_0 = torch.cuda.FloatTensor(B, "
                     "n_remaining_channels, T).normal_() before the loop; then, inside the reversed flow loop after "
                     "flow k's inverse 1x1 conv, for k = 8 then k = 4 (k % n_early_every == 0 and k > 0), "
                     "torch.cuda.FloatTensor(B, n_early_size, T).normal_() -> noise_1, noise_2, each concatenated "
                     "in front: audio = cat((sigma * z, audio), 1). Here drawn from the CPU generator (shim); on "
                     "CUDA the reference draws from the CUDA generator. Equivalent z for a reverse(mel, z) of the "
                     "layout 'early outputs first': sigma * cat([noise_2, noise_1, noise_0], 1)",
            "shapes": {k: list(v.shape) for k, v in noise.items()}}
    save_npz(out / "net_waveglow.npz", meta, **arrays)


def tacotron2_fixture(args, out: Path) -> None:
    mel, text, seed = mel_input(8), "Say hello!", 1234
    with reference(args.tacotron2):
        hparams, model_module = importlib.import_module("hparams"), importlib.import_module("model")
        text_module = importlib.import_module("text")
        h = hparams.create_hparams()
        h.max_decoder_steps = 8
        model = model_module.Tacotron2(h).eval()
        keys = set_formula_weights(model)
        ids = torch.LongTensor([text_module.text_to_sequence(text, ["english_cleaners"])])
        lengths, frames = torch.LongTensor([ids.shape[1]]), torch.LongTensor([mel.shape[2]])
        runs, real_f = {}, model_module.F
        for variant in ("dropout", "no_prenet_dropout"):
            if variant == "no_prenet_dropout":  # model.py's F with dropout = identity: in eval mode only the
                model_module.F = types.SimpleNamespace(**vars(real_f))  # prenet's dropout calls were active
                model_module.F.dropout = lambda x, *a, **kw: x
            with torch.no_grad(), cuda_constructors_on_cpu([]):
                torch.manual_seed(seed)
                runs[f"tf_{variant}"] = model((ids, lengths, mel, ids.shape[1], frames))
                torch.manual_seed(seed)
                runs[f"fr_{variant}"] = model.inference(ids)
            model_module.F = real_f
    arrays = {}
    for name, (mel_out, postnet, gate, align) in runs.items():
        arrays.update({f"{name}_mel": mel_out, f"{name}_mel_postnet": postnet,
                       f"{name}_gate": gate.reshape(gate.shape[0], -1), f"{name}_alignments": align})
    hp = {k: v for k, v in vars(h).items() if isinstance(v, (int, float, str, bool)) and k != "training_files"}
    meta = {"reference": "NVIDIA/tacotron2 model.Tacotron2(hparams.create_hparams()), eval mode, "
            "max_decoder_steps = 8", "hparams": hp, "formula": FORMULA, "keys": keys, "text": text,
            "text_ids": "text.text_to_sequence(text, ['english_cleaners'])", "mel": MEL_INPUT + " (frames = 8)",
            "tf_*": f"teacher-forced: torch.manual_seed({seed}); model((text_ids, [L], mel, L, [8])) -> mel, "
                    "mel_postnet, gate (1, T) logits, alignments (1, T, L)",
            "fr_*": f"free-running: torch.manual_seed({seed}); model.inference(text_ids) -> [mel, mel_postnet, gate "
                    "(1, T) logits, alignments]; stops at max_decoder_steps = 8 (gate < threshold 0.5 throughout)",
            "rng": "the only random draws in eval mode are the prenet's two F.dropout(p=0.5, training=True) calls. "
                   "Teacher-forced: one call per prenet layer on ALL T+1 decoder inputs at once (go frame + the T "
                   "target frames, the last one unused), shape (T+1, B, 256) each, layer 1 then layer 2. "
                   "Free-running: per step, layer 1 then layer 2 on (B, 256).",
            "*_no_prenet_dropout": "the same with the prenet's dropout shimmed to identity (deterministic)"}
    for part in ("tf", "fr"):  # two files of < 20 KB each
        save_npz(out / f"net_tacotron2_{part}.npz", meta, text_ids=ids,
                 **{k: v for k, v in arrays.items() if k.startswith(part + "_")})


def text_fixture(args, out: Path) -> None:
    with reference(args.tacotron2), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        text_module = importlib.import_module("text")
        symbols = list(importlib.import_module("text.symbols").symbols)
        entries = [{"text": s, "ids": text_module.text_to_sequence(s, ["english_cleaners"])} for s in SENTENCES]
        for entry in entries:
            entry["decoded"] = text_module.sequence_to_text(entry["ids"])
    if args.project:
        sys.path.insert(0, str(Path(args.project).resolve()))
        for name in ("utils.text", "models.tacotron2.text"):
            with contextlib.suppress(ImportError), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ours = importlib.import_module(name)
                for entry in entries:
                    entry["ours_ids"] = ours.text_to_sequence(entry["text"], ["english_cleaners"])
                    entry["ours_decoded"] = ours.sequence_to_text(entry["ours_ids"])
                    entry["equal"] = entry["ours_ids"] == entry["ids"]
                break
    doc = {"call": "text.text_to_sequence(text, ['english_cleaners']); decoded: text.sequence_to_text(ids)",
           "ours": "ours_ids / ours_decoded: the project's text_to_sequence (from --project), for comparison only",
           "symbols": symbols, "sentences": entries}
    (out / "text_nvidia.json").write_text(json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n")


def provenance(args, out: Path) -> None:
    def commit(path):
        with contextlib.suppress(Exception):
            return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                                  check=True).stdout.strip()
        return "unknown (not a git checkout)"
    versions = {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__}
    for name in ("librosa", "scipy", "inflect", "unidecode"):
        with contextlib.suppress(Exception):
            versions[name] = importlib.metadata.version(name.replace("unidecode", "Unidecode"))
    files = {p.name: {"bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
             for p in sorted(out.iterdir()) if p.suffix in (".npz", ".json") and p.name != "provenance.json"}
    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": "python make_fixtures.py " + " ".join(sys.argv[1:]),
           "references": {"NVIDIA/tacotron2": commit(args.tacotron2), "NVIDIA/waveglow": commit(args.waveglow),
                          "jik876/hifi-gan": commit(args.hifigan)},
           "versions": versions, "platform": platform.platform(), "files": files}
    (out / "provenance.json").write_text(json.dumps(doc, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in ("tacotron2", "waveglow", "hifigan"):
        parser.add_argument(f"--{name}", required=True, help=f"checkout of the {name} reference")
    parser.add_argument("--output", required=True)
    parser.add_argument("--project", help="generated project root: adds its text ids to text_nvidia.json")
    args = parser.parse_args()
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)
    warnings.filterwarnings("ignore")
    install_import_shims()
    for make in (mel_fixtures, hifigan_fixtures, waveglow_fixture, tacotron2_fixture, text_fixture, provenance):
        make(args, out)
        print(f"{make.__name__}: done", flush=True)


if __name__ == "__main__":
    main()
