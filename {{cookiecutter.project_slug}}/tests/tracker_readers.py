"""The experiment trackers read back with their own libraries, for the tests of ``utils/tracking``: per tracker, the
variables a job needs to log into a local store in a folder, and a reader of that store. A reader returns each run as
``{"id", "status", "params": {section.key: text}, "tags": {name: text}, "scalars": {tag: [(step, value), ...]}``
(as logged), ``"images": {tag: [steps]}, "audio": {tag: [steps]}, "files": [artifact names]}``. A tracker is added
to :data:`READERS` with its environment and reader; the tests that read every tracker pick it up."""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path
from typing import Callable, Iterator
from unittest import mock

import pytest


def mlflow_env(folder) -> dict[str, str]:
    """MLflow on a file store in ``folder/mlruns``: no server (mlflow-skinny has no SQL store). Its asynchronous
    metrics go in batches each second: its queue's flush at the end of a run, else a second's poll twice, is then
    immediate."""
    return {"MLFLOW_TRACKING_URI": f"file:{Path(folder) / 'mlruns'}", "MLFLOW_ALLOW_FILE_STORE": "true",
            "MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS": "1"}


def read_mlflow(folder) -> list[dict]:
    """Every run of the MLflow file store in ``folder`` (:func:`mlflow_env`), with ``MlflowClient``."""
    mlflow = pytest.importorskip("mlflow")
    with mock.patch.dict(os.environ, mlflow_env(folder)):
        client = mlflow.MlflowClient()
        return [_mlflow_run(client, run) for run in client.search_runs(
            [experiment.experiment_id for experiment in client.search_experiments()])]


def _mlflow_run(client, run) -> dict:
    run_id = run.info.run_id
    scalars = {key: [(m.step, m.value) for m in client.get_metric_history(run_id, key)] for key in run.data.metrics}
    images, audio = {}, {}
    for image in client.list_artifacts(run_id, "images"):  # <key>+step+<N>+timestamp+...png (and a .webp)
        if found := re.match(r"images/(.+)\+step\+(\d+)\+.*\.png$", image.path):
            images.setdefault(found[1], []).append(int(found[2]))
    for tag in client.list_artifacts(run_id, "audio"):
        audio[tag.path] = [int(clip.path.rsplit("_", 1)[1].removesuffix(".wav"))
                           for clip in client.list_artifacts(run_id, tag.path)]
    files = [item.path for item in client.list_artifacts(run_id) if not item.is_dir]
    return {"id": run_id, "status": run.info.status, "params": run.data.params, "tags": run.data.tags,
            "scalars": scalars, "images": images, "audio": audio, "files": files}


def wandb_env(folder) -> dict[str, str]:
    """W&B offline, its runs in the output folder (``<output_dir>/wandb``), its own folders (cache, staged artifacts,
    settings) under ``folder``, its console capture off and its lines silent."""
    home = Path(folder) / "wandb-home"
    return {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONSOLE": "off", "WANDB_CACHE_DIR": str(home / "cache"),
            "WANDB_DATA_DIR": str(home / "data"), "WANDB_CONFIG_DIR": str(home / "config")}


def wandb_records(path) -> Iterator:
    """The records (``wandb.proto.wandb_internal_pb2.Record``) of a ``.wandb`` file, the log ``wandb sync`` uploads: a
    7-byte header (``:W&B``, magic, version), then LevelDB's log format: 32 KiB blocks of chunks, each a 7-byte header
    (CRC-32, length, type: 1 whole record, 2 first, 3 middle, 4 last part) and its bytes; a block's last bytes, too few
    for a header, are zeros. A record cut short (a process killed while writing) ends the reading."""
    from wandb.proto import wandb_internal_pb2

    data, block = Path(path).read_bytes(), 32768
    assert data[:4] == b":W&B", path
    position, pending = 7, b""
    while position + 7 <= len(data):
        if block - position % block < 7:
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + 7])
        if position + 7 + length > len(data):
            return
        pending += data[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def flat(config: dict, prefix: str = "") -> Iterator[tuple[str, str]]:
    """``(section.key, value as text)`` of a nested config (a text as itself, anything else as JSON)."""
    for key, value in config.items():
        if isinstance(value, dict):
            yield from flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value if isinstance(value, str) else json.dumps(value)


def read_wandb(folder) -> list[dict]:
    """Every W&B run logged offline below ``folder`` (its ``offline-run-*`` folders), read from W&B's own records. W&B
    does not resume a run offline: each start of a run id writes a folder of its own; they are read in start order,
    one after another, as ``wandb sync`` uploads them. The config's ``metadata`` section is the run's tags."""
    pytest.importorskip("wandb")
    starts = {}
    for path in Path(folder).rglob("offline-run-*/run-*.wandb"):
        records = list(wandb_records(path))
        run = next(record.run for record in records if record.HasField("run"))
        starts.setdefault(run.run_id, []).append((run.start_time.ToNanoseconds(), records))
    return [wandb_run(run_id, [record for _, records in sorted(found, key=lambda each: each[0]) for record in records])
            for run_id, found in starts.items()]


def wandb_run(run_id: str, records: list) -> dict:
    """One run of :func:`read_wandb` from its ``records``, in the format of this module's readers."""
    config, scalars, media, files, status = {}, {}, {"image-file": {}, "audio-file": {}}, [], "RUNNING"
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind in ("run", "config"):
            config.update({item.key: json.loads(item.value_json)
                           for item in (record.run.config if kind == "run" else record.config).update})
        elif kind == "history":
            step = record.history.step.num
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            types = {key.removesuffix("/_type"): value for key, value in row.items() if key.endswith("/_type")}
            for tag, type_ in types.items():
                media.get(type_, {}).setdefault(tag, []).append(step)
            for key, value in row.items():  # a medium's fields (its path, size, ...) are no scalars
                if not key.startswith("_") and key.rsplit("/", 1)[0] not in types:
                    scalars.setdefault(key, []).append((step, value))
        elif kind == "artifact":
            files += [entry.path for entry in record.artifact.manifest.contents]
        elif kind == "exit":
            status = "FINISHED" if record.exit.exit_code == 0 else "FAILED"
    tags = {key: str(value) for key, value in config.pop("metadata", {}).items()}
    config.pop("_wandb", None)
    return {"id": run_id, "status": status, "params": dict(flat(config)), "tags": tags, "scalars": scalars,
            "images": media["image-file"], "audio": media["audio-file"], "files": files}


READERS: dict[str, tuple[Callable[[Path], dict], Callable[[Path], list[dict]]]] = {
    "mlflow": (mlflow_env, read_mlflow), "wandb": (wandb_env, read_wandb)}
"""tracker -> (the variables a job logging into a local store under a folder needs, the reader of that store)."""
