"""What a single-file checkpoint holds (the loop's position, every rank's RNG states, optimizer, scheduler, scaler,
provenance), how it is written and pruned, and the release format that inference needs alone."""

from __future__ import annotations

import dataclasses
import random
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from utils.checkpoint.files import (CheckpointError, atomic_write_bytes, fsync_dir, prune, remove_stale_temporaries,
                                    serialized, write_failure)
from utils.training.ema import in_modules

CHECKPOINT_RE = re.compile(r"^checkpoint_(\d+)\.pt$")


def checkpoint_bytes(modules: Sequence[torch.nn.Module], optimizer_moments: int = 2, averages: int = 0) -> int:
    """The size of a training checkpoint of ``modules`` (bytes, about): their weights and buffers, plus
    ``optimizer_moments`` copies of the trainable weights (Adam keeps 2) and ``averages`` copies (an EMA: 1)."""
    weights = sum(t.numel() * t.element_size() for m in modules for t in [*m.parameters(), *m.buffers()])
    trainable = sum(t.numel() * t.element_size() for m in modules for t in m.parameters() if t.requires_grad)
    return weights + (optimizer_moments + averages) * trainable


def save_checkpoint(output_dir: str | Path, state: dict[str, Any], step: int, keep_last: int = 0) -> Path:
    """Write ``checkpoint_<step>.pt`` and ``checkpoint_last.pt`` atomically into ``output_dir`` (it must exist); return
    the former. The newest ``keep_last`` numbered ones by step stay (0: all; the one just written always). A sharded
    ``checkpoint_last`` link (a run continued with DDP) is removed: "last" names the newest of either kind.

    Raises:
        CheckpointError: ``state`` holds objects that :func:`load_checkpoint` would refuse (nothing is written), or a
            file cannot be written (a full disk: no earlier checkpoint is touched).
    """
    output_dir = Path(output_dir)
    remove_stale_temporaries(output_dir)
    numbered = output_dir / f"checkpoint_{step}.pt"
    data = serialized(state, numbered)
    files, written = [numbered, output_dir / "checkpoint_last.pt"], []
    try:
        for path in files:
            atomic_write_bytes(path, data)
            written.append(path)
        if (output_dir / "checkpoint_last").is_symlink():  # an older sharded checkpoint's: this file is newer
            (output_dir / "checkpoint_last").unlink()
            fsync_dir(output_dir)
    except OSError as err:  # a full disk, a quota, a folder gone read-only: the earlier files are untouched
        kept = [path for path in (files[1], *[p for p in list_checkpoints(output_dir) if p != numbered][-1:])
                if path.is_file() and path not in written]
        raise write_failure(step, output_dir, err.strerror or str(err), kept, written,
                            [path for path in files if path not in written]) from None
    # The newest by step, but never the file just written (an older run's higher steps may be there).
    prune([path for path in list_checkpoints(output_dir) if path != numbered], keep_last, Path.unlink)
    return numbered


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Numbered checkpoints in ``output_dir``, oldest step first."""
    found = [(int(m.group(1)), p) for p in Path(output_dir).glob("checkpoint_*.pt")
             if (m := CHECKPOINT_RE.match(p.name))]
    return [p for _, p in sorted(found)]


def capture_rng_state() -> dict[str, Any]:
    """This process's generator states (Python, NumPy, torch CPU and CUDA), as ``weights_only=True`` loads them."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": random.getstate(), "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos,
                                                    has_gauss, cached], "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put back the generator states of :func:`capture_rng_state`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.cpu().numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


@dataclasses.dataclass
class TrainState:
    """Where the training loop is."""

    step: int = 0  # optimizer steps done
    epoch: int = 0  # the epoch being read
    batch_in_epoch: int = 0  # batches of that epoch this rank has read
    skipped_steps: int = 0  # for a non-finite loss or gradient norm, or a spike (train.on_spike=skip)
    samples_in_epoch: int = 0  # of the epoch's order, all ranks together: a resume on any world size skips them
    skipped_updates: dict = dataclasses.field(default_factory=dict)  # per optimizer (phase): any cause, fp16 too
    skips_in_a_row: dict = dataclasses.field(default_factory=dict)  # per optimizer: its latest updates skipped


STATEFUL_PARTS = ("optimizer", "scheduler", "scaler")  # what a training checkpoint holds besides the model


class NamedStates(dict):
    """Several stateful objects under one checkpoint entry, by name: the optimizers of a model with several phases
    (``{"discriminator": ..., "generator": ...}``), or their schedulers. Saved as ``{name: state_dict}``."""

    def state_dict(self) -> dict[str, Any]:
        return {name: part.state_dict() for name, part in self.items()}

    def load_state_dict(self, states: Mapping[str, Any]) -> None:
        """Load each object's state.

        Raises:
            CheckpointError: the checkpoint names other objects than these.
        """
        if not isinstance(states, Mapping) or set(states) != set(self):
            found = sorted(states) if isinstance(states, Mapping) else type(states).__name__
            raise CheckpointError(f"the checkpoint holds states for {found}, this run has {sorted(self)}")
        for name, part in self.items():
            part.load_state_dict(states[name])


def training_checkpoint(model: torch.nn.Module, parts: Mapping[str, Any], state: TrainState, rng: list,
                        **info: Any) -> dict[str, Any]:
    """The dict ``train.py`` saves: everything the next step depends on, so that a resume is exact. ``model``: the
    plain (unwrapped) one; ``parts``: :data:`STATEFUL_PARTS` by name; ``rng``: every rank's :func:`capture_rng_state`,
    in rank order; ``info``: provenance stored as is (``model_name``, ``config``, ``torch_version``, ...).

    Raises:
        KeyError: ``parts`` lacks one of :data:`STATEFUL_PARTS`.
    """
    return {"model": model.state_dict(), **{name: parts[name].state_dict() for name in STATEFUL_PARTS},
            **dataclasses.asdict(state), "rng": rng, **info}


RELEASE_FORMAT = "release"  # the "format" entry of a release checkpoint


def release_checkpoint(model_name: str, model_state: Mapping[str, torch.Tensor], modules: tuple[str, ...],
                       config: Mapping[str, Any], step: Any, ema_weights: bool, source: str) -> dict[str, Any]:
    """What inference (and ``train.py --init-from``) needs alone: the weights of the sub-modules ``modules`` (all when
    empty) of ``model_state`` (EMA weights in place), the model's name, config and source; ``weights_only`` loads it."""
    weights = {key: value.detach().cpu().clone() for key, value in model_state.items() if in_modules(key, modules)}
    return {"format": RELEASE_FORMAT, "model_name": model_name, "config": dict(config), "step": step,
            "model": weights, "ema_weights": ema_weights, "source": source, "torch_version": str(torch.__version__)}
