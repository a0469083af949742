"""Experiment trackers beside TensorBoard (``train.trackers``: tensorboard, wandb, mlflow), on rank 0 only: the ``train``
keys (:class:`TrackerSettings`), what a backend gets (:class:`TrackerContext`) and offers (:class:`Tracker`), and the
fan-out the run log writes to (:class:`Trackers`, from :meth:`Backends.open`). Each backend is a module of this package
with ``start(ctx: TrackerContext) -> Tracker`` that imports its library inside ``start`` (importing it imports none);
``parts.py`` hands their ``start`` to :class:`Backends`. Tags are TensorBoard's (``train/loss``, ``val/loss``,
``ranks/memory_gib/rank0``, ``audio/vocoded``, ``alignment``, ...).

A tracker that does not start within ``train.tracker_start_timeout_s`` seconds, or fails to start, is left out with one
warning line; one that fails mid-run is dropped with one warning line: training goes on with the others. At the end the
trackers get ``train.tracker_finish_timeout_s`` seconds together to end their runs; one still ending then is abandoned
(its library's background process killed), so no tracker keeps the run's process alive. The libraries' own log records
and console lines go to ``<output_dir>/trackers.log`` (:data:`LOG_NAME`), not the console. A run resumed from an older
checkpoint than the last step a tracker holds (a fallback resume) skips the rows and media up to that step for it: no
step is logged twice."""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Optional, Protocol

import numpy
import torch
from pydantic import Field
from tqdm import tqdm

from distributed import get_world_size
from utils.config import Config, ConfigError, Section
from utils.launch import detect_launcher_env
from utils.run import git_commit
from utils.run_log import one_line

# W&B's and MLflow's HTTP client (requests) imports urllib3's SOCKS support whether or not a proxy is set, and without
# PySocks urllib3 warns then: a line about nothing the run uses, shown or not by when a tracker's thread imports it. A
# SOCKS proxy in the environment still fails the tracker's start in one line. Set here, before any tracker's thread.
warnings.filterwarnings("ignore", message="SOCKS support in urllib3 requires")

LIBRARIES = {"tensorboard": None, "wandb": "wandb", "mlflow": "mlflow"}
"""Tracker -> the library it needs beyond ``requirements.txt`` (its backend imports it in ``start``)."""
PROJECT = Path(__file__).resolve().parents[2].name
"""The project's name (its folder): the W&B project and MLflow experiment when neither setting nor variable names one."""
LOG_NAME = "trackers.log"
"""In the output folder: the trackers' libraries' own log records and console lines (:func:`library_log`)."""


def figure_to_array(figure: Any) -> numpy.ndarray:
    """A matplotlib ``figure`` rendered to an RGB ``uint8`` array ``(H, W, 3)`` (``add_image``'s ``HWC`` layout)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = figure.canvas if isinstance(figure.canvas, FigureCanvasAgg) else FigureCanvasAgg(figure)
    canvas.draw()
    return numpy.asarray(canvas.buffer_rgba())[:, :, :3].copy()


class TrackerSettings(Section):
    """The ``train`` keys of the experiment trackers, part of ``TrainConfig``."""

    trackers: list[Literal["tensorboard", "wandb", "mlflow"]] = ["tensorboard"]  # several at once
    # W&B project and MLflow experiment; None: WANDB_PROJECT / MLFLOW_EXPERIMENT_NAME, else the project's name
    tracker_project: Optional[str] = None
    tracker_run_name: Optional[str] = None  # None: the output folder's name
    tracker_start_timeout_s: float = Field(30.0, gt=0)  # seconds the trackers may take to start before left out
    # seconds the trackers may take together to end their runs (final uploads) at the end before they are abandoned
    tracker_finish_timeout_s: float = Field(60.0, gt=0)
    tracker_log_checkpoint: bool = False  # at the end of the run, the last checkpoint logged as an artifact


@dataclasses.dataclass(frozen=True)
class TrackerContext:
    """What a backend's ``start`` gets."""

    settings: TrackerSettings  # the train section (its tracker keys)
    config: dict  # the resolved config (``Config.to_dict()``, after the recipe and --set): the run's parameters
    metadata: dict  # git_commit, torch_version, world_size, launcher, model_name
    output_dir: Path
    tensorboard_dir: str  # where TensorBoard writes (<output_dir>/tensorboard or the platform's folder)
    run_name: str
    run_id: Optional[str]  # this tracker's run id from the checkpoint resumed, else None
    resumed_step: int  # the step resumed from (0: a fresh run)


