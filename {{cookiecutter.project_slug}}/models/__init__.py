"""The models by name (``--model NAME``): one import line and one ``SPEC`` line each (the generator prunes by line)."""

from model import ModelSpec
from models import hifigan
from models import matcha
from models import tacotron2
from models import waveglow
from utils.config import SHARED_SECTION_NAMES, ModelSection


def registry(*specs: ModelSpec) -> dict[str, ModelSpec]:
    """``{name: spec}`` in the order given (``model.py`` says what a spec holds).

    Raises:
        ValueError: a name given twice, not an identifier, or that of a shared section (audio, data, train, optimizer)
            or "tiny";
            a section class that is not a :class:`utils.config.ModelSection`.
    """
    found: dict[str, ModelSpec] = {}
    for spec in specs:
        if not spec.name.isidentifier() or spec.name in SHARED_SECTION_NAMES or spec.name == "tiny":
            shared = ", ".join(SHARED_SECTION_NAMES)
            raise ValueError(f"model name {spec.name!r} must be an identifier other than {shared}, tiny")
        if spec.name in found:
            raise ValueError(f"model name {spec.name!r} is registered twice")
        if not (isinstance(spec.config_cls, type) and issubclass(spec.config_cls, ModelSection)):
            raise ValueError(f"model {spec.name!r}: its config_cls {spec.config_cls!r} is not a utils.config.ModelSection "
                             "(the section every model has: batch_size)")
        found[spec.name] = spec
    return found


MODELS: dict[str, ModelSpec] = registry(
    hifigan.SPEC,
    matcha.SPEC,
    tacotron2.SPEC,
    waveglow.SPEC,
)
