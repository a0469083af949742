"""The parts a user may leave out at generation: the post-generation hook's ``ANSWERS`` and the project's composition
root's ``TABLE`` (``parts.py``, which the hook reads) name them (sharding, cloud platforms, after-training tools,
benchmarks, experiment trackers, ...); every test here reads them from there, and their words from :data:`WORDS`.

* Every combination of answers, with every two-model answer, generates a project that passes ruff and keeps its
  import contracts (both static: nothing of the project is imported, torch neither); with a model alone, the answers
  that give every two parts each pair of answers (:func:`answers_linted`). Cheap enough for 2 ** len(PARTS)
  combinations: cookiecutter's Python API in two interpreters side by side, one ruff over all, one interpreter
  running lint-imports in each project.
* A part answered no is gone whole: every path the post-generation hook lists for it (each one present when it is
  answered yes), its config keys, and every word of it in the README, the manual, ``config.json`` and each tool's
  ``--help``; a key of it given on the command line is refused naming its part, and a config copied from a project
  with every part is refused in one run, one line naming every such key and its part.
* A project of any example model with every part left out names none of them anywhere outside ``tests/``
  (:data:`CAPABILITIES`), and WaveGlow's has at most :data:`SMALLEST_LINES` lines of code.
* The smallest projects (WaveGlow alone, Tacotron2 with HiFi-GAN and Matcha-TTS with HiFi-GAN, every part left out:
  :data:`SELECTED`, Matcha-TTS the generic tests' model in its own, :data:`TRAINED`) pass their own fast tier,
  which runs every tool's ``--help`` (``tests/test_docs.py``); less the test files of code no part and no model changes
  (``test_own_model.SAME_IN_EVERY_VARIANT``: the same files testing the same code, run by the whole project's suite);
  Tacotron2 with HiFi-GAN's less the launch's too (``test_own_model.SAME_FOR_EVERY_MODEL``: WaveGlow's runs them on
  the same code, every part left out).
  Tacotron2 with HiFi-GAN's has the two-optimizer example model copied in (``test_own_model.TWO_OPTIMIZERS``, as
  ``two-optimizers-beside-tacotron2-hifigan`` there), its generic tests training it: that variant's fast tests
  outside the parts' files run here, once (:data:`COPIED`).
"""

import ast
import concurrent.futures
import itertools
import json
import random
import re
from pathlib import Path

import pytest

from conftest import PY, ROOT, run, stream
from test_ecosystem import MODELS, call, output, tool
from test_own_model import ANYWHERE_ELSE, MODEL_BOUND, TWO_OPTIMIZERS, add_own_model


def hook_names(name: str):
    """A name of the post-generation hook (``ANSWERS``: ``{part: its Jinja answer}``; ``read_table``): its module run
    unrendered, as a module (its ``main`` is not called; the answers it holds are Jinja strings, unused here)."""
    namespace = {"__name__": "post_gen_project"}
    exec(compile((ROOT / "hooks" / "post_gen_project.py").read_text(), "post_gen_project.py", "exec"), namespace)
    return namespace[name]


PARTS = tuple(hook_names("ANSWERS"))
"""The yes/no questions of the parts, in the hook's order."""
ALL_OFF = dict.fromkeys(PARTS, "no")
WORDS = {  # what a project without the part must not mention (case-insensitive, whole words)
    "sharding": ["fsdp", "fully_shard", "sharded", "activation checkpointing", "activation_checkpointing",
                 "async_checkpoint", "reshard_after_forward", "scripts.memory", "consolidate_checkpoint"],
    "cloud_platforms": ["kubeflow", "kubernetes", "pytorchjob", "trainjob", "skypilot", "sagemaker", "azure ml",
                        "azureml", "vertex ai", "grace_period", "requirements-launch"],
    "after_training_tools": ["onnx", "onnxruntime", "scripts.export", "import_weights", "dump_gta_mels",
                             "scripts.plot_run"],
    "benchmarks": ["scripts.benchmark", "benchmark_step", "benchmark_data", "benchmark_data_rows", "scripts.scaling"],
    "experiment_trackers": ["wandb", "mlflow", "requirements-trackers", "tracker_project"],
    "corpora": ["make_shards", "shar", "vctk_mic", "libritts", "nemo", "parquet", "hifi-tts"],
}
"""Words of each part: a project without it names none of them in its README, manual, config or ``--help`` texts."""


