"""Nothing in a checkpoint runs. Files and folders crafted as an attacker would (so that loading them unsafely opens a
marker file) go through every loader of the project: ``inference.py``, ``scripts.import_weights``, ``scripts.export``,
``scripts.consolidate_checkpoint``, ``train.py --init-from``, ``--resume PATH`` and ``--resume auto``. Each is refused
in one line that says it held code (``--resume auto`` renames a folder that holds code aside and falls back to the
checkpoint before it), and the marker never appears.

The routes: a ``.pt`` file (``torch.save``'s zip archive; PyTorch's legacy pickle format; a published format's
pickled module holding the payload) and a sharded folder (its ``.metadata``, which DCP itself reads with
``pickle.load``; a non-tensor entry in a shard, which DCP itself reads with ``torch.load(weights_only=False)``; its
``train_state.pt``), each with checksums that match (the attacker writes them too). Everything runs in this process
(``conftest.run_main``, ``conftest.run_train_main``): what is proven is what a load runs, not the launch."""

import io
import json
import os
import pickle
import shutil
import sys
import types
from pathlib import Path

import pytest
import torch
from conftest import (TEST_MODEL, OpensAFile, made_once, run_main, run_train_main, synth_corpus, train_in_process,
                      write_checkpoints)
from torch.distributed.checkpoint.metadata import BytesStorageMetadata

from models import MODELS, config_schemas
from utils.checkpoint.files import write_checksums
from utils.checkpoint.sharded import TRAIN_STATE_NAME, load_sharded_model, read_train_state, sharded_intact
from utils.config import config_from_dict

pytestmark = pytest.mark.skipif(TEST_MODEL is None, reason="no model is registered in models/__init__.py")

# The model whose run writes sharded folders: FSDP trains models with one optimizer only (tests/test_fsdp.py).
SHARDABLE = sorted(name for name, spec in MODELS.items() if not spec.phase_names)
FOLDER_MODEL = TEST_MODEL if TEST_MODEL in SHARDABLE else (SHARDABLE or [None])[0]
needs_folders = pytest.mark.skipif(FOLDER_MODEL is None, reason="every registered model trains several optimizers: "
                                                                "train.py writes no sharded folder for them")
COMMON = ["--config", "config.json", "--tiny", "--set", "data.num_workers=0", "--set", "train.val_interval=1000",
          "--set", "train.log_interval=1",
          "--set", "train.checkpoint_interval=1", "--set", "train.keep_last=0", "--set", "train.precision=fp32"]
FSDP = ["--set", "train.parallelism=fsdp"]


def run_dir(tmp_path_factory, name: str, model: str, *extra: str) -> tuple[Path, Path]:
    """``(corpus, output folder)`` of a 2-step tiny run of ``model`` (a checkpoint at each step), made once."""
    corpus = made_once(tmp_path_factory, "safety_corpus", lambda folder: str(synth_corpus(folder, n=8)))[0]

    def make(folder):
        train_in_process([*COMMON, "--model", model, "--dataset-path", str(corpus), "--output-dir", str(folder),
                          "--max-steps", "2", *extra])
    return corpus, made_once(tmp_path_factory, name, make)[0]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """A DDP run's output folder of TEST_MODEL: ``checkpoint_1.pt``, ``checkpoint_2.pt``, ``checkpoint_last.pt``."""
    return run_dir(tmp_path_factory, "safety_single", TEST_MODEL)


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


# --- the crafted files and folders ---------------------------------------------------------------------------------

def zip_file(source: Path, target: Path, marker: Path) -> None:
    """A whole checkpoint of this project with the payload beside its entries, as ``torch.save`` writes it."""
    state = torch.load(source, weights_only=True)
    torch.save({**state, "payload": OpensAFile(marker)}, target)


