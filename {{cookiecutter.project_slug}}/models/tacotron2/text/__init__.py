"""Text front end: clean a transcript and map it to the integer ids Tacotron2 embeds.

As in NVIDIA's Tacotron2 reference, ARPAbet phones may be written inline between curly braces: ``"Turn {L EH1 F T}
here"``. A character that is not in the symbol table after cleaning is dropped with a :class:`UserWarning`; it never
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
_CURLY_NVIDIA = re.compile(r"(.*?)\{(.+?)\}(.*)")  # "." stops at a newline: no {phones} after one

_REPORTED: set[str] = set()
"""Symbols already reported as dropped in this process: each is reported once, however many transcripts hold it."""


def _lookup(items: Sequence[str], dropped: list[str], nvidia: bool = False) -> list[int]:
    ids = []
    for item in items:
        index = symbol_to_id.get(item)
        if index is None or (item == "_" and not nvidia):  # "_" is padding, never real text (NVIDIA keeps it: id 0)
            dropped.append(item)
        else:
            ids.append(index)
    return ids


def text_to_sequence(text: str, cleaner_names: Sequence[str] = ("english_cleaners",)) -> list[int]:
    """Clean ``text`` with the named cleaners (:data:`models.tacotron2.text.cleaners.CLEANERS`, in order) and convert
    it to symbol ids (``0 < id < len(symbols)``; id 0 is padding). ``{...}`` spans hold space-separated ARPAbet phones
    (``{HH AH0 L OW1}``), which are not cleaned. Empty if nothing in ``text`` maps to a symbol. With
    ``nvidia_english_cleaners``, NVIDIA's ways: the ends are not stripped, ``"_"`` is kept (id 0), and no ``{...}``
    span is read after a newline.

    Warns: UserWarning: naming each character (or phone) not in the symbol table, the first time this process drops it.

    Raises:
        ValueError: an unknown cleaner name.
    """
    ids: list[int] = []
    dropped: list[str] = []
    nvidia = "nvidia_english_cleaners" in cleaner_names
    rest = text if nvidia else text.strip()
    while rest:
        match = (_CURLY_NVIDIA if nvidia else _CURLY).match(rest)
        if match is None:
            ids += _lookup(clean_text(rest, cleaner_names), dropped, nvidia)
            break
        before, phones, rest = match.groups()
        ids += _lookup(clean_text(before, cleaner_names), dropped, nvidia)
        ids += _lookup(["@" + phone for phone in phones.split()], dropped)
    new = [c for c in dict.fromkeys(dropped) if c not in _REPORTED]
    if new:
        _REPORTED.update(new)
        warnings.warn(f"text_to_sequence: dropped symbol(s) not in the symbol table: "
                      f"{', '.join(repr(c) for c in new)}", stacklevel=2)
    return ids


def sequence_to_text(sequence: Sequence[int]) -> str:
    """Map symbol ids (ints, or a 1-D tensor's ``.tolist()``) back to a string, skipping padding id 0; ARPAbet phones
    come back wrapped in braces.

    Raises:
        ValueError: an id outside ``[0, len(symbols))``.
    """
    out = []
    for index in map(int, sequence):
        if index not in id_to_symbol:
            raise ValueError(f"sequence_to_text: id {index} is outside the symbol table (0..{len(symbols) - 1})")
        if index == 0:
            continue
        symbol = id_to_symbol[index]
        out.append("{" + symbol[1:] + "}" if symbol.startswith("@") else symbol)
    return "".join(out).replace("}{", " ")
