"""Remove the files of example models that were not chosen, and of the parts answered no. No network, no questions,
idempotent.

Each example model is a set of whole files (its package in ``models/``, its layers, its tests); the table below lists
them, and a second one the files that need two of them (Tacotron2 and a vocoder). ``config.json`` loses the sections
(and ``tiny`` overrides) of models not chosen, and the registry ``models/__init__.py`` the lines that name them (its
``from models import <name>`` and ``<name>.SPEC,`` lines). The parts are declared once, in the project's composition
root ``parts.py`` (:data:`ROOT_FILE`): its ``TABLE`` lists each part's files and config keys, read here; a part
answered no loses them and its lines there (tagged ``# part: <name>``), whose ``TABLE`` and ``LEFT_OUT`` are written
anew (those left out keep only their names and keys). Only paths of these tables, ``config.json``, the registry and
``parts.py`` are touched: never ``.git`` or a user's own files, so regenerating over an existing project
(``cookiecutter -f``, ``cruft update``) is safe.
"""

import ast
import json
import re
import shutil
import sys
from pathlib import Path

CHOICE = "{{ cookiecutter.example_model }}"
CHOSEN = {"both": {"tacotron2", "waveglow"}, "tacotron2_hifigan": {"tacotron2", "hifigan"},
          "matcha_hifigan": {"matcha", "hifigan"}}.get(CHOICE, {CHOICE})

REF = "tests/data/reference/"
FILES = {
    "waveglow": ["models/waveglow", "modules/waveglow.py", "tests/test_waveglow.py", "tests/test_parity_waveglow.py",
                 REF + "net_waveglow.npz", REF + "waveglow_tiny_legacy.pt", REF + "waveglow_tiny_expected.npz",
                 REF + "make_legacy_fixture.py"],
    "hifigan": ["models/hifigan", "modules/hifigan.py", "tests/test_hifigan.py", "tests/test_parity_hifigan.py",
                "tests/test_benchmark_hifigan.py",
                *(f"{REF}net_hifigan_v{n}.npz" for n in (1, 2, 3))],
    "tacotron2": ["models/tacotron2", "modules/layers.py", "modules/attention.py", "modules/tacotron2.py",
                  "scripts/preprocess.py", "tests/test_tacotron2.py", "tests/test_text.py",
                  "tests/test_parity_tacotron2.py", "tests/test_benchmark_tacotron2.py", "tests/test_shards_tacotron2.py",
                  REF + "net_tacotron2_tf.npz",
                  REF + "net_tacotron2_fr.npz", REF + "text_nvidia.json"],
    "matcha": ["models/matcha", "modules/matcha.py", "modules/matcha_decoder.py", "tests/test_matcha.py",
               "scripts/mel_statistics.py", "tests/test_matcha_text.py", "tests/test_matcha_run.py",
               "tests/test_matcha_corpora.py", "tests/test_parity_matcha.py", "tests/test_shards_matcha.py",
               REF + "make_fixtures_matcha.py", REF + "make_fixtures_matcha_text.py", REF + "mas_matcha.npz",
               REF + "net_matcha_ljspeech.npz", REF + "net_matcha_vctk.npz", REF + "provenance_matcha.json",
               REF + "text_matcha.json", "tests/test_matcha_published.py", REF + "make_fixture_matcha_lightning.py",
               REF + "matcha_tiny_lightning.ckpt", REF + "matcha_tiny_expected.npz", "tests/test_matcha_export.py",
               "tests/test_benchmark_matcha.py"],
}
TOGETHER = {
    "scripts/dump_gta_mels.py": [{"tacotron2"}, {"waveglow", "hifigan"}],
    "tests/test_gta.py": [{"tacotron2"}, {"waveglow", "hifigan"}],
}
"""Files that need several models: kept when every set names a chosen model (Tacotron2 and a vocoder)."""

ANSWERS = {"sharding": "{{ cookiecutter.sharding }}", "cloud_platforms": "{{ cookiecutter.cloud_platforms }}",
           "after_training_tools": "{{ cookiecutter.after_training_tools }}", "benchmarks": "{{ cookiecutter.benchmarks }}",
           "experiment_trackers": "{{ cookiecutter.experiment_trackers }}",
           "corpora": "{{ cookiecutter.corpora }}"}
"""The answers to the parts' yes/no questions (the parts of the project's ``parts.TABLE``, in its order)."""
LEFT_OUT = [part for part, answer in ANSWERS.items() if answer == "no"]
EXECUTABLE = ["scripts/dataset.sh", "scripts/mpirun.sh", "scripts/slurm/train.sbatch"]
ROOT_FILE = "parts.py"
"""The project's composition root: its ``TABLE`` of parts (part -> ``"files"`` and ``"keys"``, lists of paths and of
``section.key`` strings), its ``LEFT_OUT`` (part -> its keys), its lines tagged ``# part: <name>``."""
TAG = re.compile(r"#\s*part:\s*(\w+)\s*$")


def literal(source: str, name: str) -> ast.stmt:
    """The statement of ``source`` that assigns the literal ``name`` (``NAME = ...`` or ``NAME: type = ...``)."""
    for node in ast.parse(source).body:
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
        if any(isinstance(target, ast.Name) and target.id == name for target in targets):
            return node
    raise SystemExit(f"ERROR: {ROOT_FILE} assigns no {name}")


