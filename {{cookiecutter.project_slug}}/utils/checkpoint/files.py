"""Checkpoint files: atomic writes, safe loads (``torch.load(weights_only=True)``: pickled objects are refused, never
run), damage checks (the zip archive's CRC-32s) and key-by-key loads into a model."""

from __future__ import annotations

import io
import os
import warnings
import zipfile
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import torch

from utils.checkpoint.names import TEMPORARY_GLOB, temporary, temporary_pid
from utils.errors import CheckpointError
from utils.run_log import one_line


class UnsafeCheckpoint(CheckpointError):
    """A checkpoint holds pickled code (or objects a checkpoint never holds): refused before anything in it ran."""


LegacyCheck = Callable[[Path], Optional[str]]
"""What is wrong with a file of PyTorch's legacy format (a pickle, before 1.6), or ``None``: the after-training tools'
``utils.checkpoint.published.legacy_problem``, handed down (``utils.checkpoint.resume.Formats``)."""


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the new one, never a torn one (a temporary
    beside it, fsync'ed, then ``os.replace``); an ``OSError`` where it cannot (a full disk) names ``path``."""
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
    """Make ``path`` a symbolic link to ``target`` (relative to its folder), swapped in by ``os.replace``: a reader
    sees what was there or the new link; an ``OSError`` (``EPERM``, ``EOPNOTSUPP``) where the file system has none."""
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
    """``torch.save`` bytes of ``state``; :class:`CheckpointError` (nothing written) where it holds what
    :func:`load_checkpoint` would refuse."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    if unsafe := torch.serialization.get_unsafe_globals_in_checkpoint(io.BytesIO(buffer.getvalue())):
        raise CheckpointError(f"refusing to write {where}: the state holds objects that a weights_only=True "
                              f"load refuses ({', '.join(unsafe)}); store tensors and Python primitives only")
    return buffer.getvalue()


def write_failure(step: int, output_dir: Path, reason: str, kept: list[Path], written: list[Path] = (),
                  not_written: list[Path] = ()) -> CheckpointError:
    """The error of a checkpoint that could not be written (``reason``: a full disk, a quota), naming its files
    ``written`` before the failure and those ``not_written`` (when some were), and the earlier ones ``kept``."""
    def names(paths: list[Path]) -> str:
        return ", ".join(dict.fromkeys(path.name for path in paths))
    partly = f" ({names(written)} written, {names(not_written)} not)" if written and not_written else ""
    return CheckpointError(f"could not write the step {step} checkpoint in {output_dir}: {reason}{partly}; earlier "
                           f"checkpoints are kept ({names(kept) or 'none written yet'})")


def prune(checkpoints: list[Path], keep_last: int, remove) -> None:
    """Call ``remove`` on all but the newest ``keep_last - 1`` of ``checkpoints`` (oldest first; the one just written,
    not in the list, is the last kept); ``keep_last`` 0 keeps all."""
    if keep_last > 0:
        for old in checkpoints[:max(0, len(checkpoints) - (keep_last - 1))]:
            remove(old)


def remove_stale_temporaries(output_dir: str | Path) -> list[Path]:
    """Delete (and return) the temporaries of checkpoints (``.checkpoint_*.tmp<pid>``) whose process no longer runs,
    each as large as a checkpoint: they would pile up over preemptions."""
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


def load_torch_file(path: str | Path, map_location: str | torch.device = "cpu", mmap: bool = False,
                    legacy: Optional[LegacyCheck] = None) -> Any:
    """``torch.load(path, weights_only=True)`` once :func:`torch_file_problem` passes (``mmap``: tensors mapped, not
    read); a :class:`CheckpointError` for a file missing, not a checkpoint, damaged, or holding pickled objects other
    than tensors and primitives (refused, never run)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    if (problem := torch_file_problem(path, legacy)) is not None:
        raise CheckpointError(f"{path} {problem}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "Detected pickle protocol 4": the error below says it all
            return torch.load(path, map_location=map_location, weights_only=True,
                              mmap=mmap and zipfile.is_zipfile(path))
    except Exception as err:  # noqa: BLE001 - untrusted input: whatever the damage raises is this one failure
        raise CheckpointError(f"cannot load checkpoint {path} safely: {_load_failure(err)}") from err


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu",
                    legacy: Optional[LegacyCheck] = None) -> dict[str, Any]:
    """A checkpoint of this project (a dict with a ``model`` entry), read by :func:`load_torch_file` (``legacy``: as
    there); a :class:`CheckpointError` as there, or where the file holds something else."""
    state = load_torch_file(path, map_location, legacy=legacy)
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{path} is not a checkpoint of this project (no 'model' entry)")
    return state


def _load_failure(err: BaseException) -> str:
    """One line on why ``torch.load`` failed; for a weights_only refusal, the refused global or opcode without the
    paragraph of advice (how to allowlist it: not advice for a file of unknown origin)."""
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


def misfit(own: Mapping[str, torch.Tensor], given: Mapping[str, torch.Tensor], shapes: str = "shape mismatch",
           partial: tuple[str, ...] = ()) -> str:
    """What of ``given`` does not fit the state dict ``own``: ``"missing: ...; unexpected: ...; <shapes>: key (given)
    vs (own)"`` (at most 5 of each; keys starting with a ``partial`` prefix may be missing), or ``""``."""
    problems = {"missing": sorted(key for key in own if key not in given and not key.startswith(partial)),
                "unexpected": sorted(set(given) - set(own)),
                shapes: [f"{k} {tuple(given[k].shape)} vs {tuple(own[k].shape)}"
                         for k in sorted(set(own) & set(given)) if own[k].shape != given[k].shape]}
    return "; ".join(f"{label}: {few(items)}" for label, items in problems.items() if items)


def load_model_state(model: torch.nn.Module, state_dict: dict[str, torch.Tensor], source: str) -> None:
    """Load ``state_dict`` into ``model`` strictly; a :class:`CheckpointError` for what is not a dict of tensors, or
    keys or shapes that do not match, named (:func:`misfit`)."""
    if not isinstance(state_dict, Mapping):
        raise CheckpointError(f"{source}: its 'model' entry is a {type(state_dict).__name__}, not a state dict")
    if not_tensors := sorted(str(k) for k, v in state_dict.items() if not isinstance(v, torch.Tensor)):
        raise CheckpointError(f"{source}: the model state holds entries that are not tensors: {few(not_tensors)}")
    if problems := misfit(model.state_dict(), state_dict):
        raise CheckpointError(f"{source} does not fit this model: {problems}")
    model.load_state_dict(state_dict)


_checked: dict[tuple[str, int, int], Optional[str]] = {}  # intact's answers by (file, size, mtime)


def intact(path: str | Path) -> Optional[str]:
    """Why the checkpoint file at ``path`` is damaged (a zip archive cut short, a record failing its CRC-32) or is not a
    checkpoint (not a zip archive of ``torch.save``), or ``None``. Runs nothing from it; remembered per size and mtime."""
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


def torch_file_problem(path: Path, legacy: Optional[LegacyCheck] = None) -> Optional[str]:
    """What is wrong with ``path`` as a ``torch.save`` file (``"is damaged (...)"``, ``"is not a checkpoint: ..."``),
    or ``None``: a zip archive that is :func:`intact`, or a pickle (PyTorch's legacy format, before 1.6) that
    ``legacy`` passes; without ``legacy``, refused unread."""
    with open(path, "rb") as handle:
        head = handle.read(512)
    if head.startswith(b"PK"):
        return None if (problem := intact(path)) is None else f"is {problem}"
    if head.startswith(b"\x80"):
        if legacy is None:
            return ("is in PyTorch's old format (a pickle, before 1.6), which this project reads only with the "
                    "after-training tools: refused, nothing was run")
        return legacy(path)
    text = b"\0" not in head and head.decode("utf-8", "replace").count("\ufffd") <= 1  # 1: a character cut at 512
    kind = "a text file: " * text + NEITHER
    return f"is not a checkpoint: {kind if head else 'an empty file'}"


NEITHER = "neither a file torch.save writes (a zip archive) nor a pickle"
