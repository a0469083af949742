"""Where the training loop is (:class:`TrainState`): advanced by the loop, kept by the batch stream, saved by the
checkpoints; below all three, so that none imports another for it."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping


@dataclasses.dataclass
class TrainState:
    """Where the training loop is; a stateful part of the checkpoints (``state_dict``/``load_state_dict``)."""

    step: int = 0  # optimizer steps done
    epoch: int = 0  # the epoch being read
    batch_in_epoch: int = 0  # batches of that epoch this rank has read
    skipped_steps: int = 0  # for a non-finite loss or gradient norm, or a spike (train.on_spike=skip)
    samples_in_epoch: int = 0  # of the epoch's order, all ranks together: a resume on any world size skips them
    skipped_updates: dict = dataclasses.field(default_factory=dict)  # per optimizer (phase): any cause, fp16 too
    skips_in_a_row: dict = dataclasses.field(default_factory=dict)  # per optimizer: its latest updates skipped

    def state_dict(self) -> dict[str, Any]:
        """Every field by name (copies)."""
        return dataclasses.asdict(self)

    def load_state_dict(self, entries: Mapping[str, Any]) -> None:
        """Set the fields ``entries`` holds (a checkpoint's: an older one lacks the later ones, which stay)."""
        for field in dataclasses.fields(self):
            if field.name in entries:
                setattr(self, field.name, entries[field.name])
