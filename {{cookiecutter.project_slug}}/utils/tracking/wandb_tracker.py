"""Weights & Biases as a tracker (``train.trackers: ["wandb"]``): one W&B run per training run, continued on a resume
(its id is saved in each checkpoint), in project ``train.tracker_project``, else ``WANDB_PROJECT``, else the project's
name. W&B's own variables (``WANDB_MODE``, ``WANDB_DIR``, ``WANDB_ENTITY``, ``WANDB_API_KEY``, ``WANDB_BASE_URL``, ...)
are left to the library; without ``WANDB_DIR`` its files go to ``<output_dir>/wandb``. The run gets the resolved config
(and the run's metadata under ``metadata``) as its config, the scalars at their training steps (``wandb.log`` hands
them to W&B's own process: the step does not wait for the network), images as ``wandb.Image``, audio as
``wandb.Audio`` and the checkpoint as a ``model`` artifact.

Start-up is bounded: the server must answer an HTTP request (:func:`server_answers`) within a quarter of
``train.tracker_start_timeout_s`` (at most 5 s), then the online attempt gets half of what is left (W&B's
``init_timeout``); when either fails (no network, no API key, a server that does not answer or answers with an error)
the run is logged offline, with one warning naming the ``wandb sync`` line. So is the end: W&B's ``finish`` waits for
its service process (``wandb-core``), which waits for the server; the fan-out gives it
``train.tracker_finish_timeout_s``, then :meth:`WandbTracker.abandon` kills the service (:func:`end_service`). W&B's
console lines (``wandb: ...``) and log records go to the trackers' log (``<output_dir>/trackers.log``).

W&B does not resume a run offline: each start writes a new ``offline-run-*-<id>`` folder with the same run id, and
``wandb sync`` uploads a run id's folders one after another in start order. So that no step is logged twice after a
fallback resume, :attr:`WandbTracker.last_step` is the higher of the resumed online run's last
step and the last step this run id logged from this output folder (:data:`LAST_STEP`, written at ``close``).
Source: https://docs.wandb.ai/ref/python/sdk/functions/init/"""

from __future__ import annotations

import http.client
import json
import logging
import os
import signal
import ssl
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Union

import numpy

from utils.run import child_pids
from utils.run_log import one_line
from utils.tracking import TrackerContext, library_log, project_name, warn

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
    """A started W&B run (``wandb.init``'s ``Run``), online or offline; ``log``: where W&B's own words go."""

    name = "wandb"

    def __init__(self, wandb: Any, run: Any, output_dir: Path, log: logging.Logger):
        self.wandb, self.run, self.run_id, self.log = wandb, run, run.id, log
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

    def close(self, failed: bool) -> None:
        """Note the last step logged (:data:`LAST_STEP`), finish the run (exit code 1 when ``failed``), then end W&B's
        service (``wandb.teardown()``: W&B's exit hook has nothing left to wait for). May wait for the server."""
        self.marker.write_text(json.dumps({"id": self.run_id, "step": self.logged}))
        self.run.finish(exit_code=1 if failed else 0)
        try:
            self.wandb.teardown()
        except SystemExit as exit_:  # W&B exits the process when its service exited with an error
            raise RuntimeError(f"W&B's service exited with status {exit_.code}") from None

    def abandon(self) -> None:
        """Give the run up: W&B's service killed (what it has not uploaded is lost; offline, what it wrote stays)."""
        end_service(self.wandb, self.log)


def end_service(wandb: Any, log: logging.Logger) -> None:
    """Kill this process's W&B service (``wandb-core`` and what it started: a session of its own), then
    ``wandb.teardown()``, which then returns at once and unregisters W&B's exit hook (that would wait for the service
    forever, or print a traceback once it is gone); what W&B raises meanwhile goes to ``log``."""
    for pid in child_pids("wandb-core"):
        try:
            if os.getpgid(pid) == pid:  # its own process group, with the helpers it started (wandb-xpu)
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # it ended meanwhile
            continue
    try:
        wandb.teardown()
    except SystemExit as exit_:  # W&B exits the process with its service's status: -9, killed here
        log.warning("W&B's teardown after its service was ended: it would exit with status %s", exit_.code)
    # Third-party boundary: the lost service's connection raises what asyncio and W&B's mailbox raise.
    except Exception as err:  # noqa: BLE001
        log.warning("W&B's teardown after its service was ended: %s", one_line(err))


