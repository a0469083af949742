"""Reference ids for the Matcha-TTS text front end, computed by shivammehta25/Matcha-TTS's own ``matcha.text``.

Nothing of the reference is copied here: this script imports its package from the checkout given on the command line
and calls ``text_to_sequence(text, ["english_cleaners2"])`` and its data module's blank interspersing (``intersperse``
of ``matcha/utils/utils.py``, repeated here as one line: id 0 around and between the symbols); it stores only the
texts, the phonemes, the ids and the provenance. Needs ``phonemizer`` and ``unidecode`` (pip) and espeak-ng (the
system's package); the phonemes depend on espeak-ng's version, recorded beside them.

Reference (clone, then check out the commit the fixture was made with)::

    git clone https://github.com/shivammehta25/Matcha-TTS && git -C Matcha-TTS checkout COMMIT

Command (CPU, seconds)::

    python make_fixtures_matcha_text.py --matcha Matcha-TTS --output fixtures

Writes ``text_matcha.json``: ``{"meta": {...}, "cases": [{"text", "phonemes", "ids"}, ...]}`` (``ids`` with blanks).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

TEXTS = [
    "Hello world.",
    "Printing, in the only sense with which we are at present concerned, differs from most if not from all the arts.",
    "Mr. and Mrs. Smith met Dr. Jones on St. James's Street; Capt. Hook was late!",
    "Is it 1984 or 2026? She paid $3.50 (cash).",
    "A café in Zürich — \"naïve\" [sic] {braces}.",
    "  Spaces   and\ttabs\nacross lines  ",
    "Who's there? I'm here, aren't you?",
]
"""Abbreviations, numbers (espeak reads them), transliteration, brackets, whitespace, apostrophes."""


def espeak_version() -> str:
    """``espeak-ng --version``'s first line."""
    return subprocess.run(["espeak-ng", "--version"], capture_output=True, text=True, check=True).stdout.strip()


def main(argv: list[str] | None = None) -> None:
    """Run the reference's front end over :data:`TEXTS` and write ``text_matcha.json`` into ``--output``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matcha", type=Path, required=True, help="a checkout of shivammehta25/Matcha-TTS")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(args.matcha.resolve()))
    from matcha.text import text_to_sequence  # noqa: PLC0415 (the reference's package, from the checkout given)

    cases = []
    for text in TEXTS:
        ids, phonemes = text_to_sequence(text, ["english_cleaners2"])
        blanked = [0] * (2 * len(ids) + 1)
        blanked[1::2] = ids
        cases.append({"text": text, "phonemes": phonemes, "ids": blanked})
    commit = subprocess.run(["git", "-C", str(args.matcha), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "python make_fixtures_matcha_text.py --matcha Matcha-TTS --output tests/data/reference",
            "references": {"shivammehta25/Matcha-TTS": commit},
            "versions": {"python": sys.version.split()[0], "phonemizer": importlib.metadata.version("phonemizer"),
                         "unidecode": importlib.metadata.version("unidecode"), "espeak-ng": espeak_version()}}
    args.output.mkdir(parents=True, exist_ok=True)
    out = args.output / "text_matcha.json"
    rows = ",\n  ".join(json.dumps(case, ensure_ascii=False) for case in cases)  # a case a line
    out.write_text('{"meta": ' + json.dumps(meta, ensure_ascii=False) + ',\n "cases": [\n  ' + rows + "]}\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
