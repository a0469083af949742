"""What a checkpoint holds (:func:`checkpoint_entries`, checked by :func:`entries_problem`), and the core's format:
:class:`SingleFile`, one file per step, written and pruned by rank 0."""

from __future__ import annotations

import dataclasses
import errno
import os
import random
import sys
from pathlib import Path
from typing import Any, Mapping, Optional, Protocol, Sequence

import numpy as np
import torch

from distributed import DistInfo, all_gather_object
from utils.checkpoint.files import (CheckpointError, LegacyCheck, atomic_symlink, atomic_write_bytes, fsync_dir,
                                    intact, load_checkpoint, load_model_state, load_torch_file, prune,
                                    remove_stale_temporaries, serialized, write_failure)
from utils.checkpoint.names import LAST_FILE, LAST_FOLDER, list_checkpoints, numbered, temporary
from utils.run_log import one_line
from utils.train_state import TrainState

NO_LINKS = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS)  # os.symlink on a file system without them
_copying: set[Path] = set()  # folders whose checkpoint_last.pt is a copy: said once per run


def checkpoint_bytes(modules: Sequence[torch.nn.Module], optimizer_moments: int = 2, averages: int = 0) -> int:
    """About the bytes of a training checkpoint of ``modules``: weights, buffers, and ``optimizer_moments`` (Adam: 2)
    and ``averages`` (an EMA: 1) copies of the trainable weights."""
    weights = sum(t.numel() * t.element_size() for m in modules for t in [*m.parameters(), *m.buffers()])
    trainable = sum(t.numel() * t.element_size() for m in modules for t in m.parameters() if t.requires_grad)
    return weights + (optimizer_moments + averages) * trainable


def save_checkpoint(output_dir: str | Path, state: dict[str, Any], step: int, keep_last: int = 0) -> Path:
    """Write ``checkpoint_<step>.pt`` atomically, point ``checkpoint_last.pt`` at it (:func:`point_last`; an older
    folder's ``checkpoint_last`` link goes) and return it; the newest ``keep_last`` by step stay (0: all). A
    :class:`CheckpointError` where ``state`` holds what a ``weights_only`` load refuses (nothing written) or a file
    cannot be written (no earlier checkpoint touched)."""
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
        if (output_dir / LAST_FOLDER).is_symlink():  # an older checkpoint folder's: this file is newer
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
    """``checkpoint_last.pt`` beside ``path`` made a relative link to it, or where the file system refuses links a copy
    of ``data`` (``path``'s bytes), said once per run. ``OSError``: neither."""
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
    """Whether ``folder`` takes the ``checkpoint_last.pt`` link (a test link made and removed); ``True`` where the test
    fails otherwise (the save then says why)."""
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


def rng_problem(state: Any) -> Optional[str]:
    """What of one rank's entry of a checkpoint's ``rng`` list :func:`restore_rng_state` could not put back (tried on
    new generators), or ``None``."""
    if not isinstance(state, Mapping) or not {"python", "numpy", "torch"} <= state.keys():
        return f"{_a(state)}, not a dict of the 'python', 'numpy' and 'torch' generator states"
    cuda = state.get("cuda", [])
    if not isinstance(cuda, (list, tuple)) or not all(isinstance(s, torch.Tensor) and s.dtype == torch.uint8
                                                      for s in cuda):
        return "a dict whose 'cuda' states are not a list of byte tensors"
    try:
        version, internal, gauss = state["python"]
        random.Random().setstate((version, tuple(internal), gauss))
        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.RandomState().set_state((kind, keys.cpu().numpy().astype(np.uint32), pos, has_gauss, cached))
        torch.Generator().set_state(state["torch"].cpu())
    except (AttributeError, OverflowError, RuntimeError, TypeError, ValueError) as err:  # the generators' own checks
        return f"a dict of generator states that do not load ({type(err).__name__}: {one_line(err)})"
    return None


PART_KEYS: dict[str, dict[str, type]] = {"optimizer": {"state": Mapping, "param_groups": list},
                                         "scheduler": {"last_epoch": int}, "scaler": {}}
"""What the state dicts of torch's optimizers, LR schedulers and gradient scaler hold: key and type."""
TOP_LEVEL = {"position": ("step", "epoch", "batch_in_epoch")}
"""The parts whose entries lie at a checkpoint's top level (the loop's position, as in the first checkpoints), and
those of their entries a resume needs."""