class Tracker(Protocol):
    """A started backend. Scalars, images ``(H, W, 3)`` uint8 and mono audio ``(N,)`` float32 in [-1, 1] at
    ``sampling_rate`` Hz, each at an optimizer step; ``run_id`` is saved in each checkpoint; ``last_step`` is the highest
    step the run already holds (after a resume; 0 for a new run); ``close(failed)`` ends the run (``failed``: closed by
    an error). A backend may also offer ``add_text(tag, text, step)``, and ``abandon()``: give the run up at once, its
    library's background work ended so that nothing waits for it at exit (called after the tracker failed, or did not
    finish in time; raises nothing). Any other method may raise: the fan-out drops the tracker."""

    name: str
    run_id: Optional[str]
    last_step: int

    def add_scalars(self, scalars: dict[str, float], step: int) -> None: ...

    def add_image(self, tag: str, image: numpy.ndarray, step: int) -> None: ...

    def add_audio(self, tag: str, audio: numpy.ndarray, step: int, sampling_rate: int) -> None: ...

    def log_artifact(self, path: Path) -> None: ...

    def close(self, failed: bool) -> None: ...


def project_name(ctx: TrackerContext, variable: str) -> str:
    """``train.tracker_project``, else the library's environment ``variable`` (``WANDB_PROJECT``), else :data:`PROJECT`."""
    return ctx.settings.tracker_project or os.environ.get(variable) or PROJECT


def check_trackers(train: TrackerSettings) -> None:
    """Refuse a tracker named twice in the ``train`` section's ``trackers``, and a chosen tracker whose library is not
    installed (before any work).

    Raises:
        ConfigError: one line naming the tracker (and the pip line).
    """
    chosen = train.trackers
    if twice := sorted({name for name in chosen if chosen.count(name) > 1}):
        raise ConfigError(f"train.trackers names {', '.join(twice)} more than once; name each tracker once")
    missing = [name for name in chosen if LIBRARIES[name] and importlib.util.find_spec(LIBRARIES[name]) is None]
    if missing:
        raise ConfigError(f"train.trackers: {', '.join(missing)} chosen but not installed: "
                          "pip install -r requirements-trackers.txt")


def warn(message: str) -> None:
    """One ``warning:`` line that does not break the progress bar."""
    tqdm.write(f"warning: {message}")


class LibraryLog(logging.FileHandler):
    """The handler :func:`library_log` gives a library's loggers: ``<output_dir>/trackers.log``, opened at its first
    record (a run whose libraries say nothing leaves no file)."""


def library_log(output_dir: Path, *names: str, level: int = logging.INFO) -> logging.Logger:
    """The Python loggers ``names`` (a tracker library's: ``mlflow``, ``wandb``) write their records of ``level`` and
    above to ``<output_dir>/trackers.log`` (:data:`LOG_NAME`), and no longer to the console: their console handlers are
    removed, and they do not pass records on to the root logger (or Python's last-resort handler, which prints to
    stderr). A library's records are not lost, and a failing tracker costs the console one warning line, not the
    library's tracebacks (thousands of lines once a store fills). Returns the first logger."""
    handler = LibraryLog(output_dir / LOG_NAME, delay=True)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(level)
    for name in names:
        logger = logging.getLogger(name)
        for old in list(logger.handlers):  # a console handler, or an earlier run's file in this process
            if isinstance(old, LibraryLog) or (isinstance(old, logging.StreamHandler)
                                               and not isinstance(old, logging.FileHandler)):
                logger.removeHandler(old)
                old.close()
        logger.addHandler(handler)
        logger.propagate = False
        if logger.getEffectiveLevel() > level:
            logger.setLevel(level)
    return logging.getLogger(names[0])


