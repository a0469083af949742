"""Train a model of ``models/`` on one process, one GPU per process, or many machines.

    python train.py --config config.json                                          # one process
    python multiproc.py train.py --config config.json                             # one process per GPU (DDP)
    python multiproc.py --nproc-per-node 2 train.py --config config.json --tiny   # CPU smoke run

The loop (:func:`train_loop`) knows no model: it takes a :class:`model.ModelSpec` from ``models.MODELS``. Each step
reads ``grad_accumulation`` micro-batches; DDP all-reduces the gradients in the last one's backward, then one small
all-reduce agrees on the loss and any rank's stop signal. Only rank 0 writes. A checkpoint holds everything the next
step depends on (every rank's RNG states too): ``--resume auto`` continues exactly where the run stopped.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Optional

import torch

from distributed import CollectiveError, all_gather_object, cleanup, from_rank0, init_distributed
from inference import load_vocoder
from models import MODELS
from parts import LEFT_OUT, PARTS, config_schemas
from utils.checkpoint.files import CheckpointError
from utils.checkpoint.names import last_checkpoint, last_checkpoint_path
from utils.config import Config, ConfigError, load_config
from utils.data.corpora import load_splits
from utils.data.corpus import DataError
from utils.data.loader import epochs_done, next_micro_batches
from utils.errors import TrainingError
from utils.launch import cpu_threads, record_failure
from utils.run import RunLock, StopRequest, end_dataloader_workers, take_output_dir
from utils.run_log import StepWindow, one_line, one_line_warnings
from utils.training.guards import StepCounts, StepOutcome, all_reduce_numbers
from utils.training.checks import check_settings, check_val_vocoder
from utils.training.recipe import apply_recipe
from utils.training.setup import Run, build_run
from utils.training.step import forward_backward, step_schedulers

CHECKS = (*PARTS.checks, lambda spec, cfg: check_val_vocoder(spec, cfg, MODELS))
"""The settings refused before any rank starts, beside :func:`check_settings`'s own: the parts', a validation vocoder
in a project without one."""


def train_loop(run: Run, stop: StopRequest) -> bool:
    """Optimizer steps until ``train.max_steps`` or a stop signal; logs, validates and saves at their intervals (saves
    at a stop and at the end too). Returns whether it trained to the end (not stopped)."""
    cfg, state, log = run.train, run.state, run.log
    window, epochs_seen = StepWindow(), epochs_done(state, run.data.loader)
    scaler = run.precision.scaler  # fp16's loss scaling; a pass-through in the other precisions
    while state.step < cfg.max_steps:
        t_start, step = time.perf_counter(), state.step + 1
        micro, items, ids, data_time = next_micro_batches(run.data.batches, run.spec, run.data.accumulation,
                                                          run.dist.device, run.data.prepare)
        outcome = StepOutcome(data_time=data_time, named_losses=len(run.phases) > 1)
        for phase in run.phases:  # a GAN: the discriminator's update, then the generator's
            if phase.guard is not None:
                phase.guard.save()
            result = forward_backward(phase, run.phases, run.step_fn, micro, run.precision, cfg.grad_clip)
            # The last phase's all-reduce also sums the step's stop requests and items (this rank's in ``items``).
            counts = StepCounts(int(stop.signal_name is not None), items) if phase is run.phases[-1] else None
            numbers = all_reduce_numbers(result, scaler, run.dist, counts)  # loss, gradient norm: every rank's view
            verdict = run.anomalies.check(step, phase, numbers, ids)  # non-finite, spikes: log, skip or stop; counted
            outcome.add(phase, result, numbers, verdict)
            scaler.step(phase.optimizer)  # before the next phase's forward: it sees the updated network
            if run.ema is not None and not verdict.skipped:  # a real update only: not a skip, not an fp16 overflow
                run.ema.update(phase.wrapped)
        scaler.update()  # once per step, after every optimizer (PyTorch's AMP recipe)
        epochs_seen = step_schedulers(run.phases, outcome.applied, epochs_seen, epochs_done(state, run.data.loader))
        for phase in run.phases:  # the next step's backward starts from no gradient
            phase.optimizer.zero_grad(set_to_none=True)
        state.step, outcome.step_time = step, time.perf_counter() - t_start
        window.add(outcome)
        log.step_done()
        last = step == cfg.max_steps
        if step % cfg.log_interval == 0 or last:
            log_window(run, window, outcome.grad_norm)
            window = StepWindow()
        if step % cfg.val_interval == 0 or last:
            log.validation(step, state.epoch, *run.validator.validate(step))
        run.checkpointer.poll()
        if outcome.stop_requested or step % cfg.checkpoint_interval == 0 or last:
            run.checkpointer.save(outcome.step_time)
        if outcome.stop_requested:
            run.checkpointer.finish()
            log.print(f"stopped at step {step} on {stop.signal_name or 'another rank’s signal'}; resume with the same "
                      f"command (--resume auto reads {last_checkpoint_path(run.output_dir)})")
            return False
    run.checkpointer.finish()
    return True


def log_window(run: Run, window: StepWindow, grad_norm: float) -> None:
    """The metrics row of the steps since the last, with every rank's memory and times; rank 0 warns of imbalance."""
    state, is_main = run.state, run.dist.is_main
    ranks = all_gather_object(window.balance(run.dist.device))
    for warning in (run.balance.check(state.step, ranks) if is_main else []):
        run.log.print(warning)
    run.log.metrics(window.row(step=state.step, epoch=state.epoch, lr=run.phases[-1].optimizer.param_groups[0]["lr"],
                               grad_norm=grad_norm if math.isfinite(grad_norm) else None,
                               skipped_steps=state.skipped_steps, skipped_updates=dict(state.skipped_updates),
                               **{key: [r[key] for r in ranks] for key in ranks[0]}))


