"""Turn a trained checkpoint into audio.

    # WaveGlow: vocode a mel spectrogram, or the mel of a wav (copy-synthesis)
    python inference.py --checkpoint out/checkpoint_last.pt --mel utt.pt --output out.wav [--sigma 0.6]
    python inference.py --checkpoint out/checkpoint_last.pt --wav utt.wav --output out.wav
    # Tacotron2: text to speech, vocoded by a WaveGlow checkpoint or, without one, by Griffin-Lim
    python inference.py --checkpoint taco.pt --text "Hello world." [--vocoder waveglow.pt] --output out.wav
    python inference.py --checkpoint taco.pt --text-file lines.txt --output wavs/   # one wav per line

The checkpoint says which model it holds and carries its config, so no config file is needed.
Wavs are 16-bit PCM at the configured sampling rate.
"""

from __future__ import annotations

import argparse
import pickle
import sys
from pathlib import Path

import torch

from model import MODELS
from utils.audio_processing import MelSpectrogram, griffin_lim, save_wav
from utils.checkpoint import CheckpointError, load_checkpoint, load_model_state
from utils.config import SHARED_SECTIONS, Config, ConfigError, config_from_dict
from utils.data_utils import DataError, load_wav
from utils.run_log import one_line


def load_model(path: str | Path, device: torch.device) -> tuple[str, torch.nn.Module, Config]:
    """Rebuild the model stored in a training checkpoint, in eval mode on ``device``.

    Returns:
        ``(model name, model, config)``.

    Raises:
        CheckpointError: unreadable or unsafe file, a model this project does not define, or weights
            that do not fit.
    """
    state = load_checkpoint(path)
    name = state.get("model_name")
    if name not in MODELS:
        raise CheckpointError(f"{path} holds a model '{name}' that model.py does not define "
                              f"(known: {', '.join(MODELS)})")
    schemas = {**SHARED_SECTIONS, **{n: spec.config_cls for n, spec in MODELS.items()}}
    cfg = config_from_dict(state["config"], schemas)
    try:
        model = MODELS[name].build_model(cfg)
    except ValueError as err:
        raise CheckpointError(f"{path}: its {name} config does not build a model: {one_line(err)}") from None
    load_model_state(model, state["model"], str(path))
    return name, model.to(device).eval(), cfg


def vocode(waveglow: torch.nn.Module, mel: torch.Tensor, sigma: float) -> torch.Tensor:
    """WaveGlow inference: mel ``(n_mels, frames)`` -> audio ``(samples,)`` in [-1, 1]."""
    device = next(waveglow.parameters()).device
    return waveglow.infer(mel.unsqueeze(0).to(device), sigma=sigma)[0].cpu()


def read_mel(args, cfg: Config) -> torch.Tensor:
    """The mel ``(n_mels, frames)`` to vocode: from ``--mel`` (a tensor file) or the mel of ``--wav``."""
    if args.wav:
        audio = load_wav(args.wav, cfg.audio.sampling_rate)
        return MelSpectrogram.from_config(cfg.audio)(audio)
    try:
        mel = torch.load(args.mel, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise DataError(f"--mel {args.mel}: no such file") from None
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError, KeyError, IndexError, TypeError,
            AttributeError) as err:
        raise DataError(f"--mel {args.mel}: not a tensor saved with torch.save ({type(err).__name__})") from None
    if not torch.is_tensor(mel) or mel.dim() not in (2, 3) or (mel.dim() == 3 and mel.shape[0] != 1):
        raise DataError(f"--mel {args.mel}: expected a tensor of shape (n_mels, frames) or (1, n_mels, frames)")
    mel = mel.reshape(mel.shape[-2], mel.shape[-1]).float()
    if mel.shape[0] != cfg.audio.n_mels:
        raise DataError(f"--mel {args.mel}: has {mel.shape[0]} mel channels, the model expects {cfg.audio.n_mels}")
    return mel


