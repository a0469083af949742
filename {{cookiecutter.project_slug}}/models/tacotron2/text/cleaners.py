"""Text normalisation run before text is mapped to symbol ids ("cleaners").

A cleaner is a function ``str -> str``; :func:`models.tacotron2.text.text_to_sequence` applies the ones the model config
names (``text_cleaners``) in order. The set mirrors NVIDIA's Tacotron2 reference (``text/cleaners.py``).
"""

from __future__ import annotations

import re
from typing import Callable

from unidecode import unidecode

from models.tacotron2.text.numbers import normalize_numbers

_WHITESPACE = re.compile(r"\s+")

_ABBREVIATIONS: list[tuple[re.Pattern, str]] = [  # a whole word followed by a full stop, in any case
    (re.compile(rf"\b{abbr}\.", re.IGNORECASE), expansion) for abbr, expansion in [
        ("mrs", "misess"), ("mr", "mister"), ("dr", "doctor"), ("st", "saint"), ("co", "company"), ("jr", "junior"),
        ("maj", "major"), ("gen", "general"), ("drs", "doctors"), ("rev", "reverend"), ("lt", "lieutenant"),
        ("hon", "honorable"), ("sgt", "sergeant"), ("capt", "captain"), ("esq", "esquire"), ("ltd", "limited"),
        ("col", "colonel"), ("ft", "fort")]]


def lowercase(text: str) -> str:
    """``text.lower()``."""
    return text.lower()


def collapse_whitespace(text: str) -> str:
    """Replace every run of whitespace with one space. The ends are not stripped (a segment before an inline
    ``{phones}`` span keeps its space); :func:`models.tacotron2.text.text_to_sequence` strips the whole transcript."""
    return _WHITESPACE.sub(" ", text)


def convert_to_ascii(text: str) -> str:
    """Transliterate to ASCII with ``unidecode`` (``"café"`` -> ``"cafe"``, ``"–"`` -> ``"-"``)."""
    return unidecode(text)


def expand_abbreviations(text: str) -> str:
    """Expand NVIDIA's list of English abbreviations (``"Dr."`` -> ``"doctor"``, ``"St."`` -> ``"saint"``, ...) to
    lowercase words; the full stop is consumed."""
    for pattern, expansion in _ABBREVIATIONS:
        text = pattern.sub(expansion, text)
    return text


def expand_numbers(text: str) -> str:
    """Spell out numbers, amounts and ordinals (:func:`models.tacotron2.text.numbers.normalize_numbers`)."""
    return normalize_numbers(text)


def basic_cleaners(text: str) -> str:
    """Lowercase and collapse whitespace (any language in the Latin alphabet)."""
    return collapse_whitespace(lowercase(text))


def transliteration_cleaners(text: str) -> str:
    """ASCII transliteration, lowercase, whitespace collapse (non-English Latin-script text)."""
    return collapse_whitespace(lowercase(convert_to_ascii(text)))


def english_cleaners(text: str) -> str:
    """The English pipeline used for LJSpeech: ASCII, lowercase, numbers, abbreviations, whitespace.

    ``"Dr. Smith paid $3.50 on the 2nd."`` -> ``"doctor smith paid three dollars, fifty cents on the second."``
    """
    # Numbers first because unidecode turns "£" into "PS"; the second pass catches digits that only transliteration
    # produced (full-width or superscript digits).
    text = lowercase(convert_to_ascii(expand_numbers(text)))
    return collapse_whitespace(expand_abbreviations(expand_numbers(text)))


def nvidia_english_cleaners(text: str) -> str:
    """NVIDIA's ``english_cleaners`` exactly, which its published weights were trained on: ASCII first (``"£"`` ->
    ``"ps"``), lowercase, its number rules (:func:`~models.tacotron2.text.numbers.normalize_numbers` ``nvidia=True``),
    abbreviations, whitespace. :func:`models.tacotron2.text.text_to_sequence` then keeps NVIDIA's ways too."""
    text = normalize_numbers(lowercase(convert_to_ascii(text)), nvidia=True)
    return collapse_whitespace(expand_abbreviations(text))


CLEANERS: dict[str, Callable[[str], str]] = {
    "basic_cleaners": basic_cleaners,
    "transliteration_cleaners": transliteration_cleaners,
    "english_cleaners": english_cleaners,
    "nvidia_english_cleaners": nvidia_english_cleaners,
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
