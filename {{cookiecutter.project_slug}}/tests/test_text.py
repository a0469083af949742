"""The text front end: cleaners, number spelling, the symbol table and id conversion."""

import json
import warnings

import pytest
from conftest import REFERENCE

from models.tacotron2.text import sequence_to_text, text_to_sequence
from models.tacotron2.text.cleaners import basic_cleaners, clean_text, english_cleaners, transliteration_cleaners
from models.tacotron2.text.numbers import normalize_numbers
from models.tacotron2.text.symbols import ARPABET, symbol_to_id, symbols


@pytest.mark.parametrize("text, expected", [
    ("$3.50", "three dollars, fifty cents"),
    ("$1", "one dollar"),
    ("$0.01", "one cent"),
    ("$2.00", "two dollars"),
    ("$1,250", "one thousand, two hundred fifty dollars"),  # inflect keeps its group comma
    ("£12", "twelve pounds"),
    ("1,000,000 people", "one million people"),
    ("3.14", "three point one four"),
    ("42", "forty-two"),
    ("105", "one hundred five"),
])
def test_numbers_amounts_and_decimals(text, expected):
    assert english_cleaners(text) == expected


def test_pound_amounts_are_read_in_pounds_and_pence_as_dollar_amounts_in_dollars_and_cents():
    """Pounds and pence, a unit of one singular; NVIDIA's rules read whole pounds only (its ``normalize_numbers``:
    "three pounds.fifty"), and its ``english_cleaners`` makes "£" "ps" before (``tests/data/reference/text_nvidia.json``:
    "£12" is "pstwelve")."""
    assert [english_cleaners(text) for text in ("£3.50", "£1", "£0.01", "£1.01", "£.50", "£2.00", "£1,000",
                                                "£2,500.75", "It cost £3.50.")] == [
        "three pounds, fifty pence", "one pound", "one penny", "one pound, one penny", "fifty pence", "two pounds",
        "one thousand pounds", "two thousand, five hundred pounds, seventy-five pence", "it cost three pounds, fifty pence."]
    assert normalize_numbers("£3.50", nvidia=True) == "three pounds.fifty"
    assert clean_text("£3.50", ["nvidia_english_cleaners"]) == "psthree point fifty"


@pytest.mark.parametrize("text, expected", [
    ("1st", "first"), ("2nd", "second"), ("3rd", "third"), ("4th", "fourth"), ("22nd", "twenty-second"),
    ("101st", "one hundred first"),
])
def test_ordinals(text, expected):
    assert english_cleaners(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("1984", "nineteen eighty-four"), ("1905", "nineteen oh five"), ("1900", "nineteen hundred"),
    ("2000", "two thousand"), ("2005", "two thousand five"), ("2019", "twenty nineteen"),
    ("1000", "one thousand"), ("3000", "three thousand"),
])
def test_years_read_like_nvidia(text, expected):
    assert normalize_numbers(text) == expected


def test_abbreviations_expand_case_insensitively():
    text = ("Mr. and Mrs. Smith met Dr. Jones, Drs. Lee, St. Paul, Jr., Maj. Gen. Rev. Lt. Hon. Sgt. Capt. "
            "Esq. Ltd. Co. Col. Ft. Worth")
    assert english_cleaners(text) == (
        "mister and misess smith met doctor jones, doctors lee, saint paul, junior, major general reverend "
        "lieutenant honorable sergeant captain esquire limited company colonel fort worth")


def test_abbreviation_needs_whole_word_and_full_stop():
    # "doctor" is not followed by "." after "dr", "first" contains "st" but not as a word.
    assert english_cleaners("the doctor went first.") == "the doctor went first."
    assert english_cleaners("Dr Who") == "dr who"


def test_full_english_pipeline():
    text = "  Dr. Smith\tpaid $3.50 on the 2nd of May,\n1984 at Café Ünïcode.  "
    assert english_cleaners(text).strip() == (
        "doctor smith paid three dollars, fifty cents on the second of may, nineteen eighty-four at "
        "cafe unicode.")


def test_other_cleaners():
    assert basic_cleaners("Hello   WORLD\n") == "hello world "
    assert transliteration_cleaners("Ça  va") == "ca va"
    with pytest.raises(ValueError, match="unknown text cleaner 'nope'"):
        clean_text("x", ["nope"])


