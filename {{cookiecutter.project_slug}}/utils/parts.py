"""The parts a project may leave out at generation (cookiecutter's yes/no questions), each whole files: the code that
reaches a part asks here, where it is used, so a project without it has no half of it."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType
from typing import Optional


def has_part(module: str) -> bool:
    """Whether ``module`` (``"utils.checkpoint.sharded"``) is in this project; imports only the packages above it."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a package above it is gone too
        return False


def optional_part(module: str) -> Optional[ModuleType]:
    """The module ``module`` of a part, imported, or None where the part was left out. Raises ImportError where it is
    here but fails to import: a broken part is not taken for one left out."""
    return importlib.import_module(module) if has_part(module) else None
