"""Text normalisation run before text is mapped to symbol ids ("cleaners").

A cleaner is a function ``str -> str``; :func:`models.tacotron2.text.text_to_sequence` applies the ones named in the
model config (``text_cleaners``) in order. The set mirrors NVIDIA's Tacotron2 reference (``text/cleaners.py``):

* ``basic_cleaners``: lowercase and collapse whitespace (any language in the Latin alphabet);
* ``transliteration_cleaners``: also transliterate to ASCII with ``unidecode`` (non-English text);
* ``english_cleaners``: ASCII, lowercase, numbers spelled out, abbreviations expanded, whitespace collapsed (the
  pipeline used for LJSpeech).
"""

from __future__ import annotations

import re
from typing import Callable

from unidecode import unidecode

from models.tacotron2.text.numbers import normalize_numbers

_WHITESPACE = re.compile(r"\s+")

# (abbreviation, expansion); matched case-insensitively as a whole word followed by a full stop.
_ABBREVIATIONS: list[tuple[re.Pattern, str]] = [
    (re.compile(rf"\b{abbr}\.", re.IGNORECASE), expansion)
    for abbr, expansion in [
        ("mrs", "misess"),
        ("mr", "mister"),
        ("dr", "doctor"),
        ("st", "saint"),
        ("co", "company"),
        ("jr", "junior"),
        ("maj", "major"),
        ("gen", "general"),
        ("drs", "doctors"),
        ("rev", "reverend"),
        ("lt", "lieutenant"),
        ("hon", "honorable"),
        ("sgt", "sergeant"),
        ("capt", "captain"),
        ("esq", "esquire"),
        ("ltd", "limited"),
        ("col", "colonel"),
        ("ft", "fort"),
    ]
]


def lowercase(text: str) -> str:
    """``text.lower()``."""
    return text.lower()


def collapse_whitespace(text: str) -> str:
    """Replace every run of whitespace (spaces, tabs, newlines) with one space.

    The ends are not stripped (a segment before an inline ``{phones}`` span keeps its space);
    :func:`models.tacotron2.text.text_to_sequence` strips the whole transcript.
    """
    return _WHITESPACE.sub(" ", text)


def convert_to_ascii(text: str) -> str:
    """Transliterate to ASCII with ``unidecode`` (``"café"`` -> ``"cafe"``, ``"–"`` -> ``"-"``)."""
    return unidecode(text)


def expand_abbreviations(text: str) -> str:
    """Expand English abbreviations such as ``"Dr."`` -> ``"doctor"`` and ``"St."`` -> ``"saint"``.

    The list is NVIDIA's (mr, mrs, dr, st, co, jr, maj, gen, drs, rev, lt, hon, sgt, capt, esq, ltd, col, ft).
    Expansions are lowercase; the full stop is consumed.
    """
    for pattern, expansion in _ABBREVIATIONS:
        text = pattern.sub(expansion, text)
    return text


def expand_numbers(text: str) -> str:
    """Spell out numbers, amounts and ordinals (see :func:`models.tacotron2.text.numbers.normalize_numbers`)."""
    return normalize_numbers(text)


def basic_cleaners(text: str) -> str:
    """Lowercase and collapse whitespace; nothing else."""
    return collapse_whitespace(lowercase(text))


def transliteration_cleaners(text: str) -> str:
    """ASCII transliteration, lowercase, whitespace collapse (for non-English Latin-script text)."""
    return collapse_whitespace(lowercase(convert_to_ascii(text)))


def english_cleaners(text: str) -> str:
    """The English pipeline: ASCII, lowercase, numbers, abbreviations, whitespace.

    ``"Dr. Smith paid $3.50 on the 2nd."`` -> ``"doctor smith paid three dollars, fifty cents on the second."``
    """
    # Numbers go first because unidecode turns "£" into "PS"; the second pass catches digits that only
    # transliteration produced (full-width or superscript digits).
    text = expand_numbers(text)
    text = convert_to_ascii(text)
    text = lowercase(text)
    text = expand_numbers(text)
    text = expand_abbreviations(text)
    return collapse_whitespace(text)


CLEANERS: dict[str, Callable[[str], str]] = {
    "basic_cleaners": basic_cleaners,
    "transliteration_cleaners": transliteration_cleaners,
    "english_cleaners": english_cleaners,
}
"""Cleaner name (as written in the config's ``text_cleaners``) -> function."""


def clean_text(text: str, cleaner_names: tuple[str, ...] | list[str] = ("english_cleaners",)) -> str:
    """Apply the named cleaners to ``text`` in order.

    Raises:
        ValueError: a name is not in :data:`CLEANERS` (the message lists the known names).
    """
    for name in cleaner_names:
        try:
            cleaner = CLEANERS[name]
        except KeyError:
            raise ValueError(f"unknown text cleaner '{name}' (known: {', '.join(CLEANERS)})") from None
        text = cleaner(text)
    return text
