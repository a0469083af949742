"""Activation checkpointing (utils.training.activation_checkpoint): the gradients of the plain model for every model
that names its blocks, on one process and under DDP and FSDP on 2 gloo ranks, and the activation memory it saves.

A model's batch is its benchmark's synthetic one, or, for a model without a ``Benchmark`` (optional in ``model.py``),
two items of its own training set over a small synthetic corpus."""

import os
import textwrap

import pytest
import torch
from conftest import ROOT, run_ranks, shared_corpus
from torch import nn
from torch.utils.data import default_collate

from models import MODELS
from parts import PARTS, config_schemas
from utils.config import load_config
from utils.training.activation_checkpoint import apply_activation_checkpointing, is_checkpointed
from utils.training.criterion import loss_and_terms

WITH_BLOCKS = sorted(name for name, spec in MODELS.items() if spec.training.blocks is not None)


def tiny_config():
    return load_config(os.path.join(ROOT, "config.json"), config_schemas(), tiny=True)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """``corpus()``: a 6-clip corpus (made on first use, once per session) for models without a ``Benchmark``."""
    return lambda: shared_corpus(tmp_path_factory, "activation_checkpoint_corpus", 6)


def loss_and_gradients(name: str, mode: str, corpus, every: int = 2):
    """One forward and backward of model ``name`` (tiny config, training mode: dropout on) on a fixed batch
    (:func:`tiny_batch`), its blocks checkpointed as ``mode`` says; every phase's loss for a model with several."""
    spec, cfg = MODELS[name], tiny_config()
    training = spec.training
    torch.manual_seed(0)
    model = spec.build_model(cfg).train()
    wrapped = apply_activation_checkpointing(training.blocks(model), mode, every)
    batch = tiny_batch(spec, cfg, corpus)
    torch.manual_seed(2)  # the dropout masks
    if training.phases is not None:
        nets = training.phases.networks(model)
        loss = sum(training.phases.train_step(phase, nets, batch)[0] for phase in training.phases.names)
    else:
        loss, _ = loss_and_terms(training.build_criterion(cfg)(model(batch), batch))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, wrapped, model


def tiny_batch(spec, cfg, corpus) -> dict:
    """The synthetic batch of the model's first benchmark case (its tiny form); for a model without benchmark cases,
    the first two items of its training set over ``corpus()`` (``Training.build_datasets`` and ``collate_fn``, as the
    loop batches them). Moved through ``Training.on_device`` when the model has one."""
    if (bench := PARTS.benchmarks.get(spec.name)) is not None and bench.cases:
        case = bench.cases[0].tiny
        batch = bench.synthetic_batch(cfg, case.batch_size, torch.Generator().manual_seed(1), **case.batch_kwargs)
    else:
        cfg.data.dataset_path = str(corpus())
        train_set, _ = spec.training.build_datasets(cfg)
        batch = (spec.training.collate_fn or default_collate)([train_set[0], train_set[1]])
    if spec.training.on_device is not None:
        batch = spec.training.on_device(batch, cfg)
    return batch


@pytest.mark.skipif(not WITH_BLOCKS, reason="no registered model names its blocks (Training.blocks)")
@pytest.mark.parametrize("name", WITH_BLOCKS)
def test_checkpointed_blocks_give_the_gradients_of_the_plain_model(name, corpus):
    loss, grads, _, plain = loss_and_gradients(name, "none", corpus)
    assert grads, "nothing was trained"
    for mode in ("full", "selective"):
        other_loss, other_grads, wrapped, model = loss_and_gradients(name, mode, corpus)
        blocks = MODELS[name].training.blocks(model)
        assert wrapped == (blocks if mode == "full" else blocks[::2]) and all(map(is_checkpointed, wrapped))
        assert model.state_dict().keys() == plain.state_dict().keys(), "state-dict keys must not change"
        torch.testing.assert_close(other_loss, loss, rtol=1e-6, atol=1e-6)
        assert other_grads.keys() == grads.keys()
        for key in grads:  # the same arithmetic run twice: equal up to float rounding
            torch.testing.assert_close(other_grads[key], grads[key], rtol=1e-5, atol=1e-6, msg=f"{mode}: {key}")


def deep_stack(depth: int = 16, width: int = 256) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(depth)))


def saved_for_backward(model: nn.Module, x: torch.Tensor) -> int:
    """Bytes of the tensors autograd keeps for the backward pass of ``model(x).sum()``, at their peak."""
    held = {"now": 0, "peak": 0}

    def pack(tensor):
        held["now"] += tensor.numel() * tensor.element_size()
        held["peak"] = max(held["peak"], held["now"])
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(x).sum()
    loss.backward()
    return held["peak"]