def main(argv=None) -> int:
    """``python train.py``: 0 when done or stopped by a signal (130 after Ctrl-C without a launcher), else 1 after one
    ``ERROR:`` line; also called in the workers of a framework that makes the process group (left to it)."""
    stop = StopRequest()  # first: a signal from here on stops the run cleanly instead of killing it
    try:
        args = parse_args(argv)
    except CommandLineError as err:
        print(f"ERROR: {err}", file=sys.stderr)
        return 2
    with one_line_warnings():
        return run_training(args, stop)


def check_command_line(argv: list[str]) -> Optional[str]:
    """What ``multiproc.py`` asks before it starts any rank: the line of the first problem found without a process
    group (arguments, config, settings the model cannot honour, no corpus), or ``None``."""
    try:
        args = parse_args(argv)
        cfg = load_run_config(args)
        check_settings(MODELS[args.model], cfg, CHECKS)
        load_splits(cfg.data, bad=[])  # the corpus is there and has utterances (its clips are checked by rank 0)
    except (CommandLineError, ConfigError, DataError) as err:
        return one_line(err)
    return None


def run_training(args: argparse.Namespace, stop: StopRequest) -> int:
    """:func:`main` once the arguments are read: config, process group, training, and the exit status."""
    try:
        cfg = load_run_config(args)  # before the process group: a bad config fails alone, fast
        check_settings(MODELS[args.model], cfg, CHECKS)
    except ConfigError as err:
        print(f"ERROR: {one_line(err)}", file=sys.stderr)
        return 1
    caller_group = torch.distributed.is_available() and torch.distributed.is_initialized()
    try:
        dist = init_distributed(timeout_s=cfg.train.dist_timeout_s, check_environ=PARTS.check_environ)
    except (ValueError, RuntimeError) as err:  # launcher variables, a GPU that is not there, the rendezvous
        print(f"ERROR: {one_line(err)}", file=sys.stderr)
        return 1
    if "OMP_NUM_THREADS" not in os.environ:  # the user's choice, or the launcher's (1 per rank), stands
        torch.set_num_threads(cpu_threads(int(os.environ.get("LOCAL_WORLD_SIZE") or 1)))
    try:
        train(args, cfg, dist, stop)
    except Exception as err:  # noqa: BLE001 - every failure ends the rank with one line, never a hang
        return failure_status(err, dist.rank, cfg.train.dist_timeout_s, Path(args.output_dir))
    except KeyboardInterrupt:
        print(f"ERROR: rank {dist.rank}: interrupted (Ctrl-C three times): stopped without saving; "
              f"{Path(args.output_dir) / 'checkpoint_last.pt'} is the last checkpoint", file=sys.stderr)
        return 130
    finally:
        end_dataloader_workers()
        if not caller_group:
            cleanup()
    under_launcher = "TORCHELASTIC_RUN_ID" in os.environ  # a launcher restarts ranks that exit non-zero
    return 130 if stop.signal_name == "SIGINT" and not under_launcher else 0


def failure_status(err: Exception, rank: int, timeout_s: float, output_dir: Path) -> int:
    """Print the one ``ERROR:`` line of a failed rank (after a traceback for a bug in model or data code; ``timeout_s``:
    ``train.dist_timeout_s``, which a failed collective waited) and return 1."""
    lost_peer = None  # the collective in which a peer was lost (another rank's error is the cause)
    if isinstance(err, CollectiveError):  # its message names the rank, the collective and the timeout
        line, lost_peer = one_line(err), err.collective
    elif isinstance(err, (ConfigError, DataError, CheckpointError, TrainingError)):
        line = f"rank {rank}: {one_line(err)}"
    elif isinstance(err, torch.distributed.DistBackendError):
        line, lost_peer = (f"rank {rank}: a collective failed or timed out after {timeout_s:.0f} s "
                           f"(another rank hung or died): {one_line(err)}", "a collective")
    else:  # a bug in model or data code, a full disk...
        traceback.print_exception(err)
        line = (f"rank {rank}: {type(err).__name__}: {one_line(err)} (traceback above); last checkpoint: "
                f"{last_checkpoint(output_dir)}")
    print(f"ERROR: {line}", file=sys.stderr, flush=True)
    record_failure(line, lost_peer)  # for multiproc.py's summary
    traceback.clear_frames(err.__traceback__)  # its DataLoaders go now, ending their workers at once (not 5 s each)
    return 1


