"""Turn a trained checkpoint into outputs (wav files for the example models)::

    python inference.py --checkpoint out/checkpoint_last.pt --output out.wav [model options]
    python inference.py --checkpoint out/checkpoint_last.pt --help      # the options of that checkpoint's model
    python inference.py --checkpoint out/checkpoint_last --output out.wav   # a checkpoint folder alike, if any

The checkpoint names its model and carries its config; the work is the model's ``Inference.infer``, its options its
``Inference.add_args``. Every failure is one ``ERROR:`` line and exit status 1; nothing is written then.
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from model import Vocoder
from models import MODELS
from parts import LEFT_OUT, PARTS, config_schemas
from utils.checkpoint.budget import build_recorded
from utils.checkpoint.files import CheckpointError, load_model_state
from utils.checkpoint.state import RELEASE_FORMAT, in_modules
from utils.config import Config, ConfigError, config_from_dict
from utils.data.audio import vocoder_mismatch
from utils.data.corpus import DataError
from utils.framing import saved_framing
from utils.run_log import one_line, one_line_warnings
from utils.training.ema import averaged_parameters


def load_trained(path: str | Path, device: torch.device) -> tuple[str, torch.nn.Module, Config]:
    """``(model name, model, config)`` of a checkpoint (a file, a folder of ``PARTS.formats``, a release file), the
    model in eval mode on ``device``, its EMA weights in place where it has them (said), its config's
    ``audio.mel_framing`` the one the weights were trained on (:func:`utils.framing.saved_framing`). Raises
    CheckpointError (unreadable or unsafe, a model this project does not define, a recorded config larger than the
    checkpoint's bytes justify, weights that do not fit), ConfigError (a config that does not load)."""
    state = PARTS.formats.of(path).read(path)
    name = state.get("model_name")
    if name not in MODELS:
        raise CheckpointError(f"{path} holds a model '{name}' that models/__init__.py does not register "
                              f"(known: {', '.join(MODELS) or 'none'})")
    cfg = config_from_dict(state.get("config", {}), config_schemas(), LEFT_OUT, name)
    cfg.audio.mel_framing, assumed = saved_framing(state, MODELS[name].recipe)
    if assumed:
        print(f"note: {path} records no audio.mel_framing (an import of an earlier version): its mels are framed as "
              f"{name}'s reference frames them, {cfg.audio.mel_framing} (ModelSpec.recipe)", file=sys.stderr,
              flush=True)
    release = state.get("format") == RELEASE_FORMAT
    try:  # within what the checkpoint's bytes justify: its config may be crafted too
        model = build_recorded(lambda: MODELS[name].build_model(cfg), path, release)
    except ValueError as err:
        raise CheckpointError(f"{path}: its {name} config does not build a model: {one_line(err)}") from None
    averaged = averaged_parameters(model, MODELS[name].inference_modules)
    ema = None
    if (folder := PARTS.formats.folder_of(path)) is not None:
        ema = {key: torch.empty_like(param) for key, param in averaged.items()} if state.get("ema_saved") else None
        folder.load_weights(path, model, ema)
    elif release:  # the inference modules' weights; the rest stays as built
        kept = {key: value for key, value in model.state_dict().items()
                if not in_modules(key, MODELS[name].inference_modules)}
        load_model_state(model, {**kept, **state["model"]}, str(path))
    else:
        load_model_state(model, state["model"], str(path))
        ema = state.get("ema")
    if ema is not None:
        if not isinstance(ema, dict) or sorted(ema) != sorted(averaged):
            raise CheckpointError(f"{path}: its EMA weights do not fit this model (ModelSpec.inference_modules)")
        load_model_state(model, {**model.state_dict(), **ema}, f"{path} (EMA weights)")
    if ema is not None or state.get("ema_weights"):
        decay = state.get("config", {}).get("train", {}).get("ema_decay")
        print(f"note: {path} is run with the EMA weights of step {state.get('step')} (train.ema_decay={decay})",
              file=sys.stderr, flush=True)
    return name, model.to(device).eval(), cfg


def parse_device(text: str) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:N`` as a device this machine has; a ValueError for an unknown device string, CUDA on
    a machine or build without it, or a GPU index too high."""
    try:
        device = torch.device(text)
    except RuntimeError:
        raise ValueError(f"--device {text}: not a device name; use cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {text}: use cpu, cuda or cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {text}: CUDA is not available here (this torch build or machine has no GPU); use "
                         "--device cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"--device {text}: only {torch.cuda.device_count()} GPU(s) are visible")
    return device


def build_parser(model_names: list[str]) -> argparse.ArgumentParser:
    """The common options, then one option group per model in ``model_names`` (conflicts: the first wins)."""
    parser = argparse.ArgumentParser(description="Write outputs (wavs) from a checkpoint of train.py.",
                                     conflict_handler="resolve" if len(model_names) > 1 else "error")
    parser.add_argument("--checkpoint", required=True,
                        help="a checkpoint written by train.py: a .pt file"
                             + (f" or a {PARTS.formats.folder.noun} folder" if PARTS.formats.folder else ""))
    parser.add_argument("--output", required=True, help="where to write (a .wav file for the example models)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cpu, cuda or cuda:N (default: cuda when available)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the random draws (a vocoder's noise, a prenet's dropout, Griffin-Lim's "
                             "phases): the same checkpoint and input give the same output (default 0)")
    vocoders = [name for name, spec in MODELS.items() if spec.inference and spec.inference.vocode]
    for name in model_names:
        spec = MODELS[name].inference
        group = parser.add_argument_group(f"{name} options")
        if spec is not None and spec.add_args is not None:
            spec.add_args(group)
        if spec is not None and spec.takes_vocoder and vocoders:
            group.add_argument("--vocoder", help=f"a {' or '.join(vocoders)} checkpoint to vocode with (default: "
                                                 "Griffin-Lim)")
    return parser


def load_vocoder(path: str, device: torch.device, label: str = "--vocoder ") -> Vocoder:
    """The vocoder checkpoint ``path`` on ``device`` (:func:`load_trained`): its model's name, its ``mel (n_mels,
    frames) -> audio (samples,)`` and its config (``args.load_vocoder`` of ``--vocoder``; a run's validation vocoder).
    Raises :class:`CheckpointError` as :func:`load_trained` does, and naming ``label`` and ``path`` for a model that
    cannot vocode; :class:`ConfigError` as :func:`load_trained` does."""
    name, vocoder, cfg = load_trained(path, device)
    spec = MODELS[name].inference
    if spec is None or spec.vocode is None:
        raise CheckpointError(f"{label}{path} holds a '{name}' model, which is not a vocoder")
    return Vocoder(name, lambda mel: spec.vocode(vocoder, mel, cfg), cfg)


def vocoder_for(path: str, cfg: Config, checkpoint: str, device: torch.device) -> Callable[[torch.Tensor],
                                                                                       torch.Tensor]:
    """``--vocoder`` ``path``'s ``log-mel (n_mels, frames) -> audio (samples,)`` (:func:`load_vocoder`) for the mels
    of ``checkpoint`` (its config ``cfg``; ``args.load_vocoder`` of a mel-making model's inference). Raises
    :class:`CheckpointError` as :func:`load_vocoder` does, and naming both files where the vocoder's audio settings
    differ from ``cfg``'s (:func:`vocoder_mismatch`: the mel framing aside)."""
    vocoder = load_vocoder(path, device)
    if differing := vocoder_mismatch(vocoder.cfg.audio, cfg.audio):
        raise CheckpointError(f"--vocoder {path} was trained with other audio settings than {checkpoint}: {differing}")
    return vocoder.vocode


def unknown_options(unknown: list[str], name: str, checkpoint: str) -> str:
    """The line for options the checkpoint's model does not take: which model takes them, and what this one takes."""
    options = [action.option_strings[0] for action in build_parser([name])._actions if action.option_strings
               and action.option_strings[0] not in ("-h", "--checkpoint", "--output", "--device")]
    flags = [arg for arg in unknown if arg.startswith("-")] or unknown
    owners = [other for other in MODELS if other != name and all(
        any(flag.split("=")[0] in action.option_strings for action in build_parser([other])._actions)
        for flag in flags)]
    elsewhere = f" (an option of {', '.join(owners)} checkpoints)" if owners else ""
    return (f"{' '.join(flags)}: not an option of {checkpoint}, a {name} checkpoint{elsewhere}; it takes "
            f"{', '.join(options) or 'no options of its own'} (python inference.py --checkpoint {checkpoint} --help)")


def main(argv: list[str] | None = None) -> int:
    """``python inference.py``: 0, 1 after an ``ERROR:`` line, 2 for bad options (argparse's, or its model's)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    probe = argparse.ArgumentParser(add_help=False)
    probe.add_argument("--checkpoint")
    known, _ = probe.parse_known_args(argv)
    try:
        state = None if known.checkpoint is None else PARTS.formats.of(known.checkpoint).read(known.checkpoint)
        name = None if state is None else state.get("model_name")
        if state is not None and name not in MODELS:
            raise CheckpointError(f"{known.checkpoint} holds a model '{name}' that models/__init__.py does not "
                                  f"register (known: {', '.join(MODELS) or 'none'})")
    except CheckpointError as err:
        print(f"ERROR: {one_line(err)}", file=sys.stderr)
        return 1
    parser = build_parser([name] if name else list(MODELS))
    args, unknown = parser.parse_known_args(argv)  # --help and missing options: argparse's own message, exit 2
    if unknown:
        print(f"ERROR: {unknown_options(unknown, name, known.checkpoint)}", file=sys.stderr)
        return 2
    if not (output := Path(args.output)).parent.is_dir():
        print(f"ERROR: --output {output}: the folder {output.parent} does not exist", file=sys.stderr)
        return 1
    spec = MODELS[name]
    try:
        if spec.inference is None:
            raise ConfigError(f"model '{name}' has no inference hook (Inference.infer of its spec in models/{name})")
        device = parse_device(args.device)
        _, model, cfg = load_trained(args.checkpoint, device)
        args.load_trained = lambda path: load_trained(path, device)  # another checkpoint of this project
        args.load_vocoder = lambda path: vocoder_for(path, cfg, args.checkpoint, device)  # a mel model's --vocoder
        torch.manual_seed(args.seed)  # every device's generator
        np.random.seed(args.seed)  # Griffin-Lim's random initial phases (librosa)
        with one_line_warnings():
            spec.inference.infer(model, cfg, args, device)
    except (ConfigError, DataError, CheckpointError, ValueError, OSError) as err:
        print(f"ERROR: {one_line(err)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    code = main()
    gc.freeze()  # objects left for Python's exit are not collected again: torch's take 0.7 s of CPU to walk
    sys.exit(code)
