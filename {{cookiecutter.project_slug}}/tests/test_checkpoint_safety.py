"""Nothing in a checkpoint runs. Files and folders crafted as an attacker would (so that loading them unsafely opens a
marker file) go through every loader of the project: ``inference.py``, ``train.py --init-from``, ``--resume PATH``
and ``--resume auto`` (the after-training tools' routes: ``tests/test_published.py``, ``tests/test_tools_sharded.py``;
sharded folders: ``tests/test_checkpoint_folders.py``). Each is refused in one line that says it held code, and the
marker never appears.

The routes: a ``.pt`` file (``torch.save``'s zip archive; PyTorch's legacy pickle format; a published format's
pickled module holding the payload). Everything runs in this process
(``conftest.run_main``, ``conftest.run_train_main``): what is proven is what a load runs, not the launch.

Nor does a harmless crafted file cost more than its bytes: a recorded config asking for a model far larger than the
file (``inference.py``, ``scripts.export``; each example model's own size in its test file: :data:`LARGER`), entries of
other types than ``train.py`` writes (``--resume``). Each is one line, in a process whose memory is bounded and
measured (``conftest.mains_within``); ``--resume auto`` passes over such a file as over a damaged one."""

import io
import os
import shutil
import sys
import types
from pathlib import Path
from typing import Optional

import pytest
import torch
from conftest import (TEST_MODEL, OpensAFile, bound, made_once, mains_within, run_main, run_ranks, run_train_main,
                      synth_corpus, tiny_checkpoint, train_in_process)

from models import MODELS
from parts import PARTS
from utils.checkpoint.state import in_modules

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
    classes = [name for reader in READERS.values() for name in reader.pickled_classes]
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


READERS = PARTS.formats.published.readers if PARTS.formats.published is not None else {}
"""The published formats' readers, by model (none without the after-training tools)."""
FILE_ROUTES = {"zip": zip_file, "legacy": legacy_file,
               **({"record": record_file} if any(reader.pickled_classes for reader in READERS.values()) else {})}


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


# --- crafted sizes and entries: harmless files that once ended in a traceback or took the machine's memory --------

LARGER: dict[str, dict] = {}
"""``{model: {key: value}}``: a model's own crafted size (layers hundreds of GB wide, 10^9 layers), which the model's
test file adds at import (removed with the model, so a project names none but its own) and tests
(:func:`larger_refused`); :func:`crafted_outcomes` runs each registered model's case on its tiny checkpoint."""
TOOLS = PARTS.formats.published is not None  # the after-training tools: export builds from the recorded config too


def recorded(honest: Path, target: Path, release: bool = False, **sections: dict) -> Path:
    """A copy of the checkpoint ``honest`` whose recorded config has ``sections`` (``{key: value}`` each) set;
    ``release``: as ``scripts.export --format release`` writes one (the inference modules' weights only)."""
    state = torch.load(honest, weights_only=True)
    config = {**state["config"], **{name: {**state["config"][name], **keys} for name, keys in sections.items()}}
    if release:
        modules = MODELS[state["model_name"]].inference_modules
        state = {"format": "release", "model_name": state["model_name"], "step": state["step"], "ema_weights": False,
                 "model": {key: value for key, value in state["model"].items() if in_modules(key, modules)}}
    torch.save({**state, "config": config}, target)
    return target


def spoiled_lrs(entry: dict) -> dict:
    """A scheduler entry (one state dict, or several by phase) whose ``base_lrs`` are a string."""
    if "base_lrs" in entry:
        return {**entry, "base_lrs": "0.1"}
    return {phase: spoiled_lrs(state) for phase, state in entry.items()}


def entries(honest: Path) -> dict:
    """``{case: entries that replace the checkpoint's}``: of a type ``train.py`` never writes, each."""
    state = torch.load(honest, weights_only=True)
    rng = state["rng"][0]
    return {"rng": {"rng": "seeded"}, "rng of rank 1": {"rng": [rng, {**rng, "torch": torch.zeros(3)}]},
            "scheduler": {"scheduler": [state["scheduler"]]},
            "scheduler's lrs": {"scheduler": spoiled_lrs(state["scheduler"])}, "optimizer": {"optimizer": 0.001}}


