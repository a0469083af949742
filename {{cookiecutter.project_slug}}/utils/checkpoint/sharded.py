"""Sharded checkpoints (``train.parallelism=fsdp``): one folder per step, written by every rank through
``torch.distributed.checkpoint``, checked file by file before a load, and loaded on any number of ranks (resharded)."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import shutil
import sys
import warnings
import zlib
from pathlib import Path
from typing import Any, Mapping, Optional

import torch
import torch.distributed as dist

from distributed import DistInfo, collective, from_rank0, get_world_size
from utils.checkpoint.files import (CheckpointError, UnsafeCheckpoint, atomic_symlink, atomic_write_bytes, few,
                                    fsync_dir, intact, load_torch_file, prune, serialized, write_failure)
from utils.checkpoint.names import LAST_FILE, LAST_FOLDER, PARTIAL_GLOB, list_checkpoint_folders, numbered, partial
from utils.checkpoint.state import NamedStates, Stateful, checkpoint_entries
from utils.run_log import one_line


def load_dcp():
    """``torch.distributed.checkpoint`` (DCP) and its ``state_dict``, imported on first use (it is slow to import)."""
    import torch.distributed.checkpoint.state_dict  # binds this function's name torch: the package, DCP loaded
    return torch.distributed.checkpoint


SHARDS = ("model", "optimizer", "ema")
"""The parts a folder holds in its shards (split over the ranks under FSDP), by their names in the checkpoint's states;
the others, with the provenance, are rank 0's :data:`TRAIN_STATE_NAME`."""
EXTRA = SHARDS[2:]  # those DCP takes as they are (tensors loaded in place), not through its model and optimizer states


def _optimizers(states: Mapping[str, Any]) -> list:
    """The optimizers of a checkpoint's ``states``: its ``"optimizer"``, or each of several phases'."""
    optimizer = states.get("optimizer")
    return [] if optimizer is None else list(optimizer.values()) if isinstance(optimizer, NamedStates) else [optimizer]


def broadcast_buffers(model: torch.nn.Module) -> None:
    """Rank 0's values of ``model``'s buffers (BatchNorm's running statistics) on every rank, one broadcast per dtype,
    as DDP before every forward; nothing in one process. Raises CollectiveTimeout / CollectiveError: another rank did
    not join."""
    buffers = list(model.buffers())
    if not buffers or get_world_size() == 1:
        return
    with collective("broadcast of rank 0's buffers"), torch.no_grad():
        for dtype in dict.fromkeys(buffer.dtype for buffer in buffers):
            group = [buffer for buffer in buffers if buffer.dtype == dtype]
            flat = torch.cat([buffer.reshape(-1) for buffer in group])
            dist.broadcast(flat, src=0)
            for buffer, value in zip(group, flat.split([buffer.numel() for buffer in group])):
                buffer.copy_(value.view_as(buffer))


TRAIN_STATE_NAME = "train_state.pt"  # rank 0's file of a sharded folder: all but the model and optimizer states
CHECKSUMS_NAME = "checksums.json"  # the sizes and CRC-32s of a folder's files (a zip archive has its own)
_verified: dict[tuple[str, int], Optional[str]] = {}  # checksum_problem's answers by (folder, listing's mtime)


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


