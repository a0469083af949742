"""The main job of the template's README, as a new user runs it: demo corpus -> 2-process CPU training of the
default project with --tiny -> inference wav. (Each variant's own test suite runs in tests/test_own_model.py.)"""

import json

import soundfile as sf

from conftest import PY, run


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_waveglow_main_job_on_two_processes(bake, demo_corpus):
    project = bake()  # every default: waveglow
    proc = run([PY, "multiproc.py", "--nproc-per-node", "2", "train.py", "--config", "config.json", "--tiny",
                "--dataset-path", str(demo_corpus), "--output-dir", "out", "--max-steps", "30"],
               cwd=project, timeout=900)
    out = project / "out"
    rows = read_jsonl(out / "metrics.jsonl")
    steps = [r["step"] for r in rows]
    assert steps == sorted(set(steps)) and steps[-1] == 30, "one writer (rank 0), one row per logged step"
    for key in ("step", "epoch", "loss", "lr", "items_per_s", "step_time_s", "data_time_s"):
        assert all(key in r for r in rows), key
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.1, [r["loss"] for r in rows]
    assert all(r["items_per_s"] > 0 for r in rows)
    assert read_jsonl(out / "val_metrics.jsonl")[-1]["step"] == 30
    assert {p.name for p in out.glob("checkpoint_*.pt")} == {"checkpoint_20.pt", "checkpoint_30.pt",
                                                             "checkpoint_last.pt"}  # keep_last 2 in tiny
    assert len(list((out / "tensorboard").glob("events.out.tfevents.*"))) == 1
    # rank 1 ran (its log exists) but printed nothing of rank 0's: no progress, no saves.
    rank1 = "".join(p.read_text() for p in (project / "logs").glob("rank_1*"))
    assert "saved" not in rank1 and "saved" in proc.stdout + proc.stderr

    wav = sorted((demo_corpus / "wavs").glob("*.wav"))[0]
    run([PY, "inference.py", "--checkpoint", "out/checkpoint_last.pt", "--wav", str(wav), "--output", "x.wav"],
        cwd=project, timeout=300)
    info = sf.info(str(project / "x.wav"))
    assert info.samplerate == 22050 and info.subtype == "PCM_16" and info.channels == 1
    assert abs(info.frames - sf.info(str(wav)).frames) < 22050 * 0.05
