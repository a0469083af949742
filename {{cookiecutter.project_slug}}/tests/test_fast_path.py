"""The fast path (``train.compile``) keeps the mathematics of the eager path; ``scripts/benchmark.py`` runs.

Whole models are compiled with the ``aot_eager`` backend: Dynamo's capture and AOTAutograd's forward and
backward graphs, exactly what Inductor receives, without Inductor's C++ code generation (minutes on a small
CPU). One test per model compiles with Inductor itself, on the smallest model.
"""

import argparse
import copy
import json
import subprocess
import sys

import pytest
import torch
from torch._dynamo.utils import counters

from conftest import ROOT, synth_corpus
from model import MODELS, config_schemas
from scripts import benchmark
from utils.config import build_config

CPU = torch.device("cpu")
FAST_MODELS = [name for name, spec in MODELS.items() if spec.optimize_for_training is not None]
BATCH_MODELS = [name for name, spec in MODELS.items() if spec.synthetic_batch is not None]
WITHOUT_BATCHES = sorted(set(MODELS) - set(BATCH_MODELS))


def bench_args(*argv: str) -> argparse.Namespace:
    """``scripts/benchmark.py`` arguments for a tiny CPU run with the aot_eager backend, plus ``argv``."""
    return benchmark.parse_args(["--tiny", "--device", "cpu", "--backend", "aot_eager", *argv])


def first_tiny_case(name):
    """``(name, case)``: model ``name``'s first benchmark case."""
    return next(pair for pair in benchmark.cases_for([name]))


@pytest.fixture(autouse=True)
def _fresh_dynamo(fresh_dynamo):
    """Each test compiles from scratch and counts its own graphs."""
    yield


@pytest.mark.parametrize("name", FAST_MODELS)
def test_fast_path_loss_matches_eager_fp32_and_bf16_is_close(name):
    rows = benchmark.check_case(*first_tiny_case(name), bench_args(), CPU)
    by_mode = {row["mode"]: row for row in rows}
    fp32, bf16 = by_mode["check-fp32"], by_mode["check-amp-bf16"]
    assert fp32["loss_rel_diff"] < 1e-5, fp32
    assert fp32["grad_rel_diff"] < 1e-4, fp32  # the backward too, not only the loss
    assert bf16["loss_rel_diff"] < 2e-2, bf16
    assert bf16["loss_rel_diff"] > 0, "bf16 autocast ran: its loss is not bit-equal to float32's"
    assert all(row["ok"] for row in rows)
    assert counters["stats"]["unique_graphs"] >= 1, "the fast path compiled something"


@pytest.mark.parametrize("name", FAST_MODELS)
def test_check_catches_a_fast_path_that_changes_the_mathematics(name, monkeypatch):
    spec = MODELS[name]

    def wrong(model, cfg, **kwargs):  # a 'fast path' that scales every parameter by 1.01
        with torch.no_grad():
            for param in model.parameters():
                param.mul_(1.01)
        return model

    monkeypatch.setitem(MODELS, name, type(spec)(**{**spec.__dict__, "optimize_for_training": wrong}))
    rows = benchmark.check_case(*first_tiny_case(name), bench_args(), CPU)
    assert not rows[0]["ok"] and rows[0]["loss_rel_diff"] > 1e-5, rows[0]


@pytest.mark.parametrize("name", FAST_MODELS)
def test_fast_path_keeps_parameters_and_checkpoint_keys(name):
    spec = MODELS[name]
    cfg, _ = benchmark.case_config(*first_tiny_case(name), bench_args())
    torch.manual_seed(0)
    eager = spec.build_model(cfg)
    fast = spec.optimize_for_training(copy.deepcopy(eager), cfg, backend="aot_eager")
    assert list(fast.state_dict()) == list(eager.state_dict())
    fast.load_state_dict(eager.state_dict())  # an eager checkpoint loads into the fast model and back
    eager.load_state_dict(fast.state_dict())


def test_train_compile_is_off_by_default_and_settable():
    assert build_config({}, config_schemas()).train.compile is False
    assert build_config({}, config_schemas(), overrides=["train.compile=true"]).train.compile is True


