"""Activation checkpointing (``train.activation_checkpointing``): chosen blocks keep only their inputs in the forward
pass and run their forward again in the backward. Only the block's ``forward`` is replaced (state-dict keys stay), by
the non-reentrant :func:`torch.utils.checkpoint.checkpoint`, which restores the RNG state (the same dropout masks).
FSDP2 hooks around ``__call__``, outside it. Sources: https://pytorch.org/docs/stable/checkpoint.html; Chen et al.,
"Training Deep Nets with Sublinear Memory Cost" (2016); torchtitan's ``apply_ac``."""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

MODES = ("none", "full", "selective")  # the values of train.activation_checkpointing


def apply_activation_checkpointing(blocks: list[nn.Module], mode: str, every: int = 2) -> list[nn.Module]:
    """Checkpoint the activations of ``blocks`` (the model's repeated sub-modules in forward order) in place: ``none``,
    ``full`` (every block) or ``selective`` (blocks ``0, every, 2 * every, ...``, torchtitan's per-layer mode). Returns
    the blocks it wrapped (a block checkpointed already is left as it is); a ValueError for an unknown ``mode``, or
    ``every < 1``."""
    if mode not in MODES:
        raise ValueError(f"activation checkpointing: unknown mode {mode!r}; use one of {', '.join(MODES)}")
    if every < 1:
        raise ValueError(f"activation checkpointing: every must be >= 1, got {every}")
    chosen = [] if mode == "none" else blocks if mode == "full" else blocks[::every]
    wrapped = []
    for block in chosen:
        if is_checkpointed(block):
            continue
        block.forward = functools.partial(_recomputed, block.forward)  # an instance attribute: this block only
        wrapped.append(block)
    return wrapped


def is_checkpointed(block: nn.Module) -> bool:
    """Whether :func:`apply_activation_checkpointing` has wrapped ``block``'s forward."""
    forward = block.__dict__.get("forward")
    return isinstance(forward, functools.partial) and forward.func is _recomputed


def _recomputed(forward, *args, **kwargs):
    if not torch.is_grad_enabled():  # inference and validation keep nothing for a backward anyway
        return forward(*args, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)
