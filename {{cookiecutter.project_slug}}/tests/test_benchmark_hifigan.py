"""HiFi-GAN's row of ``python -m scripts.benchmark``: both phases timed, every named loss reported (a file of the
HiFi-GAN model and of the benchmarks part: it goes with either)."""

import json
import subprocess
import sys

import pytest
from conftest import ROOT, clean_env


@pytest.mark.slow
def test_the_benchmark_times_both_phases_of_hifigan_and_reports_every_named_loss():
    done = subprocess.run([sys.executable, "-m", "scripts.benchmark", "--tiny", "--device", "cpu", "--steps", "2",
                           "--warmup", "1", "--precision", "fp32", "--cases", "tiny_hifigan_b2_s2048",
                           "--no-progress"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=clean_env(1))
    assert done.returncode == 0, done.stderr
    (row,) = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert row["case"] == "tiny_hifigan_b2_s2048" and row["tiny"] and row["step_s"] > 0
    assert set(row["losses"]) == {"loss_discriminator", "loss_generator", "g_adv", "g_fm", "mel_l1"}
    assert row["loss"] == row["losses"]["loss_generator"]
