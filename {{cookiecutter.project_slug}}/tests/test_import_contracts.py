"""The project's floors import one way: ``lint-imports`` (import-linter, reading ``.importlinter``) keeps every contract,
and the contracts cover every package of the project, so a new one cannot sit outside them. Static: nothing of the
project is imported or run. Skipped only where import-linter is not installed (``requirements.txt`` lists it)."""

import configparser
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

CONFIG = Path(ROOT) / ".importlinter"
LINT = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True, no_logo=True))"


def contracts() -> configparser.ConfigParser:
    config = configparser.ConfigParser(inline_comment_prefixes=(";",))
    config.read(CONFIG)
    return config


@pytest.mark.skipif(importlib.util.find_spec("importlinter") is None,
                    reason="import-linter is not installed (pip install -r requirements.txt)")
def test_every_import_contract_is_kept():
    proc = subprocess.run([sys.executable, "-c", LINT], cwd=ROOT, capture_output=True, text=True, timeout=300)
    names = [contracts()[section]["name"] for section in contracts().sections() if section.startswith("importlinter:")]
    assert names, f"{CONFIG} declares no contract"
    assert proc.returncode == 0, f"lint-imports failed\n{proc.stdout}\n{proc.stderr}"
    for name in names:
        assert f"{name} KEPT" in proc.stdout, f"contract {name!r} not reported kept\n{proc.stdout}"


def test_the_contracts_cover_every_package():
    """Every top-level package is a root package of the contracts (``tests`` and ``docs`` are not packages)."""
    packages = sorted(path.name for path in Path(ROOT).iterdir() if (path / "__init__.py").is_file())
    roots = contracts()["importlinter"]["root_packages"].split()
    assert sorted(roots) == packages
