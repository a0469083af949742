"""The run's validation component (:class:`utils.training.validate.Validator`) on a toy linear model: the loss it returns,
and each term its criterion returns beside the loss, is the mean over every batch of every rank's shard, computed with
the EMA weights when the run keeps them, and the model comes back with its own weights, in train mode; rank 0 draws
the first batch once. The ranks' mean is checked on 2 real gloo processes whose shards hold different numbers of
batches."""

import contextlib
import json
import textwrap
from types import SimpleNamespace

import pytest
import torch
from conftest import run_ranks
from torch import nn

from distributed import DistInfo
from utils.training.ema import EMA
from utils.training.validate import Validator

CPU = torch.device("cpu")


def shard(rank: int) -> list[dict]:
    """Rank ``rank``'s validation batches: rank 0 holds 2, rank 1 holds 1 (a batch mean over ranks would differ from
    the mean over batches)."""
    generator = torch.Generator().manual_seed(rank)
    return [{"x": torch.randn(3, 4, generator=generator), "y": torch.randn(3, 2, generator=generator)}
            for _ in range(2 - rank)]


class Toy(nn.Linear):
    """``batch["x"]`` ``(B, 4)`` -> ``(B, 2)``."""

    def __init__(self):
        super().__init__(4, 2)

    def forward(self, batch: dict) -> torch.Tensor:
        return super().forward(batch["x"])


def mse_and_mae(outputs: torch.Tensor, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The toy's criterion: the mean squared error, and the mean absolute error as a term to log."""
    return nn.functional.mse_loss(outputs, batch["y"]), {"mae": nn.functional.l1_loss(outputs, batch["y"])}


def toy_validator(rank: int, world_size: int, drawn: list) -> tuple[Validator, nn.Module, EMA]:
    """A validator of a ``(B, 4) -> (B, 2)`` linear model whose EMA holds other weights than the model; ``drawn``
    receives ``(step, batch)`` of each ``log_validation`` call."""
    torch.manual_seed(0)
    model = Toy()
    ema = EMA(model, (), decay=0.5)
    with torch.no_grad():
        for average in ema.averages.values():
            average.add_(1.0)  # the averages differ from the weights
    spec = SimpleNamespace(training=SimpleNamespace(
        log_validation=lambda plain, batch, outputs, step, writer, output_dir, cfg: drawn.append((step, batch))))
    validator = Validator(model=model, criterion=mse_and_mae,
                          loader=shard(rank), spec=spec, cfg=None,
                          dist=DistInfo(rank=rank, local_rank=rank, world_size=world_size, device=CPU, backend=None),
                          autocast=contextlib.nullcontext,
                          prepare=None, writer=None, output_dir=None, ema=ema)
    return validator, model, ema


def expected_losses(ema: EMA, ranks: range) -> list[float]:
    """The means over every batch of ``ranks``' shards of the loss and the term of a model holding the EMA's averages."""
    model = nn.Linear(4, 2)
    model.load_state_dict(ema.averages)
    losses, maes = [], []
    for batch in (batch for rank in ranks for batch in shard(rank)):
        loss, terms = mse_and_mae(model(batch["x"]), batch)
        losses.append(loss.item())
        maes.append(terms["mae"].item())
    return [sum(losses) / len(losses), sum(maes) / len(maes)]


def test_validation_is_the_mean_batch_loss_of_the_ema_weights_and_leaves_the_model_training():
    drawn = []
    validator, model, ema = toy_validator(0, 1, drawn)
    weights = {name: value.clone() for name, value in model.state_dict().items()}
    loss, terms = validator.validate(step=7)
    assert [loss, *terms.values()] == pytest.approx(expected_losses(ema, range(1)), rel=1e-6) and list(terms) == ["mae"]
    assert all(torch.equal(value, weights[name]) for name, value in model.state_dict().items())  # its own weights back
    assert model.training
    assert [step for step, _ in drawn] == [7] and torch.equal(drawn[0][1]["x"], shard(0)[0]["x"])  # the first batch



def test_validation_draws_from_a_fork_of_the_random_stream_and_leaves_training_its_own():
    """A model that draws at random in eval mode (noise, a dropout kept on): each validation draws from where the
    stream stands (another state, another loss), and training then continues the stream as it was before it."""
    validator, model, _ = toy_validator(0, 1, [])
    plain = model.forward
    model.forward = lambda batch: plain(batch) + torch.randn(len(batch["x"]), 2)
    losses = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        state = torch.random.get_rng_state()
        losses.append(validator.validate(step=1).loss)
        assert torch.equal(torch.random.get_rng_state(), state)
    assert losses[0] != losses[1]

WORKER = textwrap.dedent('''
    import json, sys
    import distributed as D
    from test_validate import toy_validator

    info = D.init_distributed()
    drawn = []
    validator, model, _ = toy_validator(info.rank, info.world_size, drawn)
    loss, terms = validator.validate(step=3)
    with open(f"{sys.argv[1]}/rank{info.rank}.json", "w") as file:
        json.dump({"loss": loss, "terms": terms, "drawn": [step for step, _ in drawn]}, file)
    D.cleanup()
''')


@pytest.mark.slow
def test_validation_is_the_mean_over_every_batch_of_every_rank(tmp_path):
    run_ranks(WORKER, tmp_path)
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    _, _, ema = toy_validator(0, 2, [])
    expected = expected_losses(ema, range(2))  # 3 batches: rank 0's 2 and rank 1's 1
    for result in results:
        assert [result["loss"], result["terms"]["mae"]] == pytest.approx(expected, rel=1e-6)
    assert [result["drawn"] for result in results] == [[3], []]  # rank 0 alone draws
