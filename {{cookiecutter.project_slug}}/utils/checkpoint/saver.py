"""The loop's saves over the run's :class:`~utils.checkpoint.checkpointer.Checkpointer`: the provenance each checkpoint
records, the lines that say what was saved, background saves completed, and the grace period after a stop signal.
Weights holding NaN or inf are never saved: no good checkpoint is replaced or pruned."""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from distributed import CollectiveError
from utils.checkpoint.checkpointer import Checkpointer
from utils.checkpoint.files import CheckpointError
from utils.run import GracePeriod, git_commit
from utils.run_log import RunLog, one_line


class Saver:
    """Saves the run's state at a step through ``checkpointer``, completes background saves, and warns when a save
    cannot fit the grace period after a stop signal (:class:`utils.run.GracePeriod`: at start-up from an estimate, else
    after a save too slow). ``info``: provenance every checkpoint records (``model_name``, ``config``, ...).

    Raises:
        CheckpointError: the estimate's test write fails (a full disk).
    """

    def __init__(self, checkpointer: Checkpointer, log: RunLog, info: dict[str, Any]):
        self.checkpointer, self.log, self.info = checkpointer, log, info
        self.grace = GracePeriod(os.environ)
        if checkpointer.dist.is_main:  # under FSDP every rank writes its own shards, in parallel
            try:
                warning = self.grace.check_estimate(checkpointer.save_bytes(), checkpointer.output_dir)
            except CheckpointError:
                log.close()  # the progress bar's line ends before the error's
                raise
            if warning is not None:
                log.print(warning)

    @property
    def step(self) -> int:
        """The loop's step (optimizer steps done)."""
        return self.checkpointer.position.step

    def save(self, step_s: float) -> None:
        """Save the state at the loop's step; ``step_s``: how long the step before it took (for the grace period).

        Raises:
            TrainingError: the weights are not finite on some rank (nothing is saved).
            CheckpointError: a file could not be written (a full disk); earlier checkpoints are kept.
        """
        t_save = time.perf_counter()
        is_main = self.checkpointer.dist.is_main
        info = dict(self.info, torch_version=str(torch.__version__), git_commit=git_commit() if is_main else None)
        path = self.checkpointer.save(info)
        if path is not None:
            self.log.print(f"step {self.step}: " + (f"saving {path} in the background" if self.checkpointer.async_save
                                                    else f"saved {path}"))
        if is_main and (warning := self.grace.check_save(self.step, time.perf_counter() - t_save, step_s)) is not None:
            self.log.print(warning)

    def poll(self) -> None:
        """Complete a background save that has finished (nothing else; call it every step)."""
        if (done := self.checkpointer.poll()) is not None:
            self.log.print(f"step {self.step}: saved {done} (written in the background)")

    def finish(self) -> None:
        """Wait for a background save (``train.async_checkpoint``), then complete it: no run ends with half a save."""
        if (done := self.checkpointer.wait()) is not None:
            self.log.print(f"saved {done} (written in the background)")

    def finish_after_error(self) -> None:
        """On an error, still finish the last background save, or say in one line that the previous one is intact."""
        try:
            self.finish()
        except (CheckpointError, CollectiveError) as err:
            self.log.print(f"warning: the background checkpoint save did not finish ({one_line(err)}); the previous "
                           "checkpoint is intact")
