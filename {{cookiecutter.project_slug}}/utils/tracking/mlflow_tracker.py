"""MLflow as a tracker (``train.trackers: ["mlflow"]``): one run per training run, continued on a resume, in the
tracking store of ``MLFLOW_TRACKING_URI`` (a server, or a local store), experiment ``train.tracker_project``, else
``MLFLOW_EXPERIMENT_NAME``, else the project's name. The run gets the resolved config as parameters (``section.key``),
the run's metadata as tags, the scalars as metrics (logged asynchronously: the step never waits for the server), the
images with ``log_image`` and the audio as WAV artifacts ``audio/<tag>/step_<N>.wav``. HTTP retries are bounded
(``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, ``MLFLOW_HTTP_REQUEST_TIMEOUT``, unless set) so that a server that does not answer
costs seconds. Source: https://mlflow.org/docs/latest/api_reference/python_api/mlflow.client.html"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import numpy
import soundfile

from utils.tracking import TrackerContext, project_name

PARAM_CHARS = 500  # MLflow's historical limit on a parameter's value


def flat_params(config: dict, prefix: str = "") -> Iterator[tuple[str, str]]:
    """``(section.key, value as text)`` of a nested config, values cut to :data:`PARAM_CHARS` characters."""
    for key, value in config.items():
        if isinstance(value, dict):
            yield from flat_params(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", (value if isinstance(value, str) else json.dumps(value))[:PARAM_CHARS]


class MlflowTracker:
    """One MLflow run through ``MlflowClient`` (explicit run ids: no global active run, whichever thread calls)."""

    name = "mlflow"

    def __init__(self, mlflow: Any, ctx: TrackerContext):
        from mlflow.entities import Param, RunTag

        self.mlflow, self.client = mlflow, mlflow.MlflowClient()
        self.run_id, self.last_step = ctx.run_id, 0
        if ctx.run_id is None:
            name = project_name(ctx, "MLFLOW_EXPERIMENT_NAME")
            experiment = self.client.get_experiment_by_name(name)
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
            self.run_id = self.client.create_run(experiment_id, run_name=ctx.run_name).info.run_id
            self.client.log_batch(self.run_id, params=[Param(k, v) for k, v in flat_params(ctx.config)])
        else:  # a resume: the same run; its parameters stay those it began with (MLflow's are immutable)
            self.client.update_run(self.run_id, status="RUNNING")
            history = self.client.get_metric_history(self.run_id, "train/loss")
            self.last_step = max((metric.step for metric in history), default=0)
        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in ctx.metadata.items()])

    def add_scalars(self, scalars: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(tag, value, now, step) for tag, value in scalars.items()]
        self.client.log_batch(self.run_id, metrics=metrics, synchronous=False)

    def add_image(self, tag: str, image: numpy.ndarray, step: int) -> None:
        self.client.log_image(self.run_id, image, key=tag, step=step, synchronous=False)

    def add_audio(self, tag: str, audio: numpy.ndarray, step: int, sampling_rate: int) -> None:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / f"step_{step}.wav"
            soundfile.write(path, numpy.clip(audio, -1.0, 1.0), sampling_rate)
            self.client.log_artifact(self.run_id, str(path), artifact_path=f"audio/{tag.removeprefix('audio/')}")

    def log_artifact(self, path: Path) -> None:
        if path.is_dir():  # a sharded checkpoint
            self.client.log_artifacts(self.run_id, str(path), artifact_path=path.name)
        else:
            self.client.log_artifact(self.run_id, str(path))

    def close(self) -> None:
        """Wait for the metrics still being sent, then end the run: FINISHED, or KILLED when closed by an error."""
        self.mlflow.flush_async_logging()
        self.client.set_terminated(self.run_id, "KILLED" if sys.exc_info()[0] else "FINISHED")


def start(ctx: TrackerContext) -> MlflowTracker:
    """The run of ``ctx`` (``ctx.run_id``: continued). Raises what MLflow raises (``MlflowException``, ``OSError``)."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    import mlflow

    return MlflowTracker(mlflow, ctx)
