"""The parts a project may leave out at generation (cookiecutter's yes/no questions: sharding, cloud platforms,
after-training tools, benchmarks). A part left out is whole files removed; the code that reaches a part asks here, at
the one place it is used, so a project without it has no half of it: its settings are unknown keys, its options are
not offered."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType
from typing import Optional


def has_part(module: str) -> bool:
    """Whether ``module`` (a dotted name, e.g. ``"utils.checkpoint.sharded"``) is in this project. Imports only the
    packages above it, never the module itself."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a package above it is gone too
        return False


def optional_part(module: str) -> Optional[ModuleType]:
    """The module ``module`` of a part, imported, or None where the part was left out at generation.

    Raises:
        ImportError: the module is here but fails to import (what it imports is missing): a broken part is not
            taken for one left out.
    """
    return importlib.import_module(module) if has_part(module) else None
