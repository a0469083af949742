"""The project's text names only what the project holds, and its complete example model file works.

* Every text file of the project (code, comments, docstrings, README, ``docs/``, configs, scripts) is scanned
  for paths of a benchmark folder or a sibling folder that exist only where the template was developed,
  and for issue numbers of a tracker the project does not have.
* ``docs/own_model_example.py``, the file the manual's (``docs/manual.md``) "Your own model" offers, defines a
  model's ``SPEC`` that, listed in the registry (``models/__init__.py``), loads its config, reads a corpus, trains (its
  loss falls); the registry does not import it from ``docs/``. The manual and both example files show a model as it
  is now: a ``SPEC = ModelSpec(...)`` listed in ``models/__init__.py``.
* A term its criterion returns beside the loss, ``(loss, {"mae": ...})``, is logged (``metrics.jsonl``,
  ``val_metrics.jsonl``, TensorBoard) with no other edit.
* ``docs/two_optimizer_example.py``, the manual's model with two optimizers, is offered the same way, works
  with the project's config as it is, and trains both of its phases with the loop's own functions: each phase
  updates only its network, and its named mel L1 falls.
* Every tool of ``scripts/`` prints its help run the way the texts show (``python -m scripts.NAME --help``: its
  ``main`` imported as a module of the ``scripts`` package, in the test's process), and no text of the project runs
  one by its path. Run by its path (``python scripts/NAME.py``, a process without the project on ``PYTHONPATH``), a
  tool that imports the project's modules says in one line how to run it (exit status 1, no traceback); one that
  imports none prints its help. No module of the project edits ``sys.path``.
* ``docs/architecture.md`` and the README say where each section of ``config.json`` is declared (the file of its
  class), and ``train.py``'s usage lines are one command each.
"""

import ast
import importlib.util
import inspect
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, bound, clean_env, run_main, synth_corpus, train_in_process
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from models import MODELS

PROJECT = Path(ROOT)
EXAMPLE = PROJECT / "docs" / "own_model_example.py"
TWO_OPTIMIZER_EXAMPLE = PROJECT / "docs" / "two_optimizer_example.py"

FORBIDDEN = {
    "a benchmark folder of the template's workspace": re.compile(r"shared/+bench"),
    "a folder beside the project": re.compile(r"\.\./+shared"),
    "an issue number": re.compile(r"\bissues?[ \t]*[#-]?[ \t]*\d+", re.IGNORECASE),
    "a tracker reference": re.compile(r"(?<![\w&/#])#\d+\b(?![\w-])"),
}
"""What no text file of the project may hold: what it means -> the pattern."""

LARGEST_TEXT = 2 * 2**20
"""Bytes: a larger file is data, not text written for the project, and is not scanned."""


def ignored_folders() -> set[str]:
    """Top-level folders that ``.gitignore`` leaves out (``data/``, ``output/``, ...): a user's runs and corpora,
    not the project."""
    gitignore = PROJECT / ".gitignore"
    lines = gitignore.read_text().splitlines() if gitignore.is_file() else []
    return {line.strip().strip("/") for line in lines if line.strip().endswith("/") and "*" not in line}


def project_text_files() -> list[Path]:
    """Every UTF-8 text file of the project, hidden folders (but ``.github``), caches and ignored folders left out."""
    skipped_top = ignored_folders()
    found = []
    for folder, subfolders, files in os.walk(PROJECT):
        here = Path(folder)
        subfolders[:] = [name for name in subfolders
                         if name != "__pycache__" and (not name.startswith(".") or name == ".github")
                         and not (here == PROJECT and name in skipped_top)]
        for name in files:
            path = here / name
            if path.stat().st_size > LARGEST_TEXT or (path.suffix == ".json" and "data" in path.parts):
                continue  # data: a reference's outputs (tests/data/) hold the texts they were given
            data = path.read_bytes()
            if b"\0" in data:
                continue
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            found.append(path)
    return found


