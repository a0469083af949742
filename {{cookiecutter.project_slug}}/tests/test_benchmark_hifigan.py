"""HiFi-GAN's row of ``python -m scripts.benchmark``: both phases timed, every named loss reported (a file of the
HiFi-GAN model and of the benchmarks part: it goes with either)."""

import json

import pytest
from conftest import process_settings_kept

from scripts import benchmark


@pytest.mark.slow
def test_the_benchmark_times_both_phases_of_hifigan_and_reports_every_named_loss(capsys):
    """``scripts.benchmark``'s ``main`` in this process (its command line as a process: ``tests/test_benchmark.py``),
    leaving the process's TF32 and cuDNN flags as it found them."""
    with process_settings_kept():
        code = benchmark.main(["--tiny", "--device", "cpu", "--steps", "2", "--warmup", "1", "--precision", "fp32",
                               "--cases", "tiny_hifigan_b2_s2048", "--no-progress"])
    done = capsys.readouterr()
    assert code == 0, done.err
    (row,) = [json.loads(line) for line in done.out.splitlines() if line.startswith("{")]
    assert row["case"] == "tiny_hifigan_b2_s2048" and row["tiny"] and row["step_s"] > 0
    assert set(row["losses"]) == {"loss_discriminator", "loss_generator", "g_adv", "g_fm", "mel_l1"}
    assert row["loss"] == row["losses"]["loss_generator"]