def hook_parts() -> dict:
    """The parts' ``TABLE`` (``{part: {"files": [...], "keys": [...]}}``) of the template's composition root, as the
    post-generation hook reads it."""
    return hook_names("read_table")(ROOT / "{{cookiecutter.project_slug}}" / "parts.py")


def combinations():
    """Every answer of every part: 2 ** len(PARTS) dicts."""
    return [dict(zip(PARTS, answers)) for answers in itertools.product(("yes", "no"), repeat=len(PARTS))]


TWO_MODELS = ("both", "tacotron2_hifigan", "matcha_hifigan")
"""The example-model answers of two models: each model of one is in one of them."""


def pairs() -> list[dict]:
    """Answers in which every two parts take each of their four pairs of answers: every part yes, every part no, and
    each part alone answered the other way from either (2 + 2 * len(PARTS) dicts, where :func:`combinations` gives
    2 ** len(PARTS))."""
    every = [dict.fromkeys(PARTS, "yes"), dict.fromkeys(PARTS, "no")]
    return every + [{**base, part: "no" if base[part] == "yes" else "yes"} for base in every for part in PARTS]


def test_each_model_alone_is_in_a_project_of_two_models_linted_with_every_combination():
    """:data:`TWO_MODELS` are the hook's answers of two models (its ``CHOSEN``), and they hold every model alone."""
    tree = ast.parse((ROOT / "hooks" / "post_gen_project.py").read_text())
    chosen = next(node.value for node in tree.body if isinstance(node, ast.Assign) and node.targets[0].id == "CHOSEN")
    two = ast.literal_eval(chosen.func.value)  # CHOSEN = {answer: its models}.get(CHOICE, {CHOICE})
    assert sorted(two) == sorted(TWO_MODELS)
    assert {model for model in MODELS if model not in two} <= set().union(*two.values())


def answers_linted(model: str) -> list[dict]:
    """The part answers :func:`test_every_combination_of_parts_passes_ruff_and_the_import_contracts` lints with
    ``model``: every combination for a project of two models; for a project of one, :func:`pairs`. A project of one
    model holds the ``.py`` files of a project of two (copied verbatim, pruned alike) but the hook's edits of
    ``parts.py`` and ``models/__init__.py``: every part with each answer beside each other part's, with this model's
    edits, and every combination of the parts among the same files in the two-model project."""
    return combinations() if model in TWO_MODELS else pairs()


def test_the_hook_and_the_questions_name_the_same_parts():
    questions = json.loads((ROOT / "cookiecutter.json").read_text())
    yes_no = [name for name, choices in questions.items() if choices == ["yes", "no"]]
    assert yes_no == list(PARTS), "cookiecutter.json's yes/no questions are the parts of the hook's ANSWERS"
    table = hook_parts()
    assert list(table) == list(PARTS), "parts.TABLE names the parts of the hook's ANSWERS, in their order"
    for part, entry in table.items():
        assert entry["files"], f"parts.TABLE lists no file of part {part}"
    assert list(WORDS) == list(PARTS), "WORDS lists the words of each part (a project without it names none)"


GENERATE = r"""
import json, sys
import jinja2
from cookiecutter.main import cookiecutter

# Each project renders the same templates anew, in an environment of the same settings: each compiled once.
compiled, compile_anew = {}, jinja2.Environment.compile

def compile_once(self, source, name=None, filename=None, raw=False, defer_init=False):
    if not isinstance(source, str):
        return compile_anew(self, source, name, filename, raw, defer_init)
    key = (type(self), source, name, filename, raw, defer_init)
    if key not in compiled:
        compiled[key] = compile_anew(self, source, name, filename, raw, defer_init)
    return compiled[key]

jinja2.Environment.compile = compile_once

template, output_dir, config_file, jobs = json.loads(sys.argv[1])
for answers in jobs:
    cookiecutter(template, no_input=True, output_dir=output_dir, config_file=config_file, extra_context=answers)
"""
"""Generate projects with cookiecutter's Python API, one interpreter for many (``[template, output folder, user
config, [answers, ...]]``)."""


