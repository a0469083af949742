"""``python -m scripts.memory`` on 2 CPU processes: what the user runs to see per-rank memory (DDP vs FSDP, activation
checkpointing) and the stall of a checkpoint save (sync vs async)."""

import json
import sys

import pytest
from conftest import bound, finish, start_job

from models import MODELS
from parts import PARTS
from scripts import memory

pytestmark = pytest.mark.slow  # real multi-process jobs: python -m pytest -m "not slow" leaves them out


def test_memory_script_shows_fsdp_halving_the_state_and_checkpointing_the_activations(tmp_path):
    out = tmp_path / "memory.json"
    proc = start_job([sys.executable, "-m", "scripts.memory", "--tiny", "--json", str(out)], tmp_path, nproc=2)
    code, output = finish(proc, timeout=bound(240))
    assert code == 0, output[-4000:]
    assert "measured fsdp / activation checkpointing full" in output  # progress while it runs
    data = json.loads(out.read_text())
    rows, ratios = data["rows"], data["ratios"]
    assert {(r["parallelism"], r["activation_checkpointing"], r["rank"]) for r in rows} == {
        (p, m, r) for p in ("ddp", "fsdp") for m in ("none", "full", "selective") for r in (0, 1)}
    assert all(r["method"] == "saved-tensor accounting" for r in rows)  # the CPU method, named
    assert ratios["fsdp_over_ddp_state"] <= 0.6
    for parallelism in ("ddp", "fsdp"):
        assert ratios[f"{parallelism}_full_over_none_activations"] <= 0.5
        assert ratios[f"{parallelism}_full_over_none_activations"] < \
            ratios[f"{parallelism}_selective_over_none_activations"] < 1
    # Both saves, on both ranks: a whole checkpoint (model + Adam state: 3 x 6 blocks x 2 MiB), complete and equal to
    # the state at the save() call on loading (the script changes every value after save() returns); the background
    # save blocked the loop for less time than the synchronous one took.
    assert {(s["save"], s["rank"]) for s in data["stalls"]} == {(k, r) for k in ("sync", "async") for r in (0, 1)}
    for s in data["stalls"]:
        assert s["verified"] is True and 0 < s["stall_s"] <= s["complete_s"]
        assert s["checkpoint_mb"] > 3 * 6 * 2 * 2**20 / 1e6
    stalls = {s["save"]: s for s in data["stalls"] if s["rank"] == 0}
    assert stalls["async"]["stall_s"] < stalls["sync"]["stall_s"]
    assert "fsdp_over_ddp_state 0.500" in output


def test_memory_script_refuses_bad_arguments_in_one_line(tmp_path, capsys):
    """In this process: its checks come before any rank is started."""
    for args, words in ((["--nproc", "1"], "--nproc must be >= 2"), (["--depth", "0"], "--depth must be >= 1"),
                        (["--json", str(tmp_path / "missing" / "m.json")], "does not exist")):
        assert memory.main(args) == 1
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1, err


def test_memory_script_measures_a_model_of_the_project(tmp_path):
    measurable = sorted(name for name, spec in MODELS.items() if spec.training.blocks is not None
                        and not spec.phase_names and name in PARTS.benchmarks and PARTS.benchmarks[name].cases)
    if not measurable:
        pytest.skip("no registered model has blocks, a synthetic batch and one optimizer")
    name, out = measurable[0], tmp_path / "memory.json"
    proc = start_job([sys.executable, "-m", "scripts.memory", "--tiny", "--model", name, "--no-stall", "--json",
                      str(out)], tmp_path, nproc=2)
    code, output = finish(proc, timeout=bound(240))
    assert code == 0, output[-4000:]
    assert f"memory: 2 processes, model '{name}' (tiny size)" in output
    data = json.loads(out.read_text())
    assert data["settings"]["model"] == name and len(data["rows"]) == 12 and data["stalls"] == []
    assert data["ratios"]["fsdp_over_ddp_state"] <= 0.6  # FSDP holds about half of a 2-rank DDP replica's state


def test_memory_script_refuses_a_model_it_cannot_measure(tmp_path, capsys):
    assert memory.main(["--model", "no_such_model"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ERROR: --model no_such_model: models/__init__.py registers no such "
                                               "model"), err
