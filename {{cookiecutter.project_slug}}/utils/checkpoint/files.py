"""Checkpoint files: written atomically (a reader sees the old file or the new one), loaded safely
(``torch.load(weights_only=True)``: a file holding arbitrary pickled objects is refused, never executed), checked for
damage (the zip archive's CRCs; CRC-32 listings of sharded folders), and loaded into a model key by key.
"""

from __future__ import annotations

import io
import json
import os
import time
import warnings
import zipfile
import zlib
from pathlib import Path
from typing import Any, Mapping, Optional

import torch

from utils.run_log import one_line


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable, unsafe, or does not fit the model."""


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the new one, never a torn one.

    The bytes go to a temporary file in the same folder, are flushed and fsync'ed, then ``os.replace`` swaps the file
    in; a process killed mid-write leaves the old file untouched.
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
    """Bytes per second of a durable write into ``folder``, as a checkpoint's is: ``nbytes`` (capped at 64 MiB) written,
    fsync'ed and removed again. Fsync's fixed cost makes a small probe slow, which errs on the safe side.

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
    """Call ``remove`` on all but the newest ``keep_last - 1`` of ``checkpoints`` (oldest first; the one just written, not
    in the list, is the last kept); ``keep_last`` 0 keeps all."""
    if keep_last > 0:
        for old in checkpoints[:max(0, len(checkpoints) - (keep_last - 1))]:
            remove(old)


def remove_stale_temporaries(output_dir: str | Path) -> list[Path]:
    """Delete the temporary files of :func:`atomic_write_bytes` left by processes that no longer run.

    A process killed mid-save (SIGKILL, out of memory) leaves ``.checkpoint_*.pt.tmp<pid>`` behind, as large as a
    checkpoint; without this they would pile up over preemptions. Returns what was removed.
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


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True``.

    Raises:
        CheckpointError: the file is missing, truncated or not a checkpoint, or holds pickled objects other than tensors
            and primitives (refused without being executed).
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

    torch's refusal is a paragraph of advice (including how to allowlist the global, which is not advice to follow for a
    file of unknown origin); the line that matters reads like "WeightsUnpickler error: Unsupported global: GLOBAL
    io.open ..." or "Trying to load unsupported GLOBAL posix.system ...".
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


def intact(path: str | Path) -> Optional[str]:
    """Why the checkpoint file at ``path`` is damaged (cut short, corrupted, not a ``torch.save`` archive), or ``None``
    when every member of its zip archive reads back with a matching CRC. Reads the whole file once; runs no code from it
    (whether its contents are safe is :func:`load_checkpoint`'s question)."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, RuntimeError) as err:  # RuntimeError: zlib/CRC
        return f"damaged ({str(err).splitlines()[0] if str(err) else type(err).__name__})"
    return None if bad is None else f"damaged (member {bad} fails its CRC check)"


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
    """Why a file of ``folder`` does not match :data:`CHECKSUMS_NAME` (missing, another size, another CRC-32), or ``None``;
    also ``None`` without that file (a folder written before checksums existed: sizes are checked by
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
