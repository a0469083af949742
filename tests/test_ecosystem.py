"""The generated project's tooling: ruff is clean in every variant, the pre-commit config and the GitHub
workflow are valid, and cruft can create, check and diff a project from this template.

Everything runs offline: cruft works on a local git copy of this checkout, pre-commit only validates its
config. A tool that is not installed skips its test locally, and fails it in CI (``CI`` set).
"""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from cookiecutter.generate import is_copy_only_path

from conftest import PY, ROOT

MODELS = ["waveglow", "tacotron2", "both", "hifigan", "tacotron2_hifigan", "matcha", "matcha_hifigan"]
TEMPLATE = ROOT / "{{cookiecutter.project_slug}}"
WORKFLOW = Path(".github/workflows/tests.yml")
IN_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
# Jinja syntax; `${{ ... }}` is a GitHub Actions expression, not Jinja.
JINJA = re.compile(r"(?<!\$)\{\{|\{%|\{#")
HYGIENE_HOOKS = {"trailing-whitespace", "end-of-file-fixer", "check-yaml", "check-json", "check-added-large-files"}
MAX_KB = 1024  # check-added-large-files --maxkb in the generated .pre-commit-config.yaml
# Never part of a template snapshot, whatever git says (used when the checkout is not a git repository).
NOT_TEMPLATE = {".git", "__pycache__", ".pytest_cache", ".ruff_cache", ".benchmarks", ".reference", ".whl"}


def tool(module: str, executable: str) -> list[str]:
    """How to run a tool: ``python -m module`` in this interpreter, else ``executable`` from PATH.

    Absent: the test is skipped on a developer's machine and fails in CI, where requirements-dev.txt
    installs it.
    """
    if importlib.util.find_spec(module) is not None:
        return [PY, "-m", module]
    found = shutil.which(executable)
    if found:
        return [found]
    message = f"{executable} is not installed (pip install -r requirements-dev.txt)"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def call(cmd, cwd, env=None, timeout=300) -> subprocess.CompletedProcess:
    """Run ``cmd`` with no stdin (a prompt fails instead of waiting) and return the finished process."""
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env={**os.environ, **(env or {})}, text=True,
                          capture_output=True, stdin=subprocess.DEVNULL, timeout=timeout)


def output(proc: subprocess.CompletedProcess) -> str:
    """The command, its exit status and the end of its output, for a failure message."""
    return (f"$ {' '.join(proc.args)}\nexit {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}"
            f"\n--- stderr\n{proc.stderr[-6000:]}")


def succeeded(proc: subprocess.CompletedProcess) -> None:
    if proc.returncode != 0:
        pytest.fail(output(proc))


# ----------------------------------------------------------------------------------------------- ruff


@pytest.mark.parametrize("model", MODELS)
def test_ruff_check_is_clean_in_every_variant(bake, model):
    ruff = tool("ruff", "ruff")
    project = bake(example_model=model)
    settings = call([*ruff, "check", "--show-settings", "train.py"], cwd=project)
    if f'Settings path: "{project / "ruff.toml"}"' not in settings.stdout:
        pytest.fail(f"a plain `ruff check` in the project does not read its ruff.toml\n{output(settings)}")

    proc = call([*ruff, "check", "--no-cache", "--output-format", "concise", "."], cwd=project)
    if proc.returncode != 0:
        pytest.fail(f"ruff check fails in the {model} variant\n{output(proc)}")


def lint_command() -> list[str]:
    """``lint-imports --no-cache`` run by this interpreter (or from PATH)."""
    lint = tool("importlinter", "lint-imports")
    if lint[-1] == "importlinter":  # the package has no __main__: its command's function
        return [PY, "-c", "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True))"]
    return [*lint, "--no-cache"]


@pytest.mark.parametrize("model", MODELS)
def test_import_contracts_hold_in_every_variant(bake, model):
    """``lint-imports`` keeps every contract of the project's ``.importlinter`` (static: nothing is imported)."""
    proc = call(lint_command(), cwd=bake(example_model=model))
    if proc.returncode != 0 or " BROKEN" in proc.stdout:
        pytest.fail(f"the import contracts fail in the {model} variant\n{output(proc)}")


