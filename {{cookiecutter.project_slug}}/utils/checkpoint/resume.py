"""Resuming: which checkpoint ``--resume`` means, agreed by every rank; what a resume checks of it (the training state,
the settings changed since); the global batch on another number of processes. :class:`Checkpointer` puts it back."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Protocol

import torch

from distributed import all_gather_object, broadcast_object
from utils.checkpoint.files import (CheckpointError, LegacyCheck, intact, load_checkpoint, load_torch_file,
                                    torch_file_problem)
from utils.checkpoint.names import LAST_FILE, aside, last_links, list_numbered
from utils.checkpoint.state import STATEFUL_PARTS, entries_problem
from utils.config import read_moved
from utils.framing import recorded_audio


class FolderFormat(Protocol):
    """Sharded checkpoint folders, as the core reads and writes them (the sharding part's ``utils.checkpoint.sharded``
    is one): a folder's integrity and train state, its weights and optimizer states put back, a run's saves."""

    ShardedCheckpointer: Callable[..., Any]  # (output_dir, rank, async_save, keep_last, timeout_s) -> the saver

    def sharded_intact(self, path: str | Path) -> Optional[str]: ...

    def read_train_state(self, path: str | Path, map_location: Any = "cpu") -> dict[str, Any]: ...

    def load_sharded(self, path: str | Path, model: Any, optimizers: list, extra: Any = None) -> None: ...

    def load_sharded_model(self, path: str | Path, model: Any) -> None: ...

    def broadcast_buffers(self, model: Any) -> None: ...

    def sharded_train_state(self, parts: Mapping[str, Any], state: Any, rng: list, **info: Any) -> dict: ...


class PublishedFormat(Protocol):
    """Weights another project published, and PyTorch's format before 1.6 they come in (the after-training tools'
    ``utils.checkpoint.published.Readers``)."""

    def legacy_problem(self, path: Path) -> Optional[str]: ...

    def read(self, path: Path, cfg: Any, label: str) -> Any: ...  # -> utils.checkpoint.weights.Weights


@dataclasses.dataclass(frozen=True)
class Formats:
    """The checkpoint formats a project reads besides its single files, each None where it left their part out:
    ``parts.py`` builds it, and hands it to every reader of checkpoints."""

    folder: Optional[FolderFormat] = None  # sharded checkpoint folders
    published: Optional[PublishedFormat] = None  # other projects' weights, PyTorch's legacy files

    @property
    def legacy(self) -> Optional[LegacyCheck]:
        """The check of a file of PyTorch's legacy format (:func:`utils.checkpoint.files.torch_file_problem`)."""
        return self.published.legacy_problem if self.published is not None else None


def agreed_resume_path(resume: str, output_dir: Path, rank: int, formats: Formats):
    """The checkpoint to resume from, decided by rank 0 (:func:`resume_path`) and seen alike by every rank (one shared
    ``--output-dir``); else, or where rank 0's decision fails, a :class:`CheckpointError` on every rank."""
    path, notes, error = None, [], None
    try:
        path, notes = resume_path(resume, output_dir, formats) if rank == 0 else (None, [])
    except CheckpointError as err:
        error = str(err)
    for note in notes:
        print(note, file=sys.stderr, flush=True)
    path, error = broadcast_object((path, error))  # rank 0's decision
    if error is not None:
        raise CheckpointError(error)
    looked_at = path if path is not None else output_dir / LAST_FILE
    stat = looked_at.stat() if looked_at.exists() else None
    views = all_gather_object(f"{stat.st_size} bytes, modified {stat.st_mtime_ns}" if stat else "no file")
    r = next((i for i, view in enumerate(views) if view != views[0]), None)
    if r is not None:
        raise CheckpointError(f"ranks disagree about {looked_at}: rank 0 sees {views[0]}, rank {r} sees {views[r]}; "
                              "--output-dir must be one folder shared by every node (a network file system)")
    return path


def resume_path(resume: str, output_dir: str | Path, formats: Formats) -> tuple[Optional[Path], list[str]]:
    """The checkpoint ``--resume`` names, and notes to print about the choice. ``auto``: the newer of the
    ``checkpoint_last.pt`` and ``checkpoint_last`` (sharded) links, else the newest intact numbered checkpoint
    (:func:`_newest_intact`), else ``None``; ``none``: ``None``; else that file or sharded folder (of ``formats``). A
    :class:`CheckpointError` for ``none`` on a folder with checkpoints, ``auto`` where every one is damaged (step 0
    would overwrite them), or a path that is no intact checkpoint."""
    output_dir = Path(output_dir)
    # A link's own time (lstat) is when it was put in place; a copy's is when it was written.
    lasts = sorted(last_links(output_dir), key=lambda path: path.lstat().st_mtime, reverse=True)
    numbered = list_numbered(output_dir)
    if resume == "auto":
        return _newest_intact(output_dir, lasts, numbered, formats)
    if resume == "none":
        if lasts or numbered:
            raise CheckpointError(f"{output_dir} already holds checkpoints, which --resume none would overwrite; "
                                  "continue with --resume auto, or start afresh in another --output-dir")
        return None, []
    if not Path(resume).is_file() and not Path(resume).is_dir():
        raise CheckpointError(f"--resume {resume}: no such checkpoint")
    if Path(resume).is_file() and (problem := torch_file_problem(Path(resume), formats.legacy)) is not None:
        raise CheckpointError(f"--resume {resume}: the file {problem}")
    if Path(resume).is_file() and (problem := malformed(Path(resume), formats.legacy)) is not None:
        raise CheckpointError(f"--resume {resume}: the file is {problem}")
    if (sharded := folder_reader(resume, formats.folder, "--resume ")) is not None and \
            (problem := sharded.sharded_intact(resume)) is not None:
        raise CheckpointError(f"--resume {resume}: the sharded checkpoint is {problem}")
    return Path(resume), []


