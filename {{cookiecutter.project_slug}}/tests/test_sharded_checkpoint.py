"""Sharded checkpoints (utils.checkpoint.ShardedCheckpointer) in one process: folders that appear complete or not
at all, the checkpoint_last link, keep_last, the fallback past a damaged folder; inference.py from a folder and from
its consolidated file (python -m scripts.consolidate_checkpoint). Written by 2 real processes: tests/test_fsdp.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TEST_MODEL, synth_corpus
from conftest import run_main as run
from conftest import write_checkpoints

import inference
from models import MODELS
from parts import PARTS
from utils.checkpoint.names import list_checkpoint_folders
from utils.checkpoint.resume import resume_path
from utils.checkpoint.sharded import sharded_intact

pytestmark = pytest.mark.skipif(TEST_MODEL is None, reason="no model is registered in model.py")


def test_step_folders_appear_whole_the_link_names_the_last_and_keep_last_holds(tmp_path):
    write_checkpoints(tmp_path, [2, 4, 6], keep_last=2)
    assert [p.name for p in list_checkpoint_folders(tmp_path)] == ["checkpoint_4", "checkpoint_6"]
    assert os.readlink(tmp_path / "checkpoint_last") == "checkpoint_6"
    assert not list(tmp_path.glob(".checkpoint_*")), "no partial folder or temporary link left"
    assert resume_path("auto", tmp_path, PARTS.formats) == (tmp_path / "checkpoint_last", [])


def test_a_killed_save_and_a_damaged_folder_fall_back_to_the_last_intact_checkpoint(tmp_path):
    write_checkpoints(tmp_path, [2, 4])
    (tmp_path / ".checkpoint_6.partial").mkdir()  # what a save killed half-way leaves
    (tmp_path / ".checkpoint_6.partial" / "__0_0.distcp").write_bytes(b"\0" * 100)
    assert resume_path("auto", tmp_path, PARTS.formats) == (tmp_path / "checkpoint_last", [])
    shard = next((tmp_path / "checkpoint_4").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:1000])  # cut short
    path, notes = resume_path("auto", tmp_path, PARTS.formats)
    assert path == tmp_path / "checkpoint_2" and len(notes) == 1
    assert "is damaged (shard" in notes[0] and "cut short" in notes[0] and "checkpoint_2" in notes[0]


def flip_bytes(path: Path) -> None:
    """Damage a file the way a bad disk or a bad copy does: some bytes in its middle change, its size does not."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 8] = bytes(b ^ 0xFF for b in data[middle:middle + 8])
    path.write_bytes(bytes(data))


def test_a_bit_flip_inside_a_shard_is_found_and_the_intact_checkpoint_taken(tmp_path):
    write_checkpoints(tmp_path, [2, 4, 6], keep_last=0)
    shard = max((tmp_path / "checkpoint_6").glob("*.distcp"), key=lambda p: p.stat().st_size)
    flip_bytes(shard)
    for args in (["inference", "--checkpoint", str(tmp_path / "checkpoint_6"), "--output", str(tmp_path / "x.wav")],
                 ["scripts.consolidate_checkpoint", str(tmp_path / "checkpoint_6"), "--output",
                  str(tmp_path / "x.pt")]):
        done = run(*args, check=False)
        errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR:")]
        assert done.returncode == 1 and len(errors) == 1, done.stderr
        assert f"{shard.name} fails its CRC-32 check" in errors[0], errors[0]
    assert not (tmp_path / "x.wav").exists() and not (tmp_path / "x.pt").exists()
    path, notes = resume_path("auto", tmp_path, PARTS.formats)
    assert path == tmp_path / "checkpoint_4" and len(notes) == 1, notes
    assert f"{shard.name} fails its CRC-32 check" in notes[0] and "checkpoint_6 -> checkpoint_6.damaged" in notes[0]
    # Out of the way: the next save with keep_last=2 keeps the intact 4 beside the new 8, not the damaged 6.
    write_checkpoints(tmp_path, [8], keep_last=2)
    assert [p.name for p in list_checkpoint_folders(tmp_path)] == ["checkpoint_4", "checkpoint_8"]
    assert (tmp_path / "checkpoint_6.damaged").is_dir()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = tmp_path_factory.mktemp("sharded")
    return out, write_checkpoints(out, [3])


