"""Check the answers before anything is written; a bad one is refused with one ``ERROR:`` line, exit 1."""

import keyword
import re
import sys
import unicodedata

# Rendered as JSON strings, which are valid Python string literals whatever the answer holds (quotes,
# backslashes, newlines): an answer must reach the checks below, not break this file.
SLUG = {{ cookiecutter.project_slug | tojson }}
LICENSE = {{ cookiecutter.license | tojson }}
EXAMPLE_MODEL = {{ cookiecutter.example_model | tojson }}
DOCKER_IMAGE = {{ cookiecutter.docker_base_image | tojson }}
PROJECT_NAME = {{ cookiecutter.project_name | tojson }}
AUTHOR_NAME = {{ cookiecutter.author_name | tojson }}
DESCRIPTION = {{ cookiecutter.description | tojson }}
PARTS = {"sharding": {{ cookiecutter.sharding | tojson }}, "cloud_platforms": {{ cookiecutter.cloud_platforms | tojson }},
         "after_training_tools": {{ cookiecutter.after_training_tools | tojson }},
         "benchmarks": {{ cookiecutter.benchmarks | tojson }},
         "experiment_trackers": {{ cookiecutter.experiment_trackers | tojson }},
         "corpora": {{ cookiecutter.corpora | tojson }}}

# Modules the generated project imports or holds: a folder of the same name on sys.path would shadow them.
SHADOWED = {
    "torch", "torchaudio", "numpy", "scipy", "librosa", "soundfile", "inflect", "unidecode", "numba", "phonemizer", "tqdm",
    "tensorboard", "matplotlib", "jinja2", "pytest", "test", "tests", "distributed", "multiproc", "train",
    "model", "inference", "modules", "utils", "scripts", "config", "text", "json", "os", "sys", "io",
    "math", "random", "signal", "typing", "dataclasses", "logging", "pathlib", "time", "copy", "site",
    "wandb", "mlflow",
}
LICENSES = ("MIT", "BSD-3-Clause", "Apache-2.0", "Proprietary")
MODELS = ("waveglow", "tacotron2", "both", "hifigan", "tacotron2_hifigan", "matcha", "matcha_hifigan")
# registry/namespace/name:tag, as `docker pull` accepts (lower-case repository, tag of [\w.-]).
IMAGE_RE = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)+:[\w][\w.-]{0,127}$")


def control_character(text: str) -> str:
    """The first control character of ``text`` (newline, tab, escape...) as ``U+000A``, or an empty string.

    The free-text answers end up on one line of the README, the LICENSE and the Dockerfile, where a newline
    would start a line of its own (in the Dockerfile, an instruction).
    """
    return next((f"U+{ord(c):04X}" for c in text if unicodedata.category(c) == "Cc"), "")


def problem() -> str:
    """The first thing wrong with the answers, or an empty string."""
    if not PROJECT_NAME.strip():
        return "project_name is empty"
    if not AUTHOR_NAME.strip():
        return "author_name is empty (it is the copyright holder in LICENSE)"
    for key, text in (("project_name", PROJECT_NAME), ("author_name", AUTHOR_NAME), ("description", DESCRIPTION)):
        if control_character(text):
            return f"{key} holds a control character ({control_character(text)}); give one line of plain text"
    if not SLUG.isidentifier() or not SLUG.isascii():
        return f"project_slug '{SLUG}' is not a valid Python identifier (use letters, digits and _, not starting with a digit)"
    if keyword.iskeyword(SLUG) or keyword.issoftkeyword(SLUG):
        return f"project_slug '{SLUG}' is a Python keyword"
    if SLUG.lower() in SHADOWED or SLUG in sys.stdlib_module_names:
        return f"project_slug '{SLUG}' would shadow the module '{SLUG}' that the project imports; pick another name"
    if LICENSE not in LICENSES:
        return f"license '{LICENSE}' is not one of {', '.join(LICENSES)}"
    if EXAMPLE_MODEL not in MODELS:
        return f"example_model '{EXAMPLE_MODEL}' is not one of {', '.join(MODELS)}"
    for part, answer in PARTS.items():
        if answer not in ("yes", "no"):
            return f"{part} '{answer}' is not yes or no"
    if not IMAGE_RE.match(DOCKER_IMAGE):
        return (f"docker_base_image '{DOCKER_IMAGE}' is not an image reference with a tag "
                "(e.g. nvcr.io/nvidia/pytorch:25.01-py3)")
    return ""


if __name__ == "__main__":
    message = problem()
    if message:
        print(f"ERROR: {message}", file=sys.stderr)
        sys.exit(1)
