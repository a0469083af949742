"""The registry: every model this project trains, by name (``--model NAME``), in the order listed here.

Adding a model is two lines: its import and its ``SPEC`` in the list (``model.py`` says what a spec holds)."""

from model import ModelSpec
from models import hifigan, tacotron2, waveglow
from utils.training.settings import SHARED_SECTIONS


def registry(*specs: ModelSpec) -> dict[str, ModelSpec]:
    """``{name: spec}`` in the order given (``models/__init__.py``'s list).

    Raises:
        ValueError: a name that is not an identifier, is a shared section (audio, data, train) or "tiny", or is given
            twice.
    """
    found: dict[str, ModelSpec] = {}
    for spec in specs:
        if not spec.name.isidentifier() or spec.name in SHARED_SECTIONS or spec.name == "tiny":
            raise ValueError(f"model name {spec.name!r} must be an identifier other than "
                             f"{', '.join(SHARED_SECTIONS)}, tiny")
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