def crafted_outcomes(tmp_path_factory) -> tuple[dict, int]:
    """``({case: [crafted file, exit status, stderr]}, peak bytes)``: ``inference.py`` (and ``scripts.export``, where
    the project has the after-training tools) on recorded configs of larger models (each model's of :data:`LARGER` on
    its :func:`conftest.tiny_checkpoint`), and ``train.py --resume PATH`` on entries of other types
    (:func:`entries`), all in one process of at most 2 GiB of address space (:func:`conftest.mains_within`); made
    once per session (:func:`conftest.made_once`), for this file's tests and the models' own."""
    corpus, out = run_dir(tmp_path_factory, "safety_single", TEST_MODEL)
    honest = out / "checkpoint_2.pt"

    def make(where: Path) -> tuple[dict, int]:
        larger = {"audio.n_mels": recorded(honest, where / "mels.pt", audio={"n_mels": 10**6}),
                  "release audio.n_mels": recorded(honest, where / "release.pt", True, audio={"n_mels": 10**6}),
                  **{f"{model}.{key}": recorded(tiny_checkpoint(model, where / f"tiny_{model}.pt"),
                                                where / f"{model}_{key}.pt", **{model: {key: value}})
                     for model, keys in sorted(LARGER.items()) if model in MODELS for key, value in keys.items()}}
        runs = {case: (path, ["inference", "--checkpoint", str(path), "--device", "cpu", "--output",
                              str(where / "x.wav")]) for case, path in larger.items()}
        if TOOLS:
            runs["export audio.n_mels"] = (larger["audio.n_mels"], [
                "scripts.export", "--checkpoint", str(larger["audio.n_mels"]), "--format", "release", "--output",
                str(where / "exported.pt")])
        state = torch.load(honest, weights_only=True)
        for case, change in entries(honest).items():
            path = where / f"{case.replace(' ', '_')}.pt"
            torch.save({**state, **change}, path)
            runs[case] = (path, ["train", *COMMON, "--model", TEST_MODEL, "--dataset-path", str(corpus),
                                 "--max-steps", "3", "--output-dir", str(where / f"out_{path.stem}"), "--resume",
                                 str(path)])
        said, peak = mains_within([command for _, command in runs.values()])
        return {case: (path, *outcome) for (case, (path, _)), outcome in zip(runs.items(), said)}, peak
    return tuple(made_once(tmp_path_factory, "safety_crafted", make)[1])


@pytest.fixture(scope="module")
def crafted(tmp_path_factory):
    """:func:`crafted_outcomes`."""
    return crafted_outcomes(tmp_path_factory)


def one_line(code, err: str) -> str:
    """The one ``ERROR:`` line of a refusal: exit status 1, no traceback."""
    errors = [line for line in err.splitlines() if line.startswith("ERROR")]
    assert code == 1 and len(errors) == 1 and "Traceback" not in err, err[-3000:]
    return errors[0]


def larger_refused(crafted: tuple[dict, int], case: str) -> None:
    """The ``case`` of :func:`crafted_outcomes` (a recorded config of a larger model) ended in one line naming the
    file before the model was allocated, and the process stayed under 2 GiB."""
    outcomes, peak = crafted
    path, code, err = outcomes[case]
    line = one_line(code, err)
    assert line.startswith(f"ERROR: {path}: its recorded config builds a larger model than the checkpoint justifies: "
                           "past "), line
    assert line.endswith("which was not allocated"), line
    assert peak < 2 << 30, f"{peak / 2**30:.1f} GiB at peak"


@pytest.mark.parametrize("case", ["audio.n_mels", "release audio.n_mels", *(["export audio.n_mels"] if TOOLS else [])])
def test_a_recorded_config_of_a_larger_model_is_one_line_before_it_is_allocated(crafted, case):
    larger_refused(crafted, case)


