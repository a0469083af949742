"""The utterance table every corpus reader fills (:class:`Corpus`: arrays, not per-item objects), the ``data``
section, and a corpus's problems: a one-line :class:`DataError` naming the file (and line or id), or a
:class:`BadClip` collected in ``bad`` (``data.on_bad_clip=skip``). The readers of each layout are in
``utils/data/corpora/``."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from types import ModuleType
from typing import ClassVar, Iterable, Literal, Mapping, NamedTuple, Sequence, Union

import numpy as np
from pydantic import Field

from utils.config import Section

PathLike = Union[str, Path]

Layout = Literal["auto", "ljspeech", "filelist"]
"""The core's ``data.format`` values: detected, or one of its two readers' (a part widens it with the layouts it
adds)."""


class DataConfig(Section):
    """The ``data`` section: where the corpus is and how it is loaded. ``layouts``: the layouts a part adds, name ->
    reader module (``utils.data.corpora``'s interface), in the order ``auto`` tries them; the core's class has none."""

    layouts: ClassVar[Mapping[str, ModuleType]] = {}
    dataset_path: str = "data/LJSpeech-1.1"  # the corpus's root folder, in the layout data.format names
    format: Layout = "auto"  # the corpus's layout; auto: detected (the run's first lines say which)
    # filelists (path|text or path|speaker|text), or a part layout's lists; empty: the layout's own split
    training_files: str = ""
    validation_files: str = ""
    val_size: int = Field(100, ge=1)  # where the layout has no validation split: its last ones validate
    num_workers: int = Field(4, ge=0)  # DataLoader workers per rank, each keeping prefetch_factor batches ready
    prefetch_factor: int = Field(2, ge=1)
    persistent_workers: bool = True  # the epoch reaches them in shared memory (AudioMelDataset)
    on_bad_clip: Literal["error", "skip"] = "error"  # bad clips found at start-up: stop, or train without them
    exclude: list[str] = Field(default_factory=list)  # utterance ids left out (a malformed line's: metadata.csv:LINE)
    # the run's speaker map, name per index (utils.data.speakers): set by train.py from the training split (and
    # --init-from's map), recorded with the config; a config's own value is replaced
    speakers: list[str] = Field(default_factory=list)


class DataError(ValueError):
    """The corpus is missing, malformed or unreadable; the message names the file (and line or id)."""


GET_DATA = ("get LJSpeech with scripts/dataset.sh data, or a small demo corpus with python -m scripts.make_demo_corpus "
            "--output data/demo, or point --dataset-path at a corpus's root folder: data.format names its layout")  # where one is missing

SINGLE_SPEAKER = "LJ"
"""The speaker of a layout that names none (an LJSpeech-layout folder, ``path|text`` filelists): LJSpeech's reader."""


class Utterance(NamedTuple):
    """One recording, as :class:`Corpus` gives it: its id, audio source (a file path, ``PATH#t=START,END`` seconds of
    one, or ``FILE#row=N``, a table's row: ``utils.data.sources``), transcript, speaker, language (``""``: unknown)
    and duration (seconds; NaN where the layout gives none: its header says)."""

    id: str
    audio: str
    text: str
    speaker: str = SINGLE_SPEAKER
    language: str = ""
    duration: float = math.nan


class Strings:
    """``N`` strings packed as Arrow packs them: one UTF-8 byte array and ``N + 1`` int64 offsets (string ``i`` is
    bytes ``offsets[i]:offsets[i + 1]``). Loader workers forked from the process that read the corpus share these two
    arrays; a list's items are objects whose reference counts the workers write, which copies their pages."""

    __slots__ = ("data", "offsets")

    def __init__(self, values: Iterable[str] = ()):
        encoded = [value.encode() for value in values]
        self.offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(value) for value in encoded], out=self.offsets[1:])
        self.data = np.frombuffer(b"".join(encoded), dtype=np.uint8)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> str:
        return self.data[self.offsets[index]:self.offsets[index + 1]].tobytes().decode()

    def tolist(self) -> list[str]:
        """Every string, in order."""
        return [self[i] for i in range(len(self))]

    @classmethod
    def join(cls, parts: Sequence[Strings]) -> Strings:
        """``parts`` one after the other."""
        joined = cls()
        if parts:
            joined.data = np.concatenate([part.data for part in parts])
            shifts = np.cumsum([0] + [int(part.offsets[-1]) for part in parts[:-1]])
            joined.offsets = np.concatenate([[0], *(part.offsets[1:] + shift for part, shift in zip(parts, shifts))])
        return joined

    def take(self, indices: np.ndarray) -> Strings:
        """The strings at ``indices`` (int array ``(M,)``), gathered without a Python object per string."""
        indices = np.asarray(indices, dtype=np.int64)
        taken = Strings()
        if len(indices) and indices[0] >= 0 and (np.diff(indices) == 1).all():  # a run: a slice, no index per byte
            first, last = self.offsets[indices[0]], self.offsets[indices[-1] + 1]
            taken.data, taken.offsets = self.data[first:last], self.offsets[indices[0]:indices[-1] + 2] - first
            return taken
        starts, sizes = self.offsets[indices], self.offsets[indices + 1] - self.offsets[indices]
        taken.offsets = np.zeros(len(indices) + 1, dtype=np.int64)
        np.cumsum(sizes, out=taken.offsets[1:])
        # byte k of the result comes from byte k - (its string's start in the result) + (its start here)
        taken.data = self.data[np.repeat(starts - taken.offsets[:-1], sizes) + np.arange(taken.offsets[-1])]
        return taken


