"""What to ship after training: a release checkpoint, or ONNX files of the inference path checked against PyTorch.

    python -m scripts.export --checkpoint out/checkpoint_last.pt --format release --output model.pt
    python -m scripts.export --checkpoint out/checkpoint_last --format release --output model.pt   # sharded alike
    python -m scripts.export --checkpoint out/checkpoint_last.pt --format onnx --output onnx/

``release``: one ``torch.load(weights_only=True)`` file of the weights inference uses (EMA weights when the run kept
them), the model's name and config. ``onnx``: each ``Export.parts`` as ``<output>/<part>.onnx``, checked with
onnxruntime (:mod:`utils.onnx_export`); ``--n-timesteps N``: the sampler steps fixed in the graph of a model that
integrates one (a flow-matching decoder's Euler steps; default: its config's ``n_timesteps``). Exit status 1 with one ``ERROR:``
line for an unreadable checkpoint, an existing output (``--force`` replaces it), a bad ``--n-timesteps`` or a model
that cannot be exported; nothing is left half-written.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

if not __package__:  # run by its path, not as python -m scripts.NAME: the project's modules would not import
    sys.exit(f"ERROR: run this tool from the project folder as: python -m scripts.{Path(__file__).stem} ...")

import torch

from inference import load_trained
from models import MODELS
from parts import PARTS
from utils.checkpoint.files import CheckpointError, atomic_write_bytes
from utils.checkpoint.published import release_checkpoint
from utils.config import Config, ConfigError
from utils.onnx_export import ExportError, export_model, onnx_runtime
from utils.run_log import one_line


def size_of(path: Path) -> int:
    """Bytes of a file, or of every file in a folder (a sharded checkpoint)."""
    return path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def set_n_timesteps(steps: int | None, name: str, cfg: Config) -> None:
    """Set model ``name``'s ``n_timesteps`` in ``cfg`` to ``steps`` (None: leave it). Raises ExportError: ``steps`` under
    1, or a model whose config has no ``n_timesteps`` (it runs no sampler)."""
    if steps is None:
        return
    if steps < 1:
        raise ExportError(f"--n-timesteps {steps}: a sampler's graph needs at least 1 step")
    section = getattr(cfg, name, None)
    if not hasattr(section, "n_timesteps"):
        raise ExportError(f"--n-timesteps {steps}: model {name!r} runs no sampler (its config has no "
                          f"{name}.n_timesteps); leave the option out")
    section.n_timesteps = steps


def main(argv: list[str] | None = None) -> int:
    """Export the checkpoint as ``--format`` says. Returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True,
                        help="a checkpoint of train.py: a .pt file" + (" or a sharded folder (checkpoint_last works)"
                                                                      if PARTS.formats.folder else ""))
    parser.add_argument("--format", choices=("release", "onnx"), required=True,
                        help="release: one file for inference; onnx: the inference path as ONNX files, checked")
    parser.add_argument("--output", type=Path, required=True, help="release: the file; onnx: the folder")
    parser.add_argument("--force", action="store_true", help="replace an existing output")
    parser.add_argument("--n-timesteps", type=int, help="onnx: the sampler steps fixed in the graph of a model that "
                                                        "integrates one (default: its config's n_timesteps)")
    args = parser.parse_args(argv)
    output, release_format = args.output, args.format == "release"
    try:
        if release_format and args.n_timesteps is not None:
            raise ExportError("--n-timesteps is an option of --format onnx (a release keeps the run's config; "
                              "inference.py takes --n-timesteps)")
        if not output.parent.is_dir():
            raise CheckpointError(f"--output {output}: the folder {output.parent} does not exist")
        if output.exists() and not args.force and (release_format or any(output.glob("*.onnx"))):
            raise CheckpointError(f"{output} exists; pass --force to replace it, or --output another "
                                  f"{'file' if release_format else 'folder'}")
        if release_format:
            saved = PARTS.formats.of(args.checkpoint).read(args.checkpoint)
        else:
            onnx_runtime()  # before anything is read or created
        name, model, cfg = load_trained(args.checkpoint, torch.device("cpu"))
        if not release_format:
            set_n_timesteps(args.n_timesteps, name, cfg)
            # creates the folder once the model passes its checks
            rows = export_model(name, PARTS.exports.get(name), model, cfg, output)
            print(f"wrote {len(rows)} ONNX file(s) to {output}; the largest difference to PyTorch: "
                  f"{max(row['max_abs_diff'] for row in rows):.1e}")
            return 0
        release = release_checkpoint(name, model.state_dict(), MODELS[name].inference_modules, cfg.to_dict(), saved,
                                     str(args.checkpoint))
        buffer = io.BytesIO()
        torch.save(release, buffer)
        atomic_write_bytes(output, buffer.getvalue())
        modules = ", ".join(MODELS[name].inference_modules) or "the whole model"
        print(f"wrote {output} ({size_of(output) / 1e6:.2f} MB; the checkpoint: {size_of(args.checkpoint) / 1e6:.2f} "
              f"MB): model '{name}' at step {release['step']}, {len(release['model'])} tensors of "
              f"{modules}" + (", EMA weights" if release["ema_weights"] else ""))
        return 0
    except (CheckpointError, ConfigError, ExportError, OSError) as err:
        print(f"ERROR: {one_line(err)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