def generate(answers: list[dict], folder: Path, processes: int = 2) -> list[Path]:
    """Generate a project of each of ``answers`` (each naming its ``project_slug``) in ``folder``, by ``processes``
    interpreters side by side; their paths. Fails showing the error when one fails."""
    config = folder / "cookiecutter.yaml"  # not the user's: no replay or cache written outside folder
    config.write_text(f"cookiecutters_dir: {folder / 'templates'}\nreplay_dir: {folder / 'replay'}\n")
    shares = [answers[n::processes] for n in range(processes)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=processes) as pool:  # each a process of its own
        done = list(pool.map(lambda share: call([PY, "-c", GENERATE, json.dumps(
            [str(ROOT), str(folder), str(config), share])], cwd=folder), shares))
    for proc in done:
        if proc.returncode != 0:
            pytest.fail(f"generation failed\n{output(proc)}")
    return [folder / answer["project_slug"] for answer in answers]


LINT = r"""
import contextlib, io, json, os, sys
from importlinter.cli import lint_imports

said = []
for project in json.loads(sys.argv[1]):
    os.chdir(project)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = lint_imports(no_cache=True)
    sys.path.remove(project)  # lint_imports put the project first on the path: the next one finds its own packages
    said.append([code, out.getvalue()])
print(json.dumps(said))
"""
"""``lint-imports --no-cache`` in each of the projects given (a JSON list of folders), one after the other in one
interpreter (importlinter imported once); prints ``[[exit status, output], ...]`` as JSON."""


@pytest.mark.parametrize("model", MODELS)
def test_every_combination_of_parts_passes_ruff_and_the_import_contracts(tmp_path, model):
    linted = answers_linted(model)
    projects = generate([{"example_model": model, "project_slug": f"p{n}", **answers}
                         for n, answers in enumerate(linted)], tmp_path)
    ruff = call([*tool("ruff", "ruff"), "check", "--no-cache", "--output-format", "concise", *projects],
                cwd=tmp_path)
    if ruff.returncode != 0:
        pytest.fail(f"ruff check fails in a combination of parts with {model}\n{output(ruff)}")
    tool("importlinter", "lint-imports")  # installed (else skipped, or failed in CI)
    lint = call([PY, "-c", LINT, json.dumps([str(project) for project in projects])], cwd=tmp_path)
    if lint.returncode != 0:
        pytest.fail(f"lint-imports did not run\n{output(lint)}")
    for (code, said), answers in zip(json.loads(lint.stdout.splitlines()[-1]), linted):
        if code != 0 or " BROKEN" in said:
            pytest.fail(f"the import contracts fail with {model} and {answers}\n{said[-6000:]}")


def text_of(project: Path) -> str:
    """The README, the manual and config.json of ``project``, lower-cased."""
    return "\n".join((project / rel).read_text().lower() for rel in ("README.md", "docs/manual.md", "config.json"))


def mentions(text: str, words) -> list[str]:
    return [word for word in words if re.search(rf"(?<![\w.]){re.escape(word)}(?![\w])", text)]


@pytest.mark.parametrize("part", PARTS)
def test_a_part_left_out_is_gone_whole(bake, part):
    table = hook_parts()[part]
    whole = bake(example_model="both", project_slug="whole")
    without = bake(example_model="both", project_slug="without", **{part: "no"})
    for rel in table["files"]:
        if "hifigan" in rel or "matcha" in rel:  # a file of a model both does not hold
            continue
        assert (whole / rel).exists(), f"{rel} of part {part} is not in a project that has it"
        assert not (whole / rel).is_symlink()
        assert not (without / rel).exists(), f"{rel} of part {part} is left in a project without it"
    full, pruned = json.loads((whole / "config.json").read_text()), json.loads((without / "config.json").read_text())
    for key in table["keys"]:
        section, name = key.split(".")
        assert name in full[section], f"{key} of part {part} is not in config.json"
        assert name not in pruned[section] and name not in pruned["tiny"].get(section, {}), key
    words = WORDS.get(part)
    assert words, f"WORDS lists no word of part {part}"
    assert mentions(text_of(whole), words), f"none of {words} is in the whole project: the list is stale"
    assert not mentions(text_of(without), words), f"a project without {part} still names it"


