"""The models by name (``--model NAME``): one import line and one ``SPEC`` line each (the generator prunes by line)."""

from model import ModelSpec
from models import hifigan
from models import tacotron2
from models import waveglow
from utils.training.settings import SHARED_SECTIONS


def registry(*specs: ModelSpec) -> dict[str, ModelSpec]:
    """``{name: spec}`` in the order given (``model.py`` says what a spec holds).

    Raises:
        ValueError: a name given twice, not an identifier, or that of a shared section (audio, data, train) or "tiny".
    """
    found: dict[str, ModelSpec] = {}
    for spec in specs:
        if not spec.name.isidentifier() or spec.name in SHARED_SECTIONS or spec.name == "tiny":
            shared = ", ".join(SHARED_SECTIONS)
            raise ValueError(f"model name {spec.name!r} must be an identifier other than {shared}, tiny")
        if spec.name in found:
            raise ValueError(f"model name {spec.name!r} is registered twice")
        found[spec.name] = spec
    return found


MODELS: dict[str, ModelSpec] = registry(
    hifigan.SPEC,
    tacotron2.SPEC,
    waveglow.SPEC,
)


def config_schemas() -> dict[str, type]:
    """Section name -> its class: the shared sections, then one per registered model."""
    return {**SHARED_SECTIONS, **{name: spec.config_cls for name, spec in MODELS.items()}}