def legacy_file(source: Path, target: Path, marker: Path) -> None:
    """The same in PyTorch's format before 1.6 (a plain pickle stream: no zip archive, no checksums)."""
    state = torch.load(source, weights_only=True)
    buffer = io.BytesIO()
    torch.save({**state, "payload": OpensAFile(marker)}, buffer, _use_new_zipfile_serialization=False)
    target.write_bytes(buffer.getvalue())


def record_file(source: Path, target: Path, marker: Path) -> None:
    """A published format's pickled module (a class its reader turns into a record of attributes, e.g. NVIDIA's
    ``glow.WaveGlow``) whose attributes hold the payload."""
    classes = [name for spec in MODELS.values() if spec.published for name in spec.published.pickled_classes]
    module, _, name = classes[0].rpartition(".")
    published = type(name, (), {"__module__": module})
    record = published.__new__(published)
    record.__dict__.update({"_modules": {}, "_parameters": {}, "payload": OpensAFile(marker)})
    with PicklesAs(module, published):
        torch.save({"model": record}, target)


class PicklesAs:
    """While inside: ``module`` importable as a module holding ``cls`` (pickle looks a class up by its name)."""

    def __init__(self, module: str, cls: type):
        self.module, self.cls = module, cls

    def __enter__(self):
        self.before = sys.modules.get(self.module)
        sys.modules[self.module] = types.SimpleNamespace(**{self.cls.__name__: self.cls})

    def __exit__(self, *exc):
        if self.before is None:
            sys.modules.pop(self.module)
        else:
            sys.modules[self.module] = self.before


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


FILE_ROUTES = {"zip": zip_file, "legacy": legacy_file,
               **({"record": record_file} if any(spec.published and spec.published.pickled_classes
                                                 for spec in MODELS.values()) else {})}
FOLDER_ROUTES = {"metadata": metadata_folder, "entry": entry_folder, "train_state": train_state_folder}


def craft(route: str, honest: Path, where: Path) -> tuple[Path, Path]:
    """``(crafted file or folder, marker)``: ``route`` applied to a copy of the honest checkpoint ``honest``."""
    marker = where / "pwned"
    target = where / (honest.name if honest.is_dir() else f"crafted_{route}.pt")
    {**FILE_ROUTES, **FOLDER_ROUTES}[route](honest, target, marker)
    return target, marker


# --- every loader --------------------------------------------------------------------------------------------------

def loaders(corpus: Path, model: str, where: Path, folder: bool) -> dict:
    """Each loader's call on a checkpoint path: a function of the path giving ``(exit status, stderr)``."""
    wav = str(sorted((corpus / "wavs").glob("*.wav"))[0])
    train = [*COMMON, "--model", model, "--dataset-path", str(corpus), "--max-steps", "3",
             *(FSDP if folder and model == FOLDER_MODEL else [])]

    def main(*args):
        done = run_main(*args, check=False)
        return done.returncode, done.stderr

    def train_py(*args):
        code, _, err = run_train_main([*train, *args])
        return code, err
    calls = {
        "inference": lambda path: main("inference", "--checkpoint", str(path), "--wav", wav, "--output",
                                       str(where / "x.wav")),
        "import_weights": lambda path: main("scripts.import_weights", str(path), "--tiny", "--output",
                                            str(where / "imported.pt")),
        "export": lambda path: main("scripts.export", "--checkpoint", str(path), "--format", "release", "--output",
                                    str(where / "release.pt")),
        "init_from": lambda path: train_py("--init-from", str(path), "--output-dir", str(where / "init")),
        "resume_path": lambda path: train_py("--resume", str(path), "--output-dir", str(where / "resumed")),
    }
    if folder:
        calls["consolidate"] = lambda path: main("scripts.consolidate_checkpoint", str(path), "--output",
                                                 str(where / "whole.pt"))
    return calls


def assert_refused(code: int, err: str, marker: Path, path: Path) -> None:
    """The payload did not run, and the load ended in one ERROR line naming the checkpoint and what it held."""
    assert not marker.exists(), f"the payload in {path} ran"
    errors = [line for line in err.splitlines() if line.startswith("ERROR")]
    assert code != 0 and len(errors) == 1, err[-3000:]
    assert str(path) in errors[0] and ("holds code" in errors[0] or "nothing was run" in errors[0]), errors[0]
    assert "Traceback" not in err, err[-3000:]