def quiet_setup(wandb: Any, log: logging.Logger) -> None:
    """Set W&B up for this process (``wandb.setup``) with its console lines (``wandb: ...``) going to ``log`` instead of
    stderr (``wandb.termsetup`` in silent mode with ``log`` as its logger; W&B resets it when it sets up again)."""
    wandb.setup()
    wandb.termsetup(wandb.Settings(silent=True), log)


def start(ctx: TrackerContext) -> WandbTracker:
    """The W&B run of ``ctx`` (``ctx.run_id``: continued), online within about half of
    ``train.tracker_start_timeout_s``, else offline with one warning. Raises what an offline ``wandb.init`` raises
    (``wandb.Error``, ``OSError``)."""
    began = time.monotonic()
    import wandb  # seconds on a busy machine: part of the start-up time

    log = library_log(ctx.output_dir, __name__)  # W&B's console lines
    library_log(ctx.output_dir, "wandb", level=logging.WARNING)  # its log records' warnings (all: W&B's debug.log)
    options = dict(project=project_name(ctx, "WANDB_PROJECT"), name=ctx.run_name, id=ctx.run_id, resume="allow",
                   dir=None if os.environ.get("WANDB_DIR") else str(ctx.output_dir),
                   config={**ctx.config, "metadata": ctx.metadata})
    # The online attempt gets half the start-up time left, the offline fallback the rest. quiet: W&B skips its
    # "logged in as" account look-up, which init_timeout does not bound (5 s, asked twice without a network).
    left = ctx.settings.tracker_start_timeout_s - (time.monotonic() - began)
    settings = wandb.Settings(init_timeout=max(left / 2, 1.0), quiet=True)
    try:
        if os.environ.get("WANDB_MODE", "online") in ("online", "run"):
            server_answers(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai", min(5.0, max(left / 4, 1.0)))
        quiet_setup(wandb, log)
        run = wandb.init(**options, settings=settings)
    except (wandb.Error, OSError) as err:  # no network or no answer; UsageError, AuthenticationError: no or bad key
        end_service(wandb, log)  # it holds the failed run's id, and may wait for the server: killed, not waited for
        quiet_setup(wandb, log)
        run = wandb.init(**options, mode="offline", settings=wandb.Settings(quiet=True))
        folder = Path(run.dir).parent
        warn(f"wandb: {one_line(err)}; logging offline in {folder} instead: upload it later with `wandb sync {folder}`")
    return WandbTracker(wandb, run, ctx.output_dir, log)


def server_answers(url: str, timeout_s: float) -> None:
    """Ask W&B's server (``url``: ``WANDB_BASE_URL``, default https://api.wandb.ai) one HTTP GET, in a thread given
    ``timeout_s`` seconds in all: any answer below 500 will do (401, 404 too: the server is there). Without one, an
    online run's uploads would be retried for as long as the process lives. Liveness only: no credentials are sent, and
    the certificate is not checked (W&B checks its own connections). Raises OSError naming the server and what happened
    (no connection, no answer in time, an HTTP error of the server: 500 during an outage)."""
    answer: list[Union[int, Exception]] = []

    def ask() -> None:
        unchecked = ssl.create_default_context()
        unchecked.check_hostname, unchecked.verify_mode = False, ssl.CERT_NONE
        try:
            with urllib.request.urlopen(url, timeout=timeout_s, context=unchecked) as response:
                answer.append(response.status)
        except urllib.error.HTTPError as err:  # an answer, with an error status
            err.close()
            answer.append(err.code)
        except (OSError, ValueError, http.client.HTTPException) as err:  # URLError is an OSError; ValueError: no URL
            answer.append(err)

    thread = threading.Thread(target=ask, name="wandb-server-check", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not answer:
        raise OSError(f"W&B's server {url} did not answer an HTTP request within {timeout_s:.3g} s")
    if isinstance(answer[0], Exception):
        reason = getattr(answer[0], "reason", answer[0])  # URLError's: the socket's error
        raise OSError(f"W&B's server {url} cannot be reached ({reason})")
    if answer[0] >= 500:
        raise OSError(f"W&B's server {url} answers HTTP {answer[0]} (an outage?)")
