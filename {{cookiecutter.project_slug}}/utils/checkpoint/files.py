"""Checkpoint files: atomic writes, safe loads (``torch.load(weights_only=True)``: pickled objects are refused, never
run), damage checks (the zip archive's CRCs; CRC-32 listings of sharded folders), and key-by-key loads into a model."""

from __future__ import annotations

import io
import json
import mmap
import os
import pickle
import struct
import sys
import warnings
import zipfile
import zlib
from pathlib import Path
from typing import Any, Mapping, Optional

import torch

from utils.checkpoint.names import TEMPORARY_GLOB, temporary, temporary_pid
from utils.errors import CheckpointError
from utils.run_log import one_line


class UnsafeCheckpoint(CheckpointError):
    """A checkpoint holds pickled code (or objects a checkpoint never holds): refused before anything in it ran."""


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the new one, never a torn one: a temporary file
    in the same folder is fsync'ed, then ``os.replace`` swaps it in.

    Raises:
        OSError: the file cannot be written (a full disk: ``ENOSPC``), its ``filename`` being ``path``.
    """
    path = Path(path)
    tmp = temporary(path)
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as err:  # named by the file asked for, not by the temporary one
        raise type(err)(err.errno, err.strerror or str(err), str(path)) from None
    finally:
        if tmp.exists():  # no unlink otherwise: on a read-only folder even a missing file's unlink fails (EROFS)
            tmp.unlink()
    fsync_dir(path.parent)


def atomic_symlink(path: str | Path, target: str) -> None:
    """Make ``path`` a symbolic link to ``target`` (a name relative to its folder) so that a reader sees what was
    there before (a link, a file) or the new link, never nothing: a temporary link is made, then ``os.replace`` swaps
    it in; the folder is fsync'ed.

    Raises:
        OSError: the link cannot be made (``EPERM``, ``EOPNOTSUPP``: a file system without symbolic links).
    """
    path = Path(path)
    tmp = temporary(path)
    tmp.unlink(missing_ok=True)  # a process of the same id before ours, killed between these lines
    try:
        os.symlink(target, tmp)
        os.replace(tmp, path)
    finally:
        if tmp.is_symlink():
            tmp.unlink()
    fsync_dir(path.parent)


def fsync_dir(path: str | Path) -> None:
    """Make a folder's entries durable (a rename, a new link), as ``fsync`` does for a file's bytes."""
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def serialized(state: Any, where: str | Path) -> bytes:
    """``torch.save`` bytes of ``state``.

    Raises:
        CheckpointError: ``state`` holds what :func:`load_checkpoint` would refuse (nothing is written).
    """
    buffer = io.BytesIO()
    torch.save(state, buffer)
    if unsafe := torch.serialization.get_unsafe_globals_in_checkpoint(io.BytesIO(buffer.getvalue())):
        raise CheckpointError(f"refusing to write {where}: the state holds objects that a weights_only=True "
                              f"load refuses ({', '.join(unsafe)}); store tensors and Python primitives only")
    return buffer.getvalue()


def write_failure(step: int, output_dir: Path, reason: str, kept: list[Path], written: list[Path] = (),
                  not_written: list[Path] = ()) -> CheckpointError:
    """The error of a checkpoint that could not be written (``reason``: a full disk, a quota), naming the files of it
    that were ``written`` before the failure and those ``not_written`` (when some were), and the earlier ones kept."""
    partly = f" ({_names(written)} written, {_names(not_written)} not)" if written and not_written else ""
    return CheckpointError(f"could not write the step {step} checkpoint in {output_dir}: {reason}{partly}; earlier "
                           f"checkpoints are kept ({_names(kept) or 'none written yet'})")


def _names(paths: list[Path]) -> str:
    """The file names of ``paths``, comma-separated, each once."""
    return ", ".join(dict.fromkeys(path.name for path in paths))


def prune(checkpoints: list[Path], keep_last: int, remove) -> None:
    """Call ``remove`` on all but the newest ``keep_last - 1`` of ``checkpoints`` (oldest first; the one just written,
    not in the list, is the last kept); ``keep_last`` 0 keeps all."""
    if keep_last > 0:
        for old in checkpoints[:max(0, len(checkpoints) - (keep_last - 1))]:
            remove(old)


def remove_stale_temporaries(output_dir: str | Path) -> list[Path]:
    """Delete the temporaries of checkpoints (``.checkpoint_*.tmp<pid>``: :func:`atomic_write_bytes`'s files,
    :func:`atomic_symlink`'s links) whose process no longer runs (a save killed mid-write leaves one as large as a
    checkpoint; they would pile up over preemptions). Returns them."""
    removed = []
    for path in Path(output_dir).glob(TEMPORARY_GLOB):
        if (pid := temporary_pid(path)) is not None and pid != os.getpid():
            try:
                os.kill(pid, 0)  # signal 0: does the process exist?
            except ProcessLookupError:
                path.unlink(missing_ok=True)
                removed.append(path)
            except PermissionError:  # someone else's process: it runs
                pass
    return removed


def load_torch_file(path: str | Path, map_location: str | torch.device = "cpu", safe_globals: tuple = (),
                    what: str = "checkpoint") -> Any:
    """``torch.load(path, weights_only=True)`` (with ``safe_globals`` allowed) once :func:`torch_file_problem` found the
    file sound: every load of a checkpoint, ours or a published one, goes through here. ``what`` names it in errors.

    Raises:
        CheckpointError: the file is missing, not a checkpoint (empty, text, another format), damaged (a CRC-32 fails),
            or holds pickled objects other than tensors, primitives and ``safe_globals`` (refused, never run).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{what} not found: {path}")
    if (problem := torch_file_problem(path)) is not None:
        raise CheckpointError(f"{path} {problem}")
    try:
        with warnings.catch_warnings(), torch.serialization.safe_globals(list(safe_globals)):
            warnings.simplefilter("ignore")  # e.g. "Detected pickle protocol 4": the error below says it all
            return torch.load(path, map_location=map_location, weights_only=True)
    # The damage decides the type (RuntimeError, EOFError, UnpicklingError, KeyError, AssertionError, ...).
    except Exception as err:  # noqa: BLE001 - the file is untrusted input; every failure to read it is this one
        raise CheckpointError(f"cannot load {what} {path} safely: {_load_failure(err)}") from err


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """A checkpoint of this project (a dict with a ``model`` entry), read by :func:`load_torch_file`.

    Raises:
        CheckpointError: see :func:`load_torch_file`; or the file holds something else.
    """
    state = load_torch_file(path, map_location)
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{path} is not a checkpoint of this project (no 'model' entry)")
    return state


