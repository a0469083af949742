"""The loss-spike rule and the metrics window (pure logic; the loop's use of them is in test_train.py)."""

import json
import math
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, visible_gpus
from utils.run_log import BalanceMonitor, LossMonitor, RunLog, StepWindow, device_memory, stray_gpu_mib


def test_spike_is_flagged_after_warmup_and_kept_out_of_the_mean():
    monitor = LossMonitor(factor=3.0, warmup=5)
    assert not any(monitor.is_spike(2.0) for _ in range(5))
    assert monitor.mean == pytest.approx(2.0)
    assert not monitor.is_spike(5.9)  # below 3 x 2.0
    mean = monitor.mean
    assert monitor.is_spike(100.0)
    assert monitor.mean == mean  # the spike did not move the running mean


def test_spike_rule_works_for_negative_losses():
    monitor = LossMonitor(factor=3.0, warmup=3)
    for _ in range(3):
        monitor.is_spike(-1.0)
    assert not monitor.is_spike(0.9)  # -1 + 2 * |-1| = 1 is the threshold
    assert monitor.is_spike(1.5)


def test_spikes_are_not_flagged_during_warmup_or_when_disabled():
    assert not LossMonitor(factor=3.0, warmup=20).is_spike(1e9)
    monitor = LossMonitor(factor=0.0, warmup=0)
    monitor.is_spike(1.0)
    assert not monitor.is_spike(1e9)


def test_window_averages_finite_steps_and_sums_items():
    window = StepWindow()
    window.add(2.0, items=100, step_time=0.5, data_time=0.1)
    window.add(None, items=100, step_time=0.5, data_time=0.1)  # a skipped step
    window.add(4.0, items=100, step_time=1.0, data_time=0.1)
    row = window.row(step=3)
    assert row["loss"] == 3.0 and row["items_per_s"] == 150.0
    assert row["step_time_s"] == pytest.approx(2 / 3) and row["data_time_s"] == pytest.approx(0.1)
    only_skipped = StepWindow()
    only_skipped.add(None, items=1, step_time=1.0, data_time=0.0)
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


def test_plot_run_draws_a_run_written_by_run_log(tmp_path, capsys):
    from scripts import plot_run

    log = RunLog(tmp_path, enabled=True, total_steps=40, initial_step=0)
    for step in range(1, 41):
        log.metrics({"step": step, "epoch": 1, "loss": 3.0 / step, "lr": 1e-3, "items_per_s": 1000.0,
                     "step_time_s": 0.1, "data_time_s": 0.01, "grad_norm": 1.0 / step,
                     "memory_gib": [1.0, 1.1]})
        if step % 10 == 0:
            log.validation(step, 1, 3.5 / step)
    log.anomaly(17, "spike", "loss 9 is above 3 x its running mean", ["LJ001-0001"])
    log.close()
    assert plot_run.main([str(tmp_path)]) == 0
    png = tmp_path / "run.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {png}" in capsys.readouterr().out


@pytest.mark.parametrize("setup, message", [
    (lambda d: None, "metrics.jsonl: no logged steps"),
    (lambda d: (d / "metrics.jsonl").write_text('{"step": 1}\nnot json\n'), "metrics.jsonl:2: not a JSON line"),
])
def test_plot_run_refuses_a_folder_without_a_run(tmp_path, capsys, setup, message):
    from scripts import plot_run

    setup(tmp_path)
    assert plot_run.main([str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ERROR: ") and message in err[0], err
    assert not (tmp_path / "run.png").exists()


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
    assert warning.startswith("warning: step 6: rank 1 is a straggler: 0.300 s of compute per step against a "
                              "median 0.100 s, for 3 log intervals")
    assert BalanceMonitor(patience=1).check(1, ranks(compute=(0.001, 0.005))) == []  # under the 10 ms floor
    assert BalanceMonitor().check(1, ranks(memory=(9.0,), compute=(9.0,))) == []  # one rank: nothing to compare


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
