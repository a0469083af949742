"""Spell out numbers in English text before it is turned into symbols.

The rules follow NVIDIA's Tacotron2 reference (``text/numbers.py``, itself from Keith Ito's Tacotron): thousands
separators are dropped, ``$`` amounts become dollars and cents, ordinals (``1st``, ``22nd``) ordinal words, and plain
integers cardinal words, read as years between 1000 and 3000 ("nineteen eighty-four", "two thousand five"). Spelling
uses the ``inflect`` package. Three deliberate differences from the reference: decimals are read digit by digit after
"point" ("3.14" -> "three point one four", not "three point fourteen"); dollar amounts are spelled as amounts, not years
("$1,250" -> "one thousand, two hundred fifty dollars", not "twelve fifty dollars"); and ``£`` amounts are read as
dollar ones are, in pounds and pence ("£3.50" -> "three pounds, fifty pence"), where the reference reads whole pounds
only ("three pounds.fifty"; its ``english_cleaners`` transliterates "£" to "ps" first and says "psthree point fifty").
``normalize_numbers(text, nvidia=True)`` follows the reference exactly (``nvidia_english_cleaners``).
"""

from __future__ import annotations

import functools
import re

_COMMA_NUMBER = re.compile(r"([0-9][0-9,]+[0-9])")
_POUNDS = re.compile(r"£([0-9.,]*[0-9]+)")
_NVIDIA_POUNDS = re.compile(r"£([0-9,]*[0-9]+)")  # whole pounds only: "£3.50" -> "3 pounds.50"
_DOLLARS = re.compile(r"\$([0-9.,]*[0-9]+)")
_DECIMAL = re.compile(r"([0-9]+\.[0-9]+)")
_ORDINAL = re.compile(r"[0-9]+(st|nd|rd|th)")
_NUMBER = re.compile(r"[0-9]+")

DOLLAR_UNITS = ("dollar", "dollars", "cent", "cents")
POUND_UNITS = ("pound", "pounds", "penny", "pence")
"""A currency's units for :func:`_expand_amount`: the main unit, singular and plural, then the hundredth's."""


@functools.lru_cache(maxsize=None)
def _engine():
    """inflect's engine, built on first use: importing inflect takes ~2 s (its typeguard checks), which every process
    that imports the models (a vocoder's ranks, the tests) would pay at start-up for text it never reads."""
    import inflect

    return inflect.engine()


def _words(number: int) -> str:
    """Cardinal words for a non-negative integer, with no "and" ("one hundred five")."""
    return _engine().number_to_words(number, andword="")


def _spell_integer(number: int) -> str:
    """Cardinal words, reading 1001-2999 like a year (NVIDIA's rule)."""
    if not 1000 < number < 3000:
        return _words(number)
    if number == 2000:
        return "two thousand"
    if 2000 < number < 2010:
        return "two thousand " + _words(number % 100)
    if number % 100 == 0:
        return _words(number // 100) + " hundred"
    # In pairs of digits: 1984 -> "nineteen eighty-four", 1905 -> "nineteen oh five".
    return _engine().number_to_words(number, andword="", zero="oh", group=2).replace(", ", " ")


def _expand_amount(match: re.Match, units: tuple[str, str, str, str] = DOLLAR_UNITS, spell=_words) -> str:
    """The words of ``match.group(1)``, an amount after its currency sign (``"3.50"``, ``"1,000"``, ``".01"``), in
    ``units``: ``"three dollars, fifty cents"`` (numbers as ``spell`` writes them; a unit of one singular, a zero part
    left out, ``"zero dollars"`` for none). NVIDIA's ``_expand_dollars`` with its units a parameter; more than one
    point (``"1.2.3"``): the digits and the plural unit."""
    one, many, hundredth, hundredths = units
    amount = match.group(1).replace(",", "")
    parts = amount.split(".")
    if len(parts) > 2:
        return f"{amount} {many}"  # not an amount we can read (e.g. "$1.2.3"); leave the digits
    whole = int(parts[0]) if parts[0] else 0
    fraction = int(parts[1]) if len(parts) > 1 and parts[1] else 0
    spelled = [f"{spell(whole)} {one if whole == 1 else many}"] if whole else []
    spelled += [f"{spell(fraction)} {hundredth if fraction == 1 else hundredths}"] if fraction else []
    return ", ".join(spelled) or f"zero {many}"


def _expand_decimal(match: re.Match) -> str:
    whole, fraction = match.group(1).split(".")
    return f"{_words(int(whole))} point {' '.join(_words(int(d)) for d in fraction)}"


def normalize_numbers(text: str, nvidia: bool = False) -> str:
    """Replace every number in ``text`` with English words; case and everything else is kept.

    Examples: ``"$3.50"`` -> ``"three dollars, fifty cents"``; ``"£3.50"`` -> ``"three pounds, fifty pence"``;
    ``"£0.01"`` -> ``"one penny"``; ``"1,000,000"`` -> ``"one million"``; ``"3.14"`` -> ``"three point one four"``;
    ``"21st"`` -> ``"twenty-first"``; ``"1984"`` -> ``"nineteen eighty-four"``. ``nvidia``: NVIDIA's rules, amounts
    read by the integer rule (``"$1,250"`` -> ``"twelve fifty dollars"``), whole pounds only (``"£3.50"`` -> ``"three
    pounds.fifty"``), decimals as two integers (``"3.14"`` -> ``"three point fourteen"``), ordinals with "and"
    (``"101st"`` -> ``"one hundred and first"``).
    """
    text = _COMMA_NUMBER.sub(lambda m: m.group(1).replace(",", ""), text)
    if nvidia:
        text = _NVIDIA_POUNDS.sub(lambda m: f"{m.group(1)} pounds", text)
    else:
        text = _POUNDS.sub(lambda m: _expand_amount(m, POUND_UNITS), text)
    text = _DOLLARS.sub(lambda m: _expand_amount(m, DOLLAR_UNITS, str if nvidia else _words), text)
    text = _DECIMAL.sub(lambda m: m.group(1).replace(".", " point ") if nvidia else _expand_decimal(m), text)
    text = _ORDINAL.sub(lambda m: _engine().number_to_words(m.group(0), **({} if nvidia else {"andword": ""})), text)
    return _NUMBER.sub(lambda m: _spell_integer(int(m.group(0))), text)
