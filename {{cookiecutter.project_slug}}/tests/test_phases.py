"""Models with several optimizers (``Training.phases``, a :class:`model.Phases`): what the loop does for each phase, on a toy GAN.

The toy has a generator and a discriminator of a few linear layers, and a ``train_step`` shaped like a GAN
vocoder's: the discriminator's phase on real and detached fake samples, then the generator's phase through the
frozen discriminator. The loop's own functions run it (``utils.training.setup.build_phases``, ``utils.training.step.forward_backward``); the
communication test runs them on 2 real gloo processes and counts what each network's DDP all-reduces.
"""

import dataclasses
import math
import os
import textwrap

import pytest
import torch
from conftest import ROOT, run_ranks
from torch import nn

from distributed import DistInfo
from model import ModelSpec, Phases, Training
from parts import config_schemas
from utils.checkpoint.files import CheckpointError
from utils.checkpoint.state import NamedStates
from utils.config import load_config
from utils.training.guards import StepCounts, StepOutcome, TrainingError, Verdict, all_reduce_numbers
from utils.training.optim import build_optimizers, build_scheduler, setup_precision
from utils.training.setup import build_phases
from utils.training.step import PhaseResult, forward_backward

PHASES = ("discriminator", "generator")


class ToyGAN(nn.Module):
    """Generator ``(B, 4) -> (B, 8)``, discriminator ``(B, 8) -> (B, 1)``."""

    def __init__(self):
        super().__init__()
        self.generator = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 8))
        self.discriminator = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.1), nn.Linear(16, 1))


def toy_step(phase, nets, batch):
    """LSGAN on toy data: ``batch = {"z": (B, 4), "real": (B, 8)}``."""
    generator, discriminator = nets["generator"], nets["discriminator"]
    if phase == "discriminator":
        with torch.no_grad():
            fake = generator(batch["z"])
        loss = ((discriminator(batch["real"]) - 1) ** 2).mean() + (discriminator(fake) ** 2).mean()
        return loss, {}
    fake = generator(batch["z"])
    adversarial = ((discriminator(fake) - 1) ** 2).mean()
    l1 = (fake - batch["real"]).abs().mean()
    return adversarial + 10 * l1, {"adv": adversarial.detach(), "l1": l1.detach()}


TOY_SPEC = ModelSpec(name="toy", config_cls=object, build_model=lambda cfg: ToyGAN(), training=Training(
    build_criterion=lambda cfg: None, build_datasets=lambda cfg: ((), ()), collate_fn=None, count_items=len,
    build_optimizer=lambda model, cfg, device: {
        "discriminator": torch.optim.AdamW(model.discriminator.parameters(), lr=1e-3),
        "generator": torch.optim.AdamW(model.generator.parameters(), lr=1e-3)},
    phases=Phases(names=PHASES, networks=lambda model: {"discriminator": model.discriminator,
                                                        "generator": model.generator},
                  train_step=toy_step)))


def with_phases(spec: ModelSpec, phases) -> ModelSpec:
    """``spec`` with its ``Training.phases`` replaced (``None``: one optimizer)."""
    return dataclasses.replace(spec, training=dataclasses.replace(spec.training, phases=phases))


def toy_config():
    return load_config(os.path.join(ROOT, "config.json"), config_schemas(), tiny=True)


def toy_batch(rows: slice = slice(None), n: int = 8) -> dict:
    g = torch.Generator().manual_seed(3)
    return {"z": torch.randn(n, 4, generator=g)[rows], "real": torch.randn(n, 8, generator=g)[rows]}


def build(seed: int = 0):
    torch.manual_seed(seed)
    model, cfg = ToyGAN(), toy_config()
    optimizers = build_optimizers(TOY_SPEC, model, None, torch.device("cpu"))
    schedulers = {name: build_scheduler(TOY_SPEC, name, opt, cfg) for name, opt in optimizers.items()}
    return model, build_phases(TOY_SPEC, model, optimizers, schedulers, cfg.train)


def test_accumulating_two_halves_gives_the_gradients_of_the_whole_batch():
    fp32 = setup_precision("fp32", torch.device("cpu"))
    grads = []
    for micro in ([toy_batch()], [toy_batch(slice(0, 4)), toy_batch(slice(4, 8))]):
        model, phases = build()
        for phase in phases:
            forward_backward(phase, phases, toy_step, micro, fp32, 0.0)
        grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) == 8
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], rtol=1e-5, atol=1e-7), name