def entries_problem(saved: Mapping[str, Any]) -> Optional[str]:
    """The first entry of a checkpoint that is not as ``train.py`` writes it (``"its 'rng' entry is ..."``), or None:
    ``model`` and ``ema`` dicts of tensors, each of :data:`PART_KEYS` a state dict (several phases': a dict of them),
    ``rng`` every rank's generator states, :class:`TrainState`'s counts integers >= 0 and its tallies dicts,
    ``grad_accumulation`` >= 1. A missing entry is the ``Checkpointer``'s to name."""
    for name in ("model", "ema"):
        if name in saved and not (isinstance(saved[name], Mapping)
                                  and all(isinstance(value, torch.Tensor) for value in saved[name].values())):
            return f"its {name!r} entry is {_a(saved[name])}, not a dict of tensors"
    for name, keys in PART_KEYS.items():
        if name in saved and (problem := _part_problem(saved[name], keys)) is not None:
            return f"its {name!r} entry is {problem}"
    if "rng" in saved:
        if not isinstance(saved["rng"], (list, tuple)) or not saved["rng"]:
            shown = "an empty list" if isinstance(saved["rng"], (list, tuple)) else _a(saved["rng"])
            return f"its 'rng' entry is {shown}, not a list of every rank's generator states"
        for rank, state in enumerate(saved["rng"]):
            if (problem := rng_problem(state)) is not None:
                return f"its 'rng' entry of rank {rank} is {problem}"
    return _position_problem(saved)


def _part_problem(entry: Any, keys: dict[str, type]) -> Optional[str]:
    if not isinstance(entry, Mapping):
        return f"{_a(entry)}, not a state dict"
    by_phase = bool(keys) and bool(entry) and not keys.keys() & entry.keys() and all(
        isinstance(value, Mapping) for value in entry.values())
    for phase, state in (entry.items() if by_phase else [(None, entry)]):
        wrong = [f"{'a dict' if kind is Mapping else _a(kind())} {key!r}" for key, kind in keys.items()
                 if not isinstance(state.get(key), kind) or isinstance(state.get(key), bool)]
        if wrong:
            return f"a state dict{f' (of {phase!r})' if phase is not None else ''} without {', '.join(wrong)}"
    return None


def _position_problem(saved: Mapping[str, Any]) -> Optional[str]:
    fields = {field.name: field for field in dataclasses.fields(TrainState)}
    least = {name: 0 for name, field in fields.items() if isinstance(field.default, int)} | {"grad_accumulation": 1}
    for name in sorted(saved.keys() & least.keys()):
        if isinstance(value := saved[name], bool) or not isinstance(value, int) or value < least[name]:
            shown = value if isinstance(value, int) else _a(value)
            return f"its {name!r} entry is {shown}, not an integer >= {least[name]}"
    for name in sorted(saved.keys() & fields.keys() - least.keys()):  # the tallies by phase
        if not isinstance(saved[name], Mapping):
            return f"its {name!r} entry is {_a(saved[name])}, not a dict"
    return None


def _a(value: Any) -> str:
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def state_misfit(own: Any, given: Any, at: str = "") -> Optional[str]:
    """Where ``given`` (a part's state from a checkpoint) holds another kind of value than ``own`` (the run's
    ``state_dict()``), as ``"at ['last_epoch']: a str, this run's is an int"``, or ``None``: dicts at their shared
    keys, lists item by item, values by kind (a number, a flag, a tensor; ``None`` fits anything)."""
    if own is None or given is None:
        return None
    if isinstance(own, Mapping) and isinstance(given, Mapping):
        shared = sorted(own.keys() & given.keys(), key=str)
        found = (state_misfit(own[key], given[key], f"{at}[{key!r}]") for key in shared)
        return next((problem for problem in found if problem is not None), None)
    if isinstance(own, (list, tuple)) and isinstance(given, (list, tuple)):
        if len(own) != len(given):
            return f"at {at or 'the top'}: {len(given)} values, this run's has {len(own)}"
        found = (state_misfit(mine, theirs, f"{at}[{i}]") for i, (mine, theirs) in enumerate(zip(own, given)))
        return next((problem for problem in found if problem is not None), None)
    if _kind(own) != _kind(given):
        return f"at {at or 'the top'}: {_a(given)}, this run's is {_a(own)}"
    return None


def _kind(value: Any) -> str:
    return "number" if isinstance(value, (int, float)) and not isinstance(value, bool) else type(value).__name__


def load_part(part: Any, state: Any, name: str, path: str | Path) -> None:
    """``part.load_state_dict(state)`` of the entry ``name`` of the checkpoint at ``path`` (one of :data:`PART_KEYS`
    once :func:`state_misfit` passes); a :class:`CheckpointError` names what does not fit."""
    if name in PART_KEYS and (problem := state_misfit(part.state_dict(), state)) is not None:
        raise CheckpointError(f"{path}: its {name!r} entry does not fit this run: {problem}")
    try:
        part.load_state_dict(state)
    except (AttributeError, IndexError, KeyError, RuntimeError, TypeError, ValueError) as err:  # untrusted input
        raise CheckpointError(f"{path}: its {name!r} entry does not fit this run: {one_line(err)}") from None


