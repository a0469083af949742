"""The spike and balance rules and the metrics window (pure logic; the loop's use of them is in test_train.py)."""

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, visible_gpus

from utils.run_log import BalanceMonitor, RunLog, StepRecord, StepWindow, device_memory, stray_gpu_mib
from utils.training.guards import SpikeMonitor

TRACES = json.loads((Path(__file__).parent / "data" / "training_traces.json").read_text())
"""Per-step losses and gradient norms of healthy full-size runs of every example model on a GPU, and of a tiny
WaveGlow whose corpus holds a clip of loud noise (the file's "about" says how they were measured)."""


def test_spike_is_flagged_above_factor_times_the_recent_highest_and_kept_out_of_the_window():
    monitor = SpikeMonitor(factor=3.0, warmup=5, window=10)
    assert not any(monitor.is_spike(value) for value in (1.0, 2.0, 1.5, 1.0, 1.2))
    assert monitor.limit() == pytest.approx(6.0)  # 3 x the highest, 2.0
    assert not monitor.is_spike(5.9)
    assert monitor.is_spike(18.0)  # above 3 x 5.9
    assert max(monitor.recent) == 5.9  # the spike did not enter the window
    assert monitor.describe("gradient norm", 18.0) == ("gradient norm 18 is above 17.7 (3x the highest of its last "
                                                       "6 steps, 5.9)")
    for _ in range(10):
        monitor.is_spike(1.0)  # 5.9 leaves the window of 10 steps
    assert monitor.limit() == pytest.approx(3.0)


def test_spike_rule_works_for_losses_below_and_around_zero():
    monitor = SpikeMonitor(factor=3.0, warmup=3)
    for value in (-2.0, -1.5, -1.0):
        monitor.is_spike(value)
    assert monitor.limit() == pytest.approx(1.0)  # -1 + 2 x max(|-1|, -1 - (-2))
    assert monitor.is_spike(1.5) and not monitor.is_spike(0.9)  # a spike stays out; 0.9 is below the limit
    around_zero = SpikeMonitor(factor=3.0, warmup=3)
    for value in (-0.1, 0.2, 0.0):
        around_zero.is_spike(value)
    assert around_zero.limit() == pytest.approx(0.8)  # 0.2 + 2 x the range 0.3: not 3 x 0.2


def test_spikes_are_not_flagged_during_warmup_or_when_disabled():
    assert not SpikeMonitor(factor=3.0, warmup=20).is_spike(1e9)
    monitor = SpikeMonitor(factor=0.0, warmup=0)
    monitor.is_spike(1.0)
    assert not monitor.is_spike(1e9)


@pytest.mark.parametrize("series", sorted(TRACES["healthy"]))
def test_no_spike_in_the_first_hundreds_of_steps_of_a_healthy_full_size_run(series):
    """The default rule (3x the highest of the last 100 steps, after 20) on every loss and gradient norm of healthy
    full-size runs: silent, although these runs are not smooth (checked here, so that the test is not vacuous)."""
    values = TRACES["healthy"][series]
    monitor = SpikeMonitor(factor=3.0, warmup=20)
    assert [step for step, value in enumerate(values, 1) if monitor.is_spike(value)] == []
    if "grad_norm" in series:  # heavy tails: some step of every run is over twice the median of the 50 before it
        assert any(value > 2 * statistics.median(values[i - 50:i]) for i, value in enumerate(values) if i >= 50)


def test_a_clip_of_loud_noise_is_a_spike_every_time_it_comes_back():
    """Its gradient norm is flagged at each return of the clip once the model has learnt the voices, and no other
    step; its loss never falsely (the loss's window still holds the first steps' descent, a wide range)."""
    noisy = TRACES["noisy"]
    flagged = {}
    for series in ("grad_norm", "loss"):
        monitor = SpikeMonitor(factor=3.0, warmup=4)  # what the loud-noise test of test_train.py sets
        flagged[series] = [step for step, value in enumerate(noisy[series], 1) if monitor.is_spike(value)]
    assert flagged["grad_norm"] == noisy["noise_steps"]
    assert set(flagged["loss"]) <= set(noisy["noise_steps"])


