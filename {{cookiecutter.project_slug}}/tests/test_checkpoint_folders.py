"""Nothing in a sharded checkpoint folder runs (tests/test_checkpoint_safety.py for files): folders crafted as an
attacker would (so that loading them unsafely opens a marker file) go through every loader of the project:
``inference.py``, ``scripts.consolidate_checkpoint``, ``train.py --init-from``, ``--resume PATH`` and ``--resume
auto``. Each is refused in one line that says it held code (``--resume auto`` renames a folder that holds code aside
and falls back to the checkpoint before it), and the marker never appears.

The routes: its ``.metadata``, which DCP itself reads with ``pickle.load``; a non-tensor entry in a shard, which DCP
itself reads with ``torch.load(weights_only=False)``; its ``train_state.pt``; each with checksums that match (the
attacker writes them too)."""

import io
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from conftest import TEST_MODEL, OpensAFile, made_once, run_main, run_train_main, synth_corpus, write_checkpoints
from test_checkpoint_safety import COMMON, assert_refused, craft, loaders, run_dir, zip_file
from torch.distributed.checkpoint.metadata import BytesStorageMetadata

from models import MODELS
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
