"""Nothing in a sharded checkpoint folder runs (tests/test_checkpoint_safety.py for files): folders crafted as an
attacker would (so that loading them unsafely opens a marker file) go through every loader of the project:
``inference.py``, ``scripts.consolidate_checkpoint``, ``train.py --init-from``, ``--resume PATH`` and ``--resume
auto``. Each is refused in one line that says it held code (``--resume auto`` renames a folder that holds code aside
and falls back to the checkpoint before it), and the marker never appears.

The routes: its ``.metadata``, which DCP itself reads with ``pickle.load``; a non-tensor entry in a shard, which DCP
itself reads with ``torch.load(weights_only=False)``; its ``train_state.pt``; each with checksums that match (the
attacker writes them too).

Folders crafted to be harmless but out of bounds (a dtype that is a string, a record at a negative offset, a path to
list index 10**10, a tensor of gigabytes held by thousands of records on the same bytes, a record whose member is
compressed and says it unpacks to gigabytes) are damaged folders: one line, nothing allocated beyond the folder's own
bytes (measured in a process of its own), ``--resume auto`` falls back. A run whose weights turn non-finite after a
resume names the checkpoint before the one it resumed from as the last good one."""

import io
import json
import math
import os
import pickle
import shutil
import struct
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import (TEST_MODEL, OpensAFile, made_once, mains_within, run_main, run_train_main, synth_corpus,
                      write_checkpoints)
from test_checkpoint_safety import COMMON, assert_refused, craft, loaders, one_line, run_dir, zip_file
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, MetadataIndex,
                                                   TensorStorageMetadata)
from torch.optim.optimizer import register_optimizer_step_post_hook

from models import MODELS
from parts import PARTS
from utils.checkpoint.resume import resume_path
from utils.checkpoint.sharded import TRAIN_STATE_NAME, sharded_intact, write_checksums

pytestmark = pytest.mark.skipif(TEST_MODEL is None, reason="no model is registered in models/__init__.py")


# The model whose run writes sharded folders: FSDP trains models with one optimizer only (tests/test_fsdp.py).
SHARDABLE = sorted(name for name, spec in MODELS.items() if not spec.phase_names)
FOLDER_MODEL = TEST_MODEL if TEST_MODEL in SHARDABLE else (SHARDABLE or [None])[0]
needs_folders = pytest.mark.skipif(FOLDER_MODEL is None, reason="every registered model trains several optimizers: "
                                                                "train.py writes no sharded folder for them")
FSDP = ["--set", "train.parallelism=fsdp"]


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """An FSDP run's output folder: ``checkpoint_1/``, ``checkpoint_2/`` and the ``checkpoint_last`` link. Where every
    model trains several optimizers (FSDP refuses them), the same folders of TEST_MODEL written in this process: a
    project that cannot write them still reads one given to it."""
    if FOLDER_MODEL is not None:
        return run_dir(tmp_path_factory, "safety_sharded", FOLDER_MODEL, *FSDP)
    corpus = made_once(tmp_path_factory, "safety_corpus", lambda folder: str(synth_corpus(folder, n=8)))[0]
    return corpus, made_once(tmp_path_factory, "safety_written", lambda folder: write_checkpoints(folder, [1, 2])
                             and None)[0]


def metadata_folder(source: Path, target: Path, marker: Path) -> None:
    """A folder whose ``.metadata`` is the payload (DCP reads it with ``pickle.load``)."""
    shutil.copytree(source, target)
    (target / ".metadata").write_bytes(pickle.dumps(OpensAFile(marker)))
    write_checksums(target)


def entry_folder(source: Path, target: Path, marker: Path) -> None:
    """An honest ``.metadata`` whose non-tensor entry (an optimizer's ``lr``) points at ``torch.save`` bytes of the
    payload appended to a shard (DCP reads non-tensor entries with ``torch.load(weights_only=False)``)."""
    shutil.copytree(source, target)
    with open(target / ".metadata", "rb") as handle:
        metadata = pickle.load(handle)  # the honest folder of this test's own run
    key = next(key for key, entry in metadata.state_dict_metadata.items()
               if isinstance(entry, BytesStorageMetadata) and key.endswith(".lr"))
    index = next(index for index in metadata.storage_data if index.fqn == key)
    info = metadata.storage_data[index]
    payload = io.BytesIO()
    torch.save(OpensAFile(marker), payload)
    shard = target / info.relative_path
    info.offset, info.length = shard.stat().st_size, len(payload.getvalue())
    with open(shard, "ab") as handle:
        handle.write(payload.getvalue())
    (target / ".metadata").write_bytes(pickle.dumps(metadata))
    write_checksums(target)


