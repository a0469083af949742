"""``python -m scripts.plot_run``: one PNG of a run's ``metrics.jsonl``, ``val_metrics.jsonl`` and ``anomalies.jsonl``."""

import json

import matplotlib.image
import pytest

from scripts import plot_run
from utils.run_log import RunLog


def test_plot_run_draws_a_run_written_by_run_log(tmp_path, capsys):
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
    setup(tmp_path)
    assert plot_run.main([str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ERROR: ") and message in err[0], err
    assert not (tmp_path / "run.png").exists()


def test_plot_run_draws_a_panel_per_phase_loss_and_per_named_loss(tmp_path):
    names = {"loss_discriminator": 2.0, "loss_generator": 9.0, "grad_norm_discriminator": 3.0,
             "grad_norm_generator": 40.0, "adv": 1.0, "l1": 0.8}
    rows = [{"step": s, "loss": 9.0 - s / 10, "items_per_s": 100.0, "step_time_s": 0.1, "data_time_s": 0.01,
             "grad_norm": 40.0, "losses": {k: v / s for k, v in names.items()}} for s in range(1, 11)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert plot_run.main([str(tmp_path)]) == 0
    height = matplotlib.image.imread(tmp_path / "run.png").shape[0]
    assert height == 2.4 * 100 * (4 + 1 + 2)  # loss, items/s, data wait, norms; phase losses; adv; l1
