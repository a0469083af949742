"""Checkpoints: atomic writes, safe loading, and pruning of old files.

A checkpoint is a plain dict of tensors and Python primitives, so it loads with
``torch.load(weights_only=True)``: a file holding arbitrary pickled objects is refused, never executed.
"""

from __future__ import annotations

import io
import os
import pickle
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

CHECKPOINT_RE = re.compile(r"^checkpoint_(\d+)\.pt$")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable, unsafe, or does not fit the model."""


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the new one, never a torn one.

    The bytes go to a temporary file in the same folder, are flushed and fsync'ed, then
    ``os.replace`` swaps the file in; a process killed mid-write leaves the old file untouched.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def save_checkpoint(output_dir: str | Path, state: dict[str, Any], step: int, keep_last: int = 0) -> Path:
    """Write ``checkpoint_<step>.pt`` and ``checkpoint_last.pt`` atomically; keep the newest ``keep_last``.

    Args:
        output_dir: the run's output folder (must exist).
        state: plain dict of tensors and primitives (see :func:`load_checkpoint`).
        step: optimizer step, used in the file name.
        keep_last: how many numbered checkpoints to keep (0 keeps all); ``checkpoint_last.pt`` always stays.

    Returns:
        the path of the numbered checkpoint.
    """
    output_dir = Path(output_dir)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    numbered = output_dir / f"checkpoint_{step}.pt"
    atomic_write_bytes(numbered, data)
    atomic_write_bytes(output_dir / "checkpoint_last.pt", data)
    if keep_last > 0:
        for old in list_checkpoints(output_dir)[:-keep_last]:
            old.unlink()
    return numbered


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Numbered checkpoints in ``output_dir``, oldest step first."""
    found = [(int(m.group(1)), p) for p in Path(output_dir).glob("checkpoint_*.pt")
             if (m := CHECKPOINT_RE.match(p.name))]
    return [p for _, p in sorted(found)]


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True``.

    Raises:
        CheckpointError: the file is missing, truncated or not a checkpoint, or holds pickled objects
            other than tensors and primitives (refused without being executed).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError) as err:  # depends on the damage
        lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [type(err).__name__]
        # torch's weights_only refusal is long; its "WeightsUnpickler error" line names the offending object.
        reason = next((line for line in lines if "WeightsUnpickler error" in line), lines[0])
        raise CheckpointError(f"cannot load checkpoint {path} safely: {reason}") from err
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{path} is not a checkpoint of this project (no 'model' entry)")
    return state


def load_model_state(model: torch.nn.Module, state_dict: dict[str, torch.Tensor], source: str) -> None:
    """Load ``state_dict`` into ``model`` strictly, naming every missing, unexpected or misshapen key.

    Raises:
        CheckpointError: the keys or shapes do not match (e.g. a checkpoint of another model or config).
    """
    own = model.state_dict()
    missing = sorted(set(own) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(own))
    misshapen = [f"{k} {tuple(state_dict[k].shape)} vs {tuple(own[k].shape)}"
                 for k in sorted(set(own) & set(state_dict)) if own[k].shape != state_dict[k].shape]
    if missing or unexpected or misshapen:
        parts = []
        for label, items in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", misshapen)):
            if items:
                more = f" (+{len(items) - 5} more)" if len(items) > 5 else ""
                parts.append(f"{label}: {', '.join(items[:5])}{more}")
        raise CheckpointError(f"{source} does not fit this model: {'; '.join(parts)}")
    model.load_state_dict(state_dict)


def capture_rng_state() -> dict[str, Any]:
    """This process's random number generator states (Python, NumPy, torch CPU and CUDA) as tensors and
    primitives, so they load with ``weights_only=True``."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": random.getstate(), "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos,
                                                    has_gauss, cached], "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put back the generator states of :func:`capture_rng_state`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.cpu().numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