@dataclasses.dataclass(frozen=True, eq=False)
class Corpus:
    """``N`` utterances as columns of equal length: ``ids``, ``audio``, ``text``, ``speaker``, ``language``
    (:class:`Strings`) and ``duration`` (float64 ``(N,)`` seconds, NaN where the layout gives none). ``corpus[i]`` is
    utterance ``i`` as an :class:`Utterance`; iterating gives them in corpus order. Lengths in samples or mel frames,
    read from durations and headers without decoding audio: ``utils.data.sources.clip_samples``."""

    ids: Strings
    audio: Strings
    text: Strings
    speaker: Strings
    language: Strings
    duration: np.ndarray

    @classmethod
    def of(cls, rows: Iterable[Utterance]) -> Corpus:
        """The table of ``rows`` (a reader's :class:`Utterance` records), in their order."""
        columns = list(zip(*rows)) or [()] * len(Utterance._fields)
        return cls(*(Strings(column) for column in columns[:5]), np.asarray(columns[5], dtype=np.float64))

    @classmethod
    def join(cls, parts: Sequence[Corpus]) -> Corpus:
        """``parts`` one after the other."""
        columns = ("ids", "audio", "text", "speaker", "language")
        return cls(*(Strings.join([getattr(part, column) for part in parts]) for column in columns),
                   np.concatenate([part.duration for part in parts]) if parts else np.zeros(0))

    def __len__(self) -> int:
        return len(self.duration)

    def __getitem__(self, index: int) -> Utterance:
        if not -len(self) <= index < len(self):
            raise IndexError(f"utterance {index} of a corpus of {len(self)}")
        index %= len(self)
        duration = float(self.duration[index])
        return Utterance(self.ids[index], self.audio[index], self.text[index], self.speaker[index],
                         self.language[index], duration if duration == duration else math.nan)  # one NaN: rows compare

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Corpus) and len(self) == len(other) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def take(self, indices: Sequence[int]) -> Corpus:
        """The utterances at ``indices``, in that order (a split, a subset left after a filter)."""
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        return Corpus(*(column.take(indices) for column in (self.ids, self.audio, self.text, self.speaker,
                                                             self.language)), self.duration[indices])


class BadClip(NamedTuple):
    """One utterance (or corpus line) that cannot be trained on: its id, its audio (or the list file and line), and
    why. A line without a usable id (malformed, an id already used) gets the id ``<file name>:<line>``
    (``metadata.csv:7``)."""

    id: str
    path: str
    reason: str
