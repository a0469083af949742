"""Matcha-TTS's text front end: the ids of shivammehta25/Matcha-TTS's ``english_cleaners2`` and blanks
(``tests/data/reference/text_matcha.json``, made by its own code with the espeak-ng recorded there), and its errors."""

import json
from pathlib import Path

import pytest

from models.matcha import text

CASES = json.loads((Path(__file__).parent / "data" / "reference" / "text_matcha.json").read_text())["cases"]


def test_the_table_is_the_references():
    """178 symbols, padding first, and ``"'"`` (in the table twice) mapped to its last id as the reference's dict."""
    assert len(text.SYMBOLS) == 178 and text.SYMBOLS[0] == "_" and text.SYMBOLS[16] == " "
    assert text.SYMBOL_TO_ID["'"] == 176 and text.SYMBOL_TO_ID["ᵻ"] == 177


@pytest.mark.parametrize("case", CASES, ids=[case["text"][:24] for case in CASES])
def test_phonemes_and_ids_equal_the_references(case):
    assert text.phonemize(case["text"]) == case["phonemes"]
    assert text.text_to_ids(case["text"]) == case["ids"]
    assert text.text_to_ids(case["text"], add_blank=False) == case["ids"][1::2]


def test_the_references_phonemes_map_to_its_ids_without_the_phonemizer():
    for case in CASES:
        assert text.phonemes_to_ids(case["phonemes"]) == case["ids"]


def test_a_phoneme_outside_the_table_is_dropped_with_one_warning():
    with pytest.warns(UserWarning, match="'§'"):
        assert text.phonemes_to_ids("a§b", add_blank=False) == [text.SYMBOL_TO_ID["a"], text.SYMBOL_TO_ID["b"]]


@pytest.mark.parametrize("line", ["", "   ", "...", "?!"])
def test_text_that_phonemizes_to_nothing_is_refused(line):
    with pytest.raises(ValueError, match="phonemizes to nothing"):
        text.text_to_ids(line)


def test_a_missing_phonemizer_or_espeak_says_what_to_install(monkeypatch):
    monkeypatch.setattr(text, "_BACKEND", [])
    monkeypatch.setattr(text, "phonemizer", None)
    with pytest.raises(text.PhonemizerMissing, match="pip install phonemizer.*espeak-ng"):
        text.text_to_ids("Hello.")
    assert text.versions() == {"phonemizer": None, "espeak-ng": None}

    def no_espeak(**kwargs):
        raise RuntimeError("espeak not installed on your system")

    monkeypatch.undo()
    monkeypatch.setattr(text, "_BACKEND", [])
    monkeypatch.setattr(text, "EspeakBackend", no_espeak)
    with pytest.raises(text.PhonemizerMissing, match="found no espeak-ng .*pip install phonemizer"):
        text.text_to_ids("Hello.")


def test_the_versions_are_recorded():
    found = text.versions()
    assert found["phonemizer"] and found["espeak-ng"] and found["espeak-ng"][0].isdigit()
