"""Published weights as a checkpoint of this project: to listen to them with ``inference.py`` before (or without)
training, or to share them in this project's format.

    python -m scripts.import_weights PUBLISHED_FILE --output model.pt
    python inference.py --checkpoint model.pt --output out.wav ...

Reads a file in a registered model's reference format (``Published.read``; nothing in it runs), or a checkpoint of
this project, into the model of ``--config`` and writes ``{"model", "model_name", "config", "step": 0, "source"}``
(and the file's speaker map, ``speakers``, where it has one: ``data.speakers``); ``train.py --init-from`` fine-tunes
from it. The config records the mel framing the weights were trained on
(:func:`settle_framing`), which ``inference.py --wav`` and ``scripts.dump_gta_mels`` frame with.
Exit status 1 with one ``ERROR:`` line for a file of no known format, weights that do not fit the config, or an
``--output`` that exists (``--force`` replaces it) or whose folder does not.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

if not __package__:  # run by its path, not as python -m scripts.NAME: the project's modules would not import
    sys.exit(f"ERROR: run this tool from the project folder as: python -m scripts.{Path(__file__).stem} ...")

import torch

from models import MODELS
from parts import LEFT_OUT, PARTS, config_schemas
from utils.checkpoint.files import CheckpointError, atomic_write_bytes
from utils.checkpoint.weights import Weights, load_into, read_weights
from utils.config import Config, ConfigError, load_config
from utils.data import speakers
from utils.training.recipe import apply_recipe

ROOT = Path(__file__).resolve().parent.parent


def settle_framing(cfg: Config, weights: Weights) -> str:
    """Fill ``cfg`` as ``train.py`` fills a run's (:func:`utils.training.recipe.apply_recipe`: the settings it leaves
    null take the model's recipe), ``audio.mel_framing`` first set to the framing a checkpoint of this project records
    (``weights.framing``), replacing the config's: its weights keep the frames they were trained on. A published file
    records none and takes its model's reference framing (its ``ModelSpec.recipe``'s: ``nvidia`` or ``jik876``), or
    the value the config gives. Returns what the output line adds: the framing, and the
    config's value it replaced."""
    given = cfg.audio.mel_framing
    if weights.framing is not None:
        cfg.audio.mel_framing = weights.framing
    apply_recipe(MODELS[weights.model_name], cfg, PARTS.data_framing(cfg.data))
    replaced = f", replacing the config's {given}: the framing its weights were trained on" if given not in (
        None, cfg.audio.mel_framing) else ""
    return f"; audio.mel_framing={cfg.audio.mel_framing}{replaced}"


def main(argv: list[str] | None = None) -> int:
    """Write the published file as a checkpoint of this project. Returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("weights", type=Path, help=f"the published file ({PARTS.formats.published.sources})")
    parser.add_argument("--output", type=Path, required=True, help="the checkpoint to write (a .pt file)")
    parser.add_argument("--config", default=str(ROOT / "config.json"), help="the config to build the model with")
    parser.add_argument("--tiny", action="store_true", help="apply the config's tiny block (weights of tiny models)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a value")
    parser.add_argument("--force", action="store_true", help="replace an existing --output")
    args = parser.parse_args(argv)
    try:
        if not args.output.parent.is_dir():
            raise CheckpointError(f"--output {args.output}: the folder {args.output.parent} does not exist")
        if args.output.exists() and not args.force:
            raise CheckpointError(f"{args.output} exists; pass --force to replace it, or --output another file")
        cfg = load_config(args.config, config_schemas(), tiny=args.tiny, overrides=args.set, left_out=LEFT_OUT)
        weights = read_weights(args.weights, MODELS, cfg, label="the weights file", formats=PARTS.formats)
        framing = settle_framing(cfg, weights)
        if weights.speakers:  # the file's speaker map: the model's table, and the run that starts from the output
            cfg.data.speakers = speakers.saved_map({speakers.ENTRY: weights.speakers}, str(args.weights))[0]
        model = MODELS[weights.model_name].build_model(cfg)
        kept = load_into(model, weights, str(args.weights))
    except (CheckpointError, ConfigError, ValueError) as err:
        print(f"ERROR: {str(err).splitlines()[0]}", file=sys.stderr)
        return 1
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "model_name": weights.model_name, "config": cfg.to_dict(), "step": 0,
                "source": str(args.weights), **({speakers.ENTRY: weights.speakers} if weights.speakers else {})},
               buffer)
    try:
        atomic_write_bytes(args.output, buffer.getvalue())
    except OSError as err:  # a read-only folder, a full disk
        print(f"ERROR: cannot write {args.output}: {err.strerror or err}", file=sys.stderr)
        return 1
    fresh = f"; {', '.join(prefix.rstrip('.') for prefix in kept)} untrained (not in the file)" if kept else ""
    print(f"wrote {args.output}: model '{weights.model_name}' from {weights.source}{fresh}{framing}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