@pytest.fixture(scope="module")
def all_off(bake_once):
    """``all_off(model)``: a project of ``model`` with every part left out, made once."""
    made = {}

    def make(model):
        if model not in made:
            made[model] = bake_once(example_model=model, project_slug=f"small_{model}", **ALL_OFF)
        return made[model]
    return make


def tools_of(project: Path) -> list[str]:
    """Every module of ``project`` with a command line: the entry scripts and each ``scripts.NAME``."""
    scripts = sorted(f"scripts.{path.stem}" for path in (project / "scripts").glob("*.py")
                     if 'if __name__ == "__main__":' in path.read_text())
    return ["train", "inference", "multiproc", *scripts]


ASK = r"""
import contextlib, importlib, io, json, sys

def said(module, argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = importlib.import_module(module).main(argv)
        except SystemExit as stop:
            code = stop.code
    return [code, out.getvalue()]

modules, keys, copied = json.loads(sys.argv[1])
answers = {name: said(name, ["--help"]) for name in modules}
for key in keys:
    answers[key] = said("train", ["--config", "config.json", "--set", f"{key}=1", "--output-dir", "out"])
answers["copied"] = said("train", ["--config", copied, "--output-dir", "out"])
print(json.dumps(answers))
"""
"""Run in the project's folder by one interpreter (torch imported once): each module's ``main(["--help"])``,
``train.main`` with ``--set KEY=1`` for each key, and with the config file ``copied``; prints ``{name: [exit status,
output]}`` as JSON."""


def copy_of_the_whole_config(project: Path) -> Path:
    """``config.json`` of a project of the same models with every part, copied into ``project`` (``whole.json``): the
    template's (every model's sections, every part's keys), less the sections of models ``project`` does not have."""
    whole = json.loads((ROOT / "{{cookiecutter.project_slug}}" / "config.json").read_text())
    own = json.loads((project / "config.json").read_text())
    whole = {name: values for name, values in whole.items() if name in own}
    whole["tiny"] = {name: values for name, values in whole["tiny"].items() if name in own["tiny"]}
    (project / "whole.json").write_text(json.dumps(whole, indent=2))
    return project / "whole.json"


@pytest.fixture(scope="module")
def asked(all_off):
    """``asked(model)``: :data:`ASK`'s answers in the smallest project of ``model``, asked once."""
    made = {}

    def ask(model):
        if model not in made:
            project = all_off(model)
            keys = [key for part in hook_parts().values() for key in part["keys"]]
            argv = json.dumps([tools_of(project), keys, str(copy_of_the_whole_config(project))])
            made[model] = project, json.loads(run([PY, "-c", ASK, argv], cwd=project).stdout)
        return made[model]
    return ask


@pytest.mark.parametrize("model", ["waveglow", "tacotron2_hifigan"])
def test_the_smallest_project_says_nothing_of_what_it_lacks_and_refuses_its_keys(asked, model):
    project, answers = asked(model)
    words = [word for part in PARTS for word in WORDS.get(part, [])]
    assert not mentions(text_of(project), words)
    keys = [key for part in hook_parts().values() for key in part["keys"]]
    for module in tools_of(project):
        code, text = answers[module]
        assert code == 0, f"{module} --help exited {code}: {text[-2000:]}"
        assert not mentions(text.lower(), words), f"{module} --help names {mentions(text.lower(), words)}"
    for key in keys:
        code, text = answers[key]
        errors = [line for line in text.splitlines() if line.startswith("ERROR:")]
        assert code != 0 and len(errors) == 1 and key in errors[0] and "Traceback" not in text, (key, text[-2000:])
        assert f"{key} ({part_of(key)})" in errors[0], errors[0]  # named with its part
    proc = run([PY, "train.py", "--config", "config.json", "--set", f"{keys[0]}=1", "--output-dir", "out"],
               cwd=project, check=False)  # the same, as a user runs it
    assert proc.returncode != 0 and proc.stderr.startswith("ERROR:") and keys[0] in proc.stderr, proc.stderr
    assert not (project / "out").exists(), "a refused setting wrote an output folder"