def test_the_scan_finds_what_it_looks_for():
    written_wrong = {  # each pattern on a line it must catch, and on one it must let pass
        "a benchmark folder of the template's workspace": ("see shared" + "/bench/notes.md", "shared memory"),
        "a folder beside the project": ("run .." + "/shared/x.sh", "../data"),
        "an issue number": ("as Issue" + " 5 asks", "issues with clips"),
        "a tracker reference": ("fixed in #" + "12", "#SBATCH --nodes 2"),
    }
    for meaning, (caught, passed) in written_wrong.items():
        assert FORBIDDEN[meaning].search(caught), (meaning, caught)
        assert not FORBIDDEN[meaning].search(passed), (meaning, passed)
    files = {path.relative_to(PROJECT).as_posix() for path in project_text_files()}
    assert {"README.md", "model.py", "config.json", "docs/own_model_example.py", "tests/test_docs.py"} <= files


def test_project_text_names_nothing_outside_the_project():
    found = []
    for path in project_text_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            for meaning, pattern in FORBIDDEN.items():
                if pattern.search(line):
                    found.append(f"{path.relative_to(PROJECT)}:{number}: {meaning}: {line.strip()[:100]}")
    assert not found, "\n".join(found)


def test_the_manual_offers_the_example_file_and_model_py_points_to_it():
    manual = (PROJECT / "docs" / "manual.md").read_text()
    section = manual.split("## Your own model", 1)[1].split("\n## ", 1)[0]
    assert "docs/own_model_example.py" in section and "cp docs/own_model_example.py models/" in section
    assert "docs/own_model_example.py" in (PROJECT / "model.py").read_text().split('"""')[1]
    assert EXAMPLE.is_file()


def test_the_manual_and_the_example_files_show_the_registry_as_it_is():
    """A model is a ``SPEC = ModelSpec(name=..., ...)`` listed in ``models/__init__.py`` (``model.register`` is gone):
    the manual's "Your own model" says so, and both example files end with their ``SPEC`` and say where to list it."""
    manual = (PROJECT / "docs" / "manual.md").read_text()
    section = manual.split("## Your own model", 1)[1].split("\n## ", 1)[0]
    assert "models/__init__.py" in section and "ModelSpec(" in section and "register(" not in section
    for example in (EXAMPLE, TWO_OPTIMIZER_EXAMPLE):
        text = example.read_text()
        assert "register(" not in text and "\nSPEC = ModelSpec(" in text, example
        assert "models/__init__.py" in text.split('"""')[1], example  # its docstring: where to list it


REGISTER = """
import importlib.util, sys
from pathlib import Path
from models import MODELS, registry
docs = Path(sys.argv[1]).resolve().parent
loaded = [getattr(module, "__file__", None) for module in list(sys.modules.values())]
assert not [f for f in loaded if f and Path(f).resolve().parent == docs], "models/__init__.py imported docs/"
if NAME not in MODELS:  # (a project that already lists models/NAME.py, the copy the manual makes, tests that)
    spec = importlib.util.spec_from_file_location(f"models.{NAME}", sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    sys.modules[f"models.{NAME}"] = module
    spec.loader.exec_module(module)
    assert module.SPEC.name == NAME, module.SPEC.name
    MODELS.update(registry(*MODELS.values(), module.SPEC))  # what listing it in models/__init__.py does
"""
"""Python source that puts the model file ``sys.argv[1]`` (defining ``SPEC``, the model ``NAME``) in the registry as
``models/__init__.py`` would list it, after checking that the registry itself imported nothing from ``docs/``."""

