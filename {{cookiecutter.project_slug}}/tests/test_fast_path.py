"""The fast path (``train.compile``) keeps the mathematics of the eager path; ``scripts/benchmark.py`` runs.

Whole models are compiled with the ``aot_eager`` backend: Dynamo's capture and AOTAutograd's forward and
backward graphs, exactly what Inductor receives, without Inductor's C++ code generation (minutes on a small
CPU). One test per model compiles with Inductor itself, on the smallest model.
"""

import argparse
import copy
import json
import os
import subprocess
import sys

import pytest
import torch
from torch._dynamo.utils import counters

from conftest import ROOT, synth_corpus
from model import MODELS
from scripts import benchmark
from utils.config import SHARED_SECTIONS, build_config

CPU = torch.device("cpu")
FAST_MODELS = [name for name, spec in MODELS.items() if spec.optimize_for_training is not None]


# Smaller still than the benchmark's --tiny cases: compilation time grows with the number of layers.
SMALLER = {"waveglow": ["waveglow.n_flows=2", "waveglow.wn_layers=1"],
           "tacotron2": ["tacotron2.encoder_n_convolutions=1", "tacotron2.postnet_n_convolutions=2"]}


def bench_args(*argv: str) -> argparse.Namespace:
    """``scripts/benchmark.py`` arguments for a tiny CPU run with the aot_eager backend, plus ``argv``."""
    return benchmark.parse_args(["--tiny", "--device", "cpu", "--backend", "aot_eager", *argv])


def smaller(name: str) -> list[str]:
    """``--set`` arguments that shrink model ``name`` further (none for a model this file does not know)."""
    return [arg for item in SMALLER.get(name, []) for arg in ("--set", item)]