def test_a_phase_trains_only_its_network_and_logs_its_metrics():
    fp32 = setup_precision("fp32", torch.device("cpu"))
    model, phases = build()
    result = forward_backward(phases[0], phases, toy_step, [toy_batch()], fp32, 0.0)
    assert all(p.grad is None for p in model.generator.parameters())
    assert all(p.grad is not None for p in model.discriminator.parameters())
    assert result.metrics == {} and torch.isfinite(result.loss) and result.grad_norm > 0
    model.discriminator.zero_grad(set_to_none=True)
    result = forward_backward(phases[1], phases, toy_step, [toy_batch()], fp32, 0.0)
    assert all(p.grad is None for p in model.discriminator.parameters()), "the frozen discriminator gets none"
    assert all(p.requires_grad for p in model.parameters()), "the freeze is taken back after the phase"
    assert set(result.metrics) == {"adv", "l1"}
    assert abs(result.loss.item() - (result.metrics["adv"] + 10 * result.metrics["l1"]).item()) < 1e-5


def test_a_steps_outcome_reads_its_stop_flag_and_items_from_the_last_phase_and_drops_a_non_finite_step():
    """What the loop reads after a step's phases (``StepOutcome``): the stop requests and items that the last phase's
    all-reduce summed, the last phase's loss and gradient norm, each phase's numbers by name, which updates were
    applied; a step with a non-finite first phase has no loss (its metrics row leaves it out of the average)."""
    fp32, cpu = setup_precision("fp32", torch.device("cpu")), torch.device("cpu")
    alone = DistInfo(rank=0, local_rank=0, world_size=1, device=cpu, backend=None)
    _, phases = build()
    nan = PhaseResult(torch.tensor(math.nan), torch.tensor(2.0), {}, 0.25)
    last = PhaseResult(torch.tensor(3.0), torch.tensor(4.0), {"l1": torch.tensor(0.5)}, 0.5)
    outcomes = []
    for first in (nan, PhaseResult(torch.tensor(1.0), torch.tensor(2.0), {}, 0.25)):
        outcome = StepOutcome(named_losses=True)
        outcome.add(phases[0], first, all_reduce_numbers(first, fp32.scaler, alone), Verdict(False, skipped=True))
        numbers = all_reduce_numbers(last, fp32.scaler, alone, StepCounts(stop_requests=1, items=16))
        outcome.add(phases[1], last, numbers, Verdict(False, skipped=False))
        outcomes.append(outcome)
    dropped, kept = outcomes
    assert dropped.loss is None and kept.loss == 3.0
    for outcome in outcomes:
        assert outcome.stop_requested and outcome.items == 16 and outcome.grad_norm == 4.0
        assert outcome.applied == {"discriminator": False, "generator": True}
        assert outcome.compute_time == 0.75
        assert {key: value for key, value in outcome.losses.items() if key != "loss_discriminator"} == {
            "grad_norm_discriminator": 2.0, "loss_generator": 3.0, "grad_norm_generator": 4.0, "l1": 0.5}
    assert kept.losses["loss_discriminator"] == 1.0
    quiet = StepOutcome()
    quiet.add(phases[1], last, all_reduce_numbers(last, fp32.scaler, alone), Verdict(False, skipped=False))
    assert not quiet.stop_requested and quiet.items == 0
    assert quiet.losses == {"l1": 0.5}  # one optimizer: its criterion's terms, no loss or gradient norm by phase