@pytest.mark.parametrize("loader", ["inference", "import_weights", "export", "init_from", "resume_path"])
@pytest.mark.parametrize("route", sorted(FILE_ROUTES))
def test_a_pt_file_holding_code_is_refused_by_every_loader(single, tmp_path, route, loader):
    corpus, out = single
    path, marker = craft(route, out / "checkpoint_2.pt", tmp_path)
    code, err = loaders(corpus, TEST_MODEL, tmp_path, folder=False)[loader](path)
    assert_refused(code, err, marker, path)


@pytest.mark.parametrize("loader", ["inference", "import_weights", "export", "consolidate", "init_from",
                                    "resume_path"])
@pytest.mark.parametrize("route", sorted(FOLDER_ROUTES))
def test_a_sharded_folder_holding_code_is_refused_by_every_loader(sharded, tmp_path, route, loader):
    corpus, out = sharded
    path, marker = craft(route, out / "checkpoint_2", tmp_path)
    assert sharded_intact(path).startswith("unsafe: ") and "holds code" in sharded_intact(path)
    code, err = loaders(corpus, FOLDER_MODEL or TEST_MODEL, tmp_path, folder=True)[loader](path)
    assert_refused(code, err, marker, path)


@needs_folders
@pytest.mark.parametrize("route", sorted(FOLDER_ROUTES))
def test_resume_auto_renames_a_folder_holding_code_aside_and_falls_back(sharded, tmp_path, route):
    corpus, honest = sharded
    out = tmp_path / "out"
    shutil.copytree(honest, out, symlinks=True)
    shutil.rmtree(out / "checkpoint_2")
    _, marker = craft(route, honest / "checkpoint_2", out)  # the newest checkpoint, named by checkpoint_last
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


def test_a_pt_file_holding_code_under_resume_auto_is_refused_and_kept(single, tmp_path):
    corpus, honest = single
    out = tmp_path / "out"
    shutil.copytree(honest, out)
    path, marker = craft("zip", honest / "checkpoint_2.pt", tmp_path)
    shutil.copy(path, out / "checkpoint_last.pt")
    code, _, err = run_train_main([*COMMON, "--model", TEST_MODEL, "--dataset-path", str(corpus), "--output-dir",
                                   str(out), "--max-steps", "3", "--resume", "auto"])
    assert_refused(code, err, marker, out / "checkpoint_last.pt")
    assert (out / "checkpoint_last.pt").read_bytes() == path.read_bytes(), "the refused file is kept as it was"


# --- what an honest folder still does -------------------------------------------------------------------------------

def test_an_honest_sharded_folder_imports_and_consolidates_to_the_same_weights(sharded, tmp_path):
    _, out = sharded
    name = FOLDER_MODEL or TEST_MODEL
    done = run_main("scripts.import_weights", str(out / "checkpoint_2"), "--tiny", "--output",
                    str(tmp_path / "imported.pt"))
    assert f"model '{name}' from a sharded checkpoint of model '{name}' at step 2" in done.stdout
    run_main("scripts.consolidate_checkpoint", str(out / "checkpoint_2"), "--output", str(tmp_path / "whole.pt"))
    imported = torch.load(tmp_path / "imported.pt", weights_only=True)["model"]
    whole = torch.load(tmp_path / "whole.pt", weights_only=True)
    assert whole["step"] == 2 and whole["optimizer"]["param_groups"][0]["lr"] > 0
    model = MODELS[name].build_model(config_from_dict(read_train_state(out / "checkpoint_2")["config"],
                                                             config_schemas()))
    load_sharded_model(out / "checkpoint_2", model)
    for key, value in model.state_dict().items():
        assert torch.equal(imported[key], value) and torch.equal(whole["model"][key], value), key
