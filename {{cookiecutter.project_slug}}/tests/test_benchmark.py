"""The benchmark tools: ``python -m scripts.benchmark`` (train step, ``--check``, ``--loader``, ``--padding``) and
``python -m scripts.scaling`` (items/s on 1, 2, ... processes), on tiny CPU runs; the fast paths they compile use the
``aot_eager`` backend (see ``tests/test_fast_path.py``)."""

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest
import torch
from conftest import (ROOT, TEST_MODEL, bound, clean_env, process_settings_kept, shared_corpus, synth_corpus)

from models import MODELS
from parts import PARTS, config_schemas
from scripts import benchmark, benchmark_data, benchmark_step
from utils.benchmark import BenchmarkCase
from utils.config import load_config

CPU = torch.device("cpu")
FAST_MODELS = [name for name, spec in MODELS.items() if spec.training.optimize_for_training is not None]
BATCH_MODELS = [name for name in MODELS if name in PARTS.benchmarks]
WITHOUT_BATCHES = sorted(set(MODELS) - set(BATCH_MODELS))


def bench_args(*argv: str) -> argparse.Namespace:
    """``python -m scripts.benchmark`` arguments for a tiny CPU run with the aot_eager backend, plus ``argv``."""
    return benchmark.parse_args(["--tiny", "--device", "cpu", "--backend", "aot_eager", *argv])


def first_tiny_case(name):
    """``(name, case)``: model ``name``'s first benchmark case."""
    return next(pair for pair in benchmark_step.cases_for([name]))


@pytest.fixture(autouse=True)
def _fresh_dynamo(fresh_dynamo):
    """Each test compiles from scratch and leaves the process's settings (TF32 and cuDNN flags set by the benchmark's
    train step, Inductor's ``fallback_random`` set by ``--check``) as it found them."""
    with process_settings_kept():
        yield


@pytest.mark.slow
@pytest.mark.parametrize("name", FAST_MODELS[:1])
def test_check_passes_the_models_own_fast_path(name):
    rows = benchmark_step.check_case(*first_tiny_case(name), bench_args(), CPU)
    assert [(row["mode"], row["limit"]) for row in rows] == [("check-fp32", 1e-5), ("check-amp-bf16", 2e-2)]
    assert all(row["ok"] and row["loss_rel_diff"] < row["limit"] for row in rows), rows
    assert rows[1]["loss_rel_diff"] > 0, "bf16 autocast ran: its loss is not bit-equal to float32's"


@pytest.mark.slow
@pytest.mark.parametrize("name", FAST_MODELS[:1])
def test_check_catches_a_fast_path_that_changes_the_mathematics(name, monkeypatch):
    """The check compares whatever ``optimize_for_training`` returns with eager, the same code for every model: one
    model shows it (each model's own fast path against eager: ``tests/test_fast_path.py``)."""
    spec = MODELS[name]

    def wrong(model, cfg, **kwargs):  # a 'fast path' that scales every parameter by 1.01
        with torch.no_grad():
            for param in model.parameters():
                param.mul_(1.01)
        return model

    monkeypatch.setitem(MODELS, name, dataclasses.replace(
        spec, training=dataclasses.replace(spec.training, optimize_for_training=wrong)))
    rows = benchmark_step.check_case(*first_tiny_case(name), bench_args(), CPU)
    assert not rows[0]["ok"] and rows[0]["loss_rel_diff"] > 1e-5, rows[0]


