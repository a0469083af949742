"""The project's floors import one way: ``lint-imports`` (import-linter, reading ``.importlinter``) keeps every contract,
and the contracts cover every package of the project, so a new one cannot sit outside them. Static: nothing of the
project is imported or run. Skipped only where import-linter is not installed (``requirements.txt`` lists it)."""

import ast
import configparser
import functools
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


# --- what the contracts cannot see: lookups by name, imports inside functions, the top-level files' own imports ------

LOOKUPS = {"optional_part", "has_part", "import_module", "__import__"}
"""Calls that load a module by its name (``importlib.import_module``, the builtin ``__import__``, the helpers an
earlier project asked for its optional parts with): an edge no import statement shows."""
COMPOSITION = {"parts", "train", "inference", "multiproc"}
"""The modules that may look a module up by its name: the composition root and the entry scripts."""


@functools.cache
def project_modules() -> dict[str, ast.Module]:
    """Every module of the project (its top-level files and packages, not ``tests`` or ``docs``): dotted name -> its
    parsed source, parsed once. Read, never imported."""
    found, folders = {}, [Path(ROOT)]
    while folders:
        folder = folders.pop()
        for path in sorted(folder.iterdir()):
            if path.is_dir() and (path / "__init__.py").is_file() and path.name != "tests":
                folders.append(path)
            elif path.suffix == ".py" and (folder != Path(ROOT) or path.stem not in ("setup", "conftest")):
                name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                found[name] = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return found


def called_name(node: ast.Call) -> str:
    """The name a call calls: ``f`` for ``f(...)`` and ``a.b.f(...)``."""
    return node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")


def imported(tree: ast.Module, name: str, modules: set[str]) -> list[tuple[str, ast.AST]]:
    """``(module, node)`` for every module of ``modules`` that module ``name`` (``tree``) imports anywhere (in
    functions and under ``TYPE_CHECKING`` too) or loads by a constant name (``import_module("utils.x")``)."""
    package = name if (Path(ROOT) / name.replace(".", "/") / "__init__.py").is_file() else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from . import x, from ..y import z
                above = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*above, *([base] if base else [])])
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        elif isinstance(node, ast.Call) and (called_name(node) in LOOKUPS or called_name(node) == "find_spec") \
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            targets = [node.args[0].value]
        found += [(target, node) for target in targets if target in modules]
    return found


def test_modules_are_looked_up_by_name_in_the_composition_root_and_the_entry_scripts_alone():
    """A module that loads another by its name hides an edge from the contracts: an optional part is imported in
    ``parts.py`` and handed down as an object, so at most 4 modules (the root and the entry scripts) load by name."""
    lookups = {name: sorted({f"{called_name(node)} (line {node.lineno})" for node in ast.walk(tree)
                             if isinstance(node, ast.Call) and called_name(node) in LOOKUPS})
               for name, tree in project_modules().items()}
    lookups = {name: calls for name, calls in lookups.items() if calls}
    assert set(lookups) <= COMPOSITION and len(lookups) <= 4, lookups


def import_cycles(modules: dict[str, ast.Module]) -> list[list[str]]:
    """The strongly connected components of more than one module (or one importing itself) of the import graph,
    every import and every load by a constant name counted (Tarjan's algorithm)."""
    graph = {name: sorted({target for target, _ in imported(tree, name, set(modules))})
             for name, tree in modules.items()}
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        on_stack.add(name)
        for target in graph.get(name, []):
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in on_stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            component = []
            while not component or component[-1] != name:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1 or name in graph.get(name, []):
                cycles.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return cycles


def test_no_import_cycle_even_with_the_loads_by_name_counted():
    assert import_cycles(project_modules()) == []


def test_the_registry_is_imported_at_the_top_of_a_module_never_inside_a_function():
    """``from models import ...`` inside a function dodges a cycle the contracts would name."""
    found = [f"{name}:{node.lineno}" for name, tree in project_modules().items()
             for function in ast.walk(tree) if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
             for node in ast.walk(function)
             if (isinstance(node, ast.ImportFrom) and node.module == "models" and not node.level)
             or (isinstance(node, ast.Import) and any(alias.name == "models" for alias in node.names))]
    assert found == []


def test_distributed_and_model_import_only_the_core():
    """import-linter sees the packages' imports, not those of the top-level files: ``distributed.py`` and ``model.py``
    (the floor above the core in the contract ``top-level-files``) import the core's modules alone."""
    layers = contracts()["importlinter:contract:top-level-files"]["layers"].split("\n")
    floor, core = ({name.strip() for name in layer.split(":")} for layer in [line for line in layers if line][-2:])
    modules = project_modules()
    for name in sorted(floor):
        outside = sorted({target for target, _ in imported(modules[name], name, set(modules))} - core)
        assert outside == [], f"{name}.py imports {outside}, beside the core {sorted(core)}"
