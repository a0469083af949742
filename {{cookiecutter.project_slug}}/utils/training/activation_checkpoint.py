"""Activation checkpointing: chosen blocks keep only their inputs in the forward pass and run their forward again during
the backward pass, trading about one more forward of compute for their activation memory.

``train.activation_checkpointing`` picks the blocks among ``ModelSpec.blocks``: ``full`` every one, ``selective`` every
``train.activation_checkpointing_every``-th one (torchtitan's per-layer selective mode), ``none`` none.

The block's module tree, parameters and state-dict keys stay as they are (checkpoints load either way): only the block's
``forward`` is replaced, by one that runs the original through :func:`torch.utils.checkpoint.checkpoint` (non-reentrant;
the random number generator state is saved and put back for the recomputation, so dropout draws the same masks and the
gradients are those of the plain model). FSDP2's ``fully_shard`` of the same block hooks around its ``__call__``,
outside this forward, so the recomputation runs while the block's weights are gathered: the order torchtitan applies
them in (checkpoint inside, shard outside).

Sources: https://pytorch.org/docs/stable/checkpoint.html; Chen et al., "Training Deep Nets with Sublinear Memory Cost"
(2016); pytorch/torchtitan's ``apply_ac``.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

MODES = ("none", "full", "selective")
"""The values of ``train.activation_checkpointing``."""


def apply_activation_checkpointing(blocks: list[nn.Module], mode: str, every: int = 2) -> list[nn.Module]:
    """Checkpoint the activations of ``blocks`` as ``mode`` says, in place; returns the blocks wrapped.

    Args:
        blocks: the model's repeated sub-modules in forward order (``ModelSpec.blocks``).
        mode: ``none`` (nothing), ``full`` (every block) or ``selective`` (blocks ``0, every, 2 * every, ...``).
        every: the stride of ``selective``.

    Returns:
        The blocks now checkpointed (a block already checkpointed is left as it is, and not listed twice).

    Raises:
        ValueError: an unknown ``mode``, or ``every < 1``.
    """
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
