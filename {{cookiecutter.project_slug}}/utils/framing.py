"""The two mel framings (``audio.mel_framing``) and how a record made before the setting existed reads: shared by the
audio code (``utils/data/audio.py``), the mel folders and the checkpoints, which each record the audio settings their
mels were made with. Imports nothing of the project."""

from __future__ import annotations

from typing import Any, Literal, Mapping, get_args

Framing = Literal["nvidia", "jik876"]
UNRESOLVED_FRAMING = "jik876"
"""The framing of an ``audio.mel_framing`` left unresolved (a config read without its model) or missing (a checkpoint
or mel folder made before the setting existed, all framed so). A checkpoint's null is read with its model:
:func:`saved_framing`."""


def recorded_audio(settings: Mapping) -> dict:
    """Recorded audio settings (``AudioConfig.model_dump()``, a mel folder's) with the framing filled in
    (:data:`UNRESOLVED_FRAMING` where None or missing), for comparing records made before and after the setting."""
    return {**settings, "mel_framing": settings.get("mel_framing") or UNRESOLVED_FRAMING}


def saved_framing(saved: Mapping[str, Any], recipe: Mapping[str, Any]) -> tuple[Framing, bool]:
    """The framing of the mels the weights of ``saved`` (a checkpoint's entries) were trained on, and whether it is
    assumed: its config's ``audio.mel_framing``; :data:`UNRESOLVED_FRAMING` where the key is missing (a checkpoint made
    before the setting existed); where null in an imported file (a ``source`` entry, step 0: ``scripts.import_weights``
    wrote null before it resolved the model's recipe, and so did a release of such a file), the model's reference
    framing, its ``recipe``'s (``ModelSpec.recipe``; :data:`UNRESOLVED_FRAMING`, the project's, where it names none),
    assumed (True: the caller says so). Raises ValueError for a value that is no framing."""
    config = saved.get("config")
    audio = config.get("audio") if isinstance(config, Mapping) else None
    audio = audio if isinstance(audio, Mapping) else {}
    framing = audio.get("mel_framing")
    if framing is None and "mel_framing" in audio and "source" in saved and saved.get("step") == 0:
        return recipe.get("audio.mel_framing") or UNRESOLVED_FRAMING, True
    if framing not in (None, *get_args(Framing)):
        raise ValueError(f"its config's audio.mel_framing {framing!r} is none of {', '.join(get_args(Framing))}")
    return framing or UNRESOLVED_FRAMING, False