def test_several_optimizers_and_their_schedulers_round_trip_through_a_checkpoint(tmp_path):
    model, phases = build()
    fp32 = setup_precision("fp32", torch.device("cpu"))
    for phase in phases:
        forward_backward(phase, phases, toy_step, [toy_batch()], fp32, 0.0)
        phase.optimizer.step()
        phase.scheduler.step()
    saved = {"optimizer": NamedStates({p.name: p.optimizer for p in phases}).state_dict(),
             "scheduler": NamedStates({p.name: p.scheduler for p in phases}).state_dict()}
    torch.save(saved, tmp_path / "c.pt")
    loaded = torch.load(tmp_path / "c.pt", weights_only=True)
    _, fresh = build()
    NamedStates({p.name: p.optimizer for p in fresh}).load_state_dict(loaded["optimizer"])
    NamedStates({p.name: p.scheduler for p in fresh}).load_state_dict(loaded["scheduler"])
    for old, new in zip(phases, fresh):
        assert old.scheduler.state_dict() == new.scheduler.state_dict()
        for a, b in zip(old.optimizer.state_dict()["state"].values(), new.optimizer.state_dict()["state"].values()):
            assert all(torch.equal(a[k], b[k]) for k in a)
    try:
        NamedStates({"generator": fresh[1].optimizer}).load_state_dict(loaded["optimizer"])
    except CheckpointError as err:
        assert "holds states for ['discriminator', 'generator'], this run has ['generator']" in str(err)
    else:
        raise AssertionError("a checkpoint of other optimizers must be refused")


def test_a_bad_optimizer_contract_is_one_clear_error():
    cfg = toy_config()
    one = with_phases(TOY_SPEC, None)
    critic = with_phases(TOY_SPEC, dataclasses.replace(TOY_SPEC.training.phases, names=("critic", "generator")))
    for spec, message in ((one, "not an optimizer; a model with several optimizers names them in Training.phases"),
                          (critic, "must return a dict of one optimizer per phase (critic, generator)")):
        try:
            build_optimizers(spec, ToyGAN(), None, torch.device("cpu"))
        except TrainingError as err:
            assert message in str(err), str(err)
        else:
            raise AssertionError(message)
    no_networks = with_phases(TOY_SPEC, dataclasses.replace(TOY_SPEC.training.phases, networks=None))
    model = ToyGAN()
    optimizers = build_optimizers(no_networks, model, None, torch.device("cpu"))
    try:
        build_phases(no_networks, model, optimizers, {n: (None, "step") for n in optimizers}, cfg.train)
    except TrainingError as err:
        assert "Phases.networks must map each phase" in str(err)
    else:
        raise AssertionError("phases without networks must be refused")


# Two real ranks run one step of both phases; a DDP communication hook on each network counts what it
# all-reduces (the default all-reduce still does the work).
COUNT_WORKER = textwrap.dedent('''
    import gc
    import sys
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    import distributed as D
    from test_phases import build, toy_batch, toy_step
    from utils.training.optim import setup_precision
    from utils.training.step import forward_backward

    info = D.init_distributed()
    model, phases = build()
    sent = {"discriminator": {}, "generator": {}}

    def counting(network, during):
        def hook(state, bucket):
            sent[network][during[0]] = sent[network].get(during[0], 0) + bucket.buffer().numel()
            return allreduce_hook(None, bucket)
        return hook

    during = ["?"]
    for phase in phases:
        phase.wrapped.register_comm_hook(None, counting(phase.name, during))
    fp32 = setup_precision("fp32", torch.device("cpu"))
    half = slice(info.rank * 4, info.rank * 4 + 4)
    for phase in phases:
        during[0] = phase.name
        forward_backward(phase, phases, toy_step, [toy_batch(half)], fp32, 0.0)
        phase.optimizer.step()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    torch.save({"sent": sent, "grads": grads}, f"{sys.argv[1]}/rank{info.rank}.pt")
    del phases, model  # the DDP wrappers go before their process group does
    gc.collect()
    D.cleanup()
''')


@pytest.mark.slow
def test_the_generator_step_all_reduces_no_discriminator_gradient(tmp_path):
    run_ranks(COUNT_WORKER, tmp_path)
    results = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    model = ToyGAN()
    d_size = sum(p.numel() for p in model.discriminator.parameters())
    g_size = sum(p.numel() for p in model.generator.parameters())
    for result in results:
        # Each network's gradients are all-reduced once, in its own phase, and nowhere else.
        assert result["sent"] == {"discriminator": {"discriminator": d_size}, "generator": {"generator": g_size}}
    assert results[0]["grads"].keys() == results[1]["grads"].keys()
    for name in results[0]["grads"]:
        assert torch.equal(results[0]["grads"][name], results[1]["grads"][name]), name
