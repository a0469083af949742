"""Nothing in a checkpoint runs. Files and folders crafted as an attacker would (so that loading them unsafely opens a
marker file) go through every loader of the project: ``inference.py``, ``train.py --init-from``, ``--resume PATH``
and ``--resume auto`` (the after-training tools' routes: ``tests/test_published.py``, ``tests/test_tools_sharded.py``;
sharded folders: ``tests/test_checkpoint_folders.py``). Each is refused in one line that says it held code, and the
marker never appears.

The routes: a ``.pt`` file (``torch.save``'s zip archive; PyTorch's legacy pickle format; a published format's
pickled module holding the payload). Everything runs in this process
(``conftest.run_main``, ``conftest.run_train_main``): what is proven is what a load runs, not the launch."""

import io
import shutil
import sys
import types
from pathlib import Path
from typing import Optional

import pytest
import torch
from conftest import TEST_MODEL, OpensAFile, made_once, run_main, run_train_main, synth_corpus, train_in_process

from models import MODELS

pytestmark = pytest.mark.skipif(TEST_MODEL is None, reason="no model is registered in models/__init__.py")

COMMON = ["--config", "config.json", "--tiny", "--set", "data.num_workers=0", "--set", "train.val_interval=1000",
          "--set", "train.log_interval=1",
          "--set", "train.checkpoint_interval=1", "--set", "train.keep_last=0", "--set", "train.precision=fp32"]


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


FILE_ROUTES = {"zip": zip_file, "legacy": legacy_file,
               **({"record": record_file} if any(spec.published and spec.published.pickled_classes
                                                 for spec in MODELS.values()) else {})}


def craft(route: str, honest: Path, where: Path, routes: Optional[dict] = None) -> tuple[Path, Path]:
    """``(crafted file or folder, marker)``: ``route`` (of ``routes``) applied to a copy of the honest checkpoint
    ``honest``."""
    marker = where / "pwned"
    target = where / (honest.name if honest.is_dir() else f"crafted_{route}.pt")
    (routes or FILE_ROUTES)[route](honest, target, marker)
    return target, marker


# --- every loader --------------------------------------------------------------------------------------------------

def loaders(corpus: Path, model: str, where: Path, *extra: str) -> dict:
    """Each loader's call on a checkpoint path: a function of the path giving ``(exit status, stderr)``; ``extra``:
    more options of ``train.py``."""
    wav = str(sorted((corpus / "wavs").glob("*.wav"))[0])
    train = [*COMMON, "--model", model, "--dataset-path", str(corpus), "--max-steps", "3", *extra]

    def main(*args):
        done = run_main(*args, check=False)
        return done.returncode, done.stderr

    def train_py(*args):
        code, _, err = run_train_main([*train, *args])
        return code, err
    return {
        "inference": lambda path: main("inference", "--checkpoint", str(path), "--wav", wav, "--output",
                                       str(where / "x.wav")),
        "init_from": lambda path: train_py("--init-from", str(path), "--output-dir", str(where / "init")),
        "resume_path": lambda path: train_py("--resume", str(path), "--output-dir", str(where / "resumed")),
    }


def assert_refused(code: int, err: str, marker: Path, path: Path) -> None:
    """The payload did not run, and the load ended in one ERROR line naming the checkpoint and what it held."""
    assert not marker.exists(), f"the payload in {path} ran"
    errors = [line for line in err.splitlines() if line.startswith("ERROR")]
    assert code != 0 and len(errors) == 1, err[-3000:]
    assert str(path) in errors[0] and ("holds code" in errors[0] or "nothing was run" in errors[0]), errors[0]
    assert "Traceback" not in err, err[-3000:]


@pytest.mark.parametrize("loader", ["inference", "init_from", "resume_path"])
@pytest.mark.parametrize("route", sorted(FILE_ROUTES))
def test_a_pt_file_holding_code_is_refused_by_every_loader(single, tmp_path, route, loader):
    corpus, out = single
    path, marker = craft(route, out / "checkpoint_2.pt", tmp_path)
    code, err = loaders(corpus, TEST_MODEL, tmp_path)[loader](path)
    assert_refused(code, err, marker, path)


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
