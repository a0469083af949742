"""Checkpoints: the training state, atomic writes, safe loading, resuming, and pruning of old files.

A checkpoint is a plain dict of tensors and Python primitives, so it loads with
``torch.load(weights_only=True)``: a file holding arbitrary pickled objects is refused, never executed.
:func:`training_checkpoint` builds the dict ``train.py`` saves, :func:`resume_training` puts one back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import io
import json
import os
import random
import re
import shutil
import socket
import sys
import time
import warnings
import zipfile
import zlib
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np
import torch

from utils.run_log import one_line

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
    fsync_dir(path.parent)


def fsync_dir(path: str | Path) -> None:
    """Make a folder's entries durable (a rename, a new link), as ``fsync`` does for a file's bytes."""
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def durable_write_speed(folder: str | Path, nbytes: int) -> float:
    """Bytes per second of a durable write into ``folder``, as a checkpoint's is: ``nbytes`` (capped at 64 MiB)
    written, fsync'ed and removed again. Fsync's fixed cost makes a small probe slow, which errs on the safe side.

    Raises:
        OSError: the folder cannot be written.
    """
    size = max(1, min(int(nbytes), 64 << 20))
    probe, data = Path(folder) / f".write_speed.tmp{os.getpid()}", os.urandom(size)  # not compressible, not sparse
    start = time.perf_counter()
    try:
        with open(probe, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    finally:
        probe.unlink(missing_ok=True)
    return size / max(time.perf_counter() - start, 1e-6)


def checkpoint_bytes(modules: Sequence[torch.nn.Module], optimizer_moments: int = 2, averages: int = 0) -> int:
    """The size of a training checkpoint of ``modules`` (bytes, about): their weights and buffers, plus
    ``optimizer_moments`` copies of the trainable weights (Adam keeps 2) and ``averages`` copies (an EMA: 1)."""
    weights = sum(t.numel() * t.element_size() for m in modules for t in [*m.parameters(), *m.buffers()])
    trainable = sum(t.numel() * t.element_size() for m in modules for t in m.parameters() if t.requires_grad)
    return weights + (optimizer_moments + averages) * trainable


def serialized(state: Any, where: str | Path) -> bytes:
    """``torch.save`` bytes of ``state``, refused when :func:`load_checkpoint` would refuse them.

    Raises:
        CheckpointError: ``state`` holds objects other than tensors and Python primitives (nothing is written).
    """
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(io.BytesIO(data))
    if unsafe:
        raise CheckpointError(f"refusing to write {where}: the state holds objects that a weights_only=True "
                              f"load refuses ({', '.join(unsafe)}); store tensors and Python primitives only")
    return data


def write_failure(step: int, output_dir: Path, reason: str, kept: list[Path]) -> CheckpointError:
    """The error of a checkpoint that could not be written (``reason``: a full disk, a quota), naming the ones kept."""
    names = dict.fromkeys(path.name for path in kept)
    return CheckpointError(f"could not write the step {step} checkpoint in {output_dir}: {reason}; "
                           f"earlier checkpoints are kept ({', '.join(names) or 'none written yet'})")


def prune(checkpoints: list[Path], keep_last: int, remove) -> None:
    """Call ``remove`` on all but the newest ``keep_last - 1`` of ``checkpoints`` (oldest first; the one just
    written, not in the list, is the last kept); ``keep_last`` 0 keeps all."""
    if keep_last > 0:
        for old in checkpoints[:max(0, len(checkpoints) - (keep_last - 1))]:
            remove(old)


def save_checkpoint(output_dir: str | Path, state: dict[str, Any], step: int, keep_last: int = 0) -> Path:
    """Write ``checkpoint_<step>.pt`` and ``checkpoint_last.pt`` atomically; keep the newest ``keep_last``. A
    ``checkpoint_last`` link of sharded checkpoints (a run continued with DDP) is removed: the newest checkpoint,
    whichever its kind, is the one "last" names.

    Args:
        output_dir: the run's output folder (must exist).
        state: plain dict of tensors and primitives (see :func:`load_checkpoint`).
        step: optimizer step, used in the file name.
        keep_last: how many numbered checkpoints to keep (0 keeps all), the newest by step; the one just
            written and ``checkpoint_last.pt`` always stay.

    Returns:
        the path of the numbered checkpoint.

    Raises:
        CheckpointError: ``state`` holds objects that :func:`load_checkpoint` would refuse (nothing is written),
            or a file cannot be written (a full disk: no earlier checkpoint is touched).
    """
    output_dir = Path(output_dir)
    remove_stale_temporaries(output_dir)
    numbered = output_dir / f"checkpoint_{step}.pt"
    data = serialized(state, numbered)  # a file load_checkpoint would refuse must not replace a good one
    try:
        atomic_write_bytes(numbered, data)
        atomic_write_bytes(output_dir / "checkpoint_last.pt", data)
        if (output_dir / "checkpoint_last").is_symlink():  # an older sharded checkpoint's: this file is newer
            (output_dir / "checkpoint_last").unlink()
            fsync_dir(output_dir)
    except OSError as err:  # a full disk, a quota, a folder gone read-only: the earlier files are untouched
        kept = [path for path in (output_dir / "checkpoint_last.pt", *list_checkpoints(output_dir)[-1:])
                if path.is_file()]
        raise write_failure(step, output_dir, err.strerror or str(err), kept) from None
    # The newest by step, but never the file just written (an older run's higher steps may be there).
    prune([path for path in list_checkpoints(output_dir) if path != numbered], keep_last, Path.unlink)
    return numbered


def remove_stale_temporaries(output_dir: str | Path) -> list[Path]:
    """Delete the temporary files of :func:`atomic_write_bytes` left by processes that no longer run.

    A process killed mid-save (SIGKILL, out of memory) leaves ``.checkpoint_*.pt.tmp<pid>`` behind, as
    large as a checkpoint; without this they would pile up over preemptions. Returns what was removed.
    """
    removed = []
    for path in Path(output_dir).glob(".checkpoint_*.pt.tmp*"):
        pid = path.name.rpartition(".tmp")[2]
        if not pid.isdigit() or int(pid) == os.getpid() or _process_exists(int(pid)):
            continue
        path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


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
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4": the error below says it all
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location=map_location, weights_only=True)
    # Any of them, depending on the damage: a cut file (RuntimeError, EOFError), a foreign one (UnpicklingError,
    # UnicodeDecodeError), a refused global, a corrupted pickle (KeyError, IndexError, TypeError, AttributeError,
    # AssertionError from the weights-only unpickler's own checks, ...). None of it runs code from the file.
    except Exception as err:  # noqa: BLE001 - the file is untrusted input; every failure to read it is this one
        reason = _load_failure(err)
        with open(path, "rb") as handle:
            head = handle.read(2)
        if not head.startswith((b"PK", b"\x80")):  # neither a zip archive nor a pickle (protocol 2 or later)
            raise CheckpointError(f"{path} is not a checkpoint: " + ("an empty file" if not head else
                                  "neither a file torch.save writes (a zip archive) nor a pickle")) from err
        raise CheckpointError(f"cannot load checkpoint {path} safely: {reason}") from err
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{path} is not a checkpoint of this project (no 'model' entry)")
    return state


def _load_failure(err: BaseException) -> str:
    """One line on why ``torch.load`` failed; for a weights_only refusal, the refused global or opcode.

    torch's refusal is a paragraph of advice (including how to allowlist the global, which is not advice to
    follow for a file of unknown origin); the line that matters reads like "WeightsUnpickler error:
    Unsupported global: GLOBAL io.open ..." or "Trying to load unsupported GLOBAL posix.system ...".
    """
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if not lines:
        return f"{type(err).__name__} while unpickling"
    if not lines[0].startswith("Weights only load failed"):
        return lines[0]
    boilerplate = ("(1)", "(2)", "Check the documentation")
    detail = " ".join(line for line in lines[1:] if not line.startswith(boilerplate))
    detail = detail.rpartition("WeightsUnpickler error:")[2].split(" Please use ")[0].strip()
    return f"refused by weights_only=True, nothing was run: {detail or lines[0]}"


def load_model_state(model: torch.nn.Module, state_dict: dict[str, torch.Tensor], source: str) -> None:
    """Load ``state_dict`` into ``model`` strictly, naming every missing, unexpected or misshapen key.

    Raises:
        CheckpointError: the keys or shapes do not match (e.g. a checkpoint of another model or config).
    """
    if not isinstance(state_dict, Mapping):
        raise CheckpointError(f"{source}: its 'model' entry is a {type(state_dict).__name__}, not a state dict")
    not_tensors = sorted(str(k) for k, v in state_dict.items() if not isinstance(v, torch.Tensor))
    if not_tensors:
        more = f" (+{len(not_tensors) - 5} more)" if len(not_tensors) > 5 else ""
        raise CheckpointError(f"{source}: the model state holds entries that are not tensors: "
                              f"{', '.join(not_tensors[:5])}{more}")
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


# --------------------------------------------------------------------------------------------
# Training state: what train.py saves and resumes
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class TrainState:
    """Where the training loop is.

    Attributes:
        step: optimizer steps done.
        epoch: the epoch being read.
        batch_in_epoch: batches of that epoch this rank has read.
        skipped_steps: steps skipped for a non-finite loss or gradient norm, or a spike (``train.on_spike=skip``).
        samples_in_epoch: samples of that epoch's order all ranks together have read (a resumed run skips them,
            on any number of processes: the data position in global samples).
        skipped_updates: per optimizer (phase name), its updates skipped for any reason (also fp16 overflows).
        skips_in_a_row: per optimizer, how many of its latest updates were skipped in a row.
    """

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    skipped_steps: int = 0
    samples_in_epoch: int = 0
    skipped_updates: dict = dataclasses.field(default_factory=dict)
    skips_in_a_row: dict = dataclasses.field(default_factory=dict)


STATEFUL_PARTS = ("optimizer", "scheduler", "scaler")
"""The objects besides the model whose ``state_dict`` a training checkpoint holds, by these names."""


class NamedStates(dict):
    """Several stateful objects under one checkpoint entry, by name: the optimizers of a model with several
    phases (``{"discriminator": ..., "generator": ...}``), or their schedulers. Saved as ``{name: state_dict}``."""

    def state_dict(self) -> dict[str, Any]:
        return {name: part.state_dict() for name, part in self.items()}

    def load_state_dict(self, states: Mapping[str, Any]) -> None:
        """Load each object's state.

        Raises:
            CheckpointError: the checkpoint names other objects than these.
        """
        if not isinstance(states, Mapping) or set(states) != set(self):
            found = sorted(states) if isinstance(states, Mapping) else type(states).__name__
            raise CheckpointError(f"the checkpoint holds states for {found}, this run has {sorted(self)}")
        for name, part in self.items():
            part.load_state_dict(states[name])


def training_checkpoint(model: torch.nn.Module, parts: Mapping[str, Any], state: TrainState, rng: list,
                        **info: Any) -> dict[str, Any]:
    """The dict ``train.py`` saves: everything the next step depends on, so that a resume is exact.

    Args:
        model: the plain (unwrapped) model.
        parts: ``{"optimizer": ..., "scheduler": ..., "scaler": ...}`` (:data:`STATEFUL_PARTS`).
        state: the loop's position.
        rng: every rank's :func:`capture_rng_state`, in rank order.
        **info: provenance stored as is (``model_name``, ``config``, ``data_seed``, ``torch_version``, ...).

    Raises:
        KeyError: ``parts`` lacks one of :data:`STATEFUL_PARTS`.
    """
    return {"model": model.state_dict(), **{name: parts[name].state_dict() for name in STATEFUL_PARTS},
            **dataclasses.asdict(state), "rng": rng, **info}


RELEASE_FORMAT = "release"
"""The ``format`` entry of a release checkpoint (:func:`release_checkpoint`)."""


def release_checkpoint(model_name: str, model_state: Mapping[str, torch.Tensor], modules: tuple[str, ...],
                       config: Mapping[str, Any], step: Any, ema_weights: bool, source: str) -> dict[str, Any]:
    """What inference needs and nothing else: the weights of the sub-modules ``modules`` (``ModelSpec.inference_modules``;
    all when empty) of ``model_state`` (EMA weights already in place where the run kept them), the model's name and
    config, and where they come from. No optimizer, scheduler, scaler, RNG or data position: it loads with
    ``weights_only=True``, ``inference.py`` runs it, and ``train.py --init-from`` starts a run from it.
    """
    from utils.ema import in_modules

    weights = {key: value.detach().cpu().clone() for key, value in model_state.items() if in_modules(key, modules)}
    return {"format": RELEASE_FORMAT, "model_name": model_name, "config": dict(config), "step": step,
            "model": weights, "ema_weights": ema_weights, "source": source, "torch_version": str(torch.__version__)}


def intact(path: str | Path) -> Optional[str]:
    """Why the checkpoint file at ``path`` is damaged (cut short, corrupted, not a ``torch.save`` archive), or
    ``None`` when every member of its zip archive reads back with a matching CRC. Reads the whole file once;
    runs no code from it (whether its contents are safe is :func:`load_checkpoint`'s question)."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, RuntimeError) as err:  # RuntimeError: zlib/CRC
        return f"damaged ({str(err).splitlines()[0] if str(err) else type(err).__name__})"
    return None if bad is None else f"damaged (member {bad} fails its CRC check)"


def resume_path(resume: str, output_dir: str | Path) -> tuple[Optional[Path], list[str]]:
    """The checkpoint ``--resume`` names, and notes to print about the choice.

    * ``auto``: ``OUTPUT/checkpoint_last.pt`` or, for sharded checkpoints, the ``OUTPUT/checkpoint_last`` link
      (the newer of the two when both are there); when it is missing or damaged (:func:`intact`,
      :func:`sharded_intact`), the newest intact numbered checkpoint, with a note saying which was used and why;
      ``None`` when the folder holds none. Damaged numbered checkpoints passed over are renamed
      ``<name>.damaged`` (kept for a look, out of the way): pruning (``keep_last``) counts only intact
      checkpoints, so an intact one is never removed in favour of a damaged one.
    * ``none``: ``None``, on a folder that holds no checkpoint.
    * anything else: that file or sharded checkpoint folder.

    Raises:
        CheckpointError: ``none`` on a folder with checkpoints (they would be overwritten); ``auto`` on a folder
            whose every checkpoint is damaged (starting from step 0 would overwrite the only copies of progress);
            a path that is neither a checkpoint file nor a sharded checkpoint folder.
    """
    output_dir = Path(output_dir)
    lasts = sorted((path for path in (output_dir / "checkpoint_last.pt", output_dir / "checkpoint_last")
                    if path.exists()), key=lambda path: path.stat().st_mtime, reverse=True)
    numbered = sorted([*list_checkpoints(output_dir), *list_sharded_checkpoints(output_dir)],
                      key=lambda path: int(path.name.split("_")[1].split(".")[0]))
    if resume == "auto":
        notes, problems, damaged = [], [], []
        for path in [*lasts, *reversed(numbered)]:
            problem = sharded_intact(path) if path.is_dir() else intact(path) if path.is_file() else "not a file"
            if problem is None:
                if problems:
                    aside = [f"{old.name} -> {move_aside(old).name}" for old in damaged]
                    notes.append(f"warning: {'; '.join(problems)}: resuming from {path}, the newest intact checkpoint"
                                 + (f" (the damaged one(s) renamed: {', '.join(aside)})" if aside else ""))
                return path, notes
            problems.append(f"{path} is {problem}")
            if path in numbered:
                damaged.append(path)
        if problems:
            raise CheckpointError(f"every checkpoint in {output_dir} is damaged ({'; '.join(problems)}); nothing was "
                                  "overwritten: move them aside to start afresh, or pass --resume PATH")
        if (output_dir / "checkpoint_last").is_symlink():
            raise CheckpointError(f"{output_dir / 'checkpoint_last'} names a folder that is gone; move it aside or "
                                  "pass --resume PATH")
        return None, []
    if resume == "none":
        if lasts or numbered or (output_dir / "checkpoint_last").is_symlink():
            raise CheckpointError(f"{output_dir} already holds checkpoints, which --resume none would overwrite; "
                                  "continue with --resume auto, or start afresh in another --output-dir")
        return None, []
    if not Path(resume).is_file() and not is_sharded(resume):
        raise CheckpointError(f"--resume {resume}: no such checkpoint")
    problem = sharded_intact(resume) if is_sharded(resume) else None
    if problem is not None:
        raise CheckpointError(f"--resume {resume}: the sharded checkpoint is {problem}")
    return Path(resume), []


def move_aside(path: Path) -> Path:
    """Rename a damaged checkpoint (file or folder) to ``<name>.damaged`` (``.damaged2``, ... when taken); returns the
    new path."""
    for n in range(1, 1000):
        target = path.with_name(f"{path.name}.damaged{n if n > 1 else ''}")
        if not target.exists():
            os.replace(path, target)
            return target
    raise CheckpointError(f"cannot rename the damaged {path}: too many .damaged copies beside it")


LOCK_NAME = ".run.lock"


class RunLock:
    """One run per output folder: rank 0 holds an exclusive ``flock`` on ``OUTPUT/.run.lock`` for the whole run.

    The file names the holder (pid, host, start time). The kernel drops the lock when its process ends, however it
    ends, so a lock file left by a dead run is free to take; :meth:`acquire` then says whose it was. (On a network
    file system this relies on its lock support, as NFSv4 has.)
    """

    def __init__(self, output_dir: str | Path):
        self.path = Path(output_dir) / LOCK_NAME
        self.handle = None

    def acquire(self) -> Optional[str]:
        """Take the lock; returns a note when a dead run's lock file was taken over, else ``None``.

        Raises:
            CheckpointError: another living run holds the folder (its holder line is named), or the lock file
                cannot be opened.
        """
        while True:
            try:
                handle = open(self.path, "a+")
            except OSError as err:
                raise CheckpointError(f"cannot open {self.path}: {err.strerror or err}") from None
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "a process that has not written its name yet"
                handle.close()
                raise CheckpointError(f"{self.path.parent} is in use by another run ({holder}); wait for it or "
                                      "stop it, or train into another --output-dir") from None
            try:
                same_file = os.stat(self.path).st_ino == os.fstat(handle.fileno()).st_ino
            except FileNotFoundError:
                same_file = False
            if same_file:
                break
            handle.close()  # the holder removed the file between our open and our lock: lock the new one
        handle.seek(0)
        previous = handle.read().strip()
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        self.handle = handle
        if previous:
            return f"note: {self.path} was left by a run that is no longer running ({previous}); taken over"
        return None

    def release(self) -> None:
        """Remove the lock file and drop the lock (idempotent): a finished run leaves no trace of it."""
        if self.handle is None:
            return
        self.path.unlink(missing_ok=True)
        self.handle.close()  # closing the last descriptor drops the flock
        self.handle = None


def config_changes(before: Mapping[str, Any], now: Mapping[str, Any], ignore: tuple[str, ...] = ()) -> list[str]:
    """``"section.key: old -> new"`` for every setting that differs between two ``Config.to_dict()`` dicts
    (a key only one of them has counts as changed), except the ``section.key`` names in ``ignore``; values as JSON
    writes them (``false -> true``)."""
    changes = []
    for section in sorted(set(before) | set(now)):
        old, new = before.get(section, {}), now.get(section, {})
        if not isinstance(old, Mapping) or not isinstance(new, Mapping):
            continue
        for key in sorted(set(old) | set(new)):
            name = f"{section}.{key}"
            if name not in ignore and old.get(key, "unset") != new.get(key, "unset"):
                changes.append(f"{name}: {as_json(old.get(key, 'unset'))} -> {as_json(new.get(key, 'unset'))}")
    return changes


def as_json(value: Any) -> str:
    """A config value as ``config.json`` and ``--set`` write it (``true``, ``null``, ``[1, 2]``); a string as is."""
    return value if isinstance(value, str) else json.dumps(list(value) if isinstance(value, tuple) else value)


def resume_training(path: str | Path, model: torch.nn.Module, parts: Mapping[str, Any], model_name: str,
                    rank: int, world_size: int, map_location: str | torch.device = "cpu",
                    config: Optional[Mapping[str, Any]] = None,
                    train_utterances: Optional[int] = None, ema=None) -> tuple[TrainState, dict[str, Any]]:
    """Put a checkpoint back: weights, optimizer, schedule, scaler, this rank's RNG states. A single file of
    :func:`training_checkpoint`, or a sharded folder of :class:`ShardedCheckpointer` (re-cut for this world
    size: every rank must call it then).

    Args:
        path: the checkpoint file or folder.
        model: the plain model (or, for a sharded checkpoint, the FSDP-sharded one; never a DDP wrapper), built
            with the checkpoint's config.
        parts: the objects of :data:`STATEFUL_PARTS`, freshly built.
        model_name: the model being trained (the checkpoint must hold the same).
        rank, world_size: this process; RNG states are restored only when the world size is the same.
        map_location: where tensors are loaded.
        config: this run's ``Config.to_dict()``; rank 0 names the settings that differ from the checkpoint's
            (``train.max_steps`` aside: raising it is how a run is continued).
        train_utterances: this run's training utterances; rank 0 warns when the checkpoint's corpus had
            another number (the epoch's order, and so the data position, is not the same any more).
        ema: this run's :class:`utils.ema.EMA` (``train.ema_decay``), or ``None``: its averages are loaded from the
            checkpoint (``"ema"``), or start afresh from the loaded weights when the checkpoint has none (rank 0
            says so).

    Returns:
        The loop's :class:`TrainState` at the checkpoint (``samples_in_epoch`` is worked out for a checkpoint
        that predates it), and ``{"world_size": processes that wrote it, "grad_accumulation": the accumulation
        it trained with, "config": its config}``.

    Raises:
        CheckpointError: an unreadable or unsafe file, another model, weights that do not fit, or a
            weights-only file that lacks the training state.
    """
    sharded = is_sharded(path)
    saved = read_checkpoint(path, map_location, verify=rank == 0)  # rank 0 verified a sharded folder's every file
    if saved.get("model_name") != model_name:
        raise CheckpointError(f"{path} holds a '{saved.get('model_name')}' model, not '{model_name}'")
    if not sharded:  # the weights first: a state dict of another network is named key by key
        load_model_state(model, saved["model"], str(path))
    fields = [field.name for field in dataclasses.fields(TrainState)]
    optional = ("skipped_steps", "samples_in_epoch", "skipped_updates", "skips_in_a_row")
    missing = [key for key in (*STATEFUL_PARTS, *fields, "rng") if key not in saved and key not in optional
               and not (sharded and key == "optimizer")]
    if missing:
        raise CheckpointError(f"{path} is not a training checkpoint of train.py (it has no {', '.join(missing)}); "
                              "--resume needs one written by train.py")
    with_ema = ema is not None and (saved.get("ema_saved", False) if sharded else "ema" in saved)
    if sharded:
        optimizer = parts["optimizer"]
        load_sharded(path, model, list(optimizer.values()) if isinstance(optimizer, NamedStates) else [optimizer],
                     extra={"ema": ema.averages} if with_ema else None)
    elif with_ema:
        try:
            ema.load_state_dict(saved["ema"], str(path))
        except ValueError as err:
            raise CheckpointError(str(err)) from None
    if ema is not None and not with_ema:
        ema.reset()
        if rank == 0:
            print(f"note: {path} holds no EMA weights; the average (train.ema_decay) starts from its weights",
                  file=sys.stderr, flush=True)
    for name in STATEFUL_PARTS:
        if not (sharded and name == "optimizer"):
            parts[name].load_state_dict(saved[name])
    saved_config = saved.get("config") if isinstance(saved.get("config"), Mapping) else {}
    written_by = len(saved["rng"])
    if written_by == world_size:
        restore_rng_state(saved["rng"][rank])
    if rank == 0 and config is not None and saved_config:
        changes = config_changes(saved_config, config, ignore=("train.max_steps",))
        if changes:
            print(f"warning: the config differs from the one {path} was trained with: {'; '.join(changes)}",
                  file=sys.stderr, flush=True)
    known = saved.get("train_utterances")
    if rank == 0 and train_utterances is not None and known is not None and known != train_utterances:
        print(f"warning: the corpus changed since {path} ({known} -> {train_utterances} training utterances): the "
              "run continues from its step, but the epoch's order and position are not the ones it stopped at",
              file=sys.stderr, flush=True)
    state = TrainState(**{key: saved[key] for key in fields if key in saved})
    accumulation = saved.get("grad_accumulation", saved_config.get("train", {}).get("grad_accumulation", 1))
    if "samples_in_epoch" not in saved:  # written before the position was kept in global samples
        batch_size = saved_config.get(model_name, {}).get("batch_size", 0)
        state.samples_in_epoch = state.batch_in_epoch * batch_size * written_by
    return state, {"world_size": written_by, "grad_accumulation": accumulation, "config": saved_config}


def world_size_change(written_by: int, accumulation: int, world_size: int, batch_size: int,
                      requested: int) -> tuple[int, Optional[str]]:
    """The gradient accumulation a resumed run trains with, and the line saying so, when the config's
    ``train.grad_accumulation`` is the one the checkpoint's run was started with (a value changed since is the user's
    to honour, not this function's).

    The global batch (``batch_size * grad_accumulation * world_size`` samples per optimizer step) is kept: on the
    same number of processes with the accumulation the checkpoint trained with (which an earlier resume on another
    number may have set); on another number when it divides the global batch. Otherwise the accumulation that comes
    closest to it (at least 1) is taken and the line says plainly that the global batch changed: an accumulation set
    automatically by an earlier resume is never carried over as if the user had asked for it. The data position
    carries over in global samples either way; the ranks' random streams (dropout) restart, so the run does not
    repeat the uninterrupted one exactly.

    Args:
        written_by: processes that wrote the checkpoint; ``accumulation``: the accumulation it trained with.
        world_size: processes now; ``batch_size``: samples per process per micro-batch (the same before and now);
        requested: ``train.grad_accumulation`` of this run's config (unused when the global batch can be kept).

    Returns:
        ``(grad_accumulation, line)``; ``(accumulation, None)`` when the world size is the same.
    """
    if written_by == world_size:
        return accumulation, None
    before = batch_size * accumulation * written_by
    head = f"note: the checkpoint was written by {written_by} process(es), this run has {world_size}"
    tail = "the data position carries over in global samples; random streams (dropout) restart"
    if before % (batch_size * world_size) == 0:
        kept = before // (batch_size * world_size)
        return kept, (f"{head}: train.grad_accumulation {accumulation} -> {kept} keeps the global batch at {before} "
                      f"({batch_size} x {kept} x {world_size}); {tail}")
    closest = max(1, round(before / (batch_size * world_size)))
    after = batch_size * closest * world_size
    return closest, (f"warning: the checkpoint was written by {written_by} process(es), this run has "
                     f"{world_size}: the global batch changes {before} -> {after} ({batch_size} x {closest} x "
                     f"{world_size}; no train.grad_accumulation keeps {before}); {tail}")


def sharded_train_state(parts: Mapping[str, Any], state: TrainState, rng: list, **info: Any) -> dict[str, Any]:
    """Rank 0's :data:`TRAIN_STATE_NAME` of a sharded checkpoint: :func:`training_checkpoint` without the model
    and optimizer states, which every rank writes as shards."""
    return {**{name: parts[name].state_dict() for name in STATEFUL_PARTS if name != "optimizer"},
            **dataclasses.asdict(state), "rng": rng, **info}


# --------------------------------------------------------------------------------------------
# Sharded checkpoints (train.parallelism=fsdp): one folder per step, written by every rank
# --------------------------------------------------------------------------------------------

TRAIN_STATE_NAME = "train_state.pt"
"""The file of a sharded checkpoint's folder that rank 0 writes: everything but the model and optimizer states
(the loop's position, schedulers, scaler, every rank's RNG states, config, provenance), a plain
:func:`torch.save` dict that loads with ``weights_only=True``."""

SHARDED_RE = re.compile(r"^checkpoint_(\d+)$")


def is_sharded(path: str | Path) -> bool:
    """Whether ``path`` is a sharded checkpoint: a folder (``checkpoint_<step>/`` or the ``checkpoint_last`` link
    to one) written by :class:`ShardedCheckpointer`, rather than one ``.pt`` file."""
    return Path(path).is_dir()


def list_sharded_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete sharded checkpoints (``checkpoint_<step>/`` folders) in ``output_dir``, oldest step first."""
    found = [(int(m.group(1)), p) for p in Path(output_dir).glob("checkpoint_*")
             if (m := SHARDED_RE.match(p.name)) and p.is_dir() and not p.is_symlink()]
    return [p for _, p in sorted(found)]


CHECKSUMS_NAME = "checksums.json"
"""The file of a sharded checkpoint's folder that lists every other file of it with its size and CRC-32, written once
all shards are (:meth:`ShardedCheckpointer._complete`): what the zip archive's own CRCs are to a single file."""


def file_crc32(path: Path) -> str:
    """The CRC-32 of a file's bytes, as 8 hexadecimal digits (read in chunks of 8 MiB)."""
    crc = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(8 << 20):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


def write_checksums(folder: Path) -> None:
    """Write :data:`CHECKSUMS_NAME` for every file of ``folder`` (atomically)."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name != CHECKSUMS_NAME)
    listing = {p.name: {"bytes": p.stat().st_size, "crc32": file_crc32(p)} for p in files}
    atomic_write_bytes(folder / CHECKSUMS_NAME, json.dumps(listing, indent=1).encode())


def checksum_problem(folder: Path) -> Optional[str]:
    """Why a file of ``folder`` does not match :data:`CHECKSUMS_NAME` (missing, another size, another CRC-32), or
    ``None``; also ``None`` without that file (a folder written before checksums existed: sizes are checked by
    :func:`sharded_intact` instead). Reads every listed file once; remembered per folder and modification time."""
    listing_path = folder / CHECKSUMS_NAME
    if not listing_path.is_file():
        return None
    key = (str(folder.resolve()), listing_path.stat().st_mtime_ns)
    if key not in _verified:
        try:
            listing = json.loads(listing_path.read_text())
            expected = {name: (int(entry["bytes"]), str(entry["crc32"])) for name, entry in listing.items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            return f"its {CHECKSUMS_NAME} does not read ({one_line(err)})"
        problem = None
        for name, (size, crc) in sorted(expected.items()):
            file = folder / name
            if not file.is_file():
                problem = f"{name} is missing"
            elif file.stat().st_size != size:
                problem = f"{name} has {file.stat().st_size} bytes, {size} were written"
            elif file_crc32(file) != crc:
                problem = f"{name} fails its CRC-32 check (its bytes changed after it was written)"
            if problem:
                break
        _verified[key] = problem
    return _verified[key]


_verified: dict[tuple[str, int], Optional[str]] = {}


def sharded_intact(path: str | Path) -> Optional[str]:
    """Why the sharded checkpoint folder at ``path`` is damaged, or ``None``: every file matches its size and CRC-32
    in :data:`CHECKSUMS_NAME`, its DCP ``.metadata`` reads, every shard file it names is there and long enough, and
    :data:`TRAIN_STATE_NAME` passes :func:`intact`."""
    from torch.distributed.checkpoint import FileSystemReader
    path = Path(path)
    if not path.exists():
        return "not found"
    if not (path / ".metadata").is_file():
        return "not a sharded checkpoint (it has no .metadata of torch.distributed.checkpoint)"
    problem = checksum_problem(path)
    if problem is not None:
        return f"damaged ({problem})"
    try:
        metadata = FileSystemReader(str(path)).read_metadata()
    except (OSError, EOFError, ValueError, RuntimeError, AttributeError, TypeError) as err:
        return f"damaged (its .metadata does not read: {one_line(err)})"
    ends: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        name = str(info.relative_path)
        ends[name] = max(ends.get(name, 0), int(info.offset) + int(info.length))
    for name, end in sorted(ends.items()):
        shard = path / name
        if not shard.is_file():
            return f"damaged (shard {name} is missing)"
        if shard.stat().st_size < end:
            return f"damaged (shard {name} is cut short: {shard.stat().st_size} of {end} bytes)"
    if not (path / TRAIN_STATE_NAME).is_file():
        return f"damaged (without {TRAIN_STATE_NAME})"
    problem = intact(path / TRAIN_STATE_NAME)
    return None if problem is None else f"damaged ({TRAIN_STATE_NAME}: {problem})"


def read_checkpoint(path: str | Path, map_location: str | torch.device = "cpu", verify: bool = True) -> dict[str, Any]:
    """A checkpoint's entries: the whole dict of a single file (:func:`load_checkpoint`); for a sharded folder its
    :data:`TRAIN_STATE_NAME` (model name, config, position; the weights are read by :func:`load_sharded`), once
    :func:`sharded_intact` (every file against its checksum) passes, unless ``verify`` is false (a rank whose
    rank 0 verified the folder).

    Raises:
        CheckpointError: neither a readable checkpoint file nor an intact sharded checkpoint folder.
    """
    if not is_sharded(path):
        return load_checkpoint(path, map_location=map_location)
    problem = sharded_intact(path) if verify else None
    if problem is not None:
        raise CheckpointError(f"{path} is {problem}")
    return read_train_state(path, map_location)


def read_train_state(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The :data:`TRAIN_STATE_NAME` dict of a sharded checkpoint folder (``weights_only=True``).

    Raises:
        CheckpointError: the folder is not a sharded checkpoint, or the file is unreadable or unsafe.
    """
    path = Path(path)
    file = path / TRAIN_STATE_NAME
    if not file.is_file():
        raise CheckpointError(f"{path} is not a sharded checkpoint of train.py (no {TRAIN_STATE_NAME})")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(file, map_location=map_location, weights_only=True)
    except Exception as err:  # noqa: BLE001 - untrusted input, as in load_checkpoint
        raise CheckpointError(f"cannot load {file} safely: {_load_failure(err)}") from err


@contextlib.contextmanager
def _quiet_single_process_dcp():
    """DCP warns on every load without a process group that it assumes one process; that is the intent here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        warnings.filterwarnings("ignore", message=".*assuming the intent is to.*")
        yield


def load_sharded_model(path: str | Path, model: torch.nn.Module) -> None:
    """Load the model weights of a sharded checkpoint folder into ``model``: a plain module in one process
    (inference; the shards are put together) or the run's own model, plain, DDP's or sharded by FSDP on any number
    of ranks (the shards are re-cut for this world size). Uses ``torch.distributed.checkpoint``.

    Raises:
        CheckpointError: the folder does not hold weights of this model (missing or misshapen entries, named).
    """
    load_sharded(path, model, [])


def load_sharded(path: str | Path, model: torch.nn.Module, optimizers: list,
                 extra: Optional[dict[str, Any]] = None) -> None:
    """Load the model (and, when ``optimizers`` are given, their states) of a sharded checkpoint folder, on any
    world size (every rank calls it; resharded on load). ``model`` is the plain or FSDP-sharded model, not a DDP
    wrapper. ``extra``: further entries the save wrote (``{"ema": {name: tensor}}``), loaded into the given tensors
    in place. Source: ``torch.distributed.checkpoint.state_dict.get_state_dict`` / ``set_state_dict``.

    Raises:
        CheckpointError: missing or misshapen entries (named), or an unreadable folder.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    path = Path(path)
    with _quiet_single_process_dcp():
        model_state, optim_state = get_state_dict(model, optimizers)
        state = {"model": model_state, **({"optimizer": optim_state} if optimizers else {}), **(extra or {})}
        try:
            dcp.load(state, checkpoint_id=str(path))
        except (RuntimeError, ValueError, KeyError, OSError) as err:
            raise CheckpointError(f"{path} does not fit this model: {_dcp_failure(err)}") from None
        except CheckpointException as err:  # a BaseException: what a rank's reader raised, gathered by DCP
            raise CheckpointError(f"cannot read {path}: {dcp_cause(err)}") from None
        set_state_dict(model, optimizers, model_state_dict=state["model"], optim_state_dict=state.get("optimizer", {}))


def dcp_cause(err: BaseException) -> str:
    """One line from a ``CheckpointException`` (DCP's error of a save or load, holding every failed rank's own error):
    the first failed rank and what it raised (for a full disk, the OS's words)."""
    for rank, (cause, _trace) in sorted(getattr(err, "failures", {}).items()):
        text = cause.strerror if isinstance(cause, OSError) and cause.strerror else one_line(cause)
        return f"rank {rank}: {type(cause).__name__}: {text}"
    return one_line(err)


def _dcp_failure(err: BaseException) -> str:
    text = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
    missing = re.findall(r"Missing key in checkpoint state_dict: ([\w.]+)", text)
    if missing:
        more = f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""
        return f"missing {', '.join(missing[:5])}{more}"
    return text[:400] or type(err).__name__


class ShardedCheckpointer:
    """Writes sharded checkpoints: every rank saves its own shards through ``torch.distributed.checkpoint`` (DCP),
    in parallel, into ``OUTPUT/.checkpoint_<step>.partial/``; once all are written, rank 0 renames the folder to
    ``checkpoint_<step>/`` and points the ``checkpoint_last`` link at it. A step folder thus appears complete or
    not at all, and a run killed mid-save leaves ``checkpoint_last`` on the previous one.

    With ``async_save`` the state is copied to host memory (a stall of one copy), then written by a background
    thread over its own gloo process group (sharing the training's group with the background collectives can
    hang: torchtitan keeps them apart the same way); the run continues meanwhile. :meth:`save` waits for the
    previous save first, and :meth:`wait` must be called before the process ends.

    Every rank constructs it (the async process group is a collective) and calls :meth:`save`/:meth:`wait`.
    Source: https://pytorch.org/docs/stable/distributed.checkpoint.html (``save``, ``async_save``).
    """

    def __init__(self, output_dir: str | Path, rank: int, async_save: bool = False, keep_last: int = 0,
                 timeout_s: float = 1800.0):
        import datetime
        import torch.distributed as dist

        self.output_dir, self.rank, self.keep_last = Path(output_dir), rank, keep_last
        self.async_save = async_save
        self.group = None
        if async_save and dist.is_available() and dist.is_initialized():
            self.group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
        self.pending = None  # (future, step) of a background save

    def save(self, step: int, model: torch.nn.Module, optimizers: list, train_state: Optional[dict],
             extra: Optional[dict[str, Any]] = None) -> Path:
        """Save ``model`` (plain or FSDP-sharded, not a DDP wrapper) and ``optimizers`` as step ``step``;
        ``train_state`` (rank 0's; ``None`` on the others) goes to :data:`TRAIN_STATE_NAME`; ``extra``: further
        sharded entries (``{"ema": {name: tensor}}``). Returns the folder the checkpoint has (async: will have) once
        complete.

        Raises:
            CheckpointError: a shard or file could not be written (a full disk); earlier checkpoints are kept.
        """
        from torch.distributed.checkpoint.state_dict import get_state_dict

        from distributed import broadcast_object

        self.wait()
        partial = self.output_dir / f".checkpoint_{step}.partial"
        failure = None
        if self.rank == 0:
            for stale in self.output_dir.glob(".checkpoint_*.partial"):
                shutil.rmtree(stale, ignore_errors=True)  # a killed save's leftovers (RunLock: ours alone)
            try:
                partial.mkdir()
                atomic_write_bytes(partial / TRAIN_STATE_NAME, serialized(train_state, partial))
            except OSError as err:
                failure = str(self._write_error(step, err.strerror or str(err)))
        failure = broadcast_object(failure)  # every rank stops with rank 0's reason, none waits for it
        if failure is not None:
            raise CheckpointError(failure)
        model_state, optim_state = get_state_dict(model, optimizers)
        state = {"model": model_state, "optimizer": optim_state, **(extra or {})}
        with _quiet_single_process_dcp():
            self._write(state, partial, step)
        return self.output_dir / f"checkpoint_{step}"

    def _write(self, state: dict, partial: Path, step: int) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        try:
            if self.async_save:
                self.pending = (dcp.async_save(state, checkpoint_id=str(partial), process_group=self.group), step)
            else:
                dcp.save(state, checkpoint_id=str(partial))
                self._complete(step)
        except OSError as err:
            raise self._write_error(step, err.strerror or str(err)) from None
        except CheckpointException as err:  # every rank gets it: DCP gathers each rank's failure
            raise self._write_error(step, dcp_cause(err)) from None

    def poll(self) -> Optional[Path]:
        """Complete a background save that has finished (rank 0 renames it into place); its folder, or ``None``.
        Costs nothing while it runs: call it every step."""
        if self.pending is None or not self.pending[0].done():
            return None
        return self.wait()

    def wait(self) -> Optional[Path]:
        """Block until a background save is written, then complete it; its folder, or ``None`` without one.

        Raises:
            CheckpointError: the background save failed (earlier checkpoints are kept).
        """
        from torch.distributed.checkpoint.api import CheckpointException

        if self.pending is None:
            return None
        future, step = self.pending
        self.pending = None
        try:
            future.result()
        except OSError as err:
            raise self._write_error(step, err.strerror or str(err)) from None
        except CheckpointException as err:
            raise self._write_error(step, dcp_cause(err)) from None
        return self._complete(step)

    def _complete(self, step: int) -> Path:
        final = self.output_dir / f"checkpoint_{step}"
        if self.rank != 0:
            return final
        partial = self.output_dir / f".checkpoint_{step}.partial"
        try:
            write_checksums(partial)
        except OSError as err:
            raise self._write_error(step, err.strerror or str(err)) from None
        if final.is_dir() and not final.is_symlink():
            shutil.rmtree(final)  # an older run's checkpoint of the same step (the folder was resumed earlier)
        os.replace(partial, final)
        link = self.output_dir / "checkpoint_last"
        tmp_link = self.output_dir / f".checkpoint_last.tmp{os.getpid()}"
        tmp_link.unlink(missing_ok=True)
        os.symlink(final.name, tmp_link)
        os.replace(tmp_link, link)  # atomic: the link names the old folder or the new one
        (self.output_dir / "checkpoint_last.pt").unlink(missing_ok=True)  # a single file of a run before: older
        fsync_dir(self.output_dir)
        prune([path for path in list_sharded_checkpoints(self.output_dir) if path != final], self.keep_last,
              shutil.rmtree)
        return final

    def _write_error(self, step: int, reason: str) -> CheckpointError:
        """The error of a failed save, once rank 0 has removed what the save wrote (the ``.partial`` folder)."""
        if self.rank == 0:
            shutil.rmtree(self.output_dir / f".checkpoint_{step}.partial", ignore_errors=True)
        return write_failure(step, self.output_dir, reason, list_sharded_checkpoints(self.output_dir)[-1:])