EXAMPLE_CHECK = 'NAME = "melae"' + REGISTER + """
import torch
from models import MODELS
from parts import config_schemas
from utils.config import build_config
from utils.training.recipe import apply_recipe
melae = MODELS["melae"]
cfg = apply_recipe(melae, build_config({}, config_schemas(),
                                       overrides=[f"data.dataset_path={sys.argv[2]}", "data.val_size=2"]))
train_set, val_set = melae.training.build_datasets(cfg)
batch = melae.training.collate_fn([train_set[i] for i in range(cfg.melae.batch_size)])
torch.manual_seed(0)
model = melae.build_model(cfg)
criterion = melae.training.build_criterion(cfg)
optimizer = melae.training.build_optimizer(model, cfg, torch.device("cpu"))
losses = []
for _ in range(30):
    optimizer.zero_grad()
    loss = criterion(model(batch), batch)
    loss.backward()
    optimizer.step()
    losses.append(float(loss))
frames = batch["mel"].shape[0] * batch["mel"].shape[2]
print(len(train_set), len(val_set), melae.training.count_items(batch), frames, losses[0], losses[-1])
"""


@pytest.mark.slow
def test_the_example_model_file_loads_reads_a_corpus_and_learns(tmp_path):
    corpus = synth_corpus(tmp_path / "corpus", n=8)
    env = clean_env(1)
    done = subprocess.run([sys.executable, "-c", EXAMPLE_CHECK, str(EXAMPLE), str(corpus)], cwd=PROJECT,
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    train_count, val_count, items, frames, first, last = done.stdout.split()
    assert int(train_count) + int(val_count) == 8 and int(train_count) >= 4 and int(val_count) >= 1
    assert int(items) == int(frames) > 0  # count_items: mel frames of the batch, for items/s
    assert float(last) < 0.8 * float(first), (first, last)  # 30 Adam steps on one batch: it learns


TERM = ('    return torch.mean((outputs.float() - batch["mel"].float()) ** 2)\n',
        '    error = outputs.float() - batch["mel"].float()\n'
        '    return torch.mean(error ** 2), {"mae": error.abs().mean()}\n')
"""A user's edit of the example's criterion, ``(old, new)``: the same loss, returned with a term to log (the mean
absolute error)."""


def test_a_term_the_example_criterion_returns_is_logged_with_no_other_edit(tmp_path, monkeypatch):
    """The example file with :data:`TERM` as its only change, listed in the registry: a run of 2 steps (in this
    process) logs the term in every row of ``metrics.jsonl`` and ``val_metrics.jsonl`` (under ``losses``, each the
    mean absolute error of the mean squared error beside it, so at most its root) and in TensorBoard."""
    text = EXAMPLE.read_text()
    assert text.count(TERM[0]) == 1, "the example's criterion changed: change TERM with it"
    (tmp_path / "melae.py").write_text(text.replace(*TERM))
    found = importlib.util.spec_from_file_location("melae_with_a_term", tmp_path / "melae.py")
    module = importlib.util.module_from_spec(found)
    monkeypatch.setitem(sys.modules, found.name, module)  # where pydantic resolves its section's annotations
    found.loader.exec_module(module)
    monkeypatch.setitem(MODELS, "melae", module.SPEC)  # what listing it in models/__init__.py does
    corpus, out = synth_corpus(tmp_path / "corpus", n=6), tmp_path / "out"
    train_in_process(["--config", "config.json", "--model", "melae", "--tiny", "--max-steps", "2", "--dataset-path",
                      str(corpus), "--output-dir", str(out), *(arg for setting in (
                          "train.log_interval=1", "train.val_interval=2", "data.val_size=2", "data.num_workers=0")
                          for arg in ("--set", setting))])
    rows, val = ([json.loads(line) for line in (out / name).read_text().splitlines()]
                 for name in ("metrics.jsonl", "val_metrics.jsonl"))
    assert [row["step"] for row in rows] == [1, 2] and [row["step"] for row in val] == [2]
    for row in rows + val:
        loss = row.get("loss", row.get("val_loss"))
        assert list(row["losses"]) == ["mae"] and 0 < row["losses"]["mae"] <= math.sqrt(loss), row
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    assert [event.value for event in events.Scalars("train/mae")] == pytest.approx([r["losses"]["mae"] for r in rows])
    assert [event.value for event in events.Scalars("val/mae")] == pytest.approx([val[0]["losses"]["mae"]])


TWO_OPTIMIZER_CHECK = 'NAME = "gan_vocoder"' + REGISTER + """
import json
import torch
from models import MODELS
from parts import config_schemas
from utils.config import load_config
from utils.training.optim import build_optimizers, build_scheduler, setup_precision
from utils.training.recipe import apply_recipe
from utils.training.setup import build_phases
from utils.training.step import forward_backward
gan = MODELS["gan_vocoder"]
# The project's config.json as --tiny reads it: it has no gan_vocoder section, the defaults apply.
cfg = apply_recipe(gan, load_config("config.json", config_schemas(), tiny=True,
                                    overrides=[f"data.dataset_path={sys.argv[2]}", "data.val_size=2"]))
train_set, val_set = gan.training.build_datasets(cfg)
batch = gan.training.collate_fn([train_set[i] for i in range(cfg.gan_vocoder.batch_size)])
torch.manual_seed(0)
model = gan.build_model(cfg)
cpu = torch.device("cpu")
optimizers = build_optimizers(gan, model, cfg, cpu)
schedulers = {name: build_scheduler(gan, name, opt, cfg) for name, opt in optimizers.items()}
phases = build_phases(gan, model, optimizers, schedulers, cfg.train)
fp32 = setup_precision("fp32", cpu)
networks = gan.training.phases.networks(model)
steps = []
for _ in range(20):
    step = {}
    for phase in phases:
        result = forward_backward(phase, phases, gan.training.phases.train_step, [batch], fp32, 0.0)
        step[phase.name] = {
            "loss": float(result.loss), "metrics": {name: float(value) for name, value in result.metrics.items()},
            "with_grads": sorted(name for name, net in networks.items()
                                 if any(p.grad is not None for p in net.parameters())),
            "all_grads": all(p.grad is not None for p in networks[phase.name].parameters())}
        phase.optimizer.step()
        phase.optimizer.zero_grad(set_to_none=True)
    steps.append(step)
with torch.no_grad():
    val_loss = float(gan.training.build_criterion(cfg)(model(batch), batch))
    audio = gan.inference.vocode(model, batch["mel"][0], cfg)
lr = [opt.param_groups[0]["lr"] for opt in optimizers.values()]
for phase in phases:
    phase.scheduler.step()
print(json.dumps({
    "phases": [phase.name for phase in phases], "intervals": [phase.interval for phase in phases],
    "decay": [opt.param_groups[0]["lr"] / before for opt, before in zip(optimizers.values(), lr)],
    "one_optimizer_each": sorted(id(p) for opt in optimizers.values() for group in opt.param_groups
                                 for p in group["params"]) == sorted(id(p) for p in model.parameters()),
    "steps": steps, "val_loss": val_loss, "audio": list(audio.shape), "mel": list(batch["mel"].shape),
    "hop": cfg.audio.hop_length, "n_mels": cfg.audio.n_mels, "items": gan.training.count_items(batch), "samples": batch["audio"].numel()}))
"""


def test_the_manual_offers_the_two_optimizer_example_file():
    manual = (PROJECT / "docs" / "manual.md").read_text()
    section = manual.split("## Your own model", 1)[1].split("\n## ", 1)[0]
    copy = "cp docs/two_optimizer_example.py models/gan_vocoder.py"
    assert copy in section and "phases=" in section and "train_step=" in section
    assert copy in TWO_OPTIMIZER_EXAMPLE.read_text().split('"""')[1]  # its docstring says the same


@pytest.mark.slow
def test_the_two_optimizer_example_trains_both_phases_and_its_mel_l1_falls(tmp_path):
    """The file loads beside the project's models, and with the loop's own functions (``build_optimizers``,
    ``build_scheduler``, ``build_phases``, ``forward_backward`` of ``utils.training``) on one batch of a corpus, 20
    steps of its two phases: each phase gives gradients to its own network only, the generator's loss is its two named
    terms as documented, the mel L1 falls, and the per-epoch schedule, validation criterion and vocoder hook work."""
    corpus = synth_corpus(tmp_path / "corpus", n=8)
    env = clean_env(1)
    done = subprocess.run([sys.executable, "-c", TWO_OPTIMIZER_CHECK, str(TWO_OPTIMIZER_EXAMPLE), str(corpus)],
                          cwd=PROJECT, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["phases"] == ["discriminator", "generator"] and found["intervals"] == ["epoch", "epoch"]
    assert found["decay"] == [pytest.approx(0.999)] * 2  # ExponentialLR, gan_vocoder.lr_decay
    assert found["one_optimizer_each"], "every parameter belongs to exactly one of the two optimizers"
    for step in found["steps"]:
        discriminator, generator = step["discriminator"], step["generator"]
        assert discriminator["with_grads"] == ["discriminator"] and discriminator["all_grads"]
        assert generator["with_grads"] == ["generator"] and generator["all_grads"]  # the frozen one gets none
        assert set(discriminator["metrics"]) == {"d_real", "d_fake"}
        assert set(generator["metrics"]) == {"g_adv", "mel_l1"}
        terms = generator["metrics"]
        assert generator["loss"] == pytest.approx(terms["g_adv"] + 45.0 * terms["mel_l1"], rel=1e-5)
    mel_l1 = [step["generator"]["metrics"]["mel_l1"] for step in found["steps"]]
    assert mel_l1[-1] < 0.8 * mel_l1[0], mel_l1  # 20 steps of both phases on one batch: it learns
    assert 0 < found["val_loss"] < mel_l1[0]
    batch_size, n_mels, frames = found["mel"]
    assert n_mels == found["n_mels"] and found["audio"] == [frames * found["hop"]]
    assert found["items"] == found["samples"] == batch_size * frames * found["hop"]


TOOLS = sorted(path.name for path in (PROJECT / "scripts").glob("*.py") if 'if __name__ == "__main__":' in path.read_text())


def test_the_tools_are_found():
    assert "make_demo_corpus.py" in TOOLS, TOOLS


PROJECT_MODULES = ({path.stem for path in PROJECT.glob("*.py")}
                   | {path.parent.name for path in PROJECT.glob("*/__init__.py")})
"""The names the project's own modules import by (``train``, ``models``, ``utils``, ``scripts``, ...)."""


def imports_the_project(tool: str) -> bool:
    """Whether ``scripts/tool`` imports a module of the project at its top: then it runs only as ``python -m``."""
    body = ast.parse((PROJECT / "scripts" / tool).read_text()).body
    roots = {alias.name for node in body if isinstance(node, ast.Import) for alias in node.names}
    roots |= {node.module for node in body if isinstance(node, ast.ImportFrom) and node.module}
    return any(root.split(".")[0] in PROJECT_MODULES for root in roots)


def python_files_outside_tests() -> list[Path]:
    """The project's own Python files, its tests left out."""
    return [path for path in project_text_files()
            if path.suffix == ".py" and path.relative_to(PROJECT).parts[0] != "tests"]


@pytest.mark.parametrize("tool", TOOLS)
def test_every_tool_runs_as_the_texts_show_and_by_its_path_says_how(tool):
    env = clean_env(1)  # without the project on PYTHONPATH; the rest of it (a slow start asked for) stays
    env["PYTHONPATH"] = os.pathsep.join(folder for folder in env["PYTHONPATH"].split(os.pathsep) if folder != ROOT)
    name = tool.removesuffix(".py")
    shown = run_main(f"scripts.{name}", "--help")  # as python -m runs it (a package module), in this process
    assert shown.stdout.startswith("usage:") and not shown.stderr, shown.stderr[-2000:]
    by_path = subprocess.run([sys.executable, os.path.join("scripts", tool), "--help"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=bound(60, 1))
    if imports_the_project(tool):
        pointer = f"ERROR: run this tool from the project folder as: python -m scripts.{name} ...\n"
        assert (by_path.returncode, by_path.stdout, by_path.stderr) == (1, "", pointer), by_path.stderr[-2000:]
    else:
        assert by_path.returncode == 0 and by_path.stdout.startswith("usage:") and not by_path.stderr, by_path.stderr


def test_the_tools_that_need_the_project_are_found():
    needing = {tool for tool in TOOLS if imports_the_project(tool)}
    assert "make_demo_corpus.py" in needing and "plot_run.py" not in needing, needing


def test_no_module_of_the_project_edits_sys_path():
    """The project's modules import because its folder is the first on ``sys.path`` (``python train.py``,
    ``python -m scripts.NAME``), never because a module put it there."""
    edit = re.compile(r"\bsys\.path\s*(\.\s*(insert|append|extend)\b|\[.*\]\s*=(?!=)|\+?=(?!=))|\baddsitedir\b")
    assert edit.search("    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))")
    assert not edit.search("pytest puts the project root on ``sys.path``")
    found = [f"{path.relative_to(PROJECT)}:{number}: {line.strip()}" for path in python_files_outside_tests()
             for number, line in enumerate(path.read_text().splitlines(), start=1) if edit.search(line)]
    assert {"train.py", "scripts/make_demo_corpus.py"} <= {path.relative_to(PROJECT).as_posix()
                                                 for path in python_files_outside_tests()}
    assert not found, "\n".join(found)


def test_no_text_of_the_project_runs_a_tool_by_its_path():
    by_path = re.compile(r"\bpython3?\s+(\./)?scripts/\w+\.py")
    found = [f"{path.relative_to(PROJECT)}:{number}: {line.strip()}" for path in project_text_files()
             if path.relative_to(PROJECT).parts[0] != "tests"
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
             if by_path.search(line)]
    assert not found, "\n".join(found)


def test_the_texts_say_where_each_config_section_is_declared():
    """"A setting" in ``docs/architecture.md`` names the class and file of each shared section, and the README's
    ``utils/`` row their files (or its ``parts.py`` row, for a section the composition root composes); a model's
    section is in ``models/``: none is in ``utils/config.py``."""
    from models import MODELS
    from parts import config_schemas

    setting = (PROJECT / "docs" / "architecture.md").read_text().split("* **A setting**", 1)[1].split("\n* ", 1)[0]
    setting = " ".join(setting.split())
    rows = (PROJECT / "README.md").read_text().splitlines()
    utils_row = next(line for line in rows if line.startswith("| `utils/`"))
    parts_row = next(line for line in rows if line.startswith("| `parts.py`"))
    settings = re.search(r"`config\.py` \(([^()]*)\)", utils_row).group(1)  # what the row says of the settings
    for name, schema in config_schemas().items():
        file = Path(inspect.getsourcefile(schema)).resolve().relative_to(PROJECT.resolve())
        if name in MODELS:
            assert file.parts[0] == "models", (name, file)
            continue
        assert f"`{name}` is `{schema.__name__}` in `{file.as_posix()}`" in setting, (name, file, setting)
        if file.as_posix() == "parts.py":
            assert f"`{name}`" in parts_row, (name, parts_row)
            continue
        in_utils = file.relative_to("utils")
        assert f"`{name}`" in settings and (f"`{in_utils.as_posix()}`" in settings
                                            or f"`{in_utils.parent.as_posix()}/`" in settings), (name, settings)
    assert "config.py" not in setting and "`config_cls` of its `SPEC`" in setting


def test_the_usage_lines_of_train_py_are_one_command_each():
    docstring = ast.get_docstring(ast.parse((PROJECT / "train.py").read_text()), clean=False)
    usage = [line for line in docstring.splitlines() if line.startswith("    ")]
    command = re.compile(r"    python (multiproc\.py (--nproc-per-node \d+ )?)?train\.py( --[\w-]+( \S+)?)* +# [^#]+")
    assert len(usage) >= 3 and all(command.fullmatch(line) for line in usage), "\n".join(usage)