def test_window_averages_finite_steps_and_sums_items():
    window = StepWindow()
    window.add(StepRecord(2.0, items=100, step_time=0.5, data_time=0.1))
    window.add(StepRecord(None, items=100, step_time=0.5, data_time=0.1))  # a skipped step
    window.add(StepRecord(4.0, items=100, step_time=1.0, data_time=0.1))
    row = window.row(step=3)
    assert row["loss"] == 3.0 and row["items_per_s"] == 150.0
    assert row["step_time_s"] == pytest.approx(2 / 3) and row["data_time_s"] == pytest.approx(0.1)
    only_skipped = StepWindow()
    only_skipped.add(StepRecord(None, items=1, step_time=1.0, data_time=0.0))
    assert math.isnan(only_skipped.row(step=1)["loss"])


def test_run_log_writes_on_rank0_only(tmp_path):
    quiet = RunLog(tmp_path / "r1", enabled=False, total_steps=2, initial_step=0)
    quiet.anomaly(1, "spike", "x", ["a"])
    quiet.close()
    assert not (tmp_path / "r1").exists()
    log = RunLog(tmp_path, enabled=True, total_steps=2, initial_step=0)
    log.metrics({"step": 1, "loss": 1.0, "items_per_s": 1.0, "step_time_s": 1.0, "data_time_s": 0.5})
    log.anomaly(1, "spike", "loss 9 is above", ["LJ001", "LJ002"])
    log.close()
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["step"] == 1
    assert json.loads((tmp_path / "anomalies.jsonl").read_text())["ids"] == ["LJ001", "LJ002"]


def test_piped_the_progress_bar_is_whole_lines_and_no_message_shares_one(tmp_path, capfd):
    """Output to a pipe or a CI log (no terminal): each redraw of the bar is a line ending in a line break, so the
    lines printed while it runs stand alone, stdout and stderr merged or not."""
    log = RunLog(tmp_path, enabled=True, total_steps=3, initial_step=0)
    for step in (1, 2, 3):
        log.step_done()
        log.metrics({"step": step, "loss": 1.0 / step, "items_per_s": 9.0, "step_time_s": 1.0, "data_time_s": 0.0})
        log.print(f"step {step}: saved checkpoint_{step}.pt")
    log.close()
    out, err = capfd.readouterr()
    assert "\r" not in out + err and out.endswith("\n") and err.endswith("\n")
    assert out.splitlines() == [f"step {step}: saved checkpoint_{step}.pt" for step in (1, 2, 3)]
    bars = err.splitlines()
    assert all(line.startswith("train:") for line in bars) and "3/3" in bars[-1] and "loss=0.3333" in bars[-1], bars


def test_a_resumed_log_drops_the_rows_it_will_write_again_and_keeps_the_rest(tmp_path, capsys):
    """A run resumed from step 4 (an older checkpoint than its last rows): rows 5.. of every row file go, a line says
    so; a torn last line (a write cut short) goes too; the other rows stay byte for byte."""
    rows = "".join(json.dumps({"step": step, "loss": 1.0 / step}) + "\n" for step in range(1, 9))
    (tmp_path / "metrics.jsonl").write_text(rows + '{"step": 9, "lo')
    (tmp_path / "val_metrics.jsonl").write_text('{"step": 4, "val_loss": 1.0}\n{"step": 8, "val_loss": 0.5}\n')
    (tmp_path / "anomalies.jsonl").write_text('{"step": 2, "kind": "spike"}\n')
    log = RunLog(tmp_path, enabled=True, total_steps=10, initial_step=4)
    log.metrics({"step": 5, "loss": 0.3, "items_per_s": 1.0, "step_time_s": 1.0, "data_time_s": 0.0})
    log.close()
    kept = rows.splitlines(keepends=True)[:4]
    assert (tmp_path / "metrics.jsonl").read_text().splitlines(keepends=True)[:4] == kept
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3,
                                                                                                            4, 5]
    assert (tmp_path / "val_metrics.jsonl").read_text() == '{"step": 4, "val_loss": 1.0}\n'
    assert (tmp_path / "anomalies.jsonl").read_text() == '{"step": 2, "kind": "spike"}\n'
    out = capsys.readouterr()
    said = (out.out + out.err).splitlines()
    assert "note: metrics.jsonl: 5 row(s) after step 4, the step resumed from, removed (those steps are trained " \
           "again)" in said and any(line.startswith("note: val_metrics.jsonl: 1 row(s)") for line in said), said
    assert not list(tmp_path.glob(".*.tmp*"))


