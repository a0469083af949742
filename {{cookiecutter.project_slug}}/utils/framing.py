"""The two mel framings (``audio.mel_framing``) and how a record made before the setting existed reads: shared by the
audio code (``utils/data/audio.py``), the mel folders and the checkpoints, which each record the audio settings their
mels were made with. Imports nothing of the project."""

from __future__ import annotations

from typing import Literal, Mapping

Framing = Literal["nvidia", "jik876"]
UNRESOLVED_FRAMING = "jik876"
"""The framing of an ``audio.mel_framing`` left unresolved (a config read without its model) or missing (a checkpoint
or mel folder made before the setting existed, all framed so)."""


def recorded_audio(settings: Mapping) -> dict:
    """Recorded audio settings (``AudioConfig.model_dump()``, a mel folder's) with the framing filled in
    (:data:`UNRESOLVED_FRAMING` where None or missing), for comparing records made before and after the setting."""
    return {**settings, "mel_framing": settings.get("mel_framing") or UNRESOLVED_FRAMING}