class Trackers:
    """Rank 0's writer with the trackers: the ``SummaryWriter`` methods the run log and the models' ``log_validation``
    call (``add_scalar``, ``add_figure``, ``add_audio``, ``add_text``, ``close``), each passed on to every tracker
    (figures as RGB arrays, audio as a NumPy clip). A step's scalars are sent together, when the next step's come (or
    media, or ``close``). With ``checkpoint`` (``train.tracker_log_checkpoint``: the newest checkpoint's path, or None),
    ``close`` logs what it gives as an artifact. ``finish_timeout_s``: what ``close`` may take
    (``train.tracker_finish_timeout_s``)."""

    def __init__(self, trackers: list[Tracker], checkpoint: Optional[Callable[[], Optional[Path]]] = None,
                 finish_timeout_s: float = 60.0):
        self.trackers, self.checkpoint, self.finish_timeout_s = list(trackers), checkpoint, finish_timeout_s
        self.ids = {tracker.name: tracker.run_id for tracker in trackers if tracker.run_id is not None}
        self._step, self._scalars = 0, {}

    def run_ids(self) -> dict[str, str]:
        """``{tracker: run id}`` of the trackers started (saved in each checkpoint, read back on a resume)."""
        return dict(self.ids)

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self._at(step)
        self._scalars[tag] = float(value)

    def add_figure(self, tag: str, figure: Any, step: int) -> None:
        self._at(step)
        self._each("add_image", step, tag, figure_to_array(figure), step)

    def add_audio(self, tag: str, audio: Any, step: int, sample_rate: int) -> None:
        """``audio``: a mono clip ``(1, N)`` or ``(N,)`` in [-1, 1], a tensor or an array, at ``sample_rate`` Hz."""
        clip = audio.detach().cpu().numpy() if isinstance(audio, torch.Tensor) else numpy.asarray(audio)
        self._at(step)
        self._each("add_audio", step, tag, clip.reshape(-1).astype(numpy.float32), step, sample_rate)

    def add_text(self, tag: str, text: str, step: int) -> None:
        self._at(step)
        self._each("add_text", step, tag, text, step)

    def _at(self, step: int) -> None:
        """Send the scalars held back of an earlier step before anything of ``step`` (W&B's step only goes forward)."""
        if step != self._step:
            self.flush()
        self._step = step

    def flush(self) -> None:
        """Send the scalars held back (one step's) to every tracker."""
        if self._scalars:
            scalars, self._scalars = self._scalars, {}
            self._each("add_scalars", self._step, scalars, self._step)

    def close(self) -> None:
        """Send the scalars held back, then end every tracker's run (the checkpoint logged first, with ``checkpoint``),
        each in a thread of its own, all within ``finish_timeout_s`` seconds: a tracker that fails, or is still ending
        its run then, is dropped with one warning line (and abandoned). The runs end as failed when ``close`` is called
        while an exception is raised (a ``finally`` after an error)."""
        self.flush()
        failed = sys.exc_info()[0] is not None
        last = self.checkpoint() if self.checkpoint is not None else None
        ended: dict[str, Optional[Exception]] = {}
        threads = {tracker.name: threading.Thread(target=self._finish, args=(tracker, last, failed, ended), daemon=True,
                                                  name=f"finish-{tracker.name}") for tracker in self.trackers}
        deadline = time.monotonic() + self.finish_timeout_s
        for thread in threads.values():
            thread.start()
        for tracker in list(self.trackers):
            threads[tracker.name].join(max(0.0, deadline - time.monotonic()))
            if tracker.name not in ended:
                self._drop(tracker, f"{tracker.name} did not end its run within train.tracker_finish_timeout_s="
                                    f"{self.finish_timeout_s:g} s (is its server reachable?) and is abandoned")
            elif ended[tracker.name] is not None:
                self._drop(tracker, f"{tracker.name} failed to end its run ({one_line(ended[tracker.name])})")

    @staticmethod
    def _finish(tracker: Tracker, last: Optional[Path], failed: bool, ended: dict[str, Optional[Exception]]) -> None:
        """``tracker``'s artifact ``last`` (where it logs files) and ``close``; ``ended[name]``: None, or the error."""
        try:
            if last is not None and getattr(tracker, "log_artifact", None) is not None:
                tracker.log_artifact(last.resolve())
            tracker.close(failed)
        except Exception as err:  # noqa: BLE001 - third-party boundary (see _each)
            ended[tracker.name] = err
        else:
            ended[tracker.name] = None

    def _each(self, method: str, step: Optional[int], *args: Any) -> None:
        """``tracker.method(*args)`` on each tracker that has it and does not hold ``step`` already."""
        for tracker in list(self.trackers):
            call = getattr(tracker, method, None)
            if call is None or (step is not None and tracker.last_step and step <= tracker.last_step):
                continue  # skipped: a fallback resume's steps this tracker's run holds
            try:
                call(*args)
            # Third-party boundary: each library raises its own types (MlflowException, wandb.Error, requests' and
            # protobuf's errors, OSError); none of them may stop training.
            except Exception as err:  # noqa: BLE001
                self._drop(tracker, f"{tracker.name} failed ({one_line(err)}) and is dropped; training goes on "
                                    "logging to the others")

    def _drop(self, tracker: Tracker, message: str) -> None:
        """Leave ``tracker`` out from now on, with the one warning line ``message``, and abandon its run (``abandon``,
        where it has one: its library's background work ended, so that the process does not wait for it at exit)."""
        self.trackers.remove(tracker)
        warn(message)
        abandon = getattr(tracker, "abandon", None)
        if abandon is not None:
            abandon()


