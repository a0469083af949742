"""The errors that cross floors: raised by the checkpoint and training code, caught by the entry scripts (each prints
one ``ERROR:`` line). Here, on the lowest floor, so a module raising one imports nothing above it. Imports nothing."""


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable, unsafe, or does not fit the model."""


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. a non-finite loss with ``train.on_nonfinite=stop``)."""