def synthesize_text(args, taco, cfg: Config, device: torch.device) -> None:
    """Tacotron2 path: each text -> mel -> audio (WaveGlow ``--vocoder`` or Griffin-Lim) -> wav."""
    from utils.text import text_to_sequence

    vocoder = None
    if args.vocoder:
        voc_name, vocoder, voc_cfg = load_model(args.vocoder, device)
        if voc_name != "waveglow":
            raise CheckpointError(f"--vocoder {args.vocoder} holds a '{voc_name}' model, not waveglow")
        if voc_cfg.audio != cfg.audio:
            raise CheckpointError(f"--vocoder {args.vocoder} was trained with other audio settings than "
                                  f"{args.checkpoint}: {voc_cfg.audio} vs {cfg.audio}")
    if args.text_file:
        lines = [line.strip() for line in Path(args.text_file).read_text().splitlines() if line.strip()]
        if not lines:
            raise DataError(f"--text-file {args.text_file} has no text")
        out_dir = Path(args.output)
        outputs = [out_dir / f"line_{i:03d}.wav" for i in range(1, len(lines) + 1)]
    else:
        lines, outputs = [args.text], [Path(args.output)]
    for text, out in zip(lines, outputs):
        ids = torch.tensor(text_to_sequence(text, cfg.tacotron2.text_cleaners), dtype=torch.long)
        if ids.numel() == 0:
            raise DataError(f"text {text!r} has no character the model knows")
        with torch.no_grad():
            mel, _, _ = taco.inference(ids.unsqueeze(0).to(device))
        mel = mel[0].float().cpu()
        if vocoder is not None:
            audio = vocode(vocoder, mel, args.sigma if args.sigma is not None else voc_cfg.waveglow.infer_sigma)
        else:
            audio = torch.from_numpy(griffin_lim(mel, cfg.audio))
        save_wav(out, audio, cfg.audio.sampling_rate)
        print(f"wrote {out} ({audio.numel() / cfg.audio.sampling_rate:.2f} s)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Synthesize wavs from a trained checkpoint.")
    parser.add_argument("--checkpoint", required=True, help="a checkpoint written by train.py")
    parser.add_argument("--output", required=True, help="output wav (a folder with --text-file)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--mel", help="WaveGlow: a torch tensor file (n_mels, frames) to vocode")
    source.add_argument("--wav", help="WaveGlow: a wav whose mel is vocoded (copy-synthesis)")
    source.add_argument("--text", help="Tacotron2: the sentence to speak")
    source.add_argument("--text-file", help="Tacotron2: a file of sentences, one wav per line")
    parser.add_argument("--vocoder", help="Tacotron2: a WaveGlow checkpoint (default: Griffin-Lim)")
    parser.add_argument("--sigma", type=float, help="WaveGlow noise scale (default: waveglow.infer_sigma, 0.6)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    try:
        name, model, cfg = load_model(args.checkpoint, device)
        if name == "waveglow":
            if not (args.mel or args.wav):
                raise ConfigError(f"{args.checkpoint} is a WaveGlow checkpoint: give --mel or --wav")
            sigma = args.sigma if args.sigma is not None else cfg.waveglow.infer_sigma
            audio = vocode(model, read_mel(args, cfg), sigma)
            save_wav(args.output, audio, cfg.audio.sampling_rate)
            print(f"wrote {args.output} ({audio.numel() / cfg.audio.sampling_rate:.2f} s)")
        elif name == "tacotron2":
            if not (args.text or args.text_file):
                raise ConfigError(f"{args.checkpoint} is a Tacotron2 checkpoint: give --text or --text-file")
            synthesize_text(args, model, cfg, device)
        else:
            raise ConfigError(f"inference.py does not know how to run a '{name}' model; add it in main()")
    except (ConfigError, DataError, CheckpointError, OSError) as err:
        print(f"ERROR: {one_line(err)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
