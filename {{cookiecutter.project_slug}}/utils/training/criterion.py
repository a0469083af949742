"""What a criterion returns (``Training.build_criterion``): the loss, or the loss and its named terms to log."""

from __future__ import annotations

from typing import Any

import torch

from utils.errors import TrainingError
from utils.run_log import SCALARS

CONTRACT = ("a criterion returns the loss (a scalar tensor), or (loss, {name: scalar tensor}) to log its terms too "
            "(model.Training.build_criterion)")


def loss_and_terms(returned: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``(loss, {term: value})`` of what a criterion returned: a bare loss tensor has no terms; ``(loss, terms)`` is
    taken as it is, each term a scalar (0-dimensional) tensor, logged only (detached or not: nothing back-propagates
    through it). The loop averages each term like the loss and logs it under ``losses`` of ``metrics.jsonl`` and
    ``val_metrics.jsonl`` and as ``train/<term>``, ``val/<term>`` (TensorBoard, the trackers); the ranks all-reduce
    the terms in order, so a criterion returns the same names in the same order on every call.

    Raises:
        TrainingError: anything else; a term named by no string, or by a name of the metrics row's own scalars
            (``loss``, ``lr``, ...: they would share its ``train/<name>``); a term that is not a scalar tensor.
    """
    if torch.is_tensor(returned):
        return returned, {}
    if not (isinstance(returned, tuple) and len(returned) == 2 and torch.is_tensor(returned[0])
            and isinstance(returned[1], dict)):
        shape = f"a tuple of {len(returned)}" if isinstance(returned, tuple) else f"a {type(returned).__name__}"
        raise TrainingError(f"the model's criterion returned {shape}: {CONTRACT}")
    loss, terms = returned
    for name, value in terms.items():
        if not isinstance(name, str) or name in SCALARS:
            raise TrainingError(f"the model's criterion returned a term named {name!r}: term names are strings other "
                                f"than {', '.join(SCALARS)} (the metrics row's own)")
        if not torch.is_tensor(value) or value.dim() != 0:
            what = f"a tensor of shape {tuple(value.shape)}" if torch.is_tensor(value) else type(value).__name__
            raise TrainingError(f"the model's criterion returned term {name!r} as {what}: {CONTRACT}")
    return loss, terms
