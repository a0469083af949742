"""The symbol table Tacotron2 embeds: one integer id per character or ARPAbet phone.

The same content and order as NVIDIA's Tacotron2 reference (``text/symbols.py``), so ids and the embedding size (148
rows) match checkpoints trained with that code: id 0 the padding symbol ``"_"``; the hyphen, the punctuation
``!'(),.:;?`` and the space; ``A-Z`` then ``a-z``; the 84 CMUdict ARPAbet phones (15 vowels in 4 stress variants, 24
consonants), each prefixed with ``"@"`` so that a phone such as ``@AA1`` can never be confused with letters.
"""

from __future__ import annotations

PAD = "_"
SPECIAL = "-"
PUNCTUATION = "!'(),.:;? "
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

# CMUdict phone set: vowels carry a lexical stress digit (0 none, 1 primary, 2 secondary) or none.
_VOWELS = ("AA", "AE", "AH", "AO", "AW", "AY", "EH", "ER", "EY", "IH", "IY", "OW", "OY", "UH", "UW")
_CONSONANTS = ("B", "CH", "D", "DH", "F", "G", "HH", "JH", "K", "L", "M", "N", "NG", "P", "R", "S", "SH",
               "T", "TH", "V", "W", "Y", "Z", "ZH")
ARPABET_PHONES: list[str] = sorted([v + s for v in _VOWELS for s in ("", "0", "1", "2")] + list(_CONSONANTS))
ARPABET: list[str] = ["@" + phone for phone in ARPABET_PHONES]

symbols: list[str] = [PAD] + list(SPECIAL) + list(PUNCTUATION) + list(LETTERS) + ARPABET
"""Every symbol, indexed by id (``len(symbols) == 148``)."""

symbol_to_id: dict[str, int] = {s: i for i, s in enumerate(symbols)}
id_to_symbol: dict[int, str] = dict(enumerate(symbols))