def test_consolidation_writes_one_file_with_the_same_weights_and_keeps_an_existing_one(saved, tmp_path):
    out, model = saved
    target = tmp_path / "whole.pt"
    done = run("scripts.consolidate_checkpoint", str(out / "checkpoint_last"), "--output", str(target))
    assert f"wrote {target}" in done.stdout and f"model '{TEST_MODEL}' at step 3" in done.stdout
    state = torch.load(target, weights_only=True)
    assert state["model_name"] == TEST_MODEL and state["step"] == 3 and "optimizer" in state
    for key, value in model.state_dict().items():
        assert torch.equal(state["model"][key], value), key
    again = run("scripts.consolidate_checkpoint", str(out / "checkpoint_last"), "--output", str(target),
                check=False)
    assert again.returncode == 1 and again.stderr.startswith("ERROR:") and "exists" in again.stderr
    small = tmp_path / "model.pt"
    run("scripts.consolidate_checkpoint", str(out / "checkpoint_3"), "--output", str(small), "--model-only")
    assert "optimizer" not in torch.load(small, weights_only=True) and small.stat().st_size < target.stat().st_size


def test_inference_reads_a_sharded_folder_and_its_consolidated_file_alike(saved, tmp_path):
    out, model = saved
    spec = MODELS[TEST_MODEL]
    target = tmp_path / "whole.pt"
    run("scripts.consolidate_checkpoint", str(out / "checkpoint_last"), "--output", str(target))
    for source in (out / "checkpoint_last", target):
        name, loaded, cfg = inference.load_trained(source, torch.device("cpu"))
        assert name == TEST_MODEL and cfg.section(TEST_MODEL) is not None
        for key, value in model.state_dict().items():
            assert torch.equal(loaded.state_dict()[key], value), (source, key)
    for source in (out / "checkpoint_last", target):  # the checkpoint's model options, read from either
        assert f"{TEST_MODEL} options" in run("inference", "--checkpoint", str(source), "--help").stdout \
            or spec.inference is None or spec.inference.add_args is None
    if spec.inference is None or spec.inference.vocode is None:
        return  # the vocoders' command line is known here; a text-to-mel model's is checked by its own tests
    wav = sorted((synth_corpus(tmp_path / "corpus", n=1) / "wavs").glob("*.wav"))[0]
    for source in (out / "checkpoint_last", target):
        done = run("inference", "--checkpoint", str(source), "--wav", str(wav), "--output",
                   str(tmp_path / f"{source.name}.wav"))
        assert "wrote" in done.stdout and (tmp_path / f"{source.name}.wav").stat().st_size > 1000


def test_a_folder_that_is_no_checkpoint_is_one_error_line(tmp_path):
    for args in (["inference", "--checkpoint", str(tmp_path), "--output", str(tmp_path / "x.wav")],
                 ["scripts.consolidate_checkpoint", str(tmp_path), "--output", str(tmp_path / "x.pt")]):
        done = run(*args, check=False)
        errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR:")]
        assert done.returncode == 1 and len(errors) == 1 and "not a sharded checkpoint" in errors[0], done.stderr
    done = run("scripts.consolidate_checkpoint", str(tmp_path / "gone"), "--output", str(tmp_path / "x.pt"),
               check=False)
    assert done.returncode == 1 and done.stderr.strip() == f"ERROR: {tmp_path / 'gone'}: no such file or folder"
    done = run("scripts.consolidate_checkpoint", str(tmp_path), "--output", str(tmp_path / "no" / "x.pt"),
               check=False)
    assert done.stderr.strip() == f"ERROR: --output {tmp_path / 'no' / 'x.pt'}: the folder {tmp_path / 'no'} does " \
                                  "not exist"


FULL_DISK_SAVES = """
import resource, sys
from pathlib import Path
from conftest import write_checkpoints
from utils.checkpoint.files import CheckpointError
out, total = Path(sys.argv[1]), int(sys.argv[2])
for share in range(1, 100, 7):  # where the write fails: inside torch.save's zip writer, or a plain write
    folder = out / f"at_{share}"
    folder.mkdir()
    resource.setrlimit(resource.RLIMIT_FSIZE, (total * share // 100, resource.RLIM_INFINITY))  # Python ignores SIGXFSZ
    try:
        write_checkpoints(folder, [2])
        print("saved")
    except CheckpointError as err:
        print("ERROR:", err)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
"""


