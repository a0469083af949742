"""Print the mel statistics Matcha-TTS normalises by, over a corpus's training split.

    python -m scripts.mel_statistics --config config.json [--dataset-path DIR] [--tiny]

Prints ``{"mel_mean": ..., "mel_std": ...}``, the mean and standard deviation of every log-mel value of the training
split (:func:`models.matcha.data.mel_statistics`, as the authors' ``generate_data_statistics.py``), for the
``matcha`` section of ``config.json``; a run whose config leaves them null computes the same at its start. The mels
are the config's (its null settings take Matcha-TTS's recipe, as ``train.py --model matcha`` does). Every
transcript is phonemized on the way (a transcript that phonemizes to nothing is named). A missing or unreadable
corpus, or no phonemizer: one ``ERROR:`` line, exit status 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

if not __package__:  # run by its path, not as python -m scripts.NAME: the project's modules would not import
    sys.exit(f"ERROR: run this tool from the project folder as: python -m scripts.{Path(__file__).stem} ...")

from models import MODELS
from models.matcha.data import MatchaDataset, mel_statistics
from parts import LEFT_OUT, PARTS, config_schemas
from utils.config import ConfigError, load_config
from utils.data.corpora import load_splits
from utils.data.corpus import DataError
from utils.training.recipe import apply_recipe


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Print the training split's mel statistics for the config the command line names. Returns the exit status."""
    parser = argparse.ArgumentParser(description="Print the mel statistics Matcha-TTS normalises by.")
    parser.add_argument("--config", required=True, help="config.json (audio and data sections are used)")
    parser.add_argument("--dataset-path", help="override data.dataset_path")
    parser.add_argument("--tiny", action="store_true", help="the tiny block's audio settings: for --tiny runs")
    args = parser.parse_args(argv)
    overrides = [f"data.dataset_path={args.dataset_path}"] if args.dataset_path else []
    try:
        cfg = load_config(args.config, config_schemas(), tiny=args.tiny, overrides=overrides, left_out=LEFT_OUT)
        apply_recipe(MODELS["matcha"], cfg, PARTS.data_framing(cfg.data))
        train, _ = load_splits(cfg.data)
        mean, std = mel_statistics(MatchaDataset(train, cfg.audio, None, "training"))
    except (ConfigError, DataError) as err:
        print(f"ERROR: {err}", file=sys.stderr)
        return 1
    print(json.dumps({"mel_mean": round(mean, 6), "mel_std": round(std, 6)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