def _newest_intact(output_dir: Path, lasts: list[Path], numbered: list[Path],
                   formats: Formats) -> tuple[Optional[Path], list[str]]:
    """``--resume auto``: the first intact of ``lasts``, then of ``numbered`` from the newest step down; the numbered
    ones passed over are renamed ``.damaged`` (holding code: ``.unsafe``), out of pruning's way. A
    :class:`CheckpointError` when all are damaged or unsafe, or a link names what is gone and no other is there."""
    notes, problems, passed_over, gone = [], [], [], []
    for path in [*lasts, *reversed(numbered)]:
        if path.is_symlink() and not path.exists():  # what the link named was pruned or removed
            gone.append(f"{path} names {os.readlink(path)}, which is gone")
            problems.append(gone[-1])
            continue
        problem = (folder_reader(path, formats.folder).sharded_intact(path) if path.is_dir()
                   else intact(path) or malformed(path, formats.legacy) if path.is_file() else "not a file")
        if problem is None:
            if problems:
                moved = [f"{old.name} -> {move_aside(old, kind).name}" for old, kind in passed_over]
                notes.append(f"warning: {'; '.join(problems)}: resuming from {path}, the newest intact checkpoint"
                             + (f" (renamed aside: {', '.join(moved)})" if moved else ""))
            return path, notes
        problems.append(f"{path} is {problem}")
        if path in numbered:
            passed_over.append((path, "unsafe" if problem.startswith("unsafe") else "damaged"))
    if len(problems) > len(gone):
        raise CheckpointError(f"every checkpoint in {output_dir} is damaged or unsafe ({'; '.join(problems)}); nothing "
                              "was overwritten: move them aside to start afresh, or pass --resume PATH")
    if gone:
        raise CheckpointError(f"{'; '.join(gone)}; move it aside or pass --resume PATH")
    return None, []


def malformed(path: Path, legacy: Optional[LegacyCheck] = None) -> Optional[str]:
    """``"malformed (its 'rng' entry is ...)"`` for a checkpoint file whose entries are not as ``train.py`` writes them
    (:func:`utils.checkpoint.state.entries_problem`; read with ``mmap``: its tensors stay on disk), else ``None``; a
    :class:`CheckpointError` where it holds code (refused, never run) or does not load (``legacy``: as
    :func:`utils.checkpoint.files.torch_file_problem` takes it)."""
    saved = load_torch_file(path, mmap=True, legacy=legacy)
    problem = entries_problem(saved) if isinstance(saved, Mapping) else f"it holds a {type(saved).__name__}, not a dict"
    return None if problem is None else f"malformed ({problem})"


def move_aside(path: Path, kind: str = "damaged") -> Path:
    """Rename a damaged (``kind="unsafe"``: code-holding) checkpoint to ``<name>.<kind>`` (``.<kind>2``, ... if taken),
    out of what ``--resume auto`` and pruning look at; returns the new path."""
    for n in range(1, 1000):
        target = aside(path, kind, n)
        if not target.exists():
            os.replace(path, target)
            return target
    raise CheckpointError(f"cannot rename the {kind} {path}: too many .{kind} copies beside it")


def config_changes(before: Mapping[str, Any], now: Mapping[str, Any], ignore: tuple[str, ...] = ()) -> list[str]:
    """``"section.key: old -> new"`` (values as JSON writes them) for every setting, but those in ``ignore``, that
    differs between two ``Config.to_dict()`` dicts (or that only one has)."""
    changes = []
    for section in sorted(set(before) | set(now)):
        old, new = before.get(section, {}), now.get(section, {})
        if not isinstance(old, Mapping) or not isinstance(new, Mapping):
            continue
        changes += [f"{section}.{key}: {as_json(old.get(key, 'unset'))} -> {as_json(new.get(key, 'unset'))}"
                    for key in sorted(set(old) | set(new))
                    if f"{section}.{key}" not in ignore and old.get(key, "unset") != new.get(key, "unset")]
    return changes


def as_json(value: Any) -> str:
    """A config value as ``config.json`` and ``--set`` write it (``true``, ``null``, ``[1, 2]``); a string as is."""
    return value if isinstance(value, str) else json.dumps(list(value) if isinstance(value, tuple) else value)