@pytest.mark.slow  # real processes: the fast tier keeps one 2-process smoke run
def test_a_full_disk_in_a_sharded_save_is_one_line_naming_it(saved, tmp_path):
    """Files that cannot grow (a file size limit: what a full disk does to a write) at several points of the save: each
    is one line; torch.save's own "[enforce fail at inline_container.cc] unexpected pos" becomes the disk's story."""
    out, _ = saved
    total = max(f.stat().st_size for f in (out / "checkpoint_3").iterdir())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(ROOT) / "tests"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", FULL_DISK_SAVES, str(tmp_path), str(total)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and len(lines) == 15 and "Traceback" not in done.stderr, done.stdout + done.stderr
    for share, line in zip(range(1, 100, 7), lines):
        folder = tmp_path / f"at_{share}"
        assert line.startswith(f"ERROR: could not write the step 2 checkpoint in {folder}: "), line
        assert line.endswith("; earlier checkpoints are kept (none written yet)") and "enforce fail" not in line, line
        assert not list(folder.iterdir()), "nothing is left behind"
    assert any(f"no space left on device writing {tmp_path / f'at_{share}' / '.checkpoint_2.partial'} (or a quota or "
               "file size limit: a write came up short)" in line for share, line in zip(range(1, 100, 7), lines)), lines


def unchecked_folder(tmp_path):
    """``(folder, warning)``: a sharded checkpoint of 2 steps in ``tmp_path`` without its checksums.json and with a bit
    flip in its largest shard, and the warning a command that reads it must print once."""
    write_checkpoints(tmp_path, [2])
    folder = tmp_path / "checkpoint_2"
    (folder / "checksums.json").unlink()
    flip_bytes(max(folder.glob("*.distcp"), key=lambda p: p.stat().st_size))
    return folder, (f"warning: {folder} has no checksums.json (written before checksums, or copied without it): its "
                    "weights are unverified (damage to its shards cannot be found)")


def test_a_listing_that_leaves_out_a_file_is_damage_and_resume_auto_falls_back(tmp_path):
    """A folder whose shard changed and whose checksums.json lists nothing (``{}``), or all but that shard: what a
    save never writes, so damaged, not a folder from before checksums."""
    write_checkpoints(tmp_path, [2, 4])
    folder = tmp_path / "checkpoint_4"
    shard = max(folder.glob("*.distcp"), key=lambda p: p.stat().st_size)
    flip_bytes(shard)
    listing = json.loads((folder / "checksums.json").read_text())
    for kept, unlisted in (({}, f".metadata, {shard.name}, train_state.pt"),
                           ({name: entry for name, entry in listing.items() if name != shard.name}, shard.name)):
        (folder / "checksums.json").write_text(json.dumps(kept))
        assert sharded_intact(folder) == f"damaged (its checksums.json does not list {unlisted}: their bytes cannot " \
                                         "be checked)"
    path, notes = resume_path("auto", tmp_path, PARTS.formats)
    assert path == tmp_path / "checkpoint_2" and len(notes) == 1, notes
    assert f"does not list {shard.name}" in notes[0] and "checkpoint_4 -> checkpoint_4.damaged" in notes[0], notes[0]


@pytest.mark.slow  # a whole checkpoint written, damaged and consolidated
def test_a_folder_without_its_checksums_is_read_with_a_line_saying_so(tmp_path):
    """A folder written before checksums (or copied without its checksums.json): a bit flip in it cannot be found, so
    every command that reads it warns that its weights are unverified (once), then reads it (``scripts.export``:
    ``tests/test_tools_sharded.py``). ``python -m scripts.consolidate_checkpoint``'s main in this process: what is
    proven is what it reads and says, not the launch."""
    folder, warning = unchecked_folder(tmp_path)
    done = run("scripts.consolidate_checkpoint", str(folder), "--output", str(tmp_path / "whole.pt"), check=False)
    assert done.returncode == 0 and done.stderr.splitlines().count(warning) == 1, done.stderr
    assert "checksums.json" not in done.stderr.replace(warning, ""), done.stderr
