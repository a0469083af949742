"""The quick start of the generated README, as a new user runs it: its commands as written, in its order, in a project
of every default answer (WaveGlow): demo corpus -> 2-process CPU training with --tiny -> a wav, said to be noise. The
template's README gives the same commands. (The fast tests of its last line run in tests/test_own_model.py.)"""

import json
import re

import soundfile as sf

from conftest import ROOT, as_written, quick_start

SETUP = ("SUDO=", "$SUDO apt-get", "python3 -m venv", "pip install")
"""The machine's set-up lines, done by CI's own virtual environment (.ci/run) before the tests."""


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_readme_quick_start_as_written(default_project, demo_corpus):
    project, commands = default_project, quick_start(default_project)
    assert demo_corpus == project / "data" / "demo" and len(list((demo_corpus / "wavs").glob("*.wav"))) == 24
    torch_line = next(c for c in commands if "pip install" in c and "torch" in c)
    assert re.search(r"pip install --retries 0 --timeout 20 torch --index-url \S+/cpu \|\| pip install torch$",
                     torch_line), "a torch index out of reach falls back within seconds"
    run = [c for c in commands if not c.startswith(SETUP) and "scripts.make_demo_corpus" not in c]
    train, infer, tests = run
    assert train.startswith("python multiproc.py") and tests.startswith("python -m pytest"), run

    proc = as_written(train, project)
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
    assert max(p.stat().st_size for p in out.glob("checkpoint_*.pt")) < 10 * 2**20, "tiny means tiny"
    assert len(list((out / "tensorboard").glob("events.out.tfevents.*"))) == 1
    # rank 1 ran (its log exists) but printed nothing of rank 0's: no progress, no saves.
    rank1 = "".join(p.read_text() for p in (project / "logs").glob("rank_1*"))
    said = proc.stdout + proc.stderr
    assert "saved" not in rank1 and "saved" in said
    # Piped, the progress bar is whole lines: no log line shares a line with it.
    assert all(line.startswith("train:") or "it/s" not in line and "step/s" not in line for line in said.splitlines())
    assert "\r" not in said

    proc = as_written(infer, project)
    wav = project / infer.split("--output ")[1].split()[0]
    info = sf.info(str(wav))
    assert info.samplerate == 22050 and info.subtype == "PCM_16" and info.channels == 1
    source = demo_corpus / "wavs" / "LJ_DEMO_0001.wav"
    assert abs(info.frames - sf.info(str(source)).frames) < 22050 * 0.05
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and f"{wav.name} sounds like noise" in warnings[0], proc.stderr  # as the README says

    block = "\n".join((project / "README.md").read_text().split("## Quick start", 1)[1]
                      .split("```bash\n", 1)[1].split("\n```", 1)[0].splitlines())
    assert block in (ROOT / "README.md").read_text(), "the template's README gives the same quick start"
