"""Matcha-TTS's text front end: a transcript to the phoneme ids its encoder embeds, as shivammehta25/Matcha-TTS's
``english_cleaners2`` and ``add_blank`` make them.

The transcript is transliterated to ASCII, lowercased and its English abbreviations expanded (numbers are left to
espeak-ng, which reads them); espeak-ng (US English, stress marks, punctuation kept, language-switch flags removed)
turns it into IPA phonemes through the ``phonemizer`` package; brackets are removed and whitespace collapsed; each
character is mapped through the reference's 178-symbol table, and with blanks id 0 is put around and between the ids
(``[a, b]`` -> ``[0, a, 0, b, 0]``). ``phonemizer`` and espeak-ng are GPL-3.0 programs the user installs
(``pip install phonemizer`` and the system's ``espeak-ng`` package); nothing of them is part of this project.
A phoneme not in the table is dropped with a :class:`UserWarning` (the reference raises ``KeyError``).
"""

from __future__ import annotations

import logging
import re
import warnings
from typing import Any, Optional

from unidecode import unidecode

try:  # optional: GPL-3.0, installed by the user (the manual says how)
    import phonemizer
    from phonemizer.backend import EspeakBackend
except ImportError:
    phonemizer = None
    EspeakBackend = None

INSTALL = "pip install phonemizer, and espeak-ng (apt-get install espeak-ng, brew install espeak-ng)"
"""What a project without the phonemizer is told to install."""

_PAD = "_"
_PUNCTUATION = ';:,.!?¡¿—…"«»“” '
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_IPA = ("ɑɐɒæɓʙβɔɕçɗɖðʤəɘɚɛɜɝɞɟʄɡɠɢʛɦɧħɥʜɨɪʝɭɬɫɮʟɱɯɰŋɳɲɴøɵɸθœɶʘɹɺɾɻʀʁɽʂʃʈʧʉʊʋⱱʌɣɤʍχʎʏʑʐʒʔʡʕʢǀǁǂǃˈˌːˑʼʴʰʱʲʷˠˤ˞↓↑→↗↘"
        "'̩'ᵻ")
SYMBOLS: list[str] = [_PAD, *_PUNCTUATION, *_LETTERS, *_IPA]
"""The reference's table, in its order (178 entries: padding, punctuation and space, Latin letters, IPA). ``"'"`` is
in it twice (ids 174 and 176); a phoneme maps to its last id, as the reference's dictionary does."""
SYMBOL_TO_ID: dict[str, int] = {symbol: index for index, symbol in enumerate(SYMBOLS)}
BLANK = 0

_WHITESPACE = re.compile(r"\s+")
_BRACKETS = re.compile(r"[\[\]\(\)\{\}]")
_ABBREVIATIONS: list[tuple[re.Pattern, str]] = [  # a whole word followed by a full stop, in any case
    (re.compile(rf"\b{abbr}\.", re.IGNORECASE), expansion) for abbr, expansion in [
        ("mrs", "misess"), ("mr", "mister"), ("dr", "doctor"), ("st", "saint"), ("co", "company"), ("jr", "junior"),
        ("maj", "major"), ("gen", "general"), ("drs", "doctors"), ("rev", "reverend"), ("lt", "lieutenant"),
        ("hon", "honorable"), ("sgt", "sergeant"), ("capt", "captain"), ("esq", "esquire"), ("ltd", "limited"),
        ("col", "colonel"), ("ft", "fort")]]

_BACKEND: list[Any] = []  # the espeak backend, made once a process (making one takes about 50 ms)
_REPORTED: set[str] = set()  # phonemes already reported as dropped in this process


class PhonemizerMissing(RuntimeError):
    """``phonemizer`` is not installed, or espeak-ng is not found by it."""


def clean(text: str) -> str:
    """``english_cleaners2`` before the phonemizer: ASCII transliteration, lowercase, abbreviations expanded
    (``"Dr."`` -> ``"doctor"``)."""
    text = unidecode(text).lower()
    for pattern, expansion in _ABBREVIATIONS:
        text = pattern.sub(expansion, text)
    return text


