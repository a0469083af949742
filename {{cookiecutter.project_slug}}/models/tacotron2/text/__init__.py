"""Text front end: clean a transcript and map it to the integer ids Tacotron2 embeds.

``text_to_sequence("Dr. Who?")`` cleans the text with the named cleaners (:mod:`models.tacotron2.text.cleaners`) and
looks every character up in the symbol table (:mod:`models.tacotron2.text.symbols`). As in NVIDIA's Tacotron2 reference,
ARPAbet phones may be written inline between curly braces: ``"Turn {L EH1 F T} here"``.

A character that is not in the table (after cleaning) is dropped with a :class:`UserWarning` that names it; it never
raises.
"""

from __future__ import annotations

import re
import warnings
from typing import Sequence

from models.tacotron2.text.cleaners import clean_text
from models.tacotron2.text.symbols import id_to_symbol, symbol_to_id, symbols

__all__ = ["text_to_sequence", "sequence_to_text", "symbols"]

_CURLY = re.compile(r"(.*?)\{(.+?)\}(.*)", re.DOTALL)


def _lookup(items: Sequence[str], dropped: list[str]) -> list[int]:
    ids = []
    for item in items:
        index = symbol_to_id.get(item)
        if index is None or item == "_":  # "_" is padding, never real text
            dropped.append(item)
        else:
            ids.append(index)
    return ids


def text_to_sequence(text: str, cleaner_names: Sequence[str] = ("english_cleaners",)) -> list[int]:
    """Clean ``text`` and convert it to a list of symbol ids.

    Args:
        text: a transcript; ``{...}`` spans hold space-separated ARPAbet phones (``{HH AH0 L OW1}``), which are not
            cleaned.
        cleaner_names: cleaners to apply in order (names from :data:`models.tacotron2.text.cleaners.CLEANERS`).

    Returns:
        Symbol ids (``0 < id < len(symbols)``; id 0 is padding and never produced). May be empty if nothing in ``text``
        maps to a symbol.

    Raises:
        ValueError: an unknown cleaner name.

    Warns: UserWarning: naming each character (or phone) that is not in the symbol table and was dropped, the first time
    this process drops it (later transcripts holding it are not reported again).
    """
    ids: list[int] = []
    dropped: list[str] = []
    rest = text.strip()
    while rest:
        match = _CURLY.match(rest)
        if match is None:
            ids += _lookup(clean_text(rest, cleaner_names), dropped)
            break
        before, phones, rest = match.groups()
        ids += _lookup(clean_text(before, cleaner_names), dropped)
        ids += _lookup(["@" + phone for phone in phones.split()], dropped)
    new = [c for c in dict.fromkeys(dropped) if c not in _REPORTED]
    if new:
        _REPORTED.update(new)
        warnings.warn(f"text_to_sequence: dropped symbol(s) not in the symbol table: "
                      f"{', '.join(repr(c) for c in new)}", stacklevel=2)
    return ids


_REPORTED: set[str] = set()
"""Symbols already reported as dropped in this process: each is reported once, however many transcripts hold it."""


def sequence_to_text(sequence: Sequence[int]) -> str:
    """Map symbol ids back to a string; ARPAbet phones come back wrapped in braces.

    Args:
        sequence: ids (ints or a 1-D tensor's ``.tolist()``); padding id 0 is skipped.

    Raises:
        ValueError: an id outside ``[0, len(symbols))``.
    """
    out = []
    for index in sequence:
        index = int(index)
        if index not in id_to_symbol:
            raise ValueError(f"sequence_to_text: id {index} is outside the symbol table (0..{len(symbols) - 1})")
        if index == 0:
            continue
        symbol = id_to_symbol[index]
        out.append("{" + symbol[1:] + "}" if symbol.startswith("@") else symbol)
    return "".join(out).replace("}{", " ")