def test_data_wait_warning_skips_the_warm_up_and_repeats_rarely(tmp_path, capsys):
    log = RunLog(tmp_path, enabled=True, total_steps=2000, initial_step=100, data_advice="raise data.num_workers")
    slow = {"loss": 1.0, "items_per_s": 1.0, "step_time_s": 1.0, "data_time_s": 0.5}
    for step in range(101, 1000):
        log.metrics({"step": step, **slow, "data_time_s": 0.05 if step == 700 else 0.5})
    log.close()
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning:")]
    first = 100 + RunLog.DATA_WAIT_WARMUP + 1
    assert warnings == [f"warning: step {step}: waiting 0.500 s per step for data (50% of the step): raise "
                        "data.num_workers" for step in (first, first + RunLog.DATA_WAIT_REPEAT)]


def ranks(memory=None, compute=None):
    """Per-rank rows as train.py gathers them; the values not given are equal across the ranks."""
    n = len(memory or compute)
    return [{"memory_gib": m, "compute_s": c, "data_wait_s": 0.0, "collective_wait_s": 0.0}
            for m, c in zip(memory or [1.0] * n, compute or [0.1] * n)]


def test_balance_names_a_rank_holding_more_memory_than_the_others():
    monitor = BalanceMonitor(memory_share=0.2, repeat=100)
    assert monitor.check(1, ranks(memory=(1.0, 1.1))) == []  # 10%: fine
    assert monitor.check(2, ranks(memory=(1.0, 1.2, 1.0, 1.1))) == []  # under the 0.25 GiB floor
    warning, = monitor.check(3, ranks(memory=(1.0, 1.0, 2.5, 1.0)))
    assert warning.startswith("warning: step 3: rank 2 holds 2.50 GiB at its peak, 150% above the median 1.00 GiB")
    assert monitor.check(50, ranks(memory=(1.0, 1.0, 2.5, 1.0))) == []  # not repeated within 100 steps
    assert monitor.check(103, ranks(memory=(1.0, 1.0, 2.5, 1.0)))


def test_balance_names_a_straggler_only_when_it_lasts():
    monitor = BalanceMonitor(straggler_share=0.2, patience=3)
    slow = ranks(compute=(0.1, 0.3, 0.1))
    assert monitor.check(1, slow) == [] and monitor.check(2, slow) == []
    assert monitor.check(3, ranks(compute=(0.1, 0.1, 0.1))) == []  # the streak breaks
    assert monitor.check(4, slow) == [] and monitor.check(5, slow) == []
    warning, = monitor.check(6, slow)
    assert warning.startswith("warning: step 6: rank 1 is a straggler: 0.300 seconds of forward passes per step, 200% "
                              "above the other ranks' median 0.100, for 3 log intervals in a row")
    assert BalanceMonitor(patience=1).check(1, ranks(compute=(0.059, 0.074))) == []  # 25%, but under the 50 ms floor
    assert BalanceMonitor().check(1, ranks(memory=(9.0,), compute=(9.0,))) == []  # one rank: nothing to compare


def test_of_two_ranks_the_slower_is_compared_with_the_other_not_with_their_median():
    monitor = BalanceMonitor(straggler_share=0.2, patience=1, clock="cpu")
    assert monitor.check(1, ranks(compute=(0.400, 0.460))) == []  # 15% apart: noise
    warning, = monitor.check(2, ranks(compute=(0.400, 0.600)))  # the median of the two would be 0.500: 20% only
    assert "rank 1 is a straggler: 0.600 CPU seconds of forward passes per step, 50% above the other ranks' " \
           "median 0.400" in warning