CAPABILITIES = ["fsdp", "sharded checkpoint", "onnx", "kubeflow", "skypilot", "sagemaker", "vertex ai", "azure ml",
                "wandb", "weights & biases", "mlflow"]
"""What a project without any part names nowhere outside ``tests/`` (case-insensitive, as part of any word: a module's
path, a comment, a docstring, a message); data shards of the sampler are no part and keep their word."""


def files_outside_tests(project: Path) -> dict[str, str]:
    """Every text file of ``project`` outside ``tests/``, by its path in the project."""
    return {str(path.relative_to(project)): path.read_text() for path in sorted(project.rglob("*"))
            if path.is_file() and path.relative_to(project).parts[0] != "tests"}


@pytest.mark.parametrize("model", MODELS)
def test_the_smallest_project_names_no_capability_it_lacks_anywhere(all_off, model):
    """Code, comments, docstrings, docs, configs and launch files of a project with every part left out."""
    found = [f"{rel}:{number}: {line.strip()}" for rel, text in files_outside_tests(all_off(model)).items()
             for number, line in enumerate(text.splitlines(), start=1)
             if any(word in line.lower() for word in CAPABILITIES)]
    assert not found, "\n".join(found[:20])


def part_of(key: str) -> str:
    """The part whose config key ``key`` is."""
    return next(part for part, entry in hook_parts().items() if key in entry["keys"])


@pytest.mark.parametrize("model", ["waveglow", "tacotron2_hifigan"])
def test_a_config_of_a_project_with_every_part_is_refused_in_one_line_naming_each_key_and_its_part(asked, model):
    """A config copied from a project of the same models with every part: one run, one line naming every key of the
    parts the project left out, each with its part, and the ``cruft update`` that brings them back (one key per run,
    as an unknown key, would take a run per key to clean)."""
    project, answers = asked(model)
    code, text = answers["copied"]
    errors = [line for line in text.splitlines() if line.startswith("ERROR:")]
    assert code == 1 and len(errors) == 1 and "Traceback" not in text, text[-2000:]
    with_keys = {part: entry["keys"] for part, entry in hook_parts().items() if entry["keys"]}
    for part, keys in with_keys.items():
        assert f"{', '.join(keys)} ({part})" in errors[0], (part, errors[0])
    answer = json.dumps(dict.fromkeys(with_keys, "yes"))
    assert errors[0].endswith(f"cruft update --variables-to-update '{answer}'"), errors[0]
    assert not (project / "out").exists(), "a refused config wrote an output folder"


COPIED = {"tacotron2_hifigan": TWO_OPTIMIZERS}
"""The example model copied into a smallest project before its fast tier runs (``TEST_MODEL``: its generic tests train
it): the fast tests of ``test_own_model``'s variant of it but the parts' files, which that variant runs itself."""
TRAINED = {"matcha_hifigan": "matcha"}
"""The example model a smallest project's generic tests train (``TEST_MODEL``) where it is not the one they pick
(a model that takes no vocoder: HiFi-GAN): Matcha-TTS, whose project no other suite runs."""
SELECTED = {"waveglow": ANYWHERE_ELSE, "tacotron2_hifigan": MODEL_BOUND,
            "matcha_hifigan": f"{MODEL_BOUND} and not test_hifigan.py and not test_checkpoint_safety.py"}
"""``-k`` of each smallest project's fast tier: the launch's tests in WaveGlow's alone (the same in each), and
HiFi-GAN's own tests in the Tacotron2 project's alone (the same all-off HiFi-GAN in both); the loaders' refusals of
crafted checkpoints (``test_checkpoint_safety.py``: the same loaders, which refuse a file before any model reads it)
in WaveGlow's and Tacotron2's."""


