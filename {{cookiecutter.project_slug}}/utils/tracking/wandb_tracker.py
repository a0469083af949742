"""Weights & Biases as a tracker (``train.trackers: ["wandb"]``): one W&B run per training run, continued on a resume
(its id is saved in each checkpoint), in project ``train.tracker_project``, else ``WANDB_PROJECT``, else the project's
name. W&B's own variables (``WANDB_MODE``, ``WANDB_DIR``, ``WANDB_ENTITY``, ``WANDB_API_KEY``, ``WANDB_BASE_URL``, ...)
are left to the library; without ``WANDB_DIR`` its files go to ``<output_dir>/wandb``. The run gets the resolved config
(and the run's metadata under ``metadata``) as its config, the scalars at their training steps (``wandb.log`` hands
them to W&B's own process: the step does not wait for the network), images as ``wandb.Image``, audio as
``wandb.Audio`` and the checkpoint as a ``model`` artifact.

Start-up is bounded: the online attempt gets half of what is left of ``train.tracker_start_timeout_s`` (W&B's
``init_timeout``); when it fails (no network, no API key, a server that does not answer) the run is logged offline, with one warning naming
the ``wandb sync`` line. W&B does not resume a run offline: each start writes a new ``offline-run-*-<id>`` folder with
the same run id, and ``wandb sync`` uploads a run id's folders one after another in start order. So that no step is
logged twice after a fallback resume, :attr:`WandbTracker.last_step` is the higher of the resumed online run's last
step and the last step this run id logged from this output folder (:data:`LAST_STEP`, written at ``close``).
Source: https://docs.wandb.ai/ref/python/sdk/functions/init/"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import numpy

from utils.run_log import one_line
from utils.tracking import TrackerContext, project_name, warn

LAST_STEP = "wandb_last_step.json"
"""In the output folder: ``{"id": run id, "step": the last step it logged from here}``, written at ``close``."""


def logged_step(path: Path, run_id: str) -> int:
    """The step :data:`LAST_STEP` ``path`` holds for ``run_id`` (0: none, another run's, or unreadable)."""
    try:
        saved = json.loads(path.read_text())
        return int(saved["step"]) if saved.get("id") == run_id else 0
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return 0


class WandbTracker:
    """A started W&B run (``wandb.init``'s ``Run``), online or offline."""

    name = "wandb"

    def __init__(self, wandb: Any, run: Any, output_dir: Path):
        self.wandb, self.run, self.run_id = wandb, run, run.id
        self.marker = output_dir / LAST_STEP
        online = run.starting_step - 1 if run.resumed else 0  # W&B resumes at the step after the last one it holds
        self.last_step = self.logged = max(online, logged_step(self.marker, run.id), 0)

    def _log(self, values: dict[str, Any], step: int) -> None:
        self.run.log(values, step=step)
        self.logged = max(self.logged, step)

    def add_scalars(self, scalars: dict[str, float], step: int) -> None:
        self._log(scalars, step)

    def add_image(self, tag: str, image: numpy.ndarray, step: int) -> None:
        self._log({tag: self.wandb.Image(image)}, step)

    def add_audio(self, tag: str, audio: numpy.ndarray, step: int, sampling_rate: int) -> None:
        self._log({tag: self.wandb.Audio(audio, sample_rate=sampling_rate)}, step)

    def log_artifact(self, path: Path) -> None:
        artifact = self.wandb.Artifact(f"checkpoint-{self.run_id}", type="model")
        if path.is_dir():  # a sharded checkpoint
            artifact.add_dir(str(path), name=path.name)
        else:
            artifact.add_file(str(path))
        self.run.log_artifact(artifact)

    def close(self) -> None:
        """Note the last step logged (:data:`LAST_STEP`), then finish the run: exit code 1 when closed by an error."""
        self.marker.write_text(json.dumps({"id": self.run_id, "step": self.logged}))
        self.run.finish(exit_code=1 if sys.exc_info()[0] else 0)


def start(ctx: TrackerContext) -> WandbTracker:
    """The W&B run of ``ctx`` (``ctx.run_id``: continued), online within about half of
    ``train.tracker_start_timeout_s``, else offline with one warning. Raises what an offline ``wandb.init`` raises (``wandb.Error``, ``OSError``)."""
    began = time.monotonic()
    import wandb  # seconds on a busy machine: part of the start-up time

    options = dict(project=project_name(ctx, "WANDB_PROJECT"), name=ctx.run_name, id=ctx.run_id, resume="allow",
                   dir=None if os.environ.get("WANDB_DIR") else str(ctx.output_dir),
                   config={**ctx.config, "metadata": ctx.metadata})
    # The online attempt gets half the start-up time left, the offline fallback the rest. quiet: W&B skips its
    # "logged in as" account look-up, which init_timeout does not bound (5 s, asked twice without a network).
    left = ctx.settings.tracker_start_timeout_s - (time.monotonic() - began)
    settings = wandb.Settings(init_timeout=max(left / 2, 1.0), quiet=True)
    try:
        if os.environ.get("WANDB_MODE", "online") in ("online", "run"):
            server_reachable(min(5.0, max(left / 4, 1.0)))
        run = wandb.init(**options, settings=settings)
    except (wandb.Error, OSError) as err:  # no network or no answer; UsageError, AuthenticationError: no or bad key
        wandb.teardown()  # W&B's service still holds the failed run's id
        run = wandb.init(**options, mode="offline", settings=wandb.Settings(quiet=True))
        folder = Path(run.dir).parent
        warn(f"wandb: {one_line(err)}; logging offline in {folder} instead: upload it later with `wandb sync {folder}`")
    return WandbTracker(wandb, run, ctx.output_dir)


def server_reachable(timeout_s: float) -> None:
    """Open and close a TCP connection to W&B's server (``WANDB_BASE_URL``, default https://api.wandb.ai) within
    ``timeout_s`` seconds: without one, an online run's uploads are retried for as long as the process lives (wandb
    before 0.31, which a project beside SkyPilot gets, also keeps the process from exiting). Raises OSError."""
    url = urllib.parse.urlsplit(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai")
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout_s).close()
    except OSError as err:
        raise OSError(f"W&B's server {url.hostname}:{port} cannot be reached ({err.strerror or err})") from None