def _backend() -> Any:
    if phonemizer is None:
        raise PhonemizerMissing(f"the Matcha-TTS text front end needs phonemizer and espeak-ng: {INSTALL}")
    if not _BACKEND:
        quiet = logging.getLogger("phonemizer")
        quiet.setLevel(logging.CRITICAL)
        try:
            _BACKEND.append(EspeakBackend(language="en-us", preserve_punctuation=True, with_stress=True,
                                          language_switch="remove-flags", logger=quiet))
        except RuntimeError as error:  # phonemizer's "espeak not installed on your system"
            raise PhonemizerMissing(f"phonemizer found no espeak-ng ({error}): {INSTALL}") from error
    return _BACKEND[0]


def phonemize(text: str) -> str:
    """The IPA phonemes of ``text`` (``"Hello world."`` -> ``"həlˈoʊ wˈɜːld."``): :func:`clean`, espeak-ng through
    ``phonemizer`` (stripped), brackets removed, whitespace collapsed.

    Raises:
        PhonemizerMissing: ``phonemizer`` or espeak-ng is not installed.
    """
    lines = _backend().phonemize([clean(text)], strip=True, njobs=1)  # no line for a text of punctuation only
    phonemes = lines[0] if lines else ""
    return _WHITESPACE.sub(" ", _BRACKETS.sub("", phonemes))


def phonemes_to_ids(phonemes: str, add_blank: bool = True) -> list[int]:
    """Map each character of ``phonemes`` to its id in :data:`SYMBOLS` (``0 < id < 178``), with :data:`BLANK` around
    and between them when ``add_blank`` (``2 * n + 1`` ids for ``n`` characters).

    Warns: UserWarning: naming each character not in the table, the first time this process drops it.
    """
    ids, dropped = [], []
    for char in phonemes:
        if char in SYMBOL_TO_ID and char != _PAD:
            ids.append(SYMBOL_TO_ID[char])
        else:
            dropped.append(char)
    new = [char for char in dict.fromkeys(dropped) if char not in _REPORTED]
    if new:
        _REPORTED.update(new)
        warnings.warn(f"Matcha-TTS text: dropped phoneme(s) not in the symbol table: "
                      f"{', '.join(repr(char) for char in new)}", stacklevel=2)
    return intersperse(ids) if add_blank else ids


def intersperse(ids: list[int]) -> list[int]:
    """``ids`` with :data:`BLANK` around and between them (``[a, b]`` -> ``[0, a, 0, b, 0]``)."""
    blanked = [BLANK] * (2 * len(ids) + 1)
    blanked[1::2] = ids
    return blanked


def text_to_ids(text: str, add_blank: bool = True) -> list[int]:
    """The ids of ``text`` as the reference's ``text_to_sequence(text, ["english_cleaners2"])`` and ``intersperse``
    make them (:func:`phonemize`, then :func:`phonemes_to_ids`).

    Raises:
        PhonemizerMissing: ``phonemizer`` or espeak-ng is not installed.
        ValueError: ``text`` phonemizes to no phoneme of the table (empty, punctuation only, or only characters
            espeak-ng does not read).
    """
    ids = phonemes_to_ids(phonemize(text), add_blank=False)
    if not any(index > len(_PUNCTUATION) for index in ids):  # ids 1 .. len(_PUNCTUATION): punctuation and space
        raise ValueError(f"the text {text!r} phonemizes to nothing (no phoneme, at most punctuation)")
    return intersperse(ids) if add_blank else ids


def versions() -> dict[str, Optional[str]]:
    """The front end's programs, to record in a run: ``{"phonemizer": version, "espeak-ng": version}`` (``None``
    where one is not installed)."""
    if phonemizer is None:
        return {"phonemizer": None, "espeak-ng": None}
    try:
        espeak = ".".join(map(str, EspeakBackend.version()))
    except RuntimeError:  # phonemizer finds no espeak library
        espeak = None
    return {"phonemizer": phonemizer.__version__, "espeak-ng": espeak}