@pytest.mark.slow
def test_benchmark_cpu_smoke_writes_a_row_per_case_and_precision(tmp_path, capsys):
    """``scripts.benchmark``'s ``main`` in this process (its command line as a process: the ``--loader`` progress test
    below)."""
    out = tmp_path / "out.json"
    code = benchmark.main(["--tiny", "--device", "cpu", "--json", str(out), "--steps", "1", "--warmup", "0"])
    said = capsys.readouterr()
    assert code == 0, said.err[-3000:]
    for name in WITHOUT_BATCHES:  # a model without random batches is skipped, and the run says so
        assert f"skipping {name}: parts.py registers no Benchmark of it" in said.out, said.out
    if not BATCH_MODELS:
        assert not out.exists() or json.loads(out.read_text()) == []
        return
    rows = json.loads(out.read_text())
    expected = {(benchmark_step.case_name(name, case, benchmark_step.case_config(name, case, bench_args())[1], True),
                 mode)
                for name, case in benchmark_step.cases_for(list(MODELS)) for mode in ("tf32", "amp-bf16", "amp-fp16")}
    assert {(row["case"], row["mode"]) for row in rows} == expected
    for row in rows:
        assert "error" not in row, row
        assert row["path"] == "eager" and row["peak_gib"] is None
        assert row["step_s"] > 0
        # Both rounded: step_s to 0.1 ms (the time it was computed from lies within 0.05 ms of it), items_per_s to an
        # integer. A fast step makes that 0.05 ms several items/s (1341 from 15 items in 11.2 ms).
        fastest, slowest = (row["items_per_step"] / (row["step_s"] + error) for error in (-5e-5, 5e-5))
        assert slowest - 0.5 <= row["items_per_s"] <= fastest + 0.5, row
        assert row["items_per_step"] > 0 and row["loss"] == row["loss"]  # finite, not NaN
    assert "| case | mode |" in said.out


def test_padding_trains_each_batching_at_the_tiny_batch_sizes_and_refuses_fixed_length_models(tmp_path, capsys):
    """``--padding`` as the manual writes it, without ``--tiny``: a CPU takes the tiny block's batch sizes (a demo
    corpus holds fewer utterances than one full-size batch); each batching's row has the planning speed and the train
    step's over ``--steps`` batches of its loader: 2, a whole epoch of fixed batches of 2 here, which pad as the
    epoch's plan does. A run of fixed-length models only is one error line."""
    corpus, variable = synth_corpus(tmp_path / "corpus", n=6), [n for n in MODELS if MODELS[n].training.variable_length]
    fixed = [name for name in MODELS if name not in variable]
    if variable:
        assert benchmark.main(["--padding", "--device", "cpu", "--dataset-path", str(corpus), "--steps", "2",
                               "--warmup", "0", "--no-progress"]) == 0
        out = capsys.readouterr().out
        rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        cfg = load_config(os.path.join(ROOT, "config.json"), config_schemas(), tiny=True)
        assert {(r["case"], r["batching"], r["batch_size"]) for r in rows} == {
            (f"padding_{n}", b, cfg.section(n).batch_size) for n in variable for b in ("random", "buckets", "frames")}
        for r in rows:
            assert "items_per_s" not in r and r["plan_items_per_s"] > 0 and r["train_batches"] == 2, r
            assert r["train_items_per_s"] > 0 and 0 <= r["train_padding_fraction"] < 1, r
            utterances = r["train_items_per_s"] * r["train_step_s"] * 2  # both rounded: within 1% here
            if r["batching"] == "frames":  # at least one a batch
                assert utterances > 0.99 * 2, r
            else:  # the epoch's fixed batches, trained as planned
                assert r["batches"] == 2 and utterances == pytest.approx(2 * r["batch_size"], rel=0.01), r
                assert r["train_padding_fraction"] == r["padding_fraction"], r
        assert "| plan items/s | peak RSS MiB | trained batches | their padding | train items/s |" in out
        assert "on a CPU: the batch sizes of config.json's tiny block" in out
        assert all(f"skipping {name}: its items all have one length" in out for name in fixed), out
    if fixed:
        with pytest.raises(SystemExit) as exit_:
            benchmark.main(["--padding", "--device", "cpu", "--dataset-path", str(corpus), "--model", fixed[0]])
        said = capsys.readouterr()
        assert exit_.value.code == 2 and said.out == "" and said.err == (
            f"ERROR: --padding measures models whose items differ in length (ModelSpec.variable_length): {fixed[0]} "
            "has items of one length\n")


@pytest.mark.skipif(not any(spec.training.variable_length for spec in MODELS.values()),
                    reason="no registered model has items of different lengths to batch by length")