def train_state_folder(source: Path, target: Path, marker: Path) -> None:
    """A folder whose ``train_state.pt`` holds the payload beside the run's position."""
    shutil.copytree(source, target)
    zip_file(source / TRAIN_STATE_NAME, target / TRAIN_STATE_NAME, marker)
    write_checksums(target)


FOLDER_ROUTES = {"metadata": metadata_folder, "entry": entry_folder, "train_state": train_state_folder}


def folder_loaders(corpus: Path, model: str, where: Path) -> dict:
    """:func:`test_checkpoint_safety.loaders` of a folder (``train.py`` with FSDP where ``model`` can), and
    ``scripts.consolidate_checkpoint``."""
    calls = loaders(corpus, model, where, *(FSDP if model == FOLDER_MODEL else []))
    calls["consolidate"] = lambda path: (lambda done: (done.returncode, done.stderr))(
        run_main("scripts.consolidate_checkpoint", str(path), "--output", str(where / "whole.pt"), check=False))
    return calls


@pytest.mark.parametrize("loader", ["inference", "consolidate", "init_from", "resume_path"])
@pytest.mark.parametrize("route", sorted(FOLDER_ROUTES))
def test_a_sharded_folder_holding_code_is_refused_by_every_loader(sharded, tmp_path, route, loader):
    corpus, out = sharded
    path, marker = craft(route, out / "checkpoint_2", tmp_path, FOLDER_ROUTES)
    assert sharded_intact(path).startswith("unsafe: ") and "holds code" in sharded_intact(path)
    code, err = folder_loaders(corpus, FOLDER_MODEL or TEST_MODEL, tmp_path)[loader](path)
    assert_refused(code, err, marker, path)


@needs_folders
@pytest.mark.parametrize("route", sorted(FOLDER_ROUTES))
def test_resume_auto_renames_a_folder_holding_code_aside_and_falls_back(sharded, tmp_path, route):
    corpus, honest = sharded
    out = tmp_path / "out"
    shutil.copytree(honest, out, symlinks=True)
    shutil.rmtree(out / "checkpoint_2")
    _, marker = craft(route, honest / "checkpoint_2", out, FOLDER_ROUTES)  # the newest checkpoint, named by checkpoint_last
    code, _, err = run_train_main([*COMMON, *FSDP, "--model", FOLDER_MODEL, "--dataset-path", str(corpus),
                                   "--output-dir", str(out), "--max-steps", "3", "--resume", "auto"])
    assert not marker.exists(), "the payload ran"
    assert code == 0, err[-3000:]
    warnings = [line for line in err.splitlines() if line.startswith("warning:") and "holds code" in line]
    assert len(warnings) == 1 and "resuming from" in warnings[0] and "checkpoint_1" in warnings[0], err[-3000:]
    assert "checkpoint_2 -> checkpoint_2.unsafe" in warnings[0], warnings[0]
    assert (out / "checkpoint_2.unsafe").is_dir() and os.readlink(out / "checkpoint_last") == "checkpoint_3"
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps[-2:] == [2, 3], steps  # steps 2 and 3 trained again from checkpoint_1


# --- folders crafted out of bounds: damaged, not a traceback nor gigabytes ------------------------------------------

def string_dtype(metadata, folder: Path) -> str:
    """A tensor entry whose dtype is the string ``'float32'``."""
    next(entry for entry in metadata.state_dict_metadata.values()
         if isinstance(entry, TensorStorageMetadata)).properties.dtype = "float32"
    return "the dtype 'float32'"


def negative_offset(metadata, folder: Path) -> str:
    """An optimizer's ``lr`` (a non-tensor entry) read from 5 bytes before the start of its shard."""
    metadata.storage_data[next(index for index in metadata.storage_data if index.fqn.endswith(".lr"))].offset = -5
    return "at offset -5"