def test_benchmark_cpu_smoke_writes_a_row_per_case_and_precision(tmp_path):
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, "scripts/benchmark.py", "--tiny", "--device", "cpu", "--json", str(out),
                           "--steps", "1", "--warmup", "0"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in WITHOUT_BATCHES:  # a model without random batches is skipped, and the run says so
        assert f"skipping {name}: its ModelSpec has no synthetic_batch" in proc.stdout, proc.stdout
    if not BATCH_MODELS:
        assert not out.exists() or json.loads(out.read_text()) == []
        return
    rows = json.loads(out.read_text())
    expected = {(benchmark.case_name(name, case, benchmark.case_config(name, case, bench_args())[1]), mode)
                for name, case in benchmark.cases_for(list(MODELS)) for mode in ("tf32", "amp-bf16", "amp-fp16")}
    assert {(row["case"], row["mode"]) for row in rows} == expected
    for row in rows:
        assert "error" not in row, row
        assert row["path"] == "eager" and row["peak_gib"] is None
        assert row["step_s"] > 0  # both rounded: step_s to 0.1 ms, items_per_s to an integer
        assert row["items_per_s"] == pytest.approx(row["items_per_step"] / row["step_s"], rel=1e-3, abs=1)
        assert row["items_per_step"] > 0 and row["loss"] == row["loss"]  # finite, not NaN
    assert "| case | mode |" in proc.stdout


@pytest.mark.parametrize("argv", [["--precision", "fp8"], ["--model", "nosuchmodel"], ["--loader"]])
def test_benchmark_refuses_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        benchmark.parse_args([*argv, "--device", "cpu"])
    assert exit_info.value.code == 2
    assert (argv[1] if len(argv) > 1 else "--dataset-path") in capsys.readouterr().err


@pytest.mark.skipif(not BATCH_MODELS, reason="no registered model has a synthetic_batch to time")
def test_benchmark_compare_adds_the_ratio(tmp_path, monkeypatch, capsys):
    name, case = first_tiny_case(BATCH_MODELS[0])
    row_name = benchmark.case_name(name, case, benchmark.case_config(name, case, bench_args())[1])
    reference = tmp_path / "ref.json"
    reference.write_text(json.dumps([{"case": row_name, "mode": "tf32", "step_s": 1.0, "items_per_s": 1000}]))
    out = tmp_path / "ours.json"
    code = benchmark.main(["--tiny", "--device", "cpu", "--eager", "--model", name, "--cases", row_name,
                           "--precision", "tf32", "--steps", "1", "--warmup", "0", "--compare", str(reference),
                           "--json", str(out)])
    assert code == 0
    (row,) = json.loads(out.read_text())
    assert row["ratio_vs_reference"] == round(row["items_per_s"] / 1000, 3)


def test_loader_benchmark_on_a_corpus(tmp_path, capsys):
    corpus = synth_corpus(tmp_path / "corpus", n=12)
    out = tmp_path / "loader.json"
    code = benchmark.main(["--loader", "--tiny", "--device", "cpu", "--dataset-path", str(corpus), "--steps", "5",
                           "--workers", "0", "2", "--json", str(out)])
    assert code == 0
    rows = json.loads(out.read_text())
    assert {(r["case"], r.get("workers")) for r in rows} == {
        *((f"loader_{name}_wav", w) for name in MODELS for w in (0, 2)), *((f"train_{name}", None) for name in MODELS)}
    for row in rows:
        assert row["items_per_s"] > 0
        assert row["mode"] == "train" or row["batches"] == 5
    table = capsys.readouterr().out.split("| loader | 0 workers | 2 workers | train step | workers needed |")[1]
    for name in MODELS:
        line = next(line for line in table.splitlines() if line.startswith(f"| loader_{name}_wav |"))
        step = next(r["items_per_s"] for r in rows if r["case"] == f"train_{name}")
        assert f"| {step:,} |" in line, line


def test_loader_benchmark_needs_enough_data(tmp_path, capsys):
    corpus = synth_corpus(tmp_path / "corpus", n=4)
    name = next(iter(MODELS))
    code = benchmark.main(["--loader", "--tiny", "--device", "cpu", "--dataset-path", str(corpus), "--model", name,
                           "--set", f"{name}.batch_size=64"])
    assert code == 1
    assert "too few for one batch of 64" in capsys.readouterr().err