def test_anomaly_lines_are_few_per_log_interval_and_every_anomaly_is_in_the_file(tmp_path, capsys):
    log = RunLog(tmp_path, enabled=True, total_steps=30, initial_step=0)
    row = {"loss": 1.0, "items_per_s": 1.0, "step_time_s": 1.0, "data_time_s": 0.0}
    for step in range(1, 11):
        log.anomaly(step, "spike", f"gradient norm {step} is above 1", [f"LJ{step:03d}-a", f"LJ{step:03d}-b"])
    log.metrics({"step": 10, **row})
    log.anomaly(11, "nonfinite", "non-finite loss", ["LJ011-a"])
    log.close()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning:")]
    listing = tmp_path / "anomalies.jsonl"
    assert lines == [f"warning: step 1: gradient norm 1 is above 1; the batch's 2 utterance ids are in {listing}",
                     f"warning: step 2: gradient norm 2 is above 1; the batch's 2 utterance ids are in {listing}",
                     f"warning: 8 more anomalies up to step 10, listed in {listing}",
                     f"warning: step 11: non-finite loss; the batch's 1 utterance ids are in {listing}"]
    rows = [json.loads(line) for line in listing.read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 12)) and rows[3]["ids"] == ["LJ004-a", "LJ004-b"]


GPU_A, GPU_B = "GPU-6f1c1b2a-0000-4000-8000-00000000000a", "GPU-6f1c1b2a-0000-4000-8000-00000000000b"


def test_stray_gpu_memory_is_what_a_process_holds_on_other_gpus_per_nvml():
    view = {GPU_A: [(100, 900 * 2**20), (101, 300 * 2**20)], GPU_B: [(101, 8000 * 2**20), (102, 500 * 2**20)]}
    assert stray_gpu_mib(101, "6F1C1B2A-0000-4000-8000-00000000000B", view) == 300  # a context on GPU A too
    assert stray_gpu_mib(102, GPU_B, view) == 0.0
    assert math.isnan(stray_gpu_mib(103, GPU_B, view))  # not seen on its own GPU (a container): unknown


def test_balance_names_a_rank_with_memory_on_another_gpu_and_says_once_when_it_cannot_tell():
    monitor = BalanceMonitor(repeat=100)
    rows = [{**row, "stray_gpu_mib": mib} for row, mib in zip(ranks(memory=(1.0, 1.0, 1.0)), (0.0, 0.0, 300.0))]
    warning, = monitor.check(5, rows)
    assert warning.startswith("warning: step 5: rank 2 holds 300 MiB on a GPU that is not its own"), warning
    unknown = [{**row, "stray_gpu_mib": math.nan} for row in ranks(memory=(1.0,))]
    note, = monitor.check(6, unknown)
    assert note.startswith("note: step 6: memory held on other GPUs is not checked"), note
    assert monitor.check(1000, unknown) == []  # said once per run
    assert "stray_gpu_mib" not in device_memory(torch.device("cpu"))  # a CPU run's rows carry memory_gib only


@pytest.mark.skipif(visible_gpus() < 2, reason="needs 2 GPUs (this machine has fewer); the logic is tested above")
def test_a_cuda_context_on_the_wrong_gpu_is_measured(tmp_path):
    """A process that touches GPU 0 before it moves to GPU 1 (the classic mistake) holds stray memory on GPU 0."""
    script = ("import math, torch\nfrom utils.run_log import device_memory\n"
              "torch.zeros(1, device='cuda:0')\ntorch.cuda.set_device(1)\ntorch.zeros(1, device='cuda:1')\n"
              "print(device_memory(torch.device('cuda:1'))['stray_gpu_mib'])\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    stray = float(done.stdout.split()[-1])
    if math.isnan(stray):
        pytest.skip("NVML does not show this process (no nvidia-ml-py, or a container's process ids)")
    assert stray > 100  # a CUDA context is several hundred MiB
