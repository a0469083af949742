"""The run's one checkpoint owner (:class:`Checkpointer`), after torchtitan's ``CheckpointManager(states={...})``."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Optional

import torch

from distributed import CollectiveError, DistInfo, all_gather_object, collective, reduce_tensor, split_over_ranks
from utils.checkpoint.files import CheckpointError, load_model_state
from utils.checkpoint.names import last_checkpoint, last_good_checkpoint
from utils.checkpoint.resume import (Formats, check_training_state, folder_reader, read_checkpoint, saved_config,
                                     warn_changes)
from utils.checkpoint.state import (STATEFUL_PARTS, NamedStates, capture_rng_state, checkpoint_bytes, entries_problem,
                                    load_part, restore_rng_state, save_checkpoint, takes_links, training_checkpoint)
from utils.errors import TrainingError
from utils.run import GracePeriod, git_commit
from utils.run_log import RunLog, one_line
from utils.train_state import TrainState


def nonfinite_weight(model: torch.nn.Module) -> Optional[str]:
    """The first floating-point parameter or buffer of ``model`` (this rank's shard) holding NaN or inf, or ``None``.
    One device synchronisation."""
    named = [(name, tensor.to_local() if split_over_ranks(tensor) else tensor)
             for name, tensor in [*model.named_parameters(), *model.named_buffers()] if tensor.is_floating_point()]
    if not named:
        return None
    finite = torch.stack([torch.isfinite(tensor.detach()).all() for _, tensor in named]).cpu()
    return None if bool(finite.all()) else named[int((~finite).nonzero()[0])][0]


class Checkpointer:
    """Saves a run's named stateful parts as one file (``ddp``: rank 0, :func:`training_checkpoint`'s layout) or one
    sharded folder (``fsdp``: every rank, ``formats.folder``), with every rank's RNG states, and loads either back.
    Every rank builds it (a background save's process group is made here) and calls its methods together;
    :meth:`save`, :meth:`poll`, :meth:`finish` follow :meth:`start`. ``parts``: ``"model"`` (plain or FSDP-sharded,
    never a DDP wrapper), ``"optimizer"``, ``"scheduler"``, ``"scaler"`` (``state_dict``/``load_state_dict``; several
    phases' as one :class:`NamedStates`), ``"ema"`` (an EMA or None) and ``"position"`` (the loop's :class:`TrainState`,
    updated in place by :meth:`load`). ``train``: the ``train`` settings; ``formats``: the checkpoint formats the
    project reads besides single files."""

    def __init__(self, parts: Mapping[str, Any], output_dir: Path, dist: DistInfo, train: Any, formats: Formats):
        self.parts, self.output_dir, self.dist, self.keep_last = parts, Path(output_dir), dist, train.keep_last
        self.model: torch.nn.Module = parts["model"]
        self.position: TrainState = parts["position"]
        self.formats = formats
        self.sharded = formats.folder if train.sharded else None
        self.writer = None if self.sharded is None else self.sharded.ShardedCheckpointer(
            output_dir, dist.rank, train.async_checkpoint, train.keep_last, train.dist_timeout_s)
        self.log: Optional[RunLog] = None
        self.info: dict[str, Any] = {}
        self.origin: Optional[Path] = None  # the checkpoint :meth:`load` read, until a save of this run completes
        self.grace = GracePeriod(os.environ)

    def start(self, log: RunLog, info: Mapping[str, Any]) -> None:
        """Ready the loop's saves: ``log`` says what each one wrote, ``info`` is their provenance (``model_name``,
        ``config``, ...); rank 0 warns where a save cannot fit the grace period after a stop signal
        (:class:`utils.run.GracePeriod`; its test write raises :class:`CheckpointError` on a full disk)."""
        self.log, self.info = log, dict(info)
        if not self.dist.is_main:  # under FSDP every rank writes its own shards, in parallel
            return
        nbytes = checkpoint_bytes([self.model], averages=int(self.parts.get("ema") is not None))
        if self.writer is not None:
            nbytes //= self.dist.world_size
        elif not takes_links(self.output_dir):
            nbytes *= 2
        try:
            warning = self.grace.check_estimate(nbytes, self.output_dir)
        except CheckpointError:
            log.close()  # the progress bar's line ends before the error's
            raise
        if warning is not None:
            log.print(warning)

    def save(self, step_s: float) -> None:
        """Save every part at ``position.step`` (:meth:`write`, raising what it raises) with :meth:`start`'s provenance,
        torch's version and the git commit, and say so; ``step_s``: the step before (seconds), for the grace period."""
        t_save, step, is_main = time.perf_counter(), self.position.step, self.dist.is_main
        path = self.write(dict(self.info, torch_version=str(torch.__version__),
                               git_commit=git_commit() if is_main else None))
        if self.writer is None or not self.writer.async_save:
            self.origin = None  # saved: the weights since are this run's (a background save: once it completes)
        if path is not None:
            background = self.writer is not None and self.writer.async_save
            self.log.print(f"step {step}: " + (f"saving {path} in the background" if background else f"saved {path}"))
        if is_main and (warning := self.grace.check_save(step, time.perf_counter() - t_save, step_s)) is not None:
            self.log.print(warning)

    def write(self, info: Mapping[str, Any]) -> Optional[Path]:
        """Write every part at ``position.step``, with the provenance ``info`` stored as is: the file (rank 0) or the
        folder (every rank; with ``train.async_checkpoint`` still being written), else ``None``. A
        :class:`TrainingError` where the weights are not finite on some rank (nothing saved; it names ``checkpoint_last``
        as the last good checkpoint, but not the checkpoint the run loaded while no save has followed: the one before
        it), a :class:`CheckpointError` where a file could not be written (a full disk; earlier checkpoints are kept)."""
        dist, step, ema = self.dist, self.position.step, self.parts.get("ema")
        broken = nonfinite_weight(self.model)
        if reduce_tensor(torch.tensor([float(broken is not None)], device=dist.device), op="sum").item():
            good = last_checkpoint(self.output_dir) if self.origin is None else \
                last_good_checkpoint(self.output_dir, step, 0, self.origin)
            raise TrainingError(f"step {step}: the weights are not finite ({broken or 'on another rank'}): not "
                                f"saved; last good checkpoint: {good}")
        rng = all_gather_object(capture_rng_state())
        info = dict(info)
        if ema is not None:  # sharded: every rank writes its shards of the averages too
            info.update({"ema_saved": True} if self.writer is not None else {"ema": ema.state_dict()})
        if self.writer is None:
            if not dist.is_main:
                return None
            saved = training_checkpoint(self.model, self.parts, self.position, rng, **info)
            return save_checkpoint(self.output_dir, saved, step, self.keep_last)
        self.sharded.broadcast_buffers(self.model)  # rank 0's running statistics, whichever rank's copy DCP writes
        train_state = self.sharded.sharded_train_state(self.parts, self.position, rng, **info) if dist.is_main else None
        with collective("sharded checkpoint save"):
            return self.writer.save(step, self.model, self._optimizers(), train_state,
                                    extra={"ema": ema.state_dict()} if ema is not None else None)

    def suspect(self) -> Optional[Path]:
        """The checkpoint :meth:`load` read, while no save of this run has completed since, when the weights are not
        finite (on some rank): they came from it, so no message names it a good checkpoint; else ``None``. Every rank
        calls it together (one all-reduce)."""
        broken = nonfinite_weight(self.model) is not None
        if reduce_tensor(torch.tensor([float(broken)], device=self.dist.device), op="sum").item():
            return self.origin
        return None

    def poll(self) -> None:
        """Complete a background save that has finished, and say so (cheap: call it every step)."""
        if self.writer is not None and (done := self.writer.poll()) is not None:
            self.origin = None
            self.log.print(f"step {self.position.step}: saved {done} (written in the background)")

    def finish(self) -> None:
        """Wait for a background save (``train.async_checkpoint``), then complete it: no run ends with half a save. A
        :class:`CheckpointError` or ``CollectiveError`` where it failed (earlier checkpoints are kept)."""
        if self.writer is None or self.writer.pending is None:
            return
        with collective("background checkpoint save"):
            done = self.writer.wait()
        self.origin = None
        self.log.print(f"saved {done} (written in the background)")

    def finish_after_error(self) -> None:
        """On an error, still finish the last background save, or say in one line that the previous one is intact."""
        try:
            self.finish()
        except (CheckpointError, CollectiveError) as err:
            self.log.print(f"warning: the background checkpoint save did not finish ({one_line(err)}); the previous "
                           "checkpoint is intact")

    def load(self, path: str | Path, model_name: str, config: Optional[Mapping[str, Any]] = None,
             train_utterances: Optional[int] = None, saved: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        """Put a checkpoint (a file, or a sharded folder re-cut for this world size) back into every part: the EMA
        afresh from the weights when it has none, the position (``samples_in_epoch`` worked out for an older one), the
        RNG states on the same world size. Rank 0 warns about changed settings of ``config`` (``Config.to_dict()``) and
        ``train_utterances`` (:func:`warn_changes`). ``saved``: its entries where the caller read them already
        (:func:`read_checkpoint` on this device). Returns the rest: ``{"world_size": processes that wrote it,
        "grad_accumulation", "config", "tracker_runs": {tracker: run id}}``; a :class:`CheckpointError` for an
        unreadable or unsafe file, another model, entries not as ``train.py`` writes them (``entries_problem``),
        weights or states that do not fit (``load_part``), or a weights-only file."""
        rank, sharded = self.dist.rank, folder_reader(path, self.formats.folder)
        if saved is None:  # rank 0 verifies a sharded folder's files
            saved = read_checkpoint(path, self.dist.device, verify=rank == 0, formats=self.formats)
        self.origin = Path(path).parent / os.readlink(path) if Path(path).is_symlink() else Path(path)
        if saved.get("model_name") != model_name:
            raise CheckpointError(f"{path} holds a '{saved.get('model_name')}' model, not '{model_name}'")
        if (problem := entries_problem(saved)) is not None:  # every rank's rng entry too: all ranks stop alike
            raise CheckpointError(f"{path} is malformed ({problem})")
        if not sharded:  # the weights first: a state dict of another network is named key by key
            load_model_state(self.model, saved["model"], str(path))
        check_training_state(saved, path, sharded is not None)
        self._load_parts(saved, path, sharded)
        before = saved_config(saved)
        written_by = len(saved["rng"])
        if written_by == self.dist.world_size:
            restore_rng_state(saved["rng"][rank])
        if rank == 0:
            warn_changes(saved, path, before, config, train_utterances)
        position = self.position
        for field in dataclasses.fields(TrainState):
            if field.name in saved:
                setattr(position, field.name, saved[field.name])
        if "samples_in_epoch" not in saved:  # written before the position was kept in global samples
            batch_size = before.get(model_name, {}).get("batch_size", 0)
            position.samples_in_epoch = position.batch_in_epoch * batch_size * written_by
        accumulation = saved.get("grad_accumulation", before.get("train", {}).get("grad_accumulation", 1))
        return {"world_size": written_by, "grad_accumulation": accumulation, "config": before,
                "tracker_runs": saved.get("tracker_runs", {})}

    def _optimizers(self) -> list:
        optimizer = self.parts["optimizer"]
        return list(optimizer.values()) if isinstance(optimizer, NamedStates) else [optimizer]

    def _load_parts(self, saved: Mapping[str, Any], path, sharded) -> None:
        """Put back the optimizer(s), scheduler(s), scaler and EMA (and a sharded folder's model: ``sharded`` is then
        ``formats.folder``); :class:`CheckpointError` where the EMA or a sharded entry does not fit."""
        ema = self.parts.get("ema")
        with_ema = ema is not None and (saved.get("ema_saved", False) if sharded else "ema" in saved)
        if sharded:
            sharded.load_sharded(path, self.model, self._optimizers(), extra={"ema": ema.averages} if with_ema else None)
        elif with_ema:
            try:
                ema.load_state_dict(saved["ema"], str(path))
            except ValueError as err:
                raise CheckpointError(str(err)) from None
        if ema is not None and not with_ema:
            ema.reset()
            if self.dist.rank == 0:
                print(f"note: {path} holds no EMA weights; the average (train.ema_decay) starts from its weights",
                      file=sys.stderr, flush=True)
        for name in STATEFUL_PARTS:
            if not (sharded and name == "optimizer"):
                load_part(self.parts[name], saved[name], name, path)
