"""The run's speaker map: speaker name -> index of the model's speaker table, made from the training split (sorted
names), saved beside the checkpoints (:data:`SPEAKERS_FILE`) and in each of them (:data:`ENTRY`), verified on a
resume and extended on ``--init-from`` (:func:`settle`)."""

from __future__ import annotations

import json
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from utils.data.corpus import Corpus, DataError

SPEAKERS_FILE = "speakers.json"
"""``{name: index}`` of the run's map, in index order, in its output folder."""

ENTRY = "speakers"
"""The checkpoint entry of the map, ``{name: index}``."""

INHERITED = "speakers_inherited"
"""The checkpoint entry saying how many of the map's first names came from ``--init-from``'s map (0: none)."""


def data_speakers(corpus: Corpus) -> list[str]:
    """The speakers of ``corpus`` (the training split), sorted: index ``i`` is the ``i``-th name."""
    return sorted(set(corpus.speaker.tolist()))


def saved_map(saved: Mapping[str, Any], what: str) -> Optional[tuple[list[str], int]]:
    """The map of the checkpoint entries ``saved`` (names in index order) and how many came from ``--init-from``;
    ``None`` where it records none (written before runs kept one). DataError naming ``what``: an entry that is no
    ``{name: index}`` of indices ``0..N-1``."""
    if ENTRY not in saved:
        return None
    entry, inherited = saved[ENTRY], saved.get(INHERITED, 0)
    if (not isinstance(entry, Mapping) or not all(isinstance(name, str) for name in entry)
            or sorted(entry.values()) != list(range(len(entry))) or not isinstance(inherited, int)
            or not 0 <= inherited <= len(entry)):
        raise DataError(f"{what}: its {ENTRY!r} entry is not a speaker map (a name -> index mapping, indices 0 to N-1)")
    return sorted(entry, key=entry.__getitem__), inherited


def extended(base: Sequence[str], speakers: Sequence[str]) -> list[str]:
    """``base`` with the names of ``speakers`` it lacks appended, in their order."""
    known = set(base)
    return [*base, *(name for name in speakers if name not in known)]


def first_difference(saved: Sequence[str], made: Sequence[str]) -> str:
    """Where two maps (names in index order) first differ: ``"index 2 is 'p226' there, 'p227' here"``."""
    for index, (old, new) in enumerate(zip(saved, made)):
        if old != new:
            return f"index {index} is {old!r} there, {new!r} here"
    longer, which = (saved, "there") if len(saved) > len(made) else (made, "here")
    return f"index {min(len(saved), len(made))} is {longer[min(len(saved), len(made))]!r} {which} only"


def settle(speakers: list[str], saved: Optional[tuple[list[str], int]], what: str,
           resume: bool) -> tuple[list[str], int, Optional[str]]:
    """The run's map from the training split's sorted ``speakers`` and a checkpoint's map ``saved``
    (:func:`saved_map`; ``what`` names the checkpoint): ``(names in index order, how many came from --init-from, the
    line to say or None)``. On a resume (``resume``) the map made again (the inherited names, then the split's others,
    sorted) must be the saved one; from ``--init-from`` its map is kept and the split's new names appended, said in
    one line. No saved map: the split's.

    Raises:
        DataError: on a resume, a map other than the saved one (the first difference named).
    """
    if saved is None:
        return speakers, 0, None
    names, inherited = saved
    if resume:
        made = extended(names[:inherited], speakers)
        if made != names:
            raise DataError(f"the speaker map of the training split ({len(made)} speakers) is not the one {what} "
                            f"was trained with ({len(names)}): {first_difference(names, made)}; train on the "
                            "corpus it was trained on, or start a run from it with --init-from")
        return names, inherited, None
    merged = extended(names, speakers)
    new = merged[len(names):]
    line = (f"--init-from {what}: {len(new)} new speaker(s) appended to its map of {len(names)}: "
            f"{', '.join(new[:5])}{', ...' if len(new) > 5 else ''}") if new else None
    return merged, len(names), line


def as_entry(names: Sequence[str]) -> dict[str, int]:
    """The map ``{name: index}`` of ``names`` in index order (:data:`ENTRY`, :data:`SPEAKERS_FILE`)."""
    return {name: index for index, name in enumerate(names)}


def map_bytes(names: Sequence[str]) -> bytes:
    """``speakers.json``'s bytes for ``names`` (in index order)."""
    return json.dumps(as_entry(names), indent=2).encode()


def chosen_index(names: Sequence[str], name: Optional[str], checkpoint: str, one_voice: bool) -> Optional[int]:
    """Inference's ``--speaker`` ``name``: its index in ``checkpoint``'s map ``names``; ``None`` for a model of one
    voice (``one_voice``: no speaker table), where ``name``, if given, must be its speaker. Raises ValueError: a model
    of several voices without a name, or a name not in the map (a few of its names said)."""
    shown = ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
    if one_voice:
        if name is not None and name not in names[:1]:
            raise ValueError(f"--speaker {name}: {checkpoint} has one voice (trained on {shown or 'one speaker'})")
        return None
    if name is None:
        raise ValueError(f"{checkpoint} speaks {len(names)} voices: give --speaker NAME ({shown})")
    if name not in names:
        raise ValueError(f"--speaker {name} is not a speaker of {checkpoint}; its speakers: {shown}")
    return list(names).index(name)


def speaker_indices(corpus: Corpus, speakers: Sequence[str]) -> np.ndarray:
    """The index in ``speakers`` (the run's map, ``data.speakers``) of each utterance's speaker: int64 ``(N,)``, a
    multi-speaker model's items' ``speaker``. DataError: a speaker the map lacks (named, with its first utterance)."""
    index = {name: i for i, name in enumerate(speakers)}
    names = corpus.speaker.tolist()
    if (unknown := next((i for i, name in enumerate(names) if name not in index), None)) is not None:
        raise DataError(f"utterance '{corpus.ids[unknown]}': its speaker {names[unknown]!r} is not in the run's "
                        f"speaker map ({len(speakers)} speakers, made from the training split)")
    return np.asarray([index[name] for name in names], dtype=np.int64)
