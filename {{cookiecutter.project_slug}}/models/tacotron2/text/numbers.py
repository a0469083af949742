"""Spell out numbers in English text before it is turned into symbols.

The rules follow NVIDIA's Tacotron2 reference (``text/numbers.py``, itself from Keith Ito's Tacotron): thousands
separators are dropped, ``£`` and ``$`` amounts become pounds / dollars and cents, ordinals (``1st``, ``22nd``) ordinal
words, and plain integers cardinal words, read as years between 1000 and 3000 ("nineteen eighty-four", "two thousand
five"). Spelling uses the ``inflect`` package. Two deliberate differences from the reference: decimals are read digit by
digit after "point" ("3.14" -> "three point one four", not "three point fourteen"), and dollar amounts are spelled as
amounts, not years ("$1,250" -> "one thousand, two hundred fifty dollars", not "twelve fifty dollars").
``normalize_numbers(text, nvidia=True)`` follows the reference exactly (``nvidia_english_cleaners``).
"""

from __future__ import annotations

import functools
import re

_COMMA_NUMBER = re.compile(r"([0-9][0-9,]+[0-9])")
_POUNDS = re.compile(r"£([0-9,]*[0-9]+)")
_DOLLARS = re.compile(r"\$([0-9.,]*[0-9]+)")
_DECIMAL = re.compile(r"([0-9]+\.[0-9]+)")
_ORDINAL = re.compile(r"[0-9]+(st|nd|rd|th)")
_NUMBER = re.compile(r"[0-9]+")


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


def _expand_dollars(match: re.Match, spell=_words) -> str:
    amount = match.group(1).replace(",", "")
    parts = amount.split(".")
    if len(parts) > 2:
        return amount + " dollars"  # not an amount we can read (e.g. "$1.2.3"); leave the digits
    dollars = int(parts[0]) if parts[0] else 0
    cents = int(parts[1]) if len(parts) > 1 and parts[1] else 0
    spelled = [f"{spell(dollars)} {'dollar' if dollars == 1 else 'dollars'}"] if dollars else []
    spelled += [f"{spell(cents)} {'cent' if cents == 1 else 'cents'}"] if cents else []
    return ", ".join(spelled) or "zero dollars"


def _expand_pounds(match: re.Match) -> str:
    amount = int(match.group(1).replace(",", ""))
    return f"{_words(amount)} {'pound' if amount == 1 else 'pounds'}"


def _expand_decimal(match: re.Match) -> str:
    whole, fraction = match.group(1).split(".")
    return f"{_words(int(whole))} point {' '.join(_words(int(d)) for d in fraction)}"


def normalize_numbers(text: str, nvidia: bool = False) -> str:
    """Replace every number in ``text`` with English words; case and everything else is kept.

    Examples: ``"$3.50"`` -> ``"three dollars, fifty cents"``; ``"£12"`` -> ``"twelve pounds"``; ``"1,000,000"`` ->
    ``"one million"``; ``"3.14"`` -> ``"three point one four"``; ``"21st"`` -> ``"twenty-first"``; ``"1984"`` ->
    ``"nineteen eighty-four"``. ``nvidia``: NVIDIA's rules, amounts read by the integer rule (``"$1,250"`` ->
    ``"twelve fifty dollars"``), decimals as two integers (``"3.14"`` -> ``"three point fourteen"``), ordinals with
    "and" (``"101st"`` -> ``"one hundred and first"``).
    """
    text = _COMMA_NUMBER.sub(lambda m: m.group(1).replace(",", ""), text)
    text = _POUNDS.sub(lambda m: f"{m.group(1)} pounds" if nvidia else _expand_pounds(m), text)
    text = _DOLLARS.sub(lambda m: _expand_dollars(m, str if nvidia else _words), text)
    text = _DECIMAL.sub(lambda m: m.group(1).replace(".", " point ") if nvidia else _expand_decimal(m), text)
    text = _ORDINAL.sub(lambda m: _engine().number_to_words(m.group(0), **({} if nvidia else {"andword": ""})), text)
    return _NUMBER.sub(lambda m: _spell_integer(int(m.group(0))), text)