@dataclasses.dataclass(frozen=True)
class Backends:
    """The trackers a run may name, each its backend's ``start`` (``parts.py`` registers them): :meth:`open` starts
    those of ``train.trackers``."""

    starts: Mapping[str, Callable[[TrackerContext], Tracker]]  # tracker -> its backend module's start

    def open(self, cfg: Config, model_name: str, output_dir: Path, tensorboard_dir: str, resumed_step: int,
             run_ids: dict[str, str]) -> Trackers:
        """The trackers of ``train.trackers`` started together, each in a thread given ``train.tracker_start_timeout_s``
        seconds in all; one not started in time, or failing, is left out with one warning line (a thread still starting
        is left to end on its own). ``run_ids``: the checkpoint's ``{tracker: run id}`` to continue (``{}`` on a fresh
        run)."""
        train = cfg.train
        ctx = TrackerContext(settings=train, config=cfg.to_dict(), metadata=run_metadata(model_name),
                             output_dir=output_dir, tensorboard_dir=tensorboard_dir,
                             run_name=train.tracker_run_name or output_dir.resolve().name, run_id=None,
                             resumed_step=resumed_step)
        results: dict[str, Any] = {}
        lock, given_up = threading.Lock(), set()

        def start(name: str) -> None:
            try:
                tracker = self.starts[name](dataclasses.replace(ctx, run_id=run_ids.get(name)))
            except Exception as err:  # noqa: BLE001 - third-party boundary (Trackers._each): a warning, never a stop
                tracker = err
            with lock:
                late = name in given_up
                results[name] = tracker
            if late and not isinstance(tracker, Exception):  # started after its warning: its run is ended, not left
                Trackers([tracker], finish_timeout_s=train.tracker_finish_timeout_s).close()

        threads = [threading.Thread(target=start, args=(name,), daemon=True) for name in train.trackers]
        deadline = time.monotonic() + train.tracker_start_timeout_s
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        started = []
        for name in train.trackers:
            with lock:
                result = results.get(name)
                if result is None:
                    given_up.add(name)
            if result is None:
                warn(f"{name} did not start within train.tracker_start_timeout_s={train.tracker_start_timeout_s:g} s "
                     "(is its server reachable?); training goes on without it")
            elif isinstance(result, Exception):
                warn(f"{name} did not start ({one_line(result)}); training goes on without it")
            else:
                started.append(result)
        return Trackers(started, finish_timeout_s=train.tracker_finish_timeout_s)


def run_metadata(model_name: str) -> dict:
    """``{git_commit, torch_version, world_size, launcher, model_name}`` of this run."""
    try:
        launcher = detect_launcher_env(os.environ)["launcher"]
    except ValueError:  # the caller made the process group (Ray Train) and its rendezvous variables are gone
        launcher = "caller's process group"
    return {"git_commit": git_commit(), "torch_version": str(torch.__version__), "world_size": get_world_size(),
            "launcher": launcher, "model_name": model_name}
