"""Checkpoint files: atomic writes, safe loads (``torch.load(weights_only=True)``: pickled objects are refused, never
run), damage checks (the zip archive's CRCs; CRC-32 listings of sharded folders), and key-by-key loads into a model."""

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
    """Write ``data`` to ``path`` so that a reader sees the old file or the new one, never a torn one: a temporary file
    in the same folder is fsync'ed, then ``os.replace`` swaps it in."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def fsync_dir(path: str | Path) -> None:
    """Make a folder's entries durable (a rename, a new link), as ``fsync`` does for a file's bytes."""
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def durable_write_speed(folder: str | Path, nbytes: int) -> float:
    """Bytes per second of a durable write into ``folder``: ``nbytes`` (capped at 64 MiB) written, fsync'ed, removed.
    Fsync's fixed cost makes a small probe slow, which errs on the safe side.

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


def write_failure(step: int, output_dir: Path, reason: str, kept: list[Path]) -> CheckpointError:
    """The error of a checkpoint that could not be written (``reason``: a full disk, a quota), naming the ones kept."""
    return CheckpointError(f"could not write the step {step} checkpoint in {output_dir}: {reason}; earlier checkpoints "
                           f"are kept ({', '.join(dict.fromkeys(path.name for path in kept)) or 'none written yet'})")


def prune(checkpoints: list[Path], keep_last: int, remove) -> None:
    """Call ``remove`` on all but the newest ``keep_last - 1`` of ``checkpoints`` (oldest first; the one just written,
    not in the list, is the last kept); ``keep_last`` 0 keeps all."""
    if keep_last > 0:
        for old in checkpoints[:max(0, len(checkpoints) - (keep_last - 1))]:
            remove(old)


def remove_stale_temporaries(output_dir: str | Path) -> list[Path]:
    """Delete the ``.checkpoint_*.pt.tmp<pid>`` files of :func:`atomic_write_bytes` whose process no longer runs (a save
    killed mid-write leaves one as large as a checkpoint; they would pile up over preemptions). Returns them."""
    removed = []
    for path in Path(output_dir).glob(".checkpoint_*.pt.tmp*"):
        pid = path.name.rpartition(".tmp")[2]
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                os.kill(int(pid), 0)  # signal 0: does the process exist?
            except ProcessLookupError:
                path.unlink(missing_ok=True)
                removed.append(path)
            except PermissionError:  # someone else's process: it runs
                pass
    return removed


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
    # The damage decides the type (RuntimeError, EOFError, UnpicklingError, KeyError, AssertionError, ...).
    except Exception as err:  # noqa: BLE001 - the file is untrusted input; every failure to read it is this one
        with open(path, "rb") as handle:
            head = handle.read(2)
        if not head.startswith((b"PK", b"\x80")):  # neither a zip archive nor a pickle (protocol 2 or later)
            raise CheckpointError(f"{path} is not a checkpoint: " + ("an empty file" if not head else
                                  "neither a file torch.save writes (a zip archive) nor a pickle")) from err
        raise CheckpointError(f"cannot load checkpoint {path} safely: {_load_failure(err)}") from err
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


def intact(path: str | Path) -> Optional[str]:
    """Why the checkpoint file at ``path`` is damaged (cut short, corrupted, not a ``torch.save`` archive), or ``None``
    when every member of its zip archive matches its CRC. Runs no code from it (safety is :func:`load_checkpoint`'s)."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, RuntimeError) as err:  # RuntimeError: zlib/CRC
        return f"damaged ({str(err).splitlines()[0] if str(err) else type(err).__name__})"
    return None if bad is None else f"damaged (member {bad} fails its CRC check)"


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
    ``None``; also ``None`` without that file (a folder from before checksums). Remembered per folder and mtime."""
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