def _load_failure(err: BaseException) -> str:
    """One line on why ``torch.load`` failed: for a weights_only refusal (a paragraph of advice, including how to
    allowlist the global: not advice for a file of unknown origin), the refused global or opcode."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if not lines:
        return f"{type(err).__name__} while unpickling"
    if not lines[0].startswith("Weights only load failed"):
        return lines[0]
    boilerplate = ("(1)", "(2)", "Check the documentation")
    detail = " ".join(line for line in lines[1:] if not line.startswith(boilerplate))
    detail = detail.rpartition("WeightsUnpickler error:")[2].split(" Please use ")[0].strip()
    return f"refused by weights_only=True, nothing was run: {detail or lines[0]}"


def few(items: list[str]) -> str:
    """The first 5 of ``items``, comma-separated, with ``(+N more)`` for the rest."""
    return ", ".join(items[:5]) + (f" (+{len(items) - 5} more)" if len(items) > 5 else "")


def load_model_state(model: torch.nn.Module, state_dict: dict[str, torch.Tensor], source: str) -> None:
    """Load ``state_dict`` into ``model`` strictly, naming every missing, unexpected or misshapen key.

    Raises:
        CheckpointError: the keys or shapes do not match (e.g. a checkpoint of another model or config).
    """
    if not isinstance(state_dict, Mapping):
        raise CheckpointError(f"{source}: its 'model' entry is a {type(state_dict).__name__}, not a state dict")
    if not_tensors := sorted(str(k) for k, v in state_dict.items() if not isinstance(v, torch.Tensor)):
        raise CheckpointError(f"{source}: the model state holds entries that are not tensors: {few(not_tensors)}")
    own = model.state_dict()
    problems = {"missing": sorted(set(own) - set(state_dict)), "unexpected": sorted(set(state_dict) - set(own)),
                "shape mismatch": [f"{k} {tuple(state_dict[k].shape)} vs {tuple(own[k].shape)}"
                                   for k in sorted(set(own) & set(state_dict)) if own[k].shape != state_dict[k].shape]}
    if any(problems.values()):
        parts = "; ".join(f"{label}: {few(items)}" for label, items in problems.items() if items)
        raise CheckpointError(f"{source} does not fit this model: {parts}")
    model.load_state_dict(state_dict)


_checked: dict[tuple[str, int, int], Optional[str]] = {}  # intact's answers by (file, size, mtime)


def intact(path: str | Path) -> Optional[str]:
    """Why the checkpoint file at ``path`` is damaged (a zip archive cut short, a record failing its CRC-32) or is not a
    checkpoint (not a zip archive, not one of ``torch.save``), or ``None``. Runs no code from it (safety is
    :func:`load_torch_file`'s). Remembered per size and mtime."""
    try:
        stat = os.stat(path)
        key = (str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)
        if key in _checked:
            return _checked[key]
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
            pickled = any(name.endswith("/data.pkl") for name in archive.namelist())
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, RuntimeError) as err:  # RuntimeError: zlib/CRC
        if str(err) != "File is not a zip file":
            return f"damaged ({one_line(err)})"
        with open(path, "rb") as handle:
            head = handle.read(4)
        return ("damaged (cut short: the zip archive's directory is missing)" if head.startswith(b"PK")
                else "not a checkpoint: " + ("an empty file" if not head else "not a zip archive, as torch.save writes"))
    problem = (f"damaged (its record {bad} fails its CRC-32 check: its bytes changed after it was written)" if bad
               else None if pickled else "not a checkpoint: a zip archive, but not one torch.save writes (no data.pkl)")
    _checked[key] = problem
    return problem