def test_ruff_config_selects_the_error_rules_and_the_house_rules():
    config = tomllib.loads((TEMPLATE / "ruff.toml").read_text())
    assert config["line-length"] == 120
    assert {"E4", "E7", "E9", "F", "C901", "PLR0912", "PLR0915"} <= set(config["lint"]["select"])
    assert config["lint"]["mccabe"]["max-complexity"] == 10
    assert "ignore" not in config["lint"], "no rule is switched off"
    # but the ban of lookups by name (TID251) in the tests, which load tools and reference code by name
    assert config["lint"].get("per-file-ignores", {}) == {"tests/**": ["TID251"]}, "no other rule is switched off"


# ------------------------------------------------------------------------------------------ pre-commit


def test_pre_commit_config_is_valid(bake, tmp_path):
    pre_commit = tool("pre_commit", "pre-commit")
    project = bake()
    path = project / ".pre-commit-config.yaml"
    config = yaml.safe_load(path.read_text())
    hooks = {hook["id"]: repo for repo in config["repos"] for hook in repo["hooks"]}

    assert {"ruff-check", "ruff"} & set(hooks), "no ruff lint hook"
    assert "ruff-format" not in hooks, "the code is not ruff-formatted: a format hook would rewrite every file"
    assert HYGIENE_HOOKS <= set(hooks), f"missing hygiene hooks: {HYGIENE_HOOKS - set(hooks)}"
    for repo in config["repos"]:
        if repo["repo"] not in ("local", "meta"):
            assert repo.get("rev"), f"{repo['repo']} has no rev"

    env = {"PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home")}  # validation neither clones nor needs a cache
    proc = call([*pre_commit, "validate-config", path.name], cwd=project, env=env)
    succeeded(proc)
    # The validator does reject a broken config (so the pass above means something).
    broken = tmp_path / "broken.yaml"
    broken.write_text("repos:\n  - repo: https://github.com/pre-commit/pre-commit-hooks\n    hooks: oops\n")
    proc = call([*pre_commit, "validate-config", broken], cwd=project, env=env)
    assert proc.returncode != 0, f"pre-commit accepted a broken config\n{output(proc)}"


def is_text(data: bytes) -> bool:
    if b"\0" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@pytest.mark.parametrize("model", ["both", "tacotron2_hifigan"])  # between them, every file of every variant
def test_generated_files_already_pass_the_hygiene_hooks(bake, model):
    """A user's first ``pre-commit run --all-files`` changes nothing: the same checks as the hooks, in Python."""
    project = bake(example_model=model)
    problems = []
    for path in sorted(p for p in project.rglob("*") if p.is_file()):
        rel = path.relative_to(project)
        data = path.read_bytes()
        if len(data) > MAX_KB * 1024:
            problems.append(f"{rel}: {len(data) // 1024} KB, over check-added-large-files' {MAX_KB} KB")
        if not is_text(data):
            continue
        text = data.decode("utf-8")
        for number, line in enumerate(text.splitlines(), 1):
            if line != line.rstrip(" \t"):
                problems.append(f"{rel}:{number}: trailing whitespace")
        if text and (not text.endswith("\n") or text.endswith("\n\n")):
            problems.append(f"{rel}: end-of-file-fixer wants exactly one newline at the end")
        try:
            if path.suffix in (".yaml", ".yml"):
                yaml.safe_load(text)
            elif path.suffix == ".json":
                json.loads(text)
            elif path.suffix == ".toml":
                tomllib.loads(text)
        except (yaml.YAMLError, ValueError) as error:
            problems.append(f"{rel}: does not parse: {error}")
    if problems:
        pytest.fail("pre-commit's hygiene hooks would change or refuse these files:\n" + "\n".join(problems))


# ------------------------------------------------------------------------------------- GitHub Actions


