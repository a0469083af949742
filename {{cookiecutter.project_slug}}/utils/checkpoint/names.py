"""The names of a run's checkpoints in its output folder, known here alone: ``checkpoint_<step>.pt`` (DDP),
``checkpoint_<step>/`` (a folder, where the project saves in folders; ``.checkpoint_<step>.partial/`` while written),
the links to the newest of each, the ``.damaged``/``.unsafe`` names of what ``--resume auto`` passed over, the
temporaries of atomic writes."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional

LAST_FILE = "checkpoint_last.pt"  # a relative link to the newest checkpoint_<step>.pt (a copy where links are refused)
LAST_FOLDER = "checkpoint_last"  # a relative link to the newest checkpoint_<step>/ folder
PARTIAL_GLOB = ".checkpoint_*.partial"  # checkpoint folders being written (or left by a killed save)
TEMPORARY_GLOB = ".checkpoint_*.tmp*"  # temporaries of checkpoint files and of the last links
_NUMBERED = re.compile(r"^checkpoint_(\d+)(\.pt)?$")


def numbered(output_dir: str | Path, step: int, folder: bool = False) -> Path:
    """``output_dir/checkpoint_<step>.pt``, or with ``folder`` the folder ``output_dir/checkpoint_<step>``."""
    return Path(output_dir) / (f"checkpoint_{step}" if folder else f"checkpoint_{step}.pt")


def partial(output_dir: str | Path, step: int) -> Path:
    """The folder a save of ``step`` in folders writes into before it is renamed :func:`numbered`."""
    return Path(output_dir) / f".checkpoint_{step}.partial"


def step_of(path: str | Path) -> Optional[int]:
    """The step of a numbered checkpoint (``checkpoint_12.pt``, ``checkpoint_12``: 12), else ``None``."""
    match = _NUMBERED.match(Path(path).name)
    return int(match.group(1)) if match else None


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Numbered checkpoint files (``checkpoint_<step>.pt``) in ``output_dir``, oldest step first."""
    return sorted((path for path in Path(output_dir).glob("checkpoint_*.pt") if step_of(path) is not None),
                  key=step_of)


def list_checkpoint_folders(output_dir: str | Path) -> list[Path]:
    """Checkpoint folders (``checkpoint_<step>/``, not links) in ``output_dir``, oldest step first."""
    return sorted((path for path in Path(output_dir).glob("checkpoint_*")
                   if step_of(path) is not None and path.suffix != ".pt" and path.is_dir() and not path.is_symlink()),
                  key=step_of)


def list_numbered(output_dir: str | Path) -> list[Path]:
    """Numbered checkpoints of both kinds in ``output_dir``, oldest step first (a file before a folder of its step)."""
    return sorted([*list_checkpoints(output_dir), *list_checkpoint_folders(output_dir)], key=step_of)


def last_links(output_dir: str | Path) -> list[Path]:
    """``output_dir``'s :data:`LAST_FILE` and :data:`LAST_FOLDER` where present (dangling links too)."""
    return [path for path in (Path(output_dir) / LAST_FILE, Path(output_dir) / LAST_FOLDER)
            if path.exists() or path.is_symlink()]


def last_checkpoint_path(output_dir: str | Path) -> Optional[Path]:
    """``output_dir``'s ``checkpoint_last`` (a folder), else ``checkpoint_last.pt``, else (or dangling) ``None``."""
    last, link = Path(output_dir) / LAST_FILE, Path(output_dir) / LAST_FOLDER
    return link if link.is_dir() else last if last.is_file() else None


def last_checkpoint(output_dir: str | Path) -> str:
    """:func:`last_checkpoint_path` for messages (``out/checkpoint_last.pt (checkpoint_8.pt)``), or ``"none yet"``."""
    if (path := last_checkpoint_path(output_dir)) is None:
        return "none yet"
    return f"{path} ({os.readlink(path)})" if path.is_symlink() else str(path)


def last_good_checkpoint(output_dir: str | Path, step: int, skips_before: int,
                         suspect: Optional[Path] = None) -> str:
    """The newest checkpoint to name as good at an anomaly of ``step`` after ``skips_before`` skips in a row: saved
    before ``step``, or in a run of skips from ``b`` before ``b - 1`` (its weights are the ones that keep failing); else
    ``"none kept from before step N"``. ``suspect`` is never named, and the answer says it was passed over."""
    before = step - skips_before - (skips_before > 0)
    earlier = [path for path in list_numbered(output_dir) if step_of(path) < before]
    kept = [path for path in earlier if suspect is None or os.path.realpath(path) != os.path.realpath(suspect)]
    good = str(kept[-1]) if kept else f"none kept from before step {before}"
    if len(kept) == len(earlier):
        return good
    return f"{good} (not {suspect}: the weights this run loaded from it turned non-finite before a save)"


def temporary(path: str | Path) -> Path:
    """This process's temporary for an atomic write of ``path``: ``.<name>.tmp<pid>`` beside it."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def temporary_pid(path: str | Path) -> Optional[int]:
    """The process id in a :func:`temporary`'s name, or ``None`` for another name."""
    pid = Path(path).name.rpartition(".tmp")[2]
    return int(pid) if pid.isdigit() else None


def aside(path: str | Path, kind: str, n: int = 1) -> Path:
    """The ``n``-th name of a damaged (``kind="damaged"``) or code-holding (``"unsafe"``) checkpoint moved aside:
    ``<name>.<kind>``, ``<name>.<kind>2``, ... (no step for :func:`step_of`)."""
    path = Path(path)
    return path.with_name(f"{path.name}.{kind}{n if n > 1 else ''}")