def torch_file_problem(path: Path) -> Optional[str]:
    """What is wrong with ``path`` as a ``torch.save`` file (``"is damaged (...)"``, ``"is not a checkpoint: a text
    file ..."``), or ``None``: a zip archive that is :func:`intact`, or a file of PyTorch's legacy format (before 1.6:
    no checksums) that :func:`legacy_problem` passes."""
    with open(path, "rb") as handle:
        head = handle.read(512)
    if head.startswith(b"PK"):
        return None if (problem := intact(path)) is None else f"is {problem}"
    if head.startswith(b"\x80"):
        return legacy_problem(path)
    text = b"\0" not in head and head.decode("utf-8", "replace").count("\ufffd") <= 1  # 1: a character cut at 512
    kind = "a text file: " * text + NEITHER
    return f"is not a checkpoint: {kind if head else 'an empty file'}"


NEITHER = "neither a file torch.save writes (a zip archive) nor a pickle"
_ITEM_BYTES = {"DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2, "LongStorage": 8,
               "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1, "BoolStorage": 1,
               "ComplexFloatStorage": 8, "ComplexDoubleStorage": 16}
"""The element size (bytes) of each storage type a file of PyTorch's legacy format names."""


class _Inert:
    """What every class a legacy pickle names becomes in :func:`legacy_problem`: any arguments, state or items (of a
    dict or list subclass), no effect."""

    def __init__(self, *args: Any, **kwargs: Any):
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, item: Any) -> None:
        pass


class _StorageScan(pickle._Unpickler):  # the Python unpickler: its memo is a dict, so an index allocates nothing
    """One pickle of a legacy file, built of :class:`_Inert` s (a storage type is its element size): each storage it
    refers to lands in ``storages`` (key -> bytes). Reads from a memory map: a length field allocates nothing."""

    dispatch = {code: load for code, load in pickle._Unpickler.dispatch.items() if code != pickle.BYTEARRAY8[0]}

    def __init__(self, file: mmap.mmap, storages: dict[str, int]):
        super().__init__(file, encoding="latin1")
        self.storages = storages

    def find_class(self, module: str, name: str) -> Any:
        return _ITEM_BYTES.get(name, 1) if module in ("torch", "torch.cuda") and name.endswith("Storage") else _Inert

    def persistent_load(self, pid: Any) -> type:
        if isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage":
            item = pid[1] if isinstance(pid[1], int) else 1
            self.storages[str(pid[2])] = max(0, int(pid[4])) * item
        return _Inert  # a storage, or a pickled module's class


_SCAN_ERRORS = (pickle.UnpicklingError, ValueError, TypeError, AttributeError, IndexError, KeyError, EOFError,
                OverflowError, struct.error)
"""What reading a pickle of arbitrary bytes may raise (random bytes reach any opcode's checks)."""


def legacy_problem(path: Path) -> Optional[str]:
    """What is wrong with ``path``, a file starting as a pickle does, as a file of PyTorch's legacy format (``torch.save``
    before 1.6: pickles of the magic number, the format's version, the system's sizes, the object; then each storage's
    bytes), or ``None`` (also for a whole pickle of something else, which the loaders refuse in their words). The
    pickles are read without building anything (:class:`_StorageScan`): the bytes the tensors declare must be in the
    file, so that no loader allocates terabytes for a few bytes of pickle."""
    storages: dict[str, int] = {}
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        try:
            magic = _StorageScan(mapped, storages).load()
        except _SCAN_ERRORS:  # random bytes after a first 0x80
            return f"is not a checkpoint: {NEITHER}"
        if magic != torch.serialization.MAGIC_NUMBER:
            return None  # a pickle of something else: the loaders name what they refuse in it
        try:
            for _ in range(3):  # the format's version, the system's sizes, the object
                _StorageScan(mapped, storages).load()
        except _SCAN_ERRORS as err:
            return f"is damaged (a file of PyTorch's legacy format whose pickle does not read: {one_line(err)})"
        left = len(mapped) - mapped.tell()
    if (declared := sum(storages.values())) > left:
        return (f"is damaged (its tensors need more bytes than the file holds: {declared} declared, {left} left after "
                "its pickles)")
    return None


CHECKSUMS_NAME = "checksums.json"  # a sharded folder's list of its files' sizes and CRC-32s (a zip archive has its own)
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


def checksum_problem(folder: Path) -> Optional[str]:
    """Why a file of ``folder`` does not match :data:`CHECKSUMS_NAME` (missing, another size, another CRC-32), or
    ``None``; also ``None`` without that file (a folder from before checksums: a note on stderr says so, once).
    Remembered per folder and mtime."""
    listing_path = folder / CHECKSUMS_NAME
    if not listing_path.is_file():
        if (str(folder.resolve()), 0) not in _verified:
            _verified[(str(folder.resolve()), 0)] = None
            print(f"note: {folder} has no {CHECKSUMS_NAME} (written before checksums, or copied without it): its "
                  "shards cannot be checked for damage", file=sys.stderr, flush=True)
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