def test_symbol_table_matches_nvidia():
    assert len(symbols) == 148
    assert symbols[0] == "_"
    assert len(ARPABET) == 84 and ARPABET[0] == "@AA" and "@ZH" in ARPABET
    assert len(set(symbols)) == len(symbols)
    for char in "-!'(),.:;? " + "abcxyzABCXYZ":
        assert char in symbol_to_id
    # NVIDIA's order: pad, "-", punctuation, letters, ARPAbet.
    assert symbol_to_id["-"] == 1 and symbol_to_id["A"] == 12 and symbol_to_id["a"] == 38


def test_text_to_sequence_round_trip():
    ids = text_to_sequence("Hello, Dr. Who!")
    assert all(isinstance(i, int) and 0 < i < len(symbols) for i in ids)
    assert sequence_to_text(ids) == "hello, doctor who!"


def test_inline_arpabet():
    ids = text_to_sequence("Turn {L EH1 F T} now")
    assert symbol_to_id["@EH1"] in ids
    assert sequence_to_text(ids) == "turn {L EH1 F T} now"


@pytest.fixture
def nothing_reported(monkeypatch):
    """A process that has not yet reported any dropped symbol."""
    import models.tacotron2.text
    monkeypatch.setattr(models.tacotron2.text, "_REPORTED", set())


def test_unknown_character_is_dropped_with_a_warning_naming_it(nothing_reported):
    with pytest.warns(UserWarning, match=r"'/'"):
        ids = text_to_sequence("a/b")
    assert sequence_to_text(ids) == "ab"
    with pytest.warns(UserWarning, match="'é'"):
        ids = text_to_sequence("né", ["basic_cleaners"])
    assert sequence_to_text(ids) == "n"
    with pytest.warns(UserWarning, match="@XX"):
        assert text_to_sequence("{XX}") == []


def test_a_dropped_symbol_is_reported_once_per_process(nothing_reported):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # not Python's once-per-message filter: our own rule
        for text in ("a/b", "c/d", "e/f~", "g~/h"):
            text_to_sequence(text)
    assert [str(w.message) for w in caught] == [
        "text_to_sequence: dropped symbol(s) not in the symbol table: '/'",
        "text_to_sequence: dropped symbol(s) not in the symbol table: '~'"]


def test_known_text_gives_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        text_to_sequence("It cost $5, i.e. 500 cents; fine?")


def test_sequence_to_text_rejects_bad_ids():
    with pytest.raises(ValueError, match="id 500"):
        sequence_to_text([5, 500])


def test_nvidia_english_cleaners_give_nvidias_ids_and_ours_differ_where_the_manual_says():
    """``tests/data/reference/text_nvidia.json``: NVIDIA's ``text_to_sequence(t, ['english_cleaners'])`` of 26
    sentences. ``nvidia_english_cleaners`` gives every one; the project's ``english_cleaners`` differs on exactly the
    8 the manual's table lists (ordinals with "and", "£", decimals, "_", the ends, ARPAbet after a newline)."""
    doc = json.loads((REFERENCE / "text_nvidia.json").read_text(encoding="utf-8"))
    assert doc["symbols"] == symbols
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the dropped symbols ("%", "&", "#", ...) are reported
        for entry in doc["sentences"]:
            assert text_to_sequence(entry["text"], ["nvidia_english_cleaners"]) == entry["ids"], entry["text"]
        differing = {entry["text"] for entry in doc["sentences"] if text_to_sequence(entry["text"]) != entry["ids"]}
    assert differing == {
        "Mr. and Mrs. Jones live on 101st Street.", "It cost £12, not $1,000,000.",
        "Pi is 3.14159 and e is about 2.718.", "$0.99, $1, $1.01, $.50 and $3.50.5",
        "1st, 2nd, 3rd, 4th, 11th, 21st, 22nd, 112th, 1,000th.", "100% sure & more #" "1 @home ~ _under_ [x] <y>",
        "  Leading and trailing spaces  ", "Line one\n{HH AH0 L OW1} two."}


@pytest.mark.parametrize("text, nvidia", [
    ("101st", "one hundred and first"), ("£12", "pstwelve"), ("3.14", "three point fourteen"),
    ("$1,250", "twelve fifty dollars"), ("$3.50", "three dollars, fifty cents"),
])
def test_nvidia_number_rules(text, nvidia):
    assert clean_text(text, ["nvidia_english_cleaners"]) == nvidia
