"""The sections of ``config.json``, as ``utils.config.load_config`` takes them: kept out of the registry
(``models/__init__.py``), which imports no training or data module of its own for them."""

from models import MODELS
from utils.config import Section
from utils.training.settings import SHARED_SECTIONS


def config_schemas() -> dict[str, type[Section]]:
    """Section name -> its class: the shared sections (``audio``, ``data``, ``train``), then one per registered model
    (its ``ModelSpec.config_cls``)."""
    return {**SHARED_SECTIONS, **{name: spec.config_cls for name, spec in MODELS.items()}}