def checksum_problem(folder: Path, read: tuple[str, ...] = ()) -> Optional[str]:
    """Why a file of ``folder`` does not match :data:`CHECKSUMS_NAME` (missing, another size, another CRC-32), or
    ``None``; a listing that leaves out a file of ``read`` (the files a load reads: ``.metadata``, the shards,
    ``train_state.pt``) is damage too (a save lists every file). ``None`` without that file (a folder from before
    checksums, or copied without it), with a warning on stderr once that its weights are unverified. Remembered per
    folder and mtime."""
    listing_path = folder / CHECKSUMS_NAME
    if not listing_path.is_file():
        if (str(folder.resolve()), 0) not in _verified:
            _verified[(str(folder.resolve()), 0)] = None
            print(f"warning: {folder} has no {CHECKSUMS_NAME} (written before checksums, or copied without it): its "
                  "weights are unverified (damage to its shards cannot be found)", file=sys.stderr, flush=True)
        return None
    key = (str(folder.resolve()), listing_path.stat().st_mtime_ns)
    if key not in _verified:
        try:
            listing = json.loads(listing_path.read_text())
            expected = {name: (int(entry["bytes"]), str(entry["crc32"])) for name, entry in listing.items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            return f"its {CHECKSUMS_NAME} does not read ({one_line(err)})"
        if unlisted := sorted(set(read) - set(expected)):
            return f"its {CHECKSUMS_NAME} does not list {few(unlisted)}: their bytes cannot be checked"
        _verified[key] = _first_mismatch(folder, expected)
    return _verified[key]


def _first_mismatch(folder: Path, expected: dict[str, tuple[int, str]]) -> Optional[str]:
    """The first file of ``expected`` (``{name: (bytes, crc32)}``) that ``folder`` lacks or holds otherwise, said."""
    for name, (size, crc) in sorted(expected.items()):
        file = folder / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != size:
            return f"{name} has {file.stat().st_size} bytes, {size} were written"
        if file_crc32(file) != crc:
            return f"{name} fails its CRC-32 check (its bytes changed after it was written)"
    return None


def sharded_intact(path: str | Path) -> Optional[str]:
    """Why the sharded checkpoint folder at ``path`` cannot be loaded, or ``None``. ``"unsafe: ..."``: it holds code
    (a ``.metadata`` pickling other globals than DCP's metadata, a non-tensor entry or ``train_state.pt`` pickling
    other objects than tensors and primitives; refused, nothing was run); ``"damaged (...)"``: its files fail their
    checksums (or its :data:`CHECKSUMS_NAME` does not list every file a load reads), its ``.metadata`` does not read or
    holds what no save writes (:func:`utils.checkpoint.safe_dcp.metadata_problem`), a shard it names is missing or
    short, its entries declare more bytes than its shards hold, its train state is not :func:`intact`. Without a
    :data:`CHECKSUMS_NAME` all but the shards' bytes is checked, with one warning. Every loader of a folder asks this
    first (:mod:`utils.checkpoint.safe_dcp` reads it as data)."""
    from utils.checkpoint import safe_dcp  # it imports DCP
    path = Path(path)
    if not path.exists():
        return "not found"
    if not (path / ".metadata").is_file():
        return "not a sharded checkpoint (it has no .metadata of torch.distributed.checkpoint)"
    try:
        metadata = safe_dcp.read_metadata(path)
        read = {".metadata", TRAIN_STATE_NAME, *(info.relative_path for info in metadata.storage_data.values())}
        present = tuple(sorted(name for name in read if Path(name).name == name and (path / name).is_file()))
        if (problem := checksum_problem(path, present)) is not None:
            return f"damaged ({problem})"
        if (problem := safe_dcp.entry_problem(path, metadata)) is not None:
            return f"damaged ({problem})"
    except UnsafeCheckpoint as err:
        return f"unsafe: {err}"
    except CheckpointError as err:
        return f"damaged ({err})"
    train_state = path / TRAIN_STATE_NAME
    if not train_state.is_file():
        return f"damaged (without {TRAIN_STATE_NAME})"
    if (problem := intact(train_state)) is not None:
        return f"damaged ({TRAIN_STATE_NAME}: {problem})"
    if unsafe := torch.serialization.get_unsafe_globals_in_checkpoint(str(train_state)):
        return (f"unsafe: its {TRAIN_STATE_NAME} holds code (pickled objects a weights_only=True load refuses: "
                f"{few(unsafe)}; refused, nothing in it was run)")
    return None


def read_train_state(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The :data:`TRAIN_STATE_NAME` dict of a sharded checkpoint folder (``weights_only=True``). Raises CheckpointError:
    the folder is not a sharded checkpoint, or the file is unreadable or unsafe."""
    file = Path(path) / TRAIN_STATE_NAME
    if not file.is_file():
        raise CheckpointError(f"{path} is not a sharded checkpoint of train.py (no {TRAIN_STATE_NAME})")
    return load_torch_file(file, map_location)


@contextlib.contextmanager
def _quiet_single_process_dcp():
    """DCP warns on every load without a process group that it assumes one process; that is the intent here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        warnings.filterwarnings("ignore", message=".*assuming the intent is to.*")
        yield


def load_sharded(path: str | Path, model: torch.nn.Module, optimizers: list,
                 extra: Optional[dict[str, Any]] = None) -> None:
    """Load the model (plain or FSDP-sharded, not a DDP wrapper) and ``optimizers`` of a sharded checkpoint folder on
    any world size (every rank calls it). ``extra``: further entries the save wrote (``{"ema": {name: tensor}}``),
    loaded into those tensors in place. Source: ``get_state_dict``/``set_state_dict`` of DCP's ``state_dict`` module.
    Raises CheckpointError: missing or misshapen entries (named), or an unreadable folder."""
    from utils.checkpoint import safe_dcp  # it imports DCP
    dcp = load_dcp()
    with _quiet_single_process_dcp():
        model_state, optim_state = dcp.state_dict.get_state_dict(model, optimizers)
        state = {"model": model_state, **({"optimizer": optim_state} if optimizers else {}), **(extra or {})}
        try:
            safe_dcp.load(state, path)
        except UnsafeCheckpoint as err:
            raise UnsafeCheckpoint(f"{path} is unsafe: {err}") from None
        except (RuntimeError, ValueError, KeyError, OSError) as err:
            raise CheckpointError(f"{path} does not fit this model: {_dcp_failure(err)}") from None
        except dcp.CheckpointException as err:  # a BaseException: what a rank's reader raised, gathered by DCP
            raise read_failure(err, path) from None
        dcp.state_dict.set_state_dict(model, optimizers, model_state_dict=state["model"],
                                      optim_state_dict=state.get("optimizer", {}))


def load_whole_sharded(path: str | Path) -> dict[str, Any]:
    """Every entry of the sharded checkpoint folder ``path`` (model, optimizer, extra entries), put together in this one
    process and nested as saved; ``train_state.pt`` is not among them (:func:`read_train_state`). Raises
    CheckpointError: unreadable or unsafe entries (:class:`UnsafeCheckpoint`; nothing in them was run)."""
    from utils.checkpoint import safe_dcp  # it imports DCP
    dcp = load_dcp()
    with _quiet_single_process_dcp():
        try:
            return safe_dcp.load_whole(path)
        except dcp.CheckpointException as err:
            raise read_failure(err, path) from None


def read_failure(err: BaseException, path: str | Path) -> CheckpointError:
    """The error of a load that DCP's ``CheckpointException`` ended: :class:`UnsafeCheckpoint` when a rank's reader
    refused code (:mod:`utils.checkpoint.safe_dcp`), else what the first failed rank raised."""
    if unsafe := [cause for cause, _ in err.failures.values() if isinstance(cause, UnsafeCheckpoint)]:
        return UnsafeCheckpoint(f"{path} is unsafe: {unsafe[0]}")
    return CheckpointError(f"cannot read {path}: {dcp_cause(err)}")


def dcp_cause(err: BaseException) -> str:
    """One line from DCP's ``CheckpointException``: the first failed rank and what it raised (a full disk: the OS's)."""
    for rank, (cause, _trace) in sorted(getattr(err, "failures", {}).items()):
        text = cause.strerror if isinstance(cause, OSError) and cause.strerror else one_line(cause)
        return f"rank {rank}: {type(cause).__name__}: {text}"
    return one_line(err)


def _dcp_failure(err: BaseException) -> str:
    text = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
    missing = re.findall(r"Missing key in checkpoint state_dict: ([\w.]+)", text)
    return f"missing {few(missing)}" if missing else text[:400] or type(err).__name__


class ShardedCheckpointer:
    """Writes sharded checkpoints: every rank saves its shards through DCP into ``OUTPUT/.checkpoint_<step>.partial/``;
    then rank 0 lists their CRC-32s, renames the folder to ``checkpoint_<step>/`` and points ``checkpoint_last`` at it:
    a killed save leaves the previous one last. With ``async_save`` (``background``) a thread writes a host copy over
    its own gloo group (as torchtitan: a shared group can hang); :meth:`wait` before the process ends. Every rank
    constructs it. Source: DCP's ``save``/``async_save``, https://pytorch.org/docs/stable/distributed.checkpoint.html"""

    def __init__(self, output_dir: str | Path, rank: int, async_save: bool = False, keep_last: int = 0,
                 timeout_s: float = 1800.0):
        self.output_dir, self.rank, self.keep_last, self.background = Path(output_dir), rank, keep_last, async_save
        self.group = None
        if async_save and dist.is_available() and dist.is_initialized():
            self.group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
        self.pending = None  # (future, step) of a background save

    def save(self, step: int, states: Mapping[str, Stateful], info: Mapping[str, Any]) -> Path:
        """Save a checkpoint's ``states`` (``"model"``: plain or FSDP-sharded, with rank 0's buffers) as step ``step``:
        those of :data:`SHARDS` in every rank's shards, the others with the provenance ``info`` in rank 0's
        :data:`TRAIN_STATE_NAME`. Returns the checkpoint's folder (a background save: being written). Raises
        CheckpointError: a shard or file could not be written (a full disk); earlier checkpoints are kept."""
        self.wait()
        with collective("sharded checkpoint save"):
            broadcast_buffers(states["model"])  # rank 0's running statistics, whichever rank's copy DCP writes
            entries = checkpoint_entries(states, {**info, **({"ema_saved": True} if "ema" in states else {})}, SHARDS)
            folder = partial(self.output_dir, step)
            from_rank0(lambda: self._start(folder, entries, step), CheckpointError)  # every rank stops with rank 0's
            model_state, optim_state = load_dcp().state_dict.get_state_dict(states["model"], _optimizers(states))
            state = {"model": model_state, "optimizer": optim_state,
                     **{name: states[name].state_dict() for name in EXTRA if name in states}}
            with _quiet_single_process_dcp():
                self._write(state, folder, step)
        return numbered(self.output_dir, step, folder=True)

    def _start(self, folder: Path, train_state: dict[str, Any], step: int) -> None:
        """Rank 0: a fresh ``folder`` holding ``train_state``; a killed save's leftovers go (``RunLock``: ours)."""
        for stale in self.output_dir.glob(PARTIAL_GLOB):
            shutil.rmtree(stale, ignore_errors=True)
        try:
            folder.mkdir()
            atomic_write_bytes(folder / TRAIN_STATE_NAME, serialized(train_state, folder))
        except OSError as err:
            raise self._write_error(step, err) from None

    def share(self, nbytes: int) -> int:
        """Rank 0 writes its shards of a checkpoint of ``nbytes``: one share of the world's."""
        return nbytes // get_world_size()

    def _write(self, state: dict, folder: Path, step: int) -> None:
        dcp = load_dcp()
        try:
            if self.background:
                self.pending = (dcp.async_save(state, checkpoint_id=str(folder), process_group=self.group), step)
            else:
                dcp.save(state, checkpoint_id=str(folder))
                self._complete(step)
        except (OSError, dcp.CheckpointException) as err:  # every rank gets the latter: DCP gathers each rank's failure
            raise self._write_error(step, err) from None

    def poll(self) -> Optional[Path]:
        """Complete a background save that has finished; its folder, or ``None``. Cheap: call it every step."""
        return self.wait() if self.pending is not None and self.pending[0].done() else None

    def wait(self) -> Optional[Path]:
        """Block until a background save is written, then complete it; its folder, or ``None`` without one. Raises
        CheckpointError: the background save failed (earlier checkpoints are kept)."""
        if self.pending is None:
            return None
        future, step = self.pending
        self.pending = None
        try:
            future.result()
        except (OSError, load_dcp().CheckpointException) as err:
            raise self._write_error(step, err) from None
        return self._complete(step)

    def _complete(self, step: int) -> Path:
        final = numbered(self.output_dir, step, folder=True)
        if self.rank != 0:
            return final
        folder = partial(self.output_dir, step)
        try:
            write_checksums(folder)
        except OSError as err:
            raise self._write_error(step, err) from None
        if final.is_dir() and not final.is_symlink():
            shutil.rmtree(final)  # an older run's checkpoint of the same step (the folder was resumed earlier)
        os.replace(folder, final)
        atomic_symlink(self.output_dir / LAST_FOLDER, final.name)  # the link names the old folder or the new
        (self.output_dir / LAST_FILE).unlink(missing_ok=True)  # a single file of a run before (or its link): older
        fsync_dir(self.output_dir)
        prune([path for path in list_checkpoint_folders(self.output_dir) if path != final], self.keep_last,
              shutil.rmtree)
        return final

    def _write_error(self, step: int, err: BaseException) -> CheckpointError:
        """The error of a failed save (``OSError``, DCP's ``CheckpointException``) once rank 0 removed its folder."""
        folder = partial(self.output_dir, step)
        if self.rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
        reason = dcp_cause(err) if isinstance(err, load_dcp().CheckpointException) else err.strerror or str(err)
        if "unexpected pos" in reason:  # torch.save's zip writer lost the OSError of a short write (ENOSPC, EDQUOT)
            reason = f"no space left on device writing {folder} (or a quota or file size limit: a write came up short)"
        return write_failure(step, self.output_dir, reason, list_checkpoint_folders(self.output_dir)[-1:])


class ShardedFolder:
    """The sharding part's checkpoint format (``utils.checkpoint.resume.FolderFormat``): one folder per step, written
    by every rank (:class:`ShardedCheckpointer`), verified file by file (:func:`sharded_intact`) and loaded on any
    number of ranks."""

    noun = "sharded checkpoint"

    def problem(self, path: Path) -> Optional[str]:
        return sharded_intact(path)

    def read(self, path: str | Path, map_location: Any = "cpu", verify: bool = True) -> dict[str, Any]:
        """The folder's :data:`TRAIN_STATE_NAME` (no weights), once :func:`sharded_intact` passes (unless not
        ``verify``); else a CheckpointError."""
        if verify and (problem := sharded_intact(path)) is not None:
            raise CheckpointError(f"{path} is {problem}")
        return read_train_state(path, map_location)

    def load(self, path: str | Path, states: Mapping[str, Stateful], saved: Mapping[str, Any]) -> tuple[str, ...]:
        """Every rank loads the parts of :data:`SHARDS` that ``states`` has and the folder holds (the EMA where its
        save had one: ``ema_saved``), in place, and returns their names (:func:`load_sharded`)."""
        held = tuple(name for name in SHARDS if name in states and (name != "ema" or saved.get("ema_saved", False)))
        extra = {name: states[name].state_dict() for name in held if name in EXTRA}
        load_sharded(path, states["model"], _optimizers(states), extra=extra or None)
        return held

    def continues(self, path: Path) -> Optional[str]:
        """A sharded model takes its weights from a folder: a file is no checkpoint to continue."""
        if Path(path).is_dir():
            return None
        return ("is a single-file checkpoint (train.parallelism=ddp); continue it with train.parallelism=ddp (a ddp "
                "run reads sharded checkpoints too)")

    def saver(self, output_dir: Path, dist: DistInfo, train: Any) -> ShardedCheckpointer:
        return ShardedCheckpointer(output_dir, dist.rank, train.async_checkpoint, train.keep_last, train.dist_timeout_s)

    def load_weights(self, path: str | Path, model: torch.nn.Module, averages: Optional[dict] = None) -> None:
        """The folder's weights into ``model`` (plain or sharded), and its EMA's into the tensors of ``averages`` where
        given. Raises CheckpointError: the folder does not hold this model's (missing or misshapen entries, named)."""
        load_sharded(path, model, [], extra=None if averages is None else {"ema": averages})


FOLDER = ShardedFolder()
"""The sharded checkpoint folders, as ``parts.py`` hands them to the readers of checkpoints."""
