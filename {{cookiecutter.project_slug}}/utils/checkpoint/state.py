"""What a single-file checkpoint holds and how it is written and pruned."""

from __future__ import annotations

import dataclasses
import errno
import os
import random
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from utils.checkpoint.files import (CheckpointError, atomic_symlink, atomic_write_bytes, fsync_dir, prune,
                                    remove_stale_temporaries, serialized, write_failure)
from utils.checkpoint.names import LAST_FILE, LAST_FOLDER, list_checkpoints, numbered, temporary
from utils.train_state import TrainState

NO_LINKS = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS)  # os.symlink on a file system without them
_copying: set[Path] = set()  # folders whose checkpoint_last.pt is a copy: said once per run


def checkpoint_bytes(modules: Sequence[torch.nn.Module], optimizer_moments: int = 2, averages: int = 0) -> int:
    """About the bytes of a training checkpoint of ``modules``: weights and buffers, plus ``optimizer_moments`` (Adam:
    2) and ``averages`` (an EMA: 1) copies of the trainable weights."""
    weights = sum(t.numel() * t.element_size() for m in modules for t in [*m.parameters(), *m.buffers()])
    trainable = sum(t.numel() * t.element_size() for m in modules for t in m.parameters() if t.requires_grad)
    return weights + (optimizer_moments + averages) * trainable


def save_checkpoint(output_dir: str | Path, state: dict[str, Any], step: int, keep_last: int = 0) -> Path:
    """Write ``checkpoint_<step>.pt`` atomically into ``output_dir``, point ``checkpoint_last.pt`` at it
    (:func:`point_last`; a sharded ``checkpoint_last`` link, older, goes) and return it; the newest ``keep_last`` by
    step stay (0: all; the one just written always). A :class:`CheckpointError` where ``state`` holds objects a
    ``weights_only`` load refuses (nothing written) or a file cannot be written (no earlier checkpoint touched)."""
    output_dir = Path(output_dir)
    remove_stale_temporaries(output_dir)
    path = numbered(output_dir, step)
    data = serialized(state, path)
    files, written = [path, output_dir / LAST_FILE], []
    try:
        atomic_write_bytes(path, data)
        written.append(path)
        point_last(path, data)
        written.append(files[1])
        if (output_dir / LAST_FOLDER).is_symlink():  # an older sharded checkpoint's: this file is newer
            (output_dir / LAST_FOLDER).unlink()
            fsync_dir(output_dir)
    except OSError as err:  # a full disk, a quota, a folder gone read-only: the earlier files are untouched
        kept = [old for old in (files[1], *[p for p in list_checkpoints(output_dir) if p != path][-1:])
                if old.is_file() and old not in written]
        raise write_failure(step, output_dir, err.strerror or str(err), kept, written,
                            [file for file in files if file not in written]) from None
    # The newest by step, but never the file just written (an older run's higher steps may be there).
    prune([old for old in list_checkpoints(output_dir) if old != path], keep_last, Path.unlink)
    return path


def point_last(path: Path, data: bytes) -> None:
    """Make ``checkpoint_last.pt`` beside ``path`` a relative link to it (atomically); where the file system refuses
    links (:data:`NO_LINKS`) a copy of ``data``, ``path``'s bytes, with a note once per run. ``OSError``: neither."""
    last = path.with_name(LAST_FILE)
    try:
        atomic_symlink(last, path.name)
    except OSError as err:
        if err.errno not in NO_LINKS:
            raise
        if path.parent not in _copying:
            _copying.add(path.parent)
            print(f"note: {path.parent} takes no symbolic links ({err.strerror or err}): {LAST_FILE} is written as "
                  "a copy of each checkpoint, twice the bytes a save makes durable", file=sys.stderr, flush=True)
        atomic_write_bytes(last, data)


def takes_links(folder: str | Path) -> bool:
    """Whether ``folder`` takes the ``checkpoint_last.pt`` link (a test link made and removed): a save writes its
    bytes once; ``True`` where the test fails otherwise (the save then says why)."""
    probe = temporary(Path(folder) / "checkpoint_link_test")  # a dead run's: removed as its other temporaries
    try:
        os.symlink(LAST_FILE, probe)
    except OSError as err:
        return err.errno not in NO_LINKS
    probe.unlink()
    return True


def capture_rng_state() -> dict[str, Any]:
    """This process's generator states (Python, NumPy, torch CPU and CUDA), as ``weights_only=True`` loads them."""
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


STATEFUL_PARTS = ("optimizer", "scheduler", "scaler")  # what a training checkpoint holds besides the model


class NamedStates(dict):
    """Several stateful objects under one checkpoint entry, by name (a GAN's optimizers or schedulers), saved as
    ``{name: state_dict}``; ``load_state_dict`` raises :class:`CheckpointError` where the checkpoint names others."""

    def state_dict(self) -> dict[str, Any]:
        return {name: part.state_dict() for name, part in self.items()}

    def load_state_dict(self, states: Mapping[str, Any]) -> None:
        if not isinstance(states, Mapping) or set(states) != set(self):
            found = sorted(states) if isinstance(states, Mapping) else type(states).__name__
            raise CheckpointError(f"the checkpoint holds states for {found}, this run has {sorted(self)}")
        for name, part in self.items():
            part.load_state_dict(states[name])


def training_checkpoint(model: torch.nn.Module, parts: Mapping[str, Any], state: TrainState, rng: list,
                        **info: Any) -> dict[str, Any]:
    """The dict ``train.py`` saves: everything the next step depends on. ``model``: the plain (unwrapped) one;
    ``parts``: :data:`STATEFUL_PARTS` by name; ``rng``: every rank's :func:`capture_rng_state`, in rank order."""
    return {"model": model.state_dict(), **{name: parts[name].state_dict() for name in STATEFUL_PARTS},
            **dataclasses.asdict(state), "rng": rng, **info}


RELEASE_FORMAT = "release"  # the "format" entry of a release checkpoint


def in_modules(name: str, modules: Sequence[str]) -> bool:
    """Whether the state-dict key ``name`` belongs to one of the sub-modules ``modules`` (all of them when empty)."""
    return not modules or any(name == module or name.startswith(f"{module}.") for module in modules)
