"""The checkpoint formats (:class:`Formats`) and resuming: which checkpoint ``--resume`` means, agreed by every rank;
the settings changed since; the global batch on another number of processes."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any, Mapping, Optional, Protocol


from distributed import DistInfo, all_gather_object, from_rank0
from utils.checkpoint.files import CheckpointError, LegacyCheck, torch_file_problem
from utils.checkpoint.names import LAST_FILE, aside, last_links, list_numbered
from utils.checkpoint.state import SingleFile, Stateful, malformed
from utils.config import Config, read_moved
from utils.framing import recorded_audio


class Saver(Protocol):
    """A run's saves in one format (:meth:`CheckpointFormat.saver`); every rank calls each method together."""

    background: bool  # a save goes on after ``save`` returns (``train.async_checkpoint``)

    def save(self, step: int, states: Mapping[str, Stateful], info: Mapping[str, Any]) -> Optional[Path]: ...

    def poll(self) -> Optional[Path]: ...  # a background save completed since, else None (cheap)

    def wait(self) -> Optional[Path]: ...  # the background save, once completed; None without one

    def share(self, nbytes: int) -> int: ...  # what rank 0 writes of a checkpoint of ``nbytes`` per save


class CheckpointFormat(Protocol):
    """How checkpoints lie on disk, one per step: the core's single file (``state.SingleFile``) or a part's folder;
    ``load`` puts back the states the format holds its own way."""

    noun: str  # what a checkpoint of it is called in a message

    def problem(self, path: Path) -> Optional[str]: ...  # why it cannot be loaded ("damaged (...)"), else None

    def read(self, path: str | Path, map_location: Any = "cpu", verify: bool = True) -> dict[str, Any]: ...

    def load(self, path: str | Path, states: Mapping[str, Stateful], saved: Mapping[str, Any]) -> tuple[str, ...]: ...

    def continues(self, path: Path) -> Optional[str]: ...  # why a run saving in it cannot resume ``path``, else None

    def saver(self, output_dir: Path, dist: DistInfo, train: Any) -> Saver: ...


class FolderFormat(CheckpointFormat, Protocol):
    """A format of folders, whose weights tools read without a run (``--init-from``, ``inference.py``)."""

    def load_weights(self, path: str | Path, model: Any, averages: Optional[dict] = None) -> None: ...


class PublishedFormat(Protocol):
    """Weights another project published, and PyTorch's format before 1.6 they come in (the after-training tools'
    ``utils.checkpoint.published.Readers``)."""

    sources: str  # what such files are, for --help

    def legacy_problem(self, path: Path) -> Optional[str]: ...

    def read(self, path: Path, cfg: Any, label: str) -> Any: ...  # -> utils.checkpoint.weights.Weights


@dataclasses.dataclass(frozen=True)
class Formats:
    """The checkpoint formats a project reads besides its single files, each None where it left their part out:
    ``parts.py`` builds it, and hands it to every reader of checkpoints."""

    folder: Optional[FolderFormat] = None  # checkpoint folders, one per step
    published: Optional[PublishedFormat] = None  # other projects' weights, PyTorch's legacy files

    @property
    def legacy(self) -> Optional[LegacyCheck]:
        """The check of a file of PyTorch's legacy format (:func:`utils.checkpoint.files.torch_file_problem`)."""
        return self.published.legacy_problem if self.published is not None else None

    @property
    def file(self) -> SingleFile:
        """The single files, reading PyTorch's legacy format where :attr:`published` does."""
        return SingleFile(self.legacy)

    def writing(self, split: bool) -> CheckpointFormat:
        """The format a run saves in: :attr:`folder` where its model is split over the ranks (``train.sharded``), else
        :attr:`file`."""
        return self.folder if split else self.file

    def of(self, path: str | Path, label: str = "") -> CheckpointFormat:
        """The format of the checkpoint at ``path``: :attr:`folder` for a folder, else :attr:`file`; as
        :meth:`folder_of` raises."""
        return self.folder_of(path, label) or self.file

    def folder_of(self, path: str | Path, label: str = "") -> Optional[FolderFormat]:
        """:attr:`folder` when ``path`` is a folder (or a link to one), else ``None``; a :class:`CheckpointError`
        (starting with ``label``) for a folder in a project without them."""
        if not Path(path).is_dir():
            return None
        if self.folder is None:
            raise CheckpointError(f"{label}{path} is a folder: this project reads single-file checkpoints (.pt)")
        return self.folder


def agreed_resume_path(resume: str, output_dir: Path, formats: Formats) -> Optional[Path]:
    """The checkpoint to resume from, decided by rank 0 (:func:`resume_path`) and seen alike by every rank; else a
    :class:`CheckpointError` on every rank."""
    def decide() -> Optional[Path]:
        path, notes = resume_path(resume, output_dir, formats)
        for note in notes:
            print(note, file=sys.stderr, flush=True)
        return path
    path = from_rank0(decide, CheckpointError)
    looked_at = path if path is not None else output_dir / LAST_FILE
    stat = looked_at.stat() if looked_at.exists() else None
    views = all_gather_object(f"{stat.st_size} bytes, modified {stat.st_mtime_ns}" if stat else "no file")
    r = next((i for i, view in enumerate(views) if view != views[0]), None)
    if r is not None:
        raise CheckpointError(f"ranks disagree about {looked_at}: rank 0 sees {views[0]}, rank {r} sees {views[r]}; "
                              "--output-dir must be one folder shared by every node (a network file system)")
    return path