def test_plan_times_an_epoch_of_synthetic_lengths_for_each_batching_side_by_side(capsys):
    """``--plan N``: no corpus; a row per ``data.batching`` over ``N`` LJSpeech-like lengths (the full-size batch size,
    frame budgets within as many padded frames as its fullest batch), then the table."""
    variable = [name for name in MODELS if MODELS[name].training.variable_length]
    assert benchmark.main(["--plan", "5000", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    rows = {row["batching"]: row for row in map(json.loads, (line for line in out.splitlines() if line[:1] == "{"))}
    cfg = load_config(os.path.join(ROOT, "config.json"), config_schemas())
    batch = cfg.section(variable[0]).batch_size
    assert list(rows) == ["frames", "buckets", "random"] and {r["utterances"] for r in rows.values()} == {5000}
    assert rows["random"]["items_per_batch"] == rows["buckets"]["items_per_batch"] == batch
    assert rows["frames"]["max_frames"] == batch * 868 and rows["frames"]["items_per_batch"] > batch  # 10.1 s clips
    assert rows["frames"]["padding_fraction"] < 0.05 < 0.25 < rows["random"]["padding_fraction"]
    assert all(r["plan_s"] >= 0 and r["plan_items_per_s"] > 0 and r["peak_rss_mib"] > 0 for r in rows.values())
    assert "| plan_5000 | frames | 5,000 |" in out
    for argv, said in ((["--plan", "0"], "--plan 0: plan at least 1 length"),
                       (["--plan", "9", "--loader", "--dataset-path", "x"],
                        "--loader, --padding, --plan and --plan-corpus are separate")):
        with pytest.raises(SystemExit):
            benchmark.parse_args([*argv, "--device", "cpu"])
        assert said in capsys.readouterr().err


@pytest.mark.skipif(not any(spec.training.variable_length for spec in MODELS.values()),
                    reason="no registered model has items of different lengths to batch by length")
def test_benchmark_data_runs_a_data_mode_alone_and_refuses_none(capsys):
    """``python -m scripts.benchmark_data``: a data mode of ``scripts.benchmark`` alone, the same rows and table; a
    usage error naming the data modes where none is given."""
    assert benchmark_data.main(["--plan", "3000", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    rows = [json.loads(line) for line in out.splitlines() if line[:1] == "{"]
    assert [(row["case"], row["batching"]) for row in rows] == [("plan_3000", name)
                                                                for name in ("frames", "buckets", "random")]
    assert "| plan_3000 | frames | 3,000 |" in out
    with pytest.raises(SystemExit) as exit_info:
        benchmark_data.main(["--device", "cpu"])
    said = capsys.readouterr().err
    assert exit_info.value.code == 2 and "give one of --loader, --padding, --plan, --plan-corpus" in said, said


def test_the_sources_mode_is_an_option_only_where_the_project_reads_shards(capsys):
    """``--sources`` and ``--shards`` (the loader from the corpus folder and from its shards side by side) are options,
    in the help and the data modes, of a project that reads shards (``PARTS.run.corpus``) alone; elsewhere each is an
    unknown argument."""
    shards = PARTS.run.corpus is not None
    with pytest.raises(SystemExit) as exit_:
        benchmark_data.main(["--help"])
    helped = capsys.readouterr().out
    assert exit_.value.code == 0 and ("--sources" in helped) == ("--shards" in helped) == shards, helped
    assert ("--sources" in benchmark_data.DATA_MODES) == shards
    for option in ([] if shards else ["--sources", "--shards"]):
        with pytest.raises(SystemExit) as exit_:
            benchmark.parse_args([option, "x", "--dataset-path", "x", "--device", "cpu"])
        assert exit_.value.code == 2 and f"unrecognized arguments: {option}" in capsys.readouterr().err

@pytest.mark.skipif(not any(spec.training.variable_length for spec in MODELS.values()),
                    reason="no registered model has items of different lengths to batch by length")
def test_plan_of_fewer_lengths_than_one_batch_is_one_error_line(capsys):
    """``--plan N`` with ``N`` below the batch size: fixed batches keep full ones only, so there is no epoch to plan:
    one error line naming the batch size and the way out, no row, exit 1 (not a division by zero)."""
    name = next(name for name in MODELS if MODELS[name].training.variable_length)
    batch = load_config(os.path.join(ROOT, "config.json"), config_schemas()).section(name).batch_size
    assert benchmark_data.main(["--plan", str(batch - 1), "--device", "cpu", "--no-progress"]) == 1
    said = capsys.readouterr()
    assert not [line for line in said.out.splitlines() if line[:1] == "{"], said.out
    assert said.err == (f"ERROR: --plan {batch - 1}: fewer lengths than one batch of {batch} ({name}.batch_size; "
                        f"data.batching buckets and random keep full batches only): plan at least {batch}, or use "
                        f"--set {name}.batch_size=N\n")
    assert benchmark_data.main(["--plan", str(batch), "--device", "cpu", "--no-progress"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line[:1] == "{"]
    assert [(row["batching"], row["batches"]) for row in rows] == [("frames", 1), ("buckets", 1), ("random", 1)]


@pytest.mark.skipif(not any(spec.training.variable_length for spec in MODELS.values()),
                    reason="no registered model has items of different lengths to batch by length")
def test_plan_corpus_times_reading_measuring_and_planning_a_corpus_and_a_worker_shares_it(capsys, tmp_path):
    """``--plan-corpus``: the training split of ``--dataset-path`` read, its lengths taken from the headers, the first
    epoch planned in frame budgets, each timed; the peak resident memory, and the memory a forked loader worker makes
    its own reading every utterance (the table's arrays are shared: well under a MiB here)."""
    corpus = synth_corpus(tmp_path / "corpus", n=12)
    assert benchmark.main(["--plan-corpus", "--dataset-path", str(corpus), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    row = next(json.loads(line) for line in out.splitlines() if line[:1] == "{")
    assert row["case"] == "corpus_11" and row["utterances"] == 11 and row["batches"] >= 1  # 1 of 12 validates
    assert row["total_s"] >= row["read_s"] + row["lengths_s"] + row["plan_s"] - 0.01 and row["peak_rss_mib"] > 0
    assert row["worker_own_mib"] is None or row["worker_own_mib"] < 1, row
    assert "11 utterances: read " in out and "a forked worker reading every utterance's fields makes" in out
    with pytest.raises(SystemExit):
        benchmark.parse_args(["--plan-corpus", "--device", "cpu"])
    assert "--plan-corpus needs --dataset-path" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--precision", "fp8"], ["--model", "nosuchmodel"], ["--loader"]])
def test_benchmark_refuses_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        benchmark.parse_args([*argv, "--device", "cpu"])
    assert exit_info.value.code == 2
    assert (argv[1] if len(argv) > 1 else "--dataset-path") in capsys.readouterr().err


@pytest.mark.skipif(not BATCH_MODELS, reason="no registered model has a synthetic_batch to time")
def test_benchmark_compare_adds_the_ratio(tmp_path, monkeypatch, capsys):
    name, case = first_tiny_case(BATCH_MODELS[0])
    row_name = benchmark_step.case_name(name, case, benchmark_step.case_config(name, case, bench_args())[1], True)
    reference = tmp_path / "ref.json"
    reference.write_text(json.dumps([{"case": row_name, "mode": "tf32", "step_s": 1.0, "items_per_s": 1000}]))
    out = tmp_path / "ours.json"
    code = benchmark.main(["--tiny", "--device", "cpu", "--eager", "--model", name, "--cases", row_name,
                           "--precision", "tf32", "--steps", "1", "--warmup", "0", "--compare", str(reference),
                           "--json", str(out)])
    assert code == 0
    (row,) = json.loads(out.read_text())
    assert row["ratio_vs_reference"] == round(row["items_per_s"] / 1000, 3)


@pytest.mark.slow
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


# --- a CPU run without --tiny uses tiny shapes and says so; progress is shown; tiny rows are named as tiny --------

PROGRESS_BAR = rb"\d+/\d+ \["
"""What a tqdm bar draws (``0/4 [00:00<?, ?step/s]``), as a regular expression over raw output bytes."""


@pytest.mark.slow  # real processes: the fast tier keeps one 2-process smoke run
def test_benchmark_loader_on_a_cpu_without_tiny_shows_progress_within_10_s(tmp_path):
    corpus = synth_corpus(tmp_path / "corpus", n=12)
    name = next(iter(MODELS))
    out = tmp_path / "rows.json"
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "scripts.benchmark", "--loader", "--device", "cpu", "--model",
                             name, "--dataset-path", str(corpus), "--workers", "0", "--steps", "3", "--json", str(out)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=clean_env(1))
    received: list[bytes] = []

    def read() -> None:  # the output as it streams, bars included (they end in '\r', not in a line break)
        while chunk := os.read(proc.stdout.fileno(), 4096):
            received.append(chunk)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    first_bar, limit = None, bound(10, 1)  # 10 s after the process has started
    while first_bar is None and time.monotonic() - start < limit:
        ended = not reader.is_alive()  # read before the output: a run that ended has all of it in by now
        if re.search(PROGRESS_BAR, b"".join(received)):
            first_bar = time.monotonic() - start
        if ended:
            break
        time.sleep(0.05)
    try:
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    output = b"".join(received).decode(errors="replace")
    assert first_bar is not None and first_bar < limit, f"no progress bar within {limit:.0f} s:\n{output[-3000:]}"
    assert proc.returncode == 0, output[-3000:]
    assert benchmark.CPU_TINY_NOTE in output.splitlines()  # one line saying so, and how to force full size
    assert "--full-size" in benchmark.CPU_TINY_NOTE
    rows = json.loads(out.read_text())
    assert {row["case"] for row in rows} == {f"train_{name}", f"loader_{name}_wav"}
    assert all(row["tiny"] is True for row in rows), rows
    tiny_batch = load_config(f"{ROOT}/config.json", config_schemas(), tiny=True).section(name).batch_size
    assert all(row["batch_size"] == tiny_batch for row in rows), rows  # the tiny block's batch, not the full one


def test_benchmark_on_a_cpu_is_tiny_unless_full_size_is_asked(capsys):
    default = benchmark.parse_args(["--device", "cpu"])
    assert default.tiny and default.size_note == benchmark.CPU_TINY_NOTE
    full = benchmark.parse_args(["--device", "cpu", "--full-size"])
    assert not full.tiny and full.size_note == benchmark.CPU_FULL_SIZE_NOTE
    assert "minutes" in benchmark.CPU_FULL_SIZE_NOTE  # what full size costs, said before it starts
    asked = benchmark.parse_args(["--device", "cpu", "--tiny"])
    assert asked.tiny and asked.size_note == ""  # asked for: nothing to explain
    with pytest.raises(SystemExit) as exit_info:
        benchmark.parse_args(["--device", "cpu", "--tiny", "--full-size"])
    assert exit_info.value.code == 2 and "--full-size" in capsys.readouterr().err


def test_median_step_time_shows_a_progress_bar_unless_told_not_to(capsys):
    calls = []
    seconds = benchmark_step.median_step_time(lambda: calls.append(1), 1, 3, CPU, "toy steps")
    assert len(calls) == 4 and seconds >= 0
    captured = capsys.readouterr()
    assert "toy steps" in captured.err and "/4 [" in captured.err and captured.out == ""
    benchmark_step.median_step_time(lambda: calls.append(1), 1, 3, CPU, "toy steps", progress=False)
    assert capsys.readouterr().err == ""


def test_tiny_rows_are_named_after_the_tiny_shape_they_time():
    full = BenchmarkCase("toy256_b12_s16000", (), 12, {"segment_length": 16000},
                         tiny=BenchmarkCase("", (), 2, {"segment_length": 2048, "ranges": (1, 4), "flag": True}))
    assert benchmark_step.case_name("toy", full, full, False) == "toy256_b12_s16000"
    assert benchmark_step.case_name("toy", full, full.tiny, True) == "tiny_toy_b2_s2048"  # tuples and bools left out
    named = dataclasses.replace(full, tiny=BenchmarkCase("small", (), 2))
    assert benchmark_step.case_name("toy", named, named.tiny, True) == "tiny_small"
    default = BenchmarkCase("toy_default", (), 0)
    assert benchmark_step.case_name("toy", default, dataclasses.replace(default, batch_size=4), False) == "toy_b4"
    assert benchmark_step.case_name("toy", default, dataclasses.replace(default, batch_size=4), True) == "tiny_toy_b4"
    without_tiny = BenchmarkCase("toy_b8_s100", (), 8, {"segment_length": 100})  # --tiny config, its own shape
    assert benchmark_step.case_name("toy", without_tiny, without_tiny, True) == "tiny_toy_b8_s100"

    names = []
    for name, case in benchmark_step.cases_for(BATCH_MODELS):
        _, shape = benchmark_step.case_config(name, case, bench_args())
        tiny_name = benchmark_step.case_name(name, case, shape, True)
        assert tiny_name.startswith(f"tiny_{name}_b{shape.batch_size}") or tiny_name == f"tiny_{shape.name}"
        assert tiny_name != case.name
        names.append(tiny_name)
    assert len(set(names)) == len(names), names


@pytest.mark.skipif(not BATCH_MODELS, reason="no registered model has a synthetic_batch to time")
def test_a_tiny_row_says_it_is_tiny_and_times_what_its_name_says():
    name, case = first_tiny_case(BATCH_MODELS[0])
    args = bench_args("--eager", "--precision", "fp32", "--steps", "1", "--warmup", "0", "--no-progress")
    row = benchmark_step.bench_case(name, case, "fp32", args, CPU)
    assert "error" not in row, row
    _, shape = benchmark_step.case_config(name, case, args)
    assert row["case"] == benchmark_step.case_name(name, case, shape, True) and row["case"].startswith("tiny_")
    assert row["tiny"] is True and row.get("full_size_case", case.name) == case.name
    assert int(re.search(r"_b(\d+)", row["case"]).group(1)) == shape.batch_size
    batch = PARTS.benchmarks[name].synthetic_batch(benchmark_step.case_config(name, case, args)[0], shape.batch_size,
                                                   torch.Generator().manual_seed(0), **shape.batch_kwargs)
    assert row["items_per_step"] == MODELS[name].training.count_items(batch)  # the tiny batch's items, not the full one's
    full = benchmark.parse_args(["--device", "cpu", "--full-size"])
    assert benchmark_step.shape_fields(name, case, full) == {"tiny": False}


# --- python -m scripts.scaling ---------------------------------------------------------------------------------

@pytest.mark.slow
def test_scaling_script_shows_progress_tables_and_plots_1_and_2_processes_and_keeps_their_output(
        tmp_path_factory, tmp_path, capsys, monkeypatch):
    """``scripts.scaling``'s ``main`` in this process, in a launched job's environment (:func:`conftest.clean_env`,
    which the runs it launches inherit); the runs are real ``multiproc.py`` jobs on 1 and 2 processes."""
    from scripts import scaling  # matplotlib: imported by this test only

    corpus = shared_corpus(tmp_path_factory, "train_corpus", 30)
    env = clean_env(2)
    for key in set(os.environ) - set(env):
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    code = scaling.main(["--model", TEST_MODEL, "--tiny", "--procs", "1", "2", "--steps", "4", "--skip", "1",
                         "--dataset-path", str(corpus), "--out", str(tmp_path)])
    done = capsys.readouterr()
    assert code == 0, done.out + done.err
    for procs in (1, 2):
        assert re.search(rf"{procs} process\(es\):\s+\d+%\|.*\| 0/4 \[", done.err), done.err  # a bar from the start
        assert re.search(rf"{procs} process\(es\):\s+\d+%\|.*\| [1-4]/4 \[", done.err), done.err  # ... that moves
        assert "train" in (tmp_path / f"procs_{procs}" / "launcher.log").read_text()  # the run's own output, kept
    lines = done.out.splitlines()
    assert lines[0].split() == ["procs", "items/s", "speed-up", "efficiency"]
    assert [line.split()[0] for line in lines[1:3]] == ["1", "2"] and lines[1].split()[2:] == ["1.00x", "100%"]
    results = json.loads((tmp_path / "scaling.json").read_text())
    assert [r["procs"] for r in results] == [1, 2] and all(r["items_per_s"] > 0 for r in results)
    assert results[1]["efficiency"] == pytest.approx(results[1]["items_per_s"] / (2 * results[0]["items_per_s"]))
    assert (tmp_path / "scaling.png").read_bytes()[:4] == b"\x89PNG"
