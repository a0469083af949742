"""TensorBoard as a tracker: the run's event files in ``TrackerContext.tensorboard_dir`` (a resumed run's events after
the step resumed from are purged: TensorBoard's own rewind)."""

from __future__ import annotations

from pathlib import Path

import numpy

from utils.run_log import tensorboard_writer
from utils.tracking import TrackerContext


class TensorBoard:
    """A ``SummaryWriter`` behind the :class:`~utils.tracking.Tracker` methods. No run id; no files as artifacts."""

    name, run_id, last_step = "tensorboard", None, 0

    def __init__(self, ctx: TrackerContext):
        self.writer = tensorboard_writer(ctx.tensorboard_dir, ctx.resumed_step)

    def add_scalars(self, scalars: dict[str, float], step: int) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)

    def add_image(self, tag: str, image: numpy.ndarray, step: int) -> None:
        self.writer.add_image(tag, image, step, dataformats="HWC")

    def add_audio(self, tag: str, audio: numpy.ndarray, step: int, sampling_rate: int) -> None:
        self.writer.add_audio(tag, audio, step, sample_rate=sampling_rate)

    def add_text(self, tag: str, text: str, step: int) -> None:
        self.writer.add_text(tag, text, step)

    def log_artifact(self, path: Path) -> None:
        pass

    def close(self, failed: bool = False) -> None:
        self.writer.close()


def start(ctx: TrackerContext) -> TensorBoard:
    return TensorBoard(ctx)