def read_table(path: Path) -> dict[str, dict[str, list[str]]]:
    """The parts' ``TABLE`` of the composition root at ``path``, read as a literal (nothing of it runs)."""
    return ast.literal_eval(literal(path.read_text(), "TABLE").value)


def wrapped(head: str, items: list[str], tail: str, width: int = 120) -> list[str]:
    """Lines of ``head`` (up to and with ``[``), then ``items`` as JSON strings, wrapped before ``width`` under the
    first one, then ``]`` and ``tail``."""
    lines, line, pad = [], head, " " * len(head)
    for i, item in enumerate(items):
        piece = json.dumps(item) + (", " if i < len(items) - 1 else "]" + tail)
        if line != head and len(line + piece.rstrip()) > width:
            lines.append(line.rstrip())
            line = pad
        line += piece
    return [*lines, line if items else head + "]" + tail]


def table_lines(table: dict[str, dict[str, list[str]]]) -> list[str]:
    """``TABLE = {...}`` as ``parts.py`` writes it: a part a block, its files and keys wrapped at 120 columns."""
    if not table:
        return ["TABLE = {}"]
    lines = ["TABLE = {"]
    for part, entry in table.items():
        lines += ["    " + json.dumps(part) + ": {", *wrapped('        "files": [', entry["files"], ","),
                  *wrapped('        "keys": [', entry["keys"], ","), "    },"]
    return [*lines, "}"]


def left_out_lines(left_out: dict[str, list[str]]) -> list[str]:
    """``LEFT_OUT: dict[str, list[str]] = {...}`` as ``parts.py`` writes it: a part a line (wrapped at 120)."""
    head = "LEFT_OUT: dict[str, list[str]] = {"
    if not left_out:
        return [head + "}"]
    lines = [line for part, keys in left_out.items() for line in wrapped(f"    {json.dumps(part)}: [", keys, ",")]
    return [head, *lines, "}"]


def replace_literal(source: str, name: str, lines: list[str]) -> str:
    """``source`` with the statement that assigns ``name`` replaced by ``lines``."""
    node, old = literal(source, name), source.splitlines()
    return "\n".join([*old[:node.lineno - 1], *lines, *old[node.end_lineno:]]) + "\n"


def prune_root(path: Path, table: dict[str, dict[str, list[str]]]) -> None:
    """The composition root without the lines tagged ``# part: <name>`` of a part left out, or naming a model not
    chosen; its ``TABLE`` of the parts kept (the files of each that this project holds) and its ``LEFT_OUT``."""
    unchosen = set(FILES) - CHOSEN
    kept = [line for line in path.read_text().splitlines()
            if not ((tag := TAG.search(line)) and (tag.group(1) in LEFT_OUT
                                                   or any(re.search(rf"\b{name}\b", line) for name in unchosen)))]
    source = "\n".join(kept) + "\n"
    root = path.parent
    present = {part: {"files": [rel for rel in entry["files"] if (root / rel).exists()], "keys": entry["keys"]}
               for part, entry in table.items() if part not in LEFT_OUT}
    source = replace_literal(source, "LEFT_OUT", left_out_lines({part: table[part]["keys"] for part in LEFT_OUT}))
    path.write_text(replace_literal(source, "TABLE", table_lines(present)))


def prune_config(path: Path, table: dict[str, dict[str, list[str]]]) -> None:
    """Remove the config sections of models not chosen and the keys of parts left out, top level and ``tiny`` block
    alike."""
    config = json.loads(path.read_text())
    unchosen = set(FILES) - CHOSEN
    for block in (config, config.get("tiny", {})):
        for name in unchosen:
            block.pop(name, None)
        for part in LEFT_OUT:
            for key in table[part]["keys"]:
                section, name = key.split(".")
                block.get(section, {}).pop(name, None)
    path.write_text(json.dumps(config, indent=2) + "\n")


def prune_registry(path: Path) -> None:
    """Remove the lines of the registry that name a model not chosen (``from models import <name>``, ``<name>.SPEC,``)."""
    unchosen = set(FILES) - CHOSEN
    kept = [line for line in path.read_text().splitlines(keepends=True)
            if not any(re.search(rf"\b{name}\b", line) for name in unchosen)]
    path.write_text("".join(kept))


def main() -> None:
    root = Path.cwd()
    table = read_table(root / ROOT_FILE)
    unchosen = [paths for name, paths in FILES.items() if name not in CHOSEN]
    unchosen += [[rel] for rel, needs in TOGETHER.items() if not all(CHOSEN & need for need in needs)]
    unchosen += [table[part]["files"] for part in LEFT_OUT]
    for paths in unchosen:
        for rel in paths:
            target = root / rel
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
    for cache in ("__pycache__", ".pytest_cache", ".ruff_cache", ".import_linter_cache", ".benchmarks"):  # left by test runs in the template checkout
        for path in [root / cache, *(found for folder in ("models", "modules", "utils", "scripts", "tests")
                                     for found in (root / folder).rglob(cache))]:
            shutil.rmtree(path, ignore_errors=True)
    prune_config(root / "config.json", table)
    prune_registry(root / "models" / "__init__.py")
    prune_root(root / ROOT_FILE, table)
    for rel in EXECUTABLE:
        if (root / rel).exists():
            (root / rel).chmod(0o755)


if __name__ == "__main__":
    main()
    sys.exit(0)
