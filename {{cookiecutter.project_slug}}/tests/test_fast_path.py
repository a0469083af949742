"""The fast path (``train.compile``) keeps the mathematics of the eager path.

Whole models are compiled with the ``aot_eager`` backend: Dynamo's capture and AOTAutograd's forward and
backward graphs, exactly what Inductor receives, without Inductor's C++ code generation (minutes on a small
CPU). One test per model compiles with Inductor itself, on the smallest model.
"""

import copy
import os

import pytest
import torch
import torch._dynamo.config as dynamo_config
import torch._inductor.config as inductor_config
from conftest import ROOT, process_settings_kept, shared_corpus
from torch._dynamo.utils import counters
from torch.utils.data import default_collate

from models import MODELS
from parts import PARTS, config_schemas
from utils.config import build_config, load_config
from utils.training.optim import loss_and_grads
from utils.training.recipe import apply_recipe

CPU = torch.device("cpu")
FAST_MODELS = [name for name, spec in MODELS.items() if spec.training.optimize_for_training is not None]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """``corpus()``: a 6-clip corpus (made on first use, once per session) for models without a ``Benchmark``."""
    return lambda: shared_corpus(tmp_path_factory, "fast_path_corpus", 6)


def tiny_case(name: str, corpus) -> tuple:
    """``(cfg, batch)``: model ``name`` in the tiny config with its first benchmark case's tiny overrides and its
    recipe, and that case's tiny synthetic batch (``Benchmark.synthetic_batch``, seed 0) on the CPU; for a model
    without a ``Benchmark`` (a project without the benchmarks part), the first two items of its training set over
    ``corpus()``, batched as the loop batches them."""
    spec, bench = MODELS[name], PARTS.benchmarks.get(name)
    shape = (bench.cases[0].tiny or bench.cases[0]) if bench is not None and bench.cases else None
    cfg = apply_recipe(spec, load_config(os.path.join(ROOT, "config.json"), config_schemas(), tiny=True,
                                         overrides=list(shape.overrides) if shape else []))
    if bench is None:
        cfg.data.dataset_path = str(corpus())
        train_set, _ = spec.training.build_datasets(cfg)
        return cfg, (spec.training.collate_fn or default_collate)([train_set[0], train_set[1]])
    batch = bench.synthetic_batch(cfg, (shape.batch_size if shape else 0) or cfg.section(name).batch_size,
                                  torch.Generator().manual_seed(0), **(shape.batch_kwargs if shape else {}))
    return cfg, batch



@pytest.fixture(autouse=True)
def _fresh_dynamo(fresh_dynamo):
    """Each test compiles from scratch, counts its own graphs and leaves the process's settings as it found them."""
    with process_settings_kept():
        yield


def test_process_settings_kept_undoes_what_the_check_sets():
    limit = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    before = (inductor_config.fallback_random, getattr(dynamo_config, limit), torch.backends.cuda.matmul.allow_tf32,
              torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    with process_settings_kept():
        inductor_config.fallback_random = not before[0]
        setattr(dynamo_config, limit, before[1] + 64)
        torch.backends.cuda.matmul.allow_tf32 = not before[2]
        torch.backends.cudnn.allow_tf32 = not before[3]
        torch.backends.cudnn.benchmark = not before[4]
    assert (inductor_config.fallback_random, getattr(dynamo_config, limit), torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark) == before


@pytest.mark.slow
@pytest.mark.parametrize("name", FAST_MODELS)
def test_fast_path_loss_matches_eager_fp32_and_bf16_is_close(name, corpus):
    spec, (cfg, batch) = MODELS[name], tiny_case(name, corpus)
    inductor_config.fallback_random = True  # dropout: eager's random numbers inside compiled code too
    torch.manual_seed(0)
    eager = spec.build_model(cfg).train()
    noise = torch.Generator().manual_seed(1)
    with torch.no_grad():  # every weight off its initial value (a layer that starts at zero included)
        for param in eager.parameters():
            param.add_(0.01 * torch.randn(param.shape, generator=noise))
    fast = spec.training.optimize_for_training(copy.deepcopy(eager), cfg, backend="aot_eager")
    criterion = spec.training.build_criterion(cfg)
    ref_loss, ref_grads = loss_and_grads(eager, criterion, batch, "fp32", CPU)
    for precision, limit, grad_limit in (("fp32", 1e-5, 1e-4), ("bf16", 2e-2, None)):
        loss, grads = loss_and_grads(fast, criterion, batch, precision, CPU)
        rel = abs(loss - ref_loss) / max(abs(ref_loss), 1e-12)
        assert rel < limit, (precision, loss, ref_loss)
        if grad_limit is not None:  # the backward too, not only the loss
            assert float((grads - ref_grads).norm() / ref_grads.norm()) < grad_limit, precision
        else:
            assert rel > 0, "bf16 autocast ran: its loss is not bit-equal to float32's"
    assert counters["stats"]["unique_graphs"] >= 1, "the fast path compiled something"


@pytest.mark.parametrize("name", FAST_MODELS)
def test_fast_path_keeps_parameters_and_checkpoint_keys(name, corpus):
    spec, (cfg, _) = MODELS[name], tiny_case(name, corpus)
    torch.manual_seed(0)
    eager = spec.build_model(cfg)
    fast = spec.training.optimize_for_training(copy.deepcopy(eager), cfg, backend="aot_eager")
    assert list(fast.state_dict()) == list(eager.state_dict())
    fast.load_state_dict(eager.state_dict())  # an eager checkpoint loads into the fast model and back
    eager.load_state_dict(fast.state_dict())


def test_train_compile_is_off_by_default_and_settable():
    assert build_config({}, config_schemas()).train.compile is False
    assert build_config({}, config_schemas(), overrides=["train.compile=true"]).train.compile is True