def first_tiny_case(name):
    return benchmark.cases_for([name])[0]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch and counts its own graphs."""
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("name", FAST_MODELS)
def test_fast_path_loss_matches_eager_fp32_and_bf16_is_close(name):
    rows = benchmark.check_case(first_tiny_case(name), bench_args(*smaller(name)), CPU)
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
    rows = benchmark.check_case(first_tiny_case(name), bench_args(*smaller(name)), CPU)
    assert not rows[0]["ok"] and rows[0]["loss_rel_diff"] > 1e-5, rows[0]


@pytest.mark.parametrize("name", FAST_MODELS)
def test_fast_path_keeps_parameters_and_checkpoint_keys(name):
    spec = MODELS[name]
    cfg, _ = benchmark.case_config(first_tiny_case(name), bench_args())
    torch.manual_seed(0)
    eager = spec.build_model(cfg)
    fast = spec.optimize_for_training(copy.deepcopy(eager), cfg, backend="aot_eager")
    assert list(fast.state_dict()) == list(eager.state_dict())
    fast.load_state_dict(eager.state_dict())  # an eager checkpoint loads into the fast model and back
    eager.load_state_dict(fast.state_dict())


def test_train_compile_is_off_by_default_and_settable():
    schemas = {**SHARED_SECTIONS, **{n: s.config_cls for n, s in MODELS.items()}}
    assert build_config({}, schemas).train.compile is False
    assert build_config({}, schemas, overrides=["train.compile=true"]).train.compile is True


def test_benchmark_cpu_smoke_writes_a_row_per_case_and_precision(tmp_path):
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, "scripts/benchmark.py", "--tiny", "--device", "cpu", "--json", str(out),
                           "--steps", "1", "--warmup", "0"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    expected = {(case.name, mode) for case in benchmark.cases_for(list(MODELS))
                for mode in ("tf32", "amp-bf16", "amp-fp16")}
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


def test_benchmark_compare_adds_the_ratio(tmp_path, monkeypatch, capsys):
    name = next(iter(MODELS))
    case = first_tiny_case(name)
    reference = tmp_path / "ref.json"
    reference.write_text(json.dumps([{"case": case.name, "mode": "tf32", "step_s": 1.0, "items_per_s": 1000}]))
    out = tmp_path / "ours.json"
    code = benchmark.main(["--tiny", "--device", "cpu", "--eager", "--cases", case.name, "--precision", "tf32",
                           "--steps", "1", "--warmup", "0", "--compare", str(reference), "--json", str(out)])
    assert code == 0
    (row,) = json.loads(out.read_text())
    assert row["ratio_vs_reference"] == round(row["items_per_s"] / 1000, 3)


def test_loader_benchmark_on_a_corpus(tmp_path):
    corpus = synth_corpus(tmp_path / "corpus", n=12)
    out = tmp_path / "loader.json"
    code = benchmark.main(["--loader", "--tiny", "--device", "cpu", "--dataset-path", str(corpus), "--steps", "5",
                           "--json", str(out)])
    assert code == 0
    rows = {row["case"]: row for row in json.loads(out.read_text())}
    assert set(rows) == {f"loader_{name}_wav" for name in MODELS}
    for row in rows.values():
        assert row["mode"] == "loader" and row["items_per_s"] > 0 and row["batches"] == 5
        assert row["workers"] == 1  # config.json's tiny block


def test_loader_benchmark_needs_enough_data(tmp_path, capsys):
    corpus = synth_corpus(tmp_path / "corpus", n=4)
    name = next(iter(MODELS))
    code = benchmark.main(["--loader", "--tiny", "--device", "cpu", "--dataset-path", str(corpus), "--model", name,
                           "--set", f"{name}.batch_size=64"])
    assert code == 1
    assert "too few for one batch of 64" in capsys.readouterr().err


# >>> waveglow
def test_waveglow_gate_with_inductor():
    """The real compiler on the piece it fuses in every WN layer: add, tanh, sigmoid, product."""
    from modules.waveglow import add_gated_activation
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 50, generator=g, requires_grad=True)
    cond = torch.randn(2, 8, 50, generator=g, requires_grad=True)
    outputs = []
    for gate in (add_gated_activation, torch.compile(add_gated_activation, fullgraph=True, dynamic=False)):
        out = gate(x, cond, 4)
        out.backward(torch.ones_like(out))
        outputs.append((out, x.grad.clone(), cond.grad.clone()))
        x.grad = cond.grad = None
    for a, b in zip(*outputs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    expected = torch.tanh((x + cond)[:, :4]) * torch.sigmoid((x + cond)[:, 4:])
    torch.testing.assert_close(outputs[1][0], expected)
    assert counters["stats"]["unique_graphs"] == 1
# <<< waveglow


# >>> tacotron2
def tiny_tacotron2(text_bucket=1):
    from modules.tacotron2 import Decoder
    torch.manual_seed(0)
    decoder = Decoder(12, encoder_dim=16, attention_rnn_dim=24, decoder_rnn_dim=24, prenet_dim=8, attention_dim=8,
                      attention_location_n_filters=4, attention_location_kernel_size=5, p_attention_dropout=0.0,
                      p_decoder_dropout=0.0)
    decoder.prenet.dropout = 0.0
    decoder.text_bucket = text_bucket
    return decoder


def decoder_inputs(text_len, batch=3, frames=7, seed=0):
    from modules.tacotron2 import get_padding_mask
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([text_len] + [max(1, text_len - 2 - i) for i in range(batch - 1)])
    memory = torch.randn(batch, text_len, 16, generator=g)
    return memory, torch.randn(batch, 12, frames, generator=g), get_padding_mask(lengths, text_len)


def test_text_bucketing_leaves_the_decoder_outputs_unchanged():
    plain, bucketed = tiny_tacotron2(), tiny_tacotron2(text_bucket=8)
    memory, mels, mask = decoder_inputs(text_len=11)
    for a, b in zip(plain(memory, mels, mask), bucketed(memory, mels, mask)):
        assert a.shape == b.shape  # alignments are cut back to the 11 symbols
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_pad_memory_masks_only_the_added_positions():
    from modules.tacotron2 import pad_memory
    memory, _, mask = decoder_inputs(text_len=5)
    padded, padded_mask = pad_memory(memory, mask, 4)
    assert padded.shape == (3, 8, 16) and torch.equal(padded[:, :5], memory) and not padded[:, 5:].any()
    assert torch.equal(padded_mask[:, :5], mask) and padded_mask[:, 5:].all()
    same, same_mask = pad_memory(memory, None, 5)
    assert same is memory and not same_mask.any()
    with pytest.raises(ValueError, match="multiple must be >= 1"):
        pad_memory(memory, mask, 0)


def test_decoder_step_is_one_static_graph_across_text_lengths_of_a_bucket():
    decoder = tiny_tacotron2()
    decoder.enable_fast_path(text_bucket=8, backend="aot_eager")
    for text_len in (9, 13, 16):  # one bucket: 16 symbols
        memory, mels, mask = decoder_inputs(text_len, seed=text_len)
        mel, gate, alignments = decoder(memory, mels, mask)
        (mel.sum() + gate.sum()).backward()
        assert alignments.shape == (3, 7, text_len)
    assert counters["stats"]["unique_graphs"] == 1
    decoder(*decoder_inputs(17))  # the next bucket (24 symbols): a second graph
    assert counters["stats"]["unique_graphs"] == 2


def test_decoder_fast_path_refuses_a_bad_bucket_and_switches_off():
    decoder = tiny_tacotron2()
    with pytest.raises(ValueError, match="text_bucket must be >= 1"):
        decoder.enable_fast_path(text_bucket=0)
    decoder.enable_fast_path(text_bucket=8, backend="aot_eager")
    decoder.disable_fast_path()
    decoder(*decoder_inputs(5))
    assert counters["stats"]["unique_graphs"] == 0


def test_tacotron2_decoder_step_with_inductor():
    """The real compiler on a tiny decoder step, dropout on (Inductor told to draw eager's numbers)."""
    import torch._inductor.config as inductor_config
    plain = tiny_tacotron2()
    plain.p_attention_dropout = plain.p_decoder_dropout = 0.1
    fast = copy.deepcopy(plain)
    fast.enable_fast_path(text_bucket=8)
    memory, mels, mask = decoder_inputs(text_len=6)
    results = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(inductor_config, "fallback_random", True)
        for decoder in (plain, fast):
            torch.manual_seed(0)
            mel, gate, alignments = decoder(memory, mels, mask)
            (mel.square().sum() + gate.sum()).backward()
            results.append((mel, gate, alignments, torch.cat([p.grad.flatten() for p in decoder.parameters()])))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert counters["stats"]["unique_graphs"] == 1


def test_loader_benchmark_reads_cached_mels(tmp_path):
    from scripts import preprocess
    corpus = synth_corpus(tmp_path / "corpus", n=8)
    config = os.path.join(ROOT, "config.json")
    assert preprocess.main(["--config", config, "--dataset-path", str(corpus), "--workers", "1"]) == 0
    out = tmp_path / "loader.json"
    assert benchmark.main(["--loader", "--tiny", "--device", "cpu", "--dataset-path", str(corpus), "--model",
                           "tacotron2", "--steps", "3", "--json", str(out)]) == 0
    rows = {row["case"]: row for row in json.loads(out.read_text())}
    assert set(rows) == {"loader_tacotron2_wav", "loader_tacotron2_cached_mels"}
# <<< tacotron2