def resume_path(resume: str, output_dir: str | Path, formats: Formats) -> tuple[Optional[Path], list[str]]:
    """The checkpoint ``--resume`` names, and notes on the choice: ``auto`` the newest intact (the last links first),
    or ``None``; ``none``: ``None``; else that path. A :class:`CheckpointError` for ``none`` where checkpoints are,
    ``auto`` where every one is damaged (step 0 would overwrite them), a path that is no intact checkpoint."""
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
    kind, path = formats.of(resume, "--resume "), Path(resume)
    if (problem := malformed(path, formats.legacy) if path.is_file() else kind.problem(path)) is not None:
        raise CheckpointError(f"--resume {resume}: the {kind.noun} is {problem}")
    return Path(resume), []


def _newest_intact(output_dir: Path, lasts: list[Path], numbered: list[Path],
                   formats: Formats) -> tuple[Optional[Path], list[str]]:
    """The first intact of ``lasts``, then of ``numbered`` newest first, those passed over renamed ``.damaged`` (or
    ``.unsafe``). A :class:`CheckpointError` when all are damaged, or a link names what is gone and none is there."""
    notes, problems, passed_over, gone = [], [], [], []
    for path in [*lasts, *reversed(numbered)]:
        if path.is_symlink() and not path.exists():  # what the link named was pruned or removed
            gone.append(f"{path} names {os.readlink(path)}, which is gone")
            problems.append(gone[-1])
            continue
        problem = formats.of(path).problem(path)
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


def move_aside(path: Path, kind: str = "damaged") -> Path:
    """Rename a damaged (``kind="unsafe"``: code-holding) checkpoint to ``<name>.<kind>`` (``.<kind>2``, ... if taken),
    out of what ``--resume auto`` and pruning look at; returns the new path."""
    for n in range(1, 1000):
        target = aside(path, kind, n)
        if not target.exists():
            os.replace(path, target)
            return target
    raise CheckpointError(f"cannot rename the {kind} {path}: too many .{kind} copies beside it")


def config_changes(before: Mapping[str, Any], now: Mapping[str, Any], ignore: tuple[str, ...] = (),
                   defaults: Optional[Mapping[str, Mapping[str, Any]]] = None) -> list[str]:
    """``"section.key: old -> new"`` (values as JSON writes them) for every setting, but those in ``ignore``, that
    differs between two ``Config.to_dict()`` dicts, or that only one has; a key ``before`` lacks (recorded before the
    key existed) is no change where ``now`` holds its default (``defaults``: ``Config.defaults()``)."""
    changes = []
    for section in sorted(set(before) | set(now)):
        old, new = before.get(section, {}), now.get(section, {})
        if not isinstance(old, Mapping) or not isinstance(new, Mapping):
            continue
        known = {**(defaults or {}).get(section, {}), **old}
        changes += [f"{section}.{key}: {as_json(old.get(key, 'unset'))} -> {as_json(new.get(key, 'unset'))}"
                    for key in sorted(set(old) | set(new))
                    if f"{section}.{key}" not in ignore and known.get(key, "unset") != new.get(key, "unset")]
    return changes


def as_json(value: Any) -> str:
    """A config value as ``config.json`` and ``--set`` write it (``true``, ``null``, ``[1, 2]``); a string as is."""
    return value if isinstance(value, str) else json.dumps(list(value) if isinstance(value, tuple) else value)


def saved_config(saved: Mapping[str, Any]) -> dict[str, Any]:
    """The config a checkpoint's run trained with (``{}``: none; a section that is no dict left out), read as this
    version reads it (``recorded_audio``, ``read_moved``)."""
    config = saved.get("config") if isinstance(saved.get("config"), Mapping) else {}
    config = {section: keys for section, keys in config.items() if isinstance(keys, Mapping)}
    config = read_moved(config, saved.get("model_name"))
    if isinstance(config.get("audio"), Mapping):
        config = {**config, "audio": recorded_audio(config["audio"])}
    return config


def warn_changes(saved: Mapping[str, Any], path, before: Mapping[str, Any], config: Optional[Config],
                 train_utterances: Optional[int]) -> None:
    """Rank 0's warnings on a resume: settings of ``config`` that differ from ``before`` (but ``train.max_steps``), a
    corpus of another size than the checkpoint's."""
    ignored = ("train.max_steps", "data.speakers")  # the speaker map: the data's, verified on its own
    if config is not None and before and (changes := config_changes(before, config.to_dict(), ignored,
                                                                     config.defaults())):
        print(f"warning: the config differs from the one {path} was trained with: {'; '.join(changes)}",
              file=sys.stderr, flush=True)
    if train_utterances is not None and (known := saved.get("train_utterances")) not in (None, train_utterances):
        print(f"warning: the corpus changed since {path} ({known} -> {train_utterances} training utterances): the "
              "run continues from its step, but the epoch's order and position are not the ones it stopped at",
              file=sys.stderr, flush=True)


def world_size_change(written_by: int, accumulation: int, world_size: int, batch_size: int,
                      requested: int) -> tuple[int, Optional[str]]:
    """``(grad_accumulation, line saying so)`` on a resume of ``written_by`` processes' checkpoint (``requested``:
    unused): the global batch, ``batch_size * grad_accumulation * world_size``, kept where it divides, else closest."""
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
