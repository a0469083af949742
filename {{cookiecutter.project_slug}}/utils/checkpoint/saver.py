"""The loop's checkpoints: rank 0 writes one file (``ddp``), or every rank its shards (``fsdp``, in the background with
``train.async_checkpoint``). Weights holding NaN or inf are never saved: no good checkpoint is replaced or pruned."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Optional

import torch

from distributed import (CollectiveError, all_gather_object, broadcast_buffers, collective, reduce_tensor,
                         sharded_by_fsdp, unwrap_model)
from utils.checkpoint.files import CheckpointError
from utils.checkpoint.sharded import ShardedCheckpointer, sharded_train_state
from utils.checkpoint.names import last_checkpoint
from utils.checkpoint.state import (NamedStates, TrainState, capture_rng_state, checkpoint_bytes, save_checkpoint,
                                    takes_links, training_checkpoint)
from utils.config import Config
from utils.errors import TrainingError
from utils.run import GracePeriod, git_commit
from utils.run_log import RunLog, one_line


def nonfinite_weight(model: torch.nn.Module) -> Optional[str]:
    """The name of the first floating-point parameter or buffer of ``model`` holding NaN or inf (this rank's shard of it
    under FSDP), or ``None``. One device synchronisation."""
    named = [(name, tensor.to_local() if sharded_by_fsdp(tensor) else tensor)
             for name, tensor in [*model.named_parameters(), *model.named_buffers()] if tensor.is_floating_point()]
    if not named:
        return None
    finite = torch.stack([torch.isfinite(tensor.detach()).all() for _, tensor in named]).cpu()
    return None if bool(finite.all()) else named[int((~finite).nonzero()[0])][0]


class Saver:
    """Saves the run's state at a step, completes background saves, and warns when a save cannot fit the grace period
    after a stop signal (:class:`utils.run.GracePeriod`: at start-up from an estimate, else after a save too slow).
    ``model`` may be DDP- or FSDP-wrapped; ``parts``: optimizer(s), scheduler(s), GradScaler; ``ema``: the weights'
    moving averages (``utils.training.ema.EMA``: its ``state_dict()`` is saved) or None; ``info``: provenance.
    Raises :class:`CheckpointError` when the estimate's test write fails (a full disk)."""

    def __init__(self, cfg: Config, output_dir: Path, dist, model, parts: dict, state: TrainState,
                 ema: Optional[Any], log: RunLog, info: dict[str, Any]):
        self.cfg, self.output_dir, self.dist, self.log = cfg, output_dir, dist, log
        self.model, self.parts, self.state, self.ema, self.info = model, parts, state, ema, info
        sharded = cfg.train.parallelism == "fsdp"
        self.checkpointer = ShardedCheckpointer(output_dir, dist.rank, cfg.train.async_checkpoint,
                                                cfg.train.keep_last, cfg.train.dist_timeout_s) if sharded else None
        self.grace = GracePeriod(os.environ)
        if dist.is_main:  # under FSDP every rank writes its own shards, in parallel
            nbytes = checkpoint_bytes([unwrap_model(model)], averages=int(ema is not None))
            nbytes //= dist.world_size if sharded else 1
            nbytes *= 1 if sharded or takes_links(output_dir) else 2  # checkpoint_last.pt: a link, else a copy
            try:
                warning = self.grace.check_estimate(nbytes, output_dir)
            except CheckpointError:
                log.close()  # the progress bar's line ends before the error's
                raise
            if warning is not None:
                log.print(warning)

    def save(self, step_s: float) -> None:
        """Save the state at ``state.step``; ``step_s``: how long the step before it took (for the grace period).

        Raises:
            TrainingError: the weights are not finite on some rank (nothing is saved).
            CheckpointError: a file could not be written (a full disk); earlier checkpoints are kept.
        """
        t_save = time.perf_counter()
        self._write()
        if self.dist.is_main and (warning := self.grace.check_save(self.state.step, time.perf_counter() - t_save,
                                                                   step_s)) is not None:
            self.log.print(warning)

    def _write(self) -> None:
        dist, state, ema = self.dist, self.state, self.ema
        broken = nonfinite_weight(unwrap_model(self.model))
        if reduce_tensor(torch.tensor([float(broken is not None)], device=dist.device), op="sum").item():
            raise TrainingError(f"step {state.step}: the weights are not finite ({broken or 'on another rank'}): not "
                                f"saved; last good checkpoint: {last_checkpoint(self.output_dir)}")
        rng = all_gather_object(capture_rng_state())
        info = dict(self.info, torch_version=str(torch.__version__), git_commit=git_commit() if dist.is_main else None)
        if ema is not None:  # sharded: every rank writes its shards of the averages too
            info.update({"ema_saved": True} if self.checkpointer is not None else {"ema": ema.state_dict()})
        if self.checkpointer is None:
            if dist.is_main:
                saved = training_checkpoint(self.model, self.parts, state, rng, **info)
                path = save_checkpoint(self.output_dir, saved, state.step, self.cfg.train.keep_last)
                self.log.print(f"step {state.step}: saved {path}")
            return
        broadcast_buffers(self.model)  # rank 0's running statistics, whichever rank's copy DCP writes
        optimizer = self.parts["optimizer"]
        optimizers = list(optimizer.values()) if isinstance(optimizer, NamedStates) else [optimizer]
        train_state = sharded_train_state(self.parts, state, rng, **info) if dist.is_main else None
        with collective("sharded checkpoint save"):
            path = self.checkpointer.save(state.step, self.model, optimizers, train_state,
                                          extra={"ema": ema.state_dict()} if ema is not None else None)
        self.log.print(f"step {state.step}: " + (f"saving {path} in the background" if self.checkpointer.async_save
                                                 else f"saved {path}"))

    def poll(self) -> None:
        """Complete a background save that has finished (nothing else; call it every step)."""
        if self.checkpointer is not None and (done := self.checkpointer.poll()) is not None:
            self.log.print(f"step {self.state.step}: saved {done} (written in the background)")

    def finish(self) -> None:
        """Wait for a background save (``train.async_checkpoint``), then complete it: no run ends with half a save."""
        if self.checkpointer is not None and self.checkpointer.pending is not None:
            with collective("background checkpoint save"):
                done = self.checkpointer.wait()
            self.log.print(f"saved {done} (written in the background)")

    def finish_after_error(self) -> None:
        """On an error, still finish the last background save, or say in one line that the previous one is intact."""
        try:
            self.finish()
        except (CheckpointError, CollectiveError) as err:
            self.log.print(f"warning: the background checkpoint save did not finish ({one_line(err)}); the previous "
                           "checkpoint is intact")
