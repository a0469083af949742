"""The run's one checkpoint owner (:class:`Checkpointer`), after torchtitan's ``CheckpointManager(states={...})``."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Optional

import torch

from distributed import CollectiveError, DistInfo, collective, reduce_tensor, split_over_ranks
from utils.checkpoint.files import CheckpointError
from utils.checkpoint.names import last_checkpoint, last_good_checkpoint
from utils.checkpoint.resume import Formats, saved_config, warn_changes, world_size_change
from utils.checkpoint.state import TOP_LEVEL, Stateful, checkpoint_bytes, entries_problem, load_part
from utils.config import Config
from utils.errors import TrainingError
from utils.run import GracePeriod, git_commit
from utils.run_log import RunLog, one_line
from utils.train_state import TrainState


def nonfinite_weight(model: torch.nn.Module) -> Optional[str]:
    """The first floating-point parameter or buffer of ``model`` (this rank's shard) holding NaN or inf, or ``None``.
    One device synchronisation."""
    named = [(name, tensor.to_local() if split_over_ranks(tensor) else tensor)
             for name, tensor in [*model.named_parameters(), *model.named_buffers()] if tensor.is_floating_point()]
    if not named:
        return None
    finite = torch.stack([torch.isfinite(tensor.detach()).all() for _, tensor in named]).cpu()
    return None if bool(finite.all()) else named[int((~finite).nonzero()[0])][0]


@dataclasses.dataclass(frozen=True)
class Resumed:
    """What a checkpoint says besides its parts' states (:meth:`Checkpointer.load`)."""

    world_size: int  # the processes that wrote it
    grad_accumulation: int  # its micro-batches per step (:meth:`Checkpointer.resume`: the ones this run takes)
    config: dict[str, Any]  # the config its run trained with (``resume.saved_config``)
    tracker_runs: dict[str, str]  # tracker -> the run id to continue


class Checkpointer:
    """Saves a run's stateful parts by name in the run's format (``formats.writing``) and loads them back from a
    checkpoint of any format the project reads (``formats.of``); every rank builds it and calls its methods together,
    :meth:`start` first. ``states``: ``"model"`` (never DDP-wrapped), ``"optimizer"``, ``"scheduler"``, ``"scaler"``
    (several phases' as one ``NamedStates``), ``"position"`` (the loop's :class:`TrainState`, updated in place),
    ``"rng"`` and ``"ema"`` (a part with ``reset()`` starts afresh where a checkpoint holds none)."""

    def __init__(self, states: Mapping[str, Stateful], output_dir: Path, dist: DistInfo, train: Any, formats: Formats):
        self.states, self.output_dir, self.dist, self.formats = dict(states), Path(output_dir), dist, formats
        self.model: torch.nn.Module = states["model"]
        self.position: TrainState = states["position"]
        self.format = formats.writing(train.sharded)
        self.saver = self.format.saver(self.output_dir, dist, train)
        self.log: Optional[RunLog] = None
        self.info: dict[str, Any] = {}
        self.origin: Optional[Path] = None  # the checkpoint :meth:`load` read, until a save of this run completes
        self.grace = GracePeriod(os.environ)

    def start(self, log: RunLog, info: Mapping[str, Any]) -> None:
        """Ready the saves: ``log`` says what each wrote, ``info`` is their provenance; rank 0 warns where a save cannot
        fit the grace period after a stop signal (:class:`GracePeriod`: a CheckpointError on a full disk)."""
        self.log, self.info = log, dict(info)
        if not self.dist.is_main:
            return
        nbytes = self.saver.share(checkpoint_bytes([self.model], averages=int("ema" in self.states)))
        try:
            warning = self.grace.check_estimate(nbytes, self.output_dir)
        except CheckpointError:
            log.close()  # the progress bar's line ends before the error's
            raise
        if warning is not None:
            log.print(warning)

    def save(self, step_s: float) -> None:
        """Save every part at ``position.step`` (:meth:`write`, raising what it raises) with :meth:`start`'s provenance,
        torch's version and the git commit, and say so; ``step_s``: the step before (seconds), for the grace period."""
        t_save, step, is_main = time.perf_counter(), self.position.step, self.dist.is_main
        path = self.write(dict(self.info, torch_version=str(torch.__version__),
                               git_commit=git_commit() if is_main else None))
        if not self.saver.background:
            self.origin = None  # saved: the weights since are this run's (a background save: once it completes)
        if path is not None:
            said = f"saving {path} in the background" if self.saver.background else f"saved {path}"
            self.log.print(f"step {step}: {said}")
        if is_main and (warning := self.grace.check_save(step, time.perf_counter() - t_save, step_s)) is not None:
            self.log.print(warning)

    def write(self, info: Mapping[str, Any]) -> Optional[Path]:
        """Write every part at ``position.step`` with the provenance ``info``; its file or folder, or ``None`` on a rank
        that writes nothing. A :class:`TrainingError` where the weights are not finite on some rank (nothing saved; the
        last good checkpoint named, never the one they came from: :meth:`suspect`), a :class:`CheckpointError` where a
        file could not be written (earlier checkpoints are kept)."""
        step, broken = self.position.step, nonfinite_weight(self.model)
        if self._on_some_rank(broken is not None):
            good = last_checkpoint(self.output_dir) if self.origin is None else \
                last_good_checkpoint(self.output_dir, step, 0, self.origin)
            raise TrainingError(f"step {step}: the weights are not finite ({broken or 'on another rank'}): not "
                                f"saved; last good checkpoint: {good}")
        return self.saver.save(step, self.states, info)

    def suspect(self) -> Optional[Path]:
        """The checkpoint :meth:`load` read, while no save has completed since, when the weights are not finite on some
        rank (they came from it: no message names it good); else ``None``. One all-reduce."""
        return self.origin if self._on_some_rank(nonfinite_weight(self.model) is not None) else None

    def _on_some_rank(self, flag: bool) -> bool:
        """Whether ``flag`` holds on some rank (one all-reduce: every rank calls it)."""
        return bool(reduce_tensor(torch.tensor([float(flag)], device=self.dist.device), op="sum").item())

    def poll(self) -> None:
        """Complete a background save that has finished, and say so (cheap: call it every step)."""
        if (done := self.saver.poll()) is not None:
            self.origin = None
            self.log.print(f"step {self.position.step}: saved {done} (written in the background)")

    def finish(self) -> None:
        """Wait for a background save (``train.async_checkpoint``), then complete it: no run ends with half a save. A
        :class:`CheckpointError` or ``CollectiveError`` where it failed (earlier checkpoints are kept)."""
        with collective("background checkpoint save"):
            done = self.saver.wait()
        if done is not None:
            self.origin = None
            self.log.print(f"saved {done} (written in the background)")

    def finish_after_error(self) -> None:
        """On an error, still finish the last background save, or say in one line that the previous one is intact."""
        try:
            self.finish()
        except (CheckpointError, CollectiveError) as err:
            self.log.print(f"warning: the background checkpoint save did not finish ({one_line(err)}); the previous "
                           "checkpoint is intact")

    def load(self, path: str | Path, model_name: str, config: Optional[Config] = None,
             train_utterances: Optional[int] = None, saved: Optional[dict[str, Any]] = None) -> Resumed:
        """Put a checkpoint back into every part: its format's own first (the weights), the others by
        ``load_state_dict``; rank 0 warns of changes to the run's ``config`` and ``train_utterances``
        (:func:`warn_changes`). ``saved``: its entries, where read already. A :class:`CheckpointError` for an
        unreadable or unsafe checkpoint, another model, entries not as ``train.py`` writes them, weights or states
        that do not fit, or a weights-only file."""
        kind = self.formats.of(path)
        if saved is None:  # rank 0 verifies what it reads of every rank's files
            saved = kind.read(path, self.dist.device, verify=self.dist.rank == 0)
        self.origin = Path(path).parent / os.readlink(path) if Path(path).is_symlink() else Path(path)
        if saved.get("model_name") != model_name:
            raise CheckpointError(f"{path} holds a '{saved.get('model_name')}' model, not '{model_name}'")
        if (problem := entries_problem(saved)) is not None:  # every rank's rng entry too: all ranks stop alike
            raise CheckpointError(f"{path} is malformed ({problem})")
        held = kind.load(path, self.states, saved)  # the weights first: another network's are named key by key
        self._load_parts(path, saved, held)
        before, written_by = saved_config(saved), len(saved["rng"])
        if self.dist.rank == 0:
            warn_changes(saved, path, before, config, train_utterances)
        if "samples_in_epoch" not in saved:  # written before the position was kept in global samples
            batch_size = before.get(model_name, {}).get("batch_size", 0)
            self.position.samples_in_epoch = self.position.batch_in_epoch * batch_size * written_by
        accumulation = saved.get("grad_accumulation", before.get("train", {}).get("grad_accumulation", 1))
        return Resumed(written_by, accumulation, before, saved.get("tracker_runs", {}))

    def _load_parts(self, path: str | Path, saved: Mapping[str, Any], held: tuple[str, ...]) -> None:
        """Put back every part but those its format ``held``; a :class:`CheckpointError` naming every entry a resume
        needs and ``saved`` lacks."""
        needed = [key for name, part in self.states.items() if name not in held and not hasattr(part, "reset")
                  for key in TOP_LEVEL.get(name, (name,))]
        if missing := [key for key in needed if key not in saved]:
            raise CheckpointError(f"{path} is not a training checkpoint of train.py (it has no {', '.join(missing)}); "
                                  "--resume needs one written by train.py")
        for name, part in self.states.items():
            if name in TOP_LEVEL:
                part.load_state_dict(saved)
            elif name in saved and name not in held:
                load_part(part, saved[name], name, path)
            elif name not in held:
                part.reset()
                if self.dist.rank == 0:
                    print(f"note: {path} holds no {name!r} entry (its run kept none): this run's {type(part).__name__} "
                          "starts afresh from the weights", file=sys.stderr, flush=True)

    def resume(self, path: Path, saved: dict[str, Any], cfg: Config, model_name: str,
               train_utterances: int) -> Resumed:
        """Resume the run of ``model_name`` with ``cfg`` from the checkpoint at ``path`` (:meth:`load` of ``saved``),
        said on rank 0. Its ``grad_accumulation``: the checkpoint's, the one that keeps the global batch on another
        number of processes, or the config's where that changed. A :class:`CheckpointError` also for a checkpoint the
        run's format cannot continue."""
        if (problem := self.format.continues(Path(path))) is not None:
            raise CheckpointError(f"{path} {problem}")
        resumed = self.load(path, model_name, config=cfg, train_utterances=train_utterances, saved=saved)
        accumulation, batch_size = cfg.train.grad_accumulation, cfg.section(model_name).batch_size
        note, world_size = None, self.dist.world_size
        if resumed.config.get("train", {}).get("grad_accumulation", accumulation) == accumulation:
            accumulation, note = world_size_change(resumed.world_size, resumed.grad_accumulation, world_size,
                                                   batch_size, accumulation)
        # else: the user changed train.grad_accumulation (named in the config warning): theirs, as given
        state = self.position
        state.batch_in_epoch = state.samples_in_epoch // (batch_size * world_size)
        if self.dist.is_main:
            if note:
                print(note, file=sys.stderr, flush=True)
            print(f"resumed from {path} at step {state.step} (epoch {state.epoch}, sample {state.samples_in_epoch} of "
                  "it)")
        return dataclasses.replace(resumed, grad_accumulation=accumulation)
