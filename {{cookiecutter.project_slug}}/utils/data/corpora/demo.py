"""What the demo corpus (``scripts.make_demo_corpus``) takes of a layout: each layout's module gives it as ``DEMO``, a
:class:`DemoLayout` (its real corpus's rate, names and files, and the writer of its index), whose writer takes the
utterances as :class:`Line` records; and the helpers the writers share."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import soundfile as sf

from utils.data.audio import save_wav


class Speaker(NamedTuple):
    """One speaker of the corpus: its ``name`` in the layout (``19``), its LibriVox ``chapter`` (where the layout
    names one), what a layout's speaker table says of it (``gender``, F or M, and ``accent``) and the ``voice`` that
    speaks it (``flite slt``)."""

    name: str
    chapter: str
    gender: str
    accent: str
    voice: str


class Line(NamedTuple):
    """One utterance as the layout names it: ``id``, ``speaker``, ``text``, and ``audio``, its file's path relative to
    the corpus folder (where the index holds the audio: to the scratch folder the writer is given)."""

    id: str
    speaker: Speaker
    text: str
    audio: str


LIBRIVOX = (("19", "198"), ("26", "495"), ("27", "123349"), ("32", "21625"), ("39", "121914"), ("40", "121026"),
            ("60", "121082"), ("78", "368"), ("83", "3054"), ("87", "121553"), ("89", "218"), ("103", "1240"))
"""LibriVox ``(reader, chapter)`` ids: speaker ``k``'s name and chapter in a layout that names none of its own."""


class DemoLayout(NamedTuple):
    """How a corpus ships, as the demo corpus writes it: its sampling ``rate`` (Hz); the ``id`` and ``audio`` path
    (relative to the corpus folder) of an utterance, as formats of ``spk`` (the speaker's name), ``chapter``, ``i``
    (the utterance's number in the corpus, from 1), ``n`` (in the speaker's, from 1) and ``para`` (``n - 1``); its
    index writer ``(folder, lines, scratch)`` (the corpus folder, the :class:`Line` records, the scratch folder); the
    globs of its ``index`` (a corpus is there: refused without --overwrite; removed first) and ``data`` (removed
    before writing); the package it ``needs``; what the closing line ``shows``; the real ``corpus`` its rate is of
    (``--help`` names it); its ``speakers`` (speaker ``k``: ``(name, chapter)``); ``single``: why it has one speaker
    (empty: as many as ``speakers``); ``validates``: whether its last :func:`validating` utterances are a validation
    split; ``packed``: whether the index holds the audio (written to the scratch folder first)."""

    rate: int
    id: str
    audio: str
    write_index: Callable[[Path, list[Line], Path], None]
    index: tuple[str, ...]
    data: tuple[str, ...] = ()
    needs: str = ""
    shows: str = ""
    corpus: str = ""
    speakers: tuple[tuple[str, str], ...] = LIBRIVOX
    single: str = ""
    validates: bool = False
    packed: bool = False


def validating(count: int) -> int:
    """How many of the last of ``count`` utterances validate where a layout has two lists: ``max(1, count // 10)``."""
    return max(1, count // 10)


def write_text(path: Path, text: str) -> None:
    """``text`` as the UTF-8 file ``path``, creating its folders."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def write_audio(path: Path, audio: np.ndarray, sampling_rate: int) -> None:
    """``audio`` ``(T,)`` as mono 16-bit PCM at ``sampling_rate`` Hz: FLAC for a ``.flac`` path, else wav."""
    if path.suffix == ".flac":
        path.parent.mkdir(parents=True, exist_ok=True)
        sf.write(str(path), np.clip(audio, -1.0, 1.0), sampling_rate, format="FLAC", subtype="PCM_16")
    else:
        save_wav(path, audio, sampling_rate)