@pytest.mark.parametrize("model", ["waveglow", "tacotron2_hifigan", "matcha_hifigan"])
@pytest.mark.timeout(0)  # minutes: a nested suite is bounded by its silence (conftest.SILENCE_S)
@pytest.mark.nested
def test_the_smallest_project_passes_its_fast_tier(bake_once, model, request):
    project, env = bake_once(example_model=model, project_slug=f"tier_{model}", **ALL_OFF), {}
    if model in COPIED:
        add_own_model(project, COPIED[model])
        env["TEST_MODEL"] = COPIED[model].name
    elif model in TRAINED:
        env["TEST_MODEL"] = TRAINED[model]
    seed = random.randrange(2**32)
    code, said = stream([PY, "-m", "pytest", "-v", "-n", "2", "--dist", "worksteal", "-p", "no:cacheprovider",
                         f"--randomly-seed={seed}",
                         "-m", "not slow", "-k", SELECTED[model], "tests"], project,
                        f"small-{model}", request.config,
                        env=env)
    last = said.splitlines()[-1] if said else ""
    assert code == 0 and " passed" in last and " failed" not in last, f"--randomly-seed={seed}\n{said[-3000:]}"


def code_lines(project: Path) -> int:
    """Lines of the project's code: its ``.py`` files outside ``tests/`` and ``docs/``."""
    return sum(len(path.read_text().splitlines()) for path in project.rglob("*.py")
               if path.relative_to(project).parts[0] not in ("tests", "docs"))


SMALLEST_LINES = 7884
"""The most lines of code (:func:`code_lines`) the WaveGlow project with every part left out may have: lowered as it
shrinks, never raised without saying why. Raised from 6650 for frame budgets (``data.batching=frames``:
``FrameBudgetSampler``, the ``data`` section's batching keys, their lines at a run's start and resume), which the
core's data loading holds in every project, and for the corpus layouts a project reads and its demo corpus writes
(the readers in ``utils/data/corpora/``, the layouts' writers in ``scripts/make_demo_corpus.py``); from 8170 for the
NeMo reader's columnar path (a manifest of a million lines read with Arrow in seconds, not a minute) and filelists
found in ``filelists/``; from 8311 for the line of ``parts.LEFT_OUT`` that names a sixth part left out
(``corpora``); from 8312 for the seam a corpus the core does not read (shards) trains through: a model's
datasets of given corpora (``Training.datasets_of``) with items made of given audio (``item``), the run's
``RunParts.corpus`` and the batch stream's ``OwnOrder``, and the one line of a format no reader has; from 8384 for
the batching a model's recipe gives (``data.batching`` and ``data.max_frames`` left null, ``model.BatchFrames``: a
budget of the model's ``batch_size`` clips), what makes frame budgets Matcha-TTS's default; from 8401 for a model's
validation audio through a vocoder checkpoint (``Training.val_vocoder``, ``model.Vocoder``: Matcha-TTS's through
HiFi-GAN), which the core's run holds in every project: the key refused where the registry has no vocoder
(``check_val_vocoder``), rank 0's load at the run's start and its audio settings' check (``validation_vocoder``,
``utils.data.audio.vocoder_mismatch``, which ``inference.py --vocoder`` shares), the vocoder handed to the model's
validation hook; from 8472 for validation's fork of the random streams (``Validator.validate``), which training
continues as they were: a run resumed past a validation at its last step repeats the run that went on; from 8474
for what Tacotron2 and Matcha-TTS each held a copy of, one copy in the core: inference's choice of a voice
(``utils.data.speakers.chosen_index``), the items' speaker indices (``speaker_indices``) and ``--vocoder``'s check
of its audio settings against the checkpoint's (``inference.vocoder_for``). Lowered from 8517 to 7884: the readers
of VCTK, LibriTTS, NeMo manifests, parquet and lhotse manifests (and the manifests' split helpers) are the corpora
part's, the core keeps LJSpeech's and filelists' and the registry the part adds its layouts to
(``DataConfig.layouts``), and the demo corpus writes a layout through its reader's module (``DEMO``), the
part's layouts' writers with their readers."""


def test_leaving_every_part_out_makes_a_smaller_project(all_off, bake):
    small, whole = code_lines(all_off("waveglow")), code_lines(bake(example_model="waveglow"))
    print(f"WaveGlow code lines: {whole} with every part, {small} with none")
    assert small < whole * 0.8, (small, whole)
    assert small <= SMALLEST_LINES, f"the smallest WaveGlow project has {small} lines of code, over {SMALLEST_LINES}"
