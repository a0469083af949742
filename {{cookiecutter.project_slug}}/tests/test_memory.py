"""scripts/memory.py on 2 CPU processes: what the user runs to see per-rank memory (DDP vs FSDP, activation
checkpointing) and the stall of a checkpoint save (sync vs async)."""

import json
import subprocess
import sys

from conftest import ROOT, clean_env


def test_memory_script_shows_fsdp_halving_the_state_and_checkpointing_the_activations(tmp_path):
    out = tmp_path / "memory.json"
    done = subprocess.run([sys.executable, "scripts/memory.py", "--depth", "6", "--width", "512", "--batch", "512",
                           "--json", str(out)], cwd=ROOT, env=clean_env(2), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "measured fsdp / activation checkpointing full" in done.stderr  # progress while it runs
    data = json.loads(out.read_text())
    rows, ratios = data["rows"], data["ratios"]
    assert {(r["parallelism"], r["activation_checkpointing"], r["rank"]) for r in rows} == {
        (p, m, r) for p in ("ddp", "fsdp") for m in ("none", "full", "selective") for r in (0, 1)}
    assert ratios["fsdp_over_ddp_state"] <= 0.6
    for parallelism in ("ddp", "fsdp"):
        assert ratios[f"{parallelism}_full_over_none_activations"] <= 0.5
        assert ratios[f"{parallelism}_full_over_none_activations"] < \
            ratios[f"{parallelism}_selective_over_none_activations"] < 1
    # Both saves wrote a whole checkpoint (model + Adam state: 3 x 6 blocks x 2 MiB); the background one blocked
    # the loop for less time than the synchronous one took.
    stalls = {s["save"]: s for s in data["stalls"] if s["rank"] == 0}
    assert stalls["sync"]["checkpoint_mb"] > 3 * 6 * 2 * 2**20 / 1e6
    assert stalls["async"]["stall_s"] < stalls["sync"]["stall_s"] and stalls["async"]["complete_s"] > 0
    assert "fsdp_over_ddp_state 0.500" in done.stdout