def far_list_index(metadata, folder: Path) -> str:
    """An optimizer's ``lr`` moved to index 10**10 of its ``param_groups`` list (DCP's ``set_element`` pads a list
    with ``None`` up to the index: 80 GB of them)."""
    key = next(key for key in metadata.state_dict_metadata if key.endswith(".lr"))
    path = tuple(10**10 if isinstance(part, int) else part for part in metadata.planner_data.pop(key))
    far = ".".join(map(str, path))
    metadata.state_dict_metadata[far], metadata.planner_data[far] = metadata.state_dict_metadata.pop(key), path
    index = next(index for index in metadata.storage_data if index.fqn == key)
    metadata.storage_data[MetadataIndex(far)] = metadata.storage_data.pop(index)
    return "index 10000000000 of a list"


def shared_bytes(metadata, folder: Path) -> str:
    """The largest tensor entry declaring 6 GiB or a little more, in thousands of chunks whose storage records all name the bytes of
    its one real record (a load would allocate the 6 GiB first)."""
    key, entry = max(((key, entry) for key, entry in metadata.state_dict_metadata.items()
                      if isinstance(entry, TensorStorageMetadata)), key=lambda item: math.prod(item[1].size))
    record = metadata.storage_data.pop(next(index for index in metadata.storage_data if index.fqn == key))
    copies = -(-(6 << 30) // (math.prod(entry.size) * entry.properties.dtype.itemsize))
    rows, rest = entry.size[0], list(entry.size[1:])
    entry.size = torch.Size([rows * copies, *rest])
    entry.chunks = [ChunkStorageMetadata(torch.Size([rows * n] + [0] * len(rest)), torch.Size([rows, *rest]))
                    for n in range(copies)]
    for n, chunk in enumerate(entry.chunks):
        metadata.storage_data[MetadataIndex(key, chunk.offsets, n)] = record
    return f"its entry {key} declares {math.prod(entry.size) * entry.properties.dtype.itemsize} bytes"


def compressed_member(metadata, folder: Path) -> str:
    """An optimizer's ``lr`` read from an archive appended to its shard whose tensor member is deflated and says it
    unpacks to 3 GiB (``torch.load`` allocates that before it unpacks a byte)."""
    saved, packed = io.BytesIO(), io.BytesIO()
    torch.save(torch.tensor(1e-3), saved)
    with zipfile.ZipFile(saved) as honest, zipfile.ZipFile(packed, "w") as archive:
        for member in honest.infolist():
            archive.writestr(member.filename, honest.read(member), compress_type=zipfile.ZIP_DEFLATED
                             if member.filename.endswith("/data/0") else zipfile.ZIP_STORED)
    data = bytearray(packed.getvalue())
    directory = data.rindex(b"PK\x01\x02", 0, data.index(b"/data/0", data.index(b"PK\x01\x02")) + 1)
    data[directory + 24:directory + 28] = struct.pack("<I", 3 << 30)  # its central directory's unpacked size
    info = metadata.storage_data[next(index for index in metadata.storage_data if index.fqn.endswith(".lr"))]
    shard = folder / info.relative_path
    info.offset, info.length = shard.stat().st_size, len(data)
    with open(shard, "ab") as handle:
        handle.write(data)
    return "holds compressed members, which torch.save never writes"


CRAFTED = {"string_dtype": string_dtype, "negative_offset": negative_offset, "far_list_index": far_list_index,
           "shared_bytes": shared_bytes, "compressed_member": compressed_member}


def crafted_folder(kind: str, source: Path, target: Path) -> str:
    """A copy of the honest folder ``source`` at ``target`` whose ``.metadata`` :data:`CRAFTED` ``kind`` changed,
    with checksums that match (the crafter writes them too); returns what the refusal must say."""
    shutil.copytree(source, target)
    with open(target / ".metadata", "rb") as handle:
        metadata = pickle.load(handle)  # the honest folder of this test's own run
    said = CRAFTED[kind](metadata, target)
    (target / ".metadata").write_bytes(pickle.dumps(metadata))
    write_checksums(target)
    return said


@pytest.mark.parametrize("kind", sorted(CRAFTED))
def test_a_folder_crafted_out_of_bounds_is_damaged_and_resume_auto_falls_back(sharded, tmp_path, kind):
    _, honest = sharded
    out = tmp_path / "out"
    shutil.copytree(honest, out, symlinks=True)
    shutil.rmtree(out / "checkpoint_2")
    said = crafted_folder(kind, honest / "checkpoint_2", out / "checkpoint_2")  # the newest, named by checkpoint_last
    problem = sharded_intact(out / "checkpoint_2")
    assert problem is not None and problem.startswith("damaged (") and said in problem, problem
    path, notes = resume_path("auto", out, PARTS.formats)
    assert path == out / "checkpoint_1" and len(notes) == 1 and said in notes[0], notes
    assert "checkpoint_2 -> checkpoint_2.damaged" in notes[0], notes[0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="measures the peak with Linux's /proc")
def test_folders_crafted_out_of_bounds_end_in_one_line_each_in_a_process_under_2_gb(sharded, tmp_path):
    """``scripts.consolidate_checkpoint`` (it allocates every tensor a folder declares) on each crafted folder, in one
    process of its own of at most 2 GiB of address space (:func:`conftest.mains_within`: the code before this check
    allocated 6 GiB for ``shared_bytes`` and 80 GB of ``None`` for ``far_list_index``): exit status 1, one ``ERROR:``
    line naming the folder, no traceback, and a peak resident size of that process under 2 GB."""
    _, honest = sharded
    folders = [tmp_path / kind for kind in sorted(CRAFTED)]
    expected = [crafted_folder(folder.name, honest / "checkpoint_2", folder) for folder in folders]
    said, peak = mains_within([["scripts.consolidate_checkpoint", str(folder), "--output", f"{folder}.pt"]
                               for folder in folders])
    for folder, what, (code, err) in zip(folders, expected, said):
        line = one_line(code, err)
        assert line.startswith(f"ERROR: {folder} is damaged (") and what in line, line
    assert peak < 2e9, f"peak {peak}"


@needs_folders
@pytest.mark.parametrize("stop", ["save", "skips"])
def test_a_folder_whose_weights_turn_non_finite_is_never_named_the_last_good_one(sharded, tmp_path, stop):
    """Resumed from checkpoint_2 (the newest), the weights turn non-finite at the first update (what damage that no
    checksum sees leaves: an optimizer state altered in a folder without checksums.json; here a global optimizer
    post-step hook, in this process). The run stops, at the next save (``save``) or after 2 skipped updates
    (``skips``), naming checkpoint_1 as the last good checkpoint and saying why not checkpoint_2: resumed again, it
    leads there again."""
    corpus, honest = sharded
    out = tmp_path / "out"
    shutil.copytree(honest, out, symlinks=True)

    def break_weights(optimizer, args, kwargs):
        with torch.no_grad():
            optimizer.param_groups[0]["params"][0].fill_(float("nan"))
    settings = ["--set", "train.checkpoint_interval=100", "--set", "train.max_skips_in_a_row=2"] if stop == "skips" \
        else []
    hook = register_optimizer_step_post_hook(break_weights)
    try:
        code, _, err = run_train_main([*COMMON, *FSDP, "--model", FOLDER_MODEL, "--dataset-path", str(corpus),
                                       "--output-dir", str(out), "--max-steps", "10", "--resume", "auto", *settings])
    finally:
        hook.remove()
    errors = [line for line in err.splitlines() if line.startswith("ERROR:")]
    assert code == 1 and len(errors) == 1, err[-3000:]
    assert ("the weights are not finite" if stop == "save" else "skipped 2 steps in a row") in errors[0], errors[0]
    assert errors[0].endswith(f"last good checkpoint: {out / 'checkpoint_1'} (not {out / 'checkpoint_2'}: the "
                              "weights this run loaded from it turned non-finite before a save)"), errors[0]
    if stop == "skips":  # the skipped update's line in anomalies.jsonl too
        rows = [json.loads(line) for line in (out / "anomalies.jsonl").read_text().splitlines()]
        assert rows and all(f"last good checkpoint: {out / 'checkpoint_1'} (not" in row["message"] for row in rows)