def saved_config(saved: Mapping[str, Any]) -> dict[str, Any]:
    """The config a checkpoint's run trained with (``{}`` where it has none; a section that is no dict, as in a crafted
    file, left out), its ``audio`` section as :func:`utils.framing.recorded_audio` reads one made before
    ``audio.mel_framing``, the keys an earlier version had as :func:`utils.config.read_moved` reads them."""
    config = saved.get("config") if isinstance(saved.get("config"), Mapping) else {}
    config = {section: keys for section, keys in config.items() if isinstance(keys, Mapping)}
    config = read_moved(config, saved.get("model_name"))
    if isinstance(config.get("audio"), Mapping):
        config = {**config, "audio": recorded_audio(config["audio"])}
    return config


def check_training_state(saved: Mapping[str, Any], path, sharded: bool) -> None:
    """Raise :class:`CheckpointError`, naming what it lacks, for a checkpoint without what a resume puts back (a
    weights-only file); ``sharded``: a folder's train state, whose optimizer is in its shards."""
    missing = [key for key in (*STATEFUL_PARTS, "step", "epoch", "batch_in_epoch", "rng")  # the others came later
               if key not in saved and not (sharded and key == "optimizer")]
    if missing:
        raise CheckpointError(f"{path} is not a training checkpoint of train.py (it has no {', '.join(missing)}); "
                              "--resume needs one written by train.py")


def warn_changes(saved: Mapping[str, Any], path, before: Mapping[str, Any],
                 config: Optional[Mapping[str, Any]], train_utterances: Optional[int]) -> None:
    """Rank 0's warnings on a resume from ``saved``: settings of ``config`` that differ from ``before``
    (:func:`saved_config`), ``train.max_steps`` aside, and a corpus of another size than the checkpoint's."""
    if config is not None and before and (changes := config_changes(before, config, ignore=("train.max_steps",))):
        print(f"warning: the config differs from the one {path} was trained with: {'; '.join(changes)}",
              file=sys.stderr, flush=True)
    if train_utterances is not None and (known := saved.get("train_utterances")) not in (None, train_utterances):
        print(f"warning: the corpus changed since {path} ({known} -> {train_utterances} training utterances): the "
              "run continues from its step, but the epoch's order and position are not the ones it stopped at",
              file=sys.stderr, flush=True)


def world_size_change(written_by: int, accumulation: int, world_size: int, batch_size: int,
                      requested: int) -> tuple[int, Optional[str]]:
    """``(grad_accumulation, line saying so)`` for a run resumed from a checkpoint that ``written_by`` processes wrote
    with ``accumulation`` (``batch_size``: samples per process per micro-batch; ``requested``: the config's, unused);
    ``(accumulation, None)`` on the same world size. The global batch (``batch_size * grad_accumulation *
    world_size``) is kept when it divides, else the closest accumulation (at least 1) is taken and the line says so."""
    if written_by == world_size:
        return accumulation, None
    before = batch_size * accumulation * written_by
    head = f"the checkpoint was written by {written_by} process(es), this run has {world_size}"
    tail = "the data position carries over in global samples; random streams (dropout) restart"
    if before % (batch_size * world_size) == 0:
        kept = before // (batch_size * world_size)
        return kept, (f"note: {head}: train.grad_accumulation {accumulation} -> {kept} keeps the global batch at "
                      f"{before} ({batch_size} x {kept} x {world_size}); {tail}")
    closest = max(1, round(before / (batch_size * world_size)))
    return closest, (f"warning: {head}: the global batch changes {before} -> {batch_size * closest * world_size} "
                     f"({batch_size} x {closest} x {world_size}; no train.grad_accumulation keeps {before}); {tail}")


def read_checkpoint(path: str | Path, map_location: str | torch.device = "cpu", verify: bool = True, *,
                    formats: Formats) -> dict[str, Any]:
    """A checkpoint's entries: a file's whole dict; a sharded folder's ``train_state.pt`` (no weights), once its
    ``sharded_intact`` passes (unless not ``verify``); else a :class:`CheckpointError`. ``formats``: those the project
    reads besides single files."""
    if (sharded := folder_reader(path, formats.folder)) is None:
        return load_checkpoint(path, map_location=map_location, legacy=formats.legacy)
    if verify and (problem := sharded.sharded_intact(path)) is not None:
        raise CheckpointError(f"{path} is {problem}")
    return sharded.read_train_state(path, map_location)


def folder_reader(path: str | Path, folder: Optional[FolderFormat], label: str = "") -> Optional[FolderFormat]:
    """``folder`` (the project's sharded folders) when ``path`` is a folder (or a link to one), else ``None``; a
    :class:`CheckpointError` (starting with ``label``) for a folder in a project without them (``folder`` None)."""
    if not Path(path).is_dir():
        return None
    if folder is None:
        raise CheckpointError(f"{label}{path} is a folder: this project reads single-file checkpoints (.pt)")
    return folder