class NamedStates(dict):
    """Stateful objects by name under one checkpoint entry (a GAN's optimizers); ``load_state_dict`` raises
    :class:`CheckpointError` where the checkpoint names others."""

    def state_dict(self) -> dict[str, Any]:
        return {name: part.state_dict() for name, part in self.items()}

    def load_state_dict(self, states: Mapping[str, Any]) -> None:
        if not isinstance(states, Mapping) or set(states) != set(self):
            found = sorted(states) if isinstance(states, Mapping) else type(states).__name__
            raise CheckpointError(f"the checkpoint holds states for {found}, this run has {sorted(self)}")
        for name, part in self.items():
            part.load_state_dict(states[name])


class Stateful(Protocol):
    """A part of a run that a checkpoint holds (the protocol of ``torch.distributed.checkpoint.stateful.Stateful``)."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...


def checkpoint_entries(states: Mapping[str, Stateful], info: Mapping[str, Any], held: tuple[str, ...] = ()
                       ) -> dict[str, Any]:
    """A checkpoint's dict: each part's ``state_dict()`` under its name (:data:`TOP_LEVEL`'s at the top), but those
    ``held`` by a format of its own, then the provenance ``info``. Every rank calls it (:class:`RngStates` gathers)."""
    entries: dict[str, Any] = {}
    for name, part in states.items():
        if name not in held:
            state = part.state_dict()
            entries.update(state if name in TOP_LEVEL else {name: state})
    return {**entries, **info}


class RngStates:
    """Every rank's generator states, in rank order (a checkpoint's ``rng``); on another world size they restart."""

    def __init__(self, rank: int = 0, world_size: int = 1):
        self.rank, self.world_size = rank, world_size

    def state_dict(self) -> list[dict[str, Any]]:
        return all_gather_object(capture_rng_state())

    def load_state_dict(self, states: Sequence[dict[str, Any]]) -> None:
        if len(states) == self.world_size:
            restore_rng_state(states[self.rank])


def malformed(path: Path, legacy: Optional[LegacyCheck] = None) -> Optional[str]:
    """``"malformed (its 'rng' entry is ...)"`` (:func:`entries_problem`, its tensors mapped, not read) or ``None``;
    a :class:`CheckpointError` where the file holds code or does not load (``legacy``: as ``torch_file_problem``)."""
    saved = load_torch_file(path, mmap=True, legacy=legacy)
    problem = entries_problem(saved) if isinstance(saved, Mapping) else f"it holds a {type(saved).__name__}, not a dict"
    return None if problem is None else f"malformed ({problem})"


@dataclasses.dataclass(frozen=True)
class SingleFile:
    """The core's ``CheckpointFormat``: ``checkpoint_<step>.pt`` of :func:`checkpoint_entries`, written by rank 0."""

    legacy: Optional[LegacyCheck] = None
    noun = "file"

    def problem(self, path: Path) -> Optional[str]:
        """Why the file cannot be loaded (:func:`intact`, :func:`malformed`), or ``None``."""
        return intact(path) or malformed(path, self.legacy) if Path(path).is_file() else "not a file"

    def read(self, path: str | Path, map_location: Any = "cpu", verify: bool = True) -> dict[str, Any]:
        """The file's dict, verified always (:func:`load_checkpoint`)."""
        return load_checkpoint(path, map_location, self.legacy)

    def load(self, path: str | Path, states: Mapping[str, Stateful], saved: Mapping[str, Any]) -> tuple[str, ...]:
        """The weights, strictly (:func:`load_model_state`); the other states are ``saved``'s entries."""
        load_model_state(states["model"], saved["model"], str(path))
        return ("model",)

    def continues(self, path: Path) -> None:
        """``None``: a run saving files resumes from any checkpoint."""

    def saver(self, output_dir: Path, dist: DistInfo, train: Any) -> FileSaver:
        return FileSaver(Path(output_dir), dist.rank, train.keep_last)


@dataclasses.dataclass(frozen=True)
class FileSaver:
    """A run's saves as single files: rank 0 writes each at once (:func:`save_checkpoint`)."""

    output_dir: Path
    rank: int
    keep_last: int
    background = False

    def save(self, step: int, states: Mapping[str, Stateful], info: Mapping[str, Any]) -> Optional[Path]:
        """Rank 0's file of step ``step`` (``None`` on the others); raises what :func:`save_checkpoint` raises."""
        entries = checkpoint_entries(states, info)
        return save_checkpoint(self.output_dir, entries, step, self.keep_last) if self.rank == 0 else None

    def poll(self) -> None:
        """``None``: nothing is written in the background."""

    wait = poll

    def share(self, nbytes: int) -> int:
        """Rank 0 writes the whole checkpoint; twice where the folder takes no link."""
        return nbytes if takes_links(self.output_dir) else 2 * nbytes


RELEASE_FORMAT = "release"  # the "format" entry of a release checkpoint


def in_modules(name: str, modules: Sequence[str]) -> bool:
    """Whether the state-dict key ``name`` belongs to one of the sub-modules ``modules`` (all of them when empty)."""
    return not modules or any(name == module or name.startswith(f"{module}.") for module in modules)
