"""Check the answers before anything is written; a bad one is refused with one ``ERROR:`` line, exit 1."""

import keyword
import re
import sys

SLUG = "{{ cookiecutter.project_slug }}"
LICENSE = "{{ cookiecutter.license }}"
EXAMPLE_MODEL = "{{ cookiecutter.example_model }}"
DOCKER_IMAGE = "{{ cookiecutter.docker_base_image }}"
PROJECT_NAME = "{{ cookiecutter.project_name }}"

# Modules the generated project imports or holds: a folder of the same name on sys.path would shadow them.
SHADOWED = {
    "torch", "torchaudio", "numpy", "scipy", "librosa", "soundfile", "inflect", "unidecode", "tqdm",
    "tensorboard", "matplotlib", "jinja2", "pytest", "test", "tests", "distributed", "multiproc", "train",
    "model", "inference", "modules", "utils", "scripts", "config", "text", "json", "os", "sys", "io",
    "math", "random", "signal", "typing", "dataclasses", "logging", "pathlib", "time", "copy", "site",
}
LICENSES = ("MIT", "BSD-3-Clause", "Apache-2.0", "Proprietary")
MODELS = ("waveglow", "tacotron2", "both")
# registry/namespace/name:tag, as `docker pull` accepts (lower-case repository, tag of [\w.-]).
IMAGE_RE = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)+:[\w][\w.-]{0,127}$")


def problem() -> str:
    """The first thing wrong with the answers, or an empty string."""
    if not PROJECT_NAME.strip():
        return "project_name is empty"
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
    if not IMAGE_RE.match(DOCKER_IMAGE):
        return (f"docker_base_image '{DOCKER_IMAGE}' is not an image reference with a tag "
                "(e.g. nvcr.io/nvidia/pytorch:25.01-py3)")
    return ""


if __name__ == "__main__":
    message = problem()
    if message:
        print(f"ERROR: {message}", file=sys.stderr)
        sys.exit(1)