def test_full_checkpointing_keeps_far_fewer_activations_and_selective_in_between():
    x = torch.randn(256, 256)
    plain = saved_for_backward(deep_stack(), x)
    full_model, half_model = deep_stack(), deep_stack()
    apply_activation_checkpointing(list(full_model), "full")
    apply_activation_checkpointing(list(half_model), "selective", every=2)
    full, half = saved_for_backward(full_model, x), saved_for_backward(half_model, x)
    assert plain >= 2 * full, (plain, full)
    assert full < half < plain, (full, half, plain)


def test_a_block_is_wrapped_once_and_bad_settings_are_refused():
    blocks = list(deep_stack(depth=4))
    assert apply_activation_checkpointing(blocks, "full") == blocks
    assert apply_activation_checkpointing(blocks, "full") == []  # already checkpointed
    assert apply_activation_checkpointing(list(deep_stack(depth=4)), "none") == []
    with pytest.raises(ValueError, match="unknown mode 'some'"):
        apply_activation_checkpointing(blocks, "some")
    with pytest.raises(ValueError, match="every must be >= 1"):
        apply_activation_checkpointing(blocks, "selective", every=0)


# Two real ranks: DDP and FSDP, each without and with checkpointed blocks, on each rank's half of a batch; rank 0
# saves the whole gradient of each (FSDP's shards gathered).
WORKER = textwrap.dedent('''
    import gc
    import sys
    import torch
    import distributed as D
    from test_activation_checkpoint import deep_stack
    from utils.training.activation_checkpoint import apply_activation_checkpointing
    from utils.training.fsdp import shard_model

    info = D.init_distributed()
    torch.manual_seed(5)
    x = torch.randn(16, 64)[info.rank * 8:info.rank * 8 + 8]
    grads = {}
    for parallelism in ("ddp", "fsdp"):
        for mode in ("none", "full"):
            model = deep_stack(depth=6, width=64)
            blocks = list(model)
            apply_activation_checkpointing(blocks, mode)
            net = shard_model(model, blocks) if parallelism == "fsdp" else D.apply_gradient_allreduce(model)
            net(x).pow(2).mean().backward()
            grads[f"{parallelism}-{mode}"] = {n: (p.grad.full_tensor() if D.split_over_ranks(p.grad) else p.grad).clone()
                                            for n, p in model.named_parameters()}
            del net, model  # the DDP/FSDP wrappers go before their process group does
            gc.collect()
    if info.rank == 0:
        torch.save(grads, sys.argv[1] + "/grads.pt")
    D.cleanup()
''')


@pytest.mark.slow
def test_checkpointing_under_ddp_and_fsdp_on_two_ranks_keeps_the_gradients(tmp_path):
    run_ranks(WORKER, tmp_path)
    grads = torch.load(tmp_path / "grads.pt", weights_only=True)
    reference = grads["ddp-none"]
    for run in ("ddp-full", "fsdp-none", "fsdp-full"):
        assert grads[run].keys() == reference.keys(), run
        for key in reference:
            torch.testing.assert_close(grads[run][key], reference[key], rtol=1e-5, atol=1e-7, msg=f"{run}: {key}")


FAST = sorted(name for name in WITH_BLOCKS if MODELS[name].training.optimize_for_training is not None)


@pytest.mark.skipif(not FAST, reason="no registered model has both blocks and a fast path (optimize_for_training)")
@pytest.mark.slow
def test_checkpointed_blocks_work_with_the_fast_path(fresh_dynamo, corpus):
    """train.compile=true after activation checkpointing (the order train.py applies them) gives the gradients of
    the fast path without checkpointing (the first such model; compiling on a CPU takes a while)."""
    name = FAST[0]
    spec, cfg = MODELS[name], tiny_config()
    grads = {}
    for mode in ("none", "full"):
        torch.manual_seed(0)
        model = spec.build_model(cfg).train()
        apply_activation_checkpointing(spec.training.blocks(model), mode)
        model = spec.training.optimize_for_training(model, cfg)
        batch = tiny_batch(spec, cfg, corpus)
        torch.manual_seed(2)
        loss_and_terms(spec.training.build_criterion(cfg)(model(batch), batch))[0].backward()
        grads[mode] = {key: p.grad for key, p in model.named_parameters() if p.grad is not None}
    assert grads["full"].keys() == grads["none"].keys() and grads["none"]
    for key in grads["none"]:
        torch.testing.assert_close(grads["full"][key], grads["none"][key], rtol=1e-5, atol=1e-6, msg=key)
