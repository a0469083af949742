"""The errors that cross floors (checkpoint, training), each one ``ERROR:`` line of the entry scripts."""


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable, unsafe, or does not fit the model."""


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. a non-finite loss with ``train.on_nonfinite=stop``)."""
