"""The registry: every model this project trains, by name (``--model NAME``), in the order listed here.

Adding a model is two lines: its import and its ``SPEC`` in the list (``model.py`` says what a spec holds)."""

from model import ModelSpec, registry
from models import hifigan
from models import tacotron2
from models import waveglow
from utils.config import SHARED_SECTIONS

MODELS: dict[str, ModelSpec] = registry(
    hifigan.SPEC,
    tacotron2.SPEC,
    waveglow.SPEC,
)


def config_schemas() -> dict[str, type]:
    """Section name -> its class: the shared sections, then one per registered model."""
    return {**SHARED_SECTIONS, **{name: spec.config_cls for name, spec in MODELS.items()}}