@pytest.mark.parametrize("case", ["rng", "rng of rank 1", "scheduler", "optimizer"])
def test_an_entry_of_another_type_is_one_line_for_resume_path(crafted, case):
    outcomes, peak = crafted
    path, code, err = outcomes[case]
    entry = case.split(" of ")[0]
    assert one_line(code, err).startswith(f"ERROR: rank 0: --resume {path}: the file is malformed (its '{entry}' "
                                          f"entry {'of rank 1 ' if 'rank 1' in case else ''}is "), err
    assert peak < 2 << 30, f"{peak / 2**30:.1f} GiB at peak"


def test_an_entry_whose_values_are_of_other_kinds_than_the_runs_is_one_line(crafted):
    outcomes, peak = crafted
    path, code, err = outcomes["scheduler's lrs"]
    line = one_line(code, err)
    assert line.startswith(f"ERROR: rank 0: {path}: its 'scheduler' entry does not fit this run: at "), line
    assert "['base_lrs']: a str, this run's is a list" in line, line
    assert peak < 2 << 30, f"{peak / 2**30:.1f} GiB at peak"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="measures the peak with Linux's /proc")
def test_the_peak_measured_is_the_started_processs_own_not_the_test_processs():
    """:func:`conftest.mains_within`'s peak is its process's own: a test process that held 256 MiB (as a worker does
    after a few tests) starts one that runs nothing, whose peak is a few MiB. (``getrusage``'s, which Linux carries
    across ``exec``, said 2 GB for a crafted folder whose process took 300 MB.)"""
    held = torch.ones(64 << 20)  # 256 MiB, every page written
    del held
    said, peak = mains_within([])
    assert said == [] and peak < 64 << 20, f"{peak / 2**20:.0f} MiB at peak"


def test_resume_auto_passes_over_a_checkpoint_whose_entries_are_of_other_types(single, tmp_path):
    corpus, honest = single
    out = tmp_path / "out"
    shutil.copytree(honest, out, symlinks=True)  # checkpoint_last.pt: a link to checkpoint_2.pt
    state = torch.load(honest / "checkpoint_2.pt", weights_only=True)
    os.unlink(out / "checkpoint_2.pt")
    torch.save({**state, **entries(honest / "checkpoint_2.pt")["scheduler"]}, out / "checkpoint_2.pt")
    code, said, err = run_train_main([*COMMON, "--model", TEST_MODEL, "--dataset-path", str(corpus), "--output-dir",
                                      str(out), "--max-steps", "1", "--resume", "auto"])  # resumed: nothing to train
    assert code == 0 and "Traceback" not in err, err[-3000:]
    assert (f"{out / 'checkpoint_2.pt'} is malformed (its 'scheduler' entry is a list, not a state dict): resuming "
            f"from {out / 'checkpoint_1.pt'}, the newest intact checkpoint (renamed aside: checkpoint_2.pt -> "
            "checkpoint_2.pt.damaged)") in err, err
    assert f"resumed from {out / 'checkpoint_1.pt'} at step 1" in said, said
    assert (out / "checkpoint_2.pt.damaged").is_file()


RANKS_SAY = """import train
print("exit status", train.main({argv!r}))
"""
"""A rank's script: ``train.main`` on the arguments, its exit status printed (:func:`conftest.run_ranks` wants 0)."""


@pytest.mark.slow  # two ranks started
def test_an_rng_entry_of_another_type_stops_both_ranks_with_rank_0s_one_line(single, crafted, tmp_path):
    corpus, _ = single
    path = crafted[0]["rng of rank 1"][0]
    argv = [*COMMON, "--model", TEST_MODEL, "--dataset-path", str(corpus), "--max-steps", "3", "--output-dir",
            str(tmp_path / "out"), "--resume", str(path)]
    (tmp_path / "ranks").mkdir()
    for rank, said in enumerate(run_ranks(RANKS_SAY.format(argv=argv), tmp_path / "ranks", timeout=bound(120))):
        assert "exit status 1" in said, said[-3000:]
        assert one_line(1, said) == (f"ERROR: rank {rank}: --resume {path}: the file is malformed (its 'rng' entry of "
                                     "rank 1 is a dict of generator states that do not load (TypeError: RNG state "
                                     "must be a torch.ByteTensor))"), said[-3000:]