def train(args: argparse.Namespace, cfg: Config, dist, stop: StopRequest) -> None:
    """The run: rank 0 holds the output folder (:class:`utils.run.RunLock`) while the run is built and trained; a folder
    this run created and left empty is removed again."""
    output_dir = Path(args.output_dir)
    lock = RunLock(output_dir) if dist.is_main else None
    created = dist.is_main and not output_dir.exists()
    try:
        from_rank0(lambda: take_output_dir(output_dir, lock), ConfigError, CheckpointError)
        run = build_run(MODELS, args, cfg, dist, PARTS.run, load_vocoder)
        if run is None:
            return
        try:
            finished = train_loop(run, stop)
        finally:
            run.checkpointer.finish_after_error()  # an error: still finish the last background save
            run.log.close()  # also on an error, so that its ERROR line starts a line of its own
        if finished and dist.is_main:
            print(f"done: {run.state.step} steps; checkpoint {last_checkpoint_path(output_dir)}")
    finally:
        if lock is not None:
            lock.release()
        if created and output_dir.is_dir() and not any(output_dir.iterdir()):
            output_dir.rmdir()


class CommandLineError(ValueError):
    """An argument of ``train.py`` is unknown, missing or malformed (argparse's message, on one line)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, raised, instead of usage and exit 2
        raise CommandLineError(f"{message} (python train.py --help lists the options)")


def parse_args(argv=None) -> argparse.Namespace:
    """``train.py``'s command line. Raises CommandLineError for an unknown, missing or malformed argument, an option
    a ``--set`` contradicts, or a platform's folder variable that cannot work here."""
    models = sorted(MODELS)
    platforms = PARTS.platforms  # the cloud platforms' folders and argument style, where present
    parser = _Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="config.json", help="JSON config (default: config.json)")
    parser.add_argument("--model", choices=models, default=models[0] if models else None,
                        help=f"which model of models/ to train (default: {models[0] if models else 'none'})")
    parser.add_argument("--dataset-path", help="the corpus's root folder (data.format: its layout); overrides data.dataset_path"
                        + (f" (default: {platforms.DATASET_PATH_DEFAULT})" if platforms else ""))
    parser.add_argument("--output-dir", help="checkpoints, logs, metrics (default: "
                                             f"{platforms.OUTPUT_DIR_DEFAULT if platforms else 'output'})")
    parser.add_argument("--max-steps", type=int, help="optimizer steps to train; overrides train.max_steps")
    parser.add_argument("--resume", default="auto",
                        help="auto: continue from OUTPUT/checkpoint_last.pt if present; none; or a checkpoint path")
    parser.add_argument("--init-from", metavar="WEIGHTS",
                        help="start from these weights, with a fresh optimizer at step 0 (fine-tuning): a checkpoint "
                             "of this project" + (f", or a published file ({PARTS.formats.published.sources})"
                                                  if PARTS.formats.published else "")
                             + "; an --output-dir with its own checkpoint resumes that instead")
    parser.add_argument("--tiny", action="store_true", help="apply the config's tiny block (CPU smoke runs)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config value; repeatable")
    argv = sys.argv[1:] if argv is None else argv
    # a platform's hyperparameters as --name value: --train.lr 1e-4 is --set train.lr=1e-4, --tiny True is --tiny
    args = parser.parse_args(platforms.hyperparameter_argv(argv, ["--tiny"]) if platforms else argv)
    if args.model is None:
        parser.error("models/ registers no model: add one (see model.py)")
    for option, key in (("--max-steps", "train.max_steps"), ("--dataset-path", "data.dataset_path")):
        given = [item for item in args.set if "=" in item and item.split("=")[0].strip() == key]
        if given and getattr(args, option[2:].replace("-", "_")) is not None:
            raise CommandLineError(f"{option} and --set {given[-1]} both set {key}; give one")
    if platforms is None:
        args.output_dir = args.output_dir or "output"
        return args
    try:
        args.output_dir = args.output_dir or platforms.default_output_dir(os.environ)
        platforms.tensorboard_dir(os.environ, args.output_dir)  # its variable checked before any rank starts
        args.dataset_path = args.dataset_path or platforms.default_dataset_path(os.environ)
    except ValueError as err:
        raise CommandLineError(str(err)) from None
    return args


def load_run_config(args: argparse.Namespace) -> Config:
    """The config file with ``--tiny``, ``--set``, ``--dataset-path`` and ``--max-steps`` applied, and the settings it
    leaves null filled with ``--model``'s recipe (:func:`utils.training.recipe.apply_recipe`)."""
    overrides = list(args.set)
    if args.dataset_path:
        overrides.append(f"data.dataset_path={args.dataset_path}")
    if args.max_steps is not None:
        overrides.append(f"train.max_steps={args.max_steps}")
    cfg = load_config(args.config, config_schemas(), tiny=args.tiny, overrides=overrides, left_out=LEFT_OUT)
    return apply_recipe(MODELS[args.model], cfg, PARTS.data_framing(cfg.data))


if __name__ == "__main__":
    gc.freeze()  # the modules' objects (torch's: 0.15 s of CPU to walk) live as long as the process: never walked again
    code = main()
    gc.freeze()
    sys.exit(code)
