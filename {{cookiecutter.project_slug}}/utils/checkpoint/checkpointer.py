"""The run's one checkpoint owner (:class:`Checkpointer`): it holds the named stateful parts of a run and writes them
as one file (``ddp``: rank 0) or one sharded folder (``fsdp``: every rank, through :mod:`utils.checkpoint.sharded`),
and puts a checkpoint of either kind back into them. After torchtitan's ``CheckpointManager(states={...})``."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any, Mapping, Optional

import torch

from distributed import DistInfo, all_gather_object, broadcast_buffers, collective, reduce_tensor, split_over_ranks
from utils.checkpoint.files import CheckpointError, load_model_state
from utils.checkpoint.names import last_checkpoint
from utils.checkpoint.resume import check_training_state, folder_reader, read_checkpoint, saved_config, warn_changes
from utils.checkpoint.state import (STATEFUL_PARTS, NamedStates, capture_rng_state, checkpoint_bytes, restore_rng_state,
                                    save_checkpoint, takes_links, training_checkpoint)
from utils.errors import TrainingError
from utils.parts import optional_part
from utils.train_state import TrainState


def nonfinite_weight(model: torch.nn.Module) -> Optional[str]:
    """The name of the first floating-point parameter or buffer of ``model`` holding NaN or inf (this rank's shard of it
    under FSDP), or ``None``. One device synchronisation."""
    named = [(name, tensor.to_local() if split_over_ranks(tensor) else tensor)
             for name, tensor in [*model.named_parameters(), *model.named_buffers()] if tensor.is_floating_point()]
    if not named:
        return None
    finite = torch.stack([torch.isfinite(tensor.detach()).all() for _, tensor in named]).cpu()
    return None if bool(finite.all()) else named[int((~finite).nonzero()[0])][0]


class Checkpointer:
    """Saves and loads a run's named stateful parts. Every rank builds it (a background save's process group is made
    here) and calls :meth:`save` and :meth:`load` together.

    ``parts``: ``"model"`` (plain or FSDP-sharded, never a DDP wrapper), ``"optimizer"``, ``"scheduler"``, ``"scaler"``
    (each with ``state_dict``/``load_state_dict``; several phases' as one :class:`NamedStates`), ``"ema"`` (an
    ``utils.training.ema.EMA`` or None) and ``"position"`` (the loop's :class:`TrainState`, updated in place by
    :meth:`load`); the owner adds every rank's RNG states. The file keeps the layout of
    :func:`utils.checkpoint.state.training_checkpoint` (the position's fields and provenance at the top level).
    ``train``: the ``train`` settings (``sharded``, ``keep_last``; with sharding ``async_checkpoint``,
    ``dist_timeout_s``).
    """

    def __init__(self, parts: Mapping[str, Any], output_dir: Path, dist: DistInfo, train: Any):
        self.parts, self.output_dir, self.dist, self.keep_last = parts, Path(output_dir), dist, train.keep_last
        # utils.checkpoint.sharded for a sharded run (never in a project without the sharding part), else None
        self.sharded = optional_part("utils.checkpoint.sharded") if train.sharded else None
        self.writer = None if self.sharded is None else self.sharded.ShardedCheckpointer(
            output_dir, dist.rank, train.async_checkpoint, train.keep_last, train.dist_timeout_s)

    @property
    def model(self) -> torch.nn.Module:
        """The model part."""
        return self.parts["model"]

    @property
    def position(self) -> TrainState:
        """The loop's position part."""
        return self.parts["position"]

    def save_bytes(self) -> int:
        """About how many bytes one save makes this rank write: its shards under FSDP, else the file (twice where
        ``checkpoint_last.pt`` must be a copy, not a link)."""
        sharded = self.writer is not None
        nbytes = checkpoint_bytes([self.model], averages=int(self.parts.get("ema") is not None))
        nbytes //= self.dist.world_size if sharded else 1
        return nbytes * (1 if sharded or takes_links(self.output_dir) else 2)

    def save(self, info: Mapping[str, Any]) -> Optional[Path]:
        """Save every part at ``position.step``, with the provenance ``info`` stored as is (``model_name``, ``config``,
        ``torch_version``, ...). Returns the file (rank 0) or the folder (every rank; with ``async_save`` a folder still
        being written in the background); ``None`` on the ranks that write nothing.

        Raises:
            TrainingError: the weights are not finite on some rank (nothing is saved).
            CheckpointError: a file could not be written (a full disk); earlier checkpoints are kept.
        """
        dist, step, ema = self.dist, self.position.step, self.parts.get("ema")
        broken = nonfinite_weight(self.model)
        if reduce_tensor(torch.tensor([float(broken is not None)], device=dist.device), op="sum").item():
            raise TrainingError(f"step {step}: the weights are not finite ({broken or 'on another rank'}): not "
                                f"saved; last good checkpoint: {last_checkpoint(self.output_dir)}")
        rng = all_gather_object(capture_rng_state())
        info = dict(info)
        if ema is not None:  # sharded: every rank writes its shards of the averages too
            info.update({"ema_saved": True} if self.writer is not None else {"ema": ema.state_dict()})
        if self.writer is None:
            if not dist.is_main:
                return None
            saved = training_checkpoint(self.model, self.parts, self.position, rng, **info)
            return save_checkpoint(self.output_dir, saved, step, self.keep_last)
        broadcast_buffers(self.model)  # rank 0's running statistics, whichever rank's copy DCP writes
        train_state = self.sharded.sharded_train_state(self.parts, self.position, rng, **info) if dist.is_main else None
        with collective("sharded checkpoint save"):
            return self.writer.save(step, self.model, self._optimizers(), train_state,
                                    extra={"ema": ema.state_dict()} if ema is not None else None)

    @property
    def async_save(self) -> bool:
        """Whether :meth:`save` writes sharded folders in the background (``train.async_checkpoint``)."""
        return self.writer is not None and self.writer.async_save

    def poll(self) -> Optional[Path]:
        """Complete a background save that has finished: its folder, or ``None`` (cheap: call it every step)."""
        return self.writer.poll() if self.writer is not None else None

    def wait(self) -> Optional[Path]:
        """Wait for a background save, then complete it: its folder, or ``None`` without one.

        Raises:
            CheckpointError, CollectiveError: the background save failed (earlier checkpoints are kept).
        """
        if self.writer is None or self.writer.pending is None:
            return None
        with collective("background checkpoint save"):
            return self.writer.wait()

    def load(self, path: str | Path, model_name: str, config: Optional[Mapping[str, Any]] = None,
             train_utterances: Optional[int] = None) -> dict[str, Any]:
        """Put a checkpoint (a file, or a sharded folder re-cut for this world size) back into every part: the model,
        optimizer(s), scheduler(s), scaler, the EMA (afresh from the weights when the checkpoint has none), the
        position (``samples_in_epoch`` worked out for an older checkpoint) and this rank's RNG states (on the same
        world size only). Rank 0 warns about settings of ``config`` (``Config.to_dict()``) that differ,
        ``train.max_steps`` aside (raising it continues a run), and about another number of ``train_utterances``.

        Returns:
            What was saved beyond the parts: ``{"world_size": processes that wrote it, "grad_accumulation": its
            accumulation, "config": its config}``.

        Raises:
            CheckpointError: an unreadable or unsafe file, another model, weights that do not fit, or a weights-only
                file that lacks the training state.
        """
        rank, sharded = self.dist.rank, folder_reader(path)
        saved = read_checkpoint(path, self.dist.device, verify=rank == 0)  # rank 0 verified a sharded folder's files
        if saved.get("model_name") != model_name:
            raise CheckpointError(f"{path} holds a '{saved.get('model_name')}' model, not '{model_name}'")
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
        return {"world_size": written_by, "grad_accumulation": accumulation, "config": before}

    def _optimizers(self) -> list:
        optimizer = self.parts["optimizer"]
        return list(optimizer.values()) if isinstance(optimizer, NamedStates) else [optimizer]

    def _load_parts(self, saved: Mapping[str, Any], path, sharded) -> None:
        """Put back the optimizer(s), scheduler(s), scaler and EMA (and a sharded folder's model); raises
        :class:`CheckpointError` where the EMA or a sharded entry does not fit this run. ``sharded``: the module that
        reads a sharded folder (:func:`folder_reader`), or None for a file."""
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
                self.parts[name].load_state_dict(saved[name])