def test_github_workflow_is_copied_verbatim_and_valid(bake):
    context = {"cookiecutter": json.loads((ROOT / "cookiecutter.json").read_text())}
    assert is_copy_only_path(str(WORKFLOW), context), "cookiecutter would render the workflow's ${{ }} with Jinja"

    project = bake(example_model="both")
    text = (project / WORKFLOW).read_text()
    assert text == (TEMPLATE / WORKFLOW).read_text(), "the workflow must reach the project unchanged"
    assert not JINJA.search(text), "Jinja syntax left in the workflow"

    workflow = yaml.safe_load(text)
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 (PyYAML) reads a bare `on` key as true
    triggers = [triggers] if isinstance(triggers, str) else list(triggers)
    assert {"push", "pull_request"} <= set(triggers), triggers

    jobs = workflow["jobs"]
    assert len(jobs) == 1, list(jobs)
    job = next(iter(jobs.values()))
    assert job["runs-on"] == "ubuntu-latest"
    steps = job["steps"]
    uses = [step.get("uses", "") for step in steps]
    assert any(u.startswith("actions/checkout@") for u in uses), uses
    setup = [step for step in steps if step.get("uses", "").startswith("actions/setup-python@")]
    assert len(setup) == 1 and str(setup[0]["with"]["python-version"]) == "3.11", setup

    commands = [" ".join(step.get("run", "").split()) for step in steps]
    expected = [
        r"apt-get install .*\bflite\b",
        r"pip install torch --index-url https://download\.pytorch\.org/whl/cpu\b",
        r"pip install -r requirements\.txt ruff\b",
        r"pip install -r requirements-launch\.txt\b",
        r"(^|[;&|] *)ruff check \.",
        r"(^|[;&|] *)lint-imports\b",
        r"python -m pytest (-q )?tests\b",
    ]
    launch = next(step for step in steps if "requirements-launch.txt" in step.get("run", ""))
    assert launch.get("if") == "hashFiles('requirements-launch.txt') != ''", launch  # a project without the platforms
    where = []
    for pattern in expected:
        found = [i for i, command in enumerate(commands) if re.search(pattern, command)]
        assert found, f"no step runs /{pattern}/ in {commands}"
        where.append(found[0])
    assert where == sorted(where), f"steps out of order: {list(zip(expected, where, strict=True))}"


# ---------------------------------------------------------------------------------------------- cruft


def template_files() -> list[Path]:
    """The template's files as git sees them (tracked, and untracked but not ignored), relative to ROOT."""
    proc = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                          capture_output=True, text=True) if shutil.which("git") else None
    if proc is not None and proc.returncode == 0 and proc.stdout:
        files = [Path(name) for name in proc.stdout.split("\0") if name]
        return [rel for rel in files if (ROOT / rel).is_file()]  # a deleted, not yet staged file is still listed
    files = []  # not a git checkout (an unpacked archive): everything but caches and local folders
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in NOT_TEMPLATE]
        files += [Path(folder, name).relative_to(ROOT) for name in names if not name.endswith(".pyc")]
    return files


def test_cruft_create_check_and_diff(tmp_path):
    cruft = tool("cruft", "cruft")
    if not shutil.which("git"):
        message = "git is not installed (cruft needs it)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)

    snapshot = tmp_path / "template"
    for rel in template_files():
        (snapshot / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, snapshot / rel)
    # No user or system git config, and cookiecutter's caches and replays inside tmp_path.
    (tmp_path / "cookiecutterrc").write_text(f"cookiecutters_dir: {tmp_path / 'cookiecutters'}\n"
                                             f"replay_dir: {tmp_path / 'replay'}\n")
    env = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0",
           "COOKIECUTTER_CONFIG": str(tmp_path / "cookiecutterrc")}
    git = ["git", "-c", "user.name=ddtemplate tests", "-c", "user.email=tests@ddtemplate.invalid",
           "-c", "commit.gpgsign=false", "-c", "init.defaultBranch=main"]
    for cmd in ([*git, "init", "-q"], [*git, "add", "-A"], [*git, "commit", "-q", "-m", "template snapshot"]):
        proc = call(cmd, cwd=snapshot, env=env)
        succeeded(proc)
    commit = call(["git", "rev-parse", "HEAD"], cwd=snapshot, env=env).stdout.strip()

    out = tmp_path / "out"
    proc = call([*cruft, "create", snapshot, "--no-input", "--output-dir", out], cwd=tmp_path, env=env)
    succeeded(proc)
    projects = [p for p in out.iterdir() if p.is_dir()]
    assert [p.name for p in projects] == ["speech_synthesis"], projects
    project = projects[0]
    state = json.loads((project / ".cruft.json").read_text())
    assert Path(state["template"]).resolve() == snapshot.resolve() and state["commit"] == commit, state
    assert (project / WORKFLOW).read_text() == (TEMPLATE / WORKFLOW).read_text()
    assert not (project / "models" / "tacotron2.py").exists(), "the post-generation hook did not run"

    proc = call([*cruft, "check", "--project-dir", project], cwd=tmp_path, env=env)
    succeeded(proc)
    # Re-rendering the template (hooks included) gives exactly the project's files.
    proc = call([*cruft, "diff", "--exit-code", "--project-dir", project], cwd=tmp_path, env=env)
    succeeded(proc)
    assert not proc.stdout.strip(), output(proc)
