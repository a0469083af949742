"""MLflow as a tracker (``train.trackers: ["mlflow"]``): one run per training run, continued on a resume, in the
tracking store of ``MLFLOW_TRACKING_URI`` (a server, or a local store), experiment ``train.tracker_project``, else
``MLFLOW_EXPERIMENT_NAME``, else the project's name. The run gets the resolved config as parameters (``section.key``),
the run's metadata as tags beside those ``mlflow.start_run`` gives (``mlflow.source.name``: the entry script,
``mlflow.user``, ...; ``git_commit`` left out outside a git checkout), the scalars as metrics (logged asynchronously:
the step never waits for the server; a batch that failed, a full store, drops the tracker at the next step), the images
with ``log_image`` and the audio as WAV artifacts ``audio/<tag>/step_<N>.wav``. An experiment this creates in a SQLite
store keeps its artifacts beside the database (:func:`artifact_location`), not in ``./mlruns`` of wherever the job
started. HTTP retries are bounded (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, ``MLFLOW_HTTP_REQUEST_TIMEOUT``, unless set) so
that a server that does not answer costs seconds. MLflow's log records go to the trackers' log
(``<output_dir>/trackers.log``). Source: https://mlflow.org/docs/latest/api_reference/python_api/mlflow.client.html"""

from __future__ import annotations

import json
import os
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy
import soundfile

from utils.tracking import TrackerContext, library_log, project_name

PARAM_CHARS = 500  # MLflow's historical limit on a parameter's value
ARTIFACTS = "mlartifacts"
"""Beside a SQLite store's database: its experiments' artifacts (the name of ``mlflow server``'s own default)."""


def artifact_location(uri: str, experiment: str) -> Optional[str]:
    """Where a new experiment named ``experiment`` of the tracking store ``uri`` keeps its runs' artifacts: for a SQLite
    database file (``sqlite:///<path>``, a relative path from the working folder), ``<its folder>/``:data:`ARTIFACTS`
    ``/<experiment, %-quoted>`` as a ``file:`` URI (each run's in ``<run id>/artifacts`` there); else None, MLflow's
    choice (a file store keeps them in its own folder, a server where it is told; MLflow's for SQLite, ``./mlruns``,
    would follow the working folder of each job). An experiment's location is fixed when it is created: an existing
    one keeps its own (``mlflow experiments create --artifact-location``)."""
    database = uri.removeprefix("sqlite:///").split("?", 1)[0] if uri.startswith("sqlite:///") else ""
    if database in ("", ":memory:"):
        return None
    return (Path(database).resolve().parent / ARTIFACTS / urllib.parse.quote(experiment, safe="")).as_uri()


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
        from mlflow.tracking.context.registry import resolve_tags

        self.mlflow, self.client = mlflow, mlflow.MlflowClient()
        self.run_id, self.last_step, self.pending = ctx.run_id, 0, []
        if ctx.run_id is None:
            name = project_name(ctx, "MLFLOW_EXPERIMENT_NAME")
            experiment = self.client.get_experiment_by_name(name)
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(
                name, artifact_location=artifact_location(mlflow.get_tracking_uri(), name))
            self.run_id = self.client.create_run(experiment_id, run_name=ctx.run_name).info.run_id
            self.client.log_batch(self.run_id, params=[Param(k, v) for k, v in flat_params(ctx.config)])
        else:  # a resume: the same run; its parameters stay those it began with (MLflow's are immutable)
            self.client.update_run(self.run_id, status="RUNNING")
            history = self.client.get_metric_history(self.run_id, "train/loss")
            self.last_step = max((metric.step for metric in history), default=0)
        # mlflow.start_run's tags (source, user, ...), then the metadata known (no git_commit outside a git checkout)
        tags = resolve_tags({key: str(value) for key, value in ctx.metadata.items() if value is not None})
        self.client.log_batch(self.run_id, tags=[RunTag(key, value) for key, value in tags.items()])

    def failed_batch(self) -> None:
        """Raise the error of a scalars batch sent earlier that failed (MLflow logs it and goes on: a full store fails
        every later one too), so that the fan-out drops this tracker. ``RunOperations`` offers only a blocking ``wait``
        (``close`` calls it); its futures say, without waiting, whether it is done."""
        still = []
        for operations in self.pending:
            futures = getattr(operations, "_operation_futures", None)
            if futures is None or not all(future.done() for future in futures):
                still.append(operations)
                continue
            for future in futures:
                if (error := future.exception()) is not None:
                    raise error
        self.pending = still

    def add_scalars(self, scalars: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        self.failed_batch()
        now = int(time.time() * 1000)
        metrics = [Metric(tag, value, now, step) for tag, value in scalars.items()]
        self.pending.append(self.client.log_batch(self.run_id, metrics=metrics, synchronous=False))

    def add_image(self, tag: str, image: numpy.ndarray, step: int) -> None:
        self.failed_batch()
        self.client.log_image(self.run_id, image, key=tag, step=step, synchronous=False)

    def add_audio(self, tag: str, audio: numpy.ndarray, step: int, sampling_rate: int) -> None:
        self.failed_batch()
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / f"step_{step}.wav"
            soundfile.write(path, numpy.clip(audio, -1.0, 1.0), sampling_rate)
            self.client.log_artifact(self.run_id, str(path), artifact_path=f"audio/{tag.removeprefix('audio/')}")

    def log_artifact(self, path: Path) -> None:
        if path.is_dir():  # a sharded checkpoint
            self.client.log_artifacts(self.run_id, str(path), artifact_path=path.name)
        else:
            self.client.log_artifact(self.run_id, str(path))

    def close(self, failed: bool) -> None:
        """Wait for the metrics still being sent (raising the error of a batch that failed), then end the run: FINISHED,
        or KILLED when ``failed``."""
        self.mlflow.flush_async_logging()
        for operations in self.pending:
            operations.wait()
        self.client.set_terminated(self.run_id, "KILLED" if failed else "FINISHED")


def start(ctx: TrackerContext) -> MlflowTracker:
    """The run of ``ctx`` (``ctx.run_id``: continued). Raises what MLflow raises (``MlflowException``, ``OSError``)."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    import mlflow

    library_log(ctx.output_dir, "mlflow", "alembic")  # alembic: a new SQLite store's set-up
    return MlflowTracker(mlflow, ctx)
