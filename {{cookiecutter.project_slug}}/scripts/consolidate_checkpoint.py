"""One file from a sharded checkpoint (``train.parallelism=fsdp``), for sharing or tools that read one file.

    python -m scripts.consolidate_checkpoint out/checkpoint_last                 # -> out/checkpoint_20_consolidated.pt
    python -m scripts.consolidate_checkpoint out/checkpoint_20 --output model.pt
    python -m scripts.consolidate_checkpoint out/checkpoint_last --model-only    # weights and config only

The shards are joined on the CPU as PyTorch's ``dcp_to_torch_save`` does, but read as data (nothing pickled in the
folder runs), with the entries of ``train_state.pt`` added: ``inference.py --checkpoint FILE`` takes it. Its optimizer
is keyed by parameter name: resume training from the folder. Written atomically; an existing file is kept unless
``--force``. Exit status 1 with one ``ERROR:`` line for a folder that is not an intact sharded checkpoint or an
existing output."""

from __future__ import annotations

import argparse
import io
import os
import sys
from pathlib import Path

if not __package__:  # run by its path, not as python -m scripts.NAME: the project's modules would not import
    sys.exit(f"ERROR: run this tool from the project folder as: python -m scripts.{Path(__file__).stem} ...")

import torch

from utils.checkpoint.files import CheckpointError, atomic_write_bytes
from utils.checkpoint.sharded import load_whole_sharded, read_train_state, sharded_intact

TRAINING_ONLY = ("optimizer", "scheduler", "scaler", "rng")  # the entries --model-only leaves out


def consolidate(folder: str | Path, output: str | Path, model_only: bool = False) -> dict:
    """Write the sharded checkpoint ``folder`` as the single file ``output``; returns what it holds. Raises
    CheckpointError: ``folder`` is not an intact sharded checkpoint of ``train.py``; OSError: ``output`` cannot be
    written (nothing is left half-written)."""
    folder = Path(folder)
    if not folder.exists():
        raise CheckpointError(f"{folder}: no such file or folder")
    if not folder.is_dir():
        raise CheckpointError(f"{folder} is not a sharded checkpoint folder (a .pt file is one file already)")
    if (problem := sharded_intact(folder)) is not None:
        raise CheckpointError(f"{folder} is {problem}")
    info = read_train_state(folder)
    state = load_whole_sharded(folder)
    state.update({key: value for key, value in info.items() if key not in state})
    if model_only:
        state = {key: value for key, value in state.items() if key not in TRAINING_ONLY}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    atomic_write_bytes(output, buffer.getvalue())
    return state


def main(argv: list[str] | None = None) -> int:
    """Consolidate the folder the command line names. Returns the exit status."""
    parser = argparse.ArgumentParser(description="Write one checkpoint file from a sharded checkpoint folder.")
    parser.add_argument("folder", type=Path, help="a sharded checkpoint: out/checkpoint_<step> or out/checkpoint_last")
    parser.add_argument("--output", type=Path, help="the file to write (default: <folder>_consolidated.pt beside it)")
    parser.add_argument("--model-only", action="store_true", help="weights, model name and config only")
    parser.add_argument("--force", action="store_true", help="replace an existing output file")
    args = parser.parse_args(argv)
    # out/checkpoint_20_consolidated.pt for out/checkpoint_20 or for out/checkpoint_last naming it
    output = args.output or args.folder.parent / f"{Path(os.path.realpath(args.folder)).name}_consolidated.pt"
    try:
        if not output.parent.is_dir():
            raise CheckpointError(f"--output {output}: the folder {output.parent} does not exist")
        if output.exists() and not args.force:
            raise CheckpointError(f"{output} exists; pass --force to replace it, or --output another file")
        state = consolidate(args.folder, output, args.model_only)
    except (CheckpointError, OSError) as err:
        print(f"ERROR: {str(err).splitlines()[0] if str(err) else type(err).__name__}", file=sys.stderr)
        return 1
    params = sum(t.numel() for t in state["model"].values() if torch.is_tensor(t))
    print(f"wrote {output} ({output.stat().st_size / 1e6:.1f} MB): model '{state.get('model_name')}' at step "
          f"{state.get('step')}, {params:,} numbers in its state dict"
          + ("" if args.model_only else "; resume training from the folder, not from this file"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
