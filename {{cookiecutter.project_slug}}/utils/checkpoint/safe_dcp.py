"""Sharded checkpoint folders read as data. DCP reads a folder's ``.metadata`` with ``pickle.load`` and its non-tensor
entries (an optimizer's ``lr``) with ``torch.load(weights_only=False)``: either runs whatever code was pickled into it.
Here ``.metadata`` is read by an unpickler that resolves only DCP's metadata classes (Python's "Restricting Globals",
https://docs.python.org/3/library/pickle.html), and every non-tensor entry by ``torch.load(weights_only=True)``."""

from __future__ import annotations

import io
import math
import pickle
from pathlib import Path
from typing import Any, Optional

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, StorageMeta, TensorStorageMetadata

from utils.checkpoint.files import CheckpointError, UnsafeCheckpoint, _load_failure

METADATA_GLOBALS = {
    "torch.distributed.checkpoint.metadata": {"Metadata", "StorageMeta", "TensorStorageMetadata", "TensorProperties",
                                              "BytesStorageMetadata", "ChunkStorageMetadata", "MetadataIndex",
                                              "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},  # a layout by its name ("torch.strided")
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath", "PureWindowsPath"},  # StorageMeta.checkpoint_id
    "collections": {"OrderedDict"},
}
"""The globals a ``.metadata`` written by DCP holds (with ``torch.<dtype>``): each builds a record of plain values."""


class MetadataUnpickler(pickle.Unpickler):
    """An unpickler of ``.metadata`` that resolves only :data:`METADATA_GLOBALS` and torch's dtypes. Raises
    UnsafeCheckpoint: at the first other global (``posix.system``, ``builtins.eval``), before anything is called."""

    def find_class(self, module: str, name: str) -> Any:
        if name in METADATA_GLOBALS.get(module, ()) or (
                module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise UnsafeCheckpoint(f"{module}.{name}")


def read_metadata(folder: str | Path) -> Metadata:
    """The DCP ``Metadata`` of the sharded checkpoint ``folder``, read by :class:`MetadataUnpickler`. Raises
    UnsafeCheckpoint: the file pickles a global that checkpoint metadata never holds (nothing was run); CheckpointError:
    the file is missing, cut short or not DCP metadata."""
    path = Path(folder) / ".metadata"
    try:
        with open(path, "rb") as handle:
            metadata = MetadataUnpickler(handle).load()
    except UnsafeCheckpoint as err:
        raise UnsafeCheckpoint(f"its .metadata holds code (the pickled global {err}, which checkpoint metadata never "
                               "holds; refused, nothing in it was run)") from None
    # The file is untrusted input: its damage decides the type (UnpicklingError, EOFError, TypeError, KeyError, ...).
    except Exception as err:  # noqa: BLE001 - every failure to read it is this one line
        raise CheckpointError(f"its .metadata does not read ({type(err).__name__}: {_load_failure(err)})") from None
    if not isinstance(metadata, Metadata) or not isinstance(metadata.state_dict_metadata, dict):
        raise CheckpointError(f"its .metadata is not DCP's metadata (it holds a {type(metadata).__name__})")
    return metadata


def load_entry(data: bytes, name: str) -> Any:
    """A non-tensor entry of a sharded checkpoint (its ``torch.save`` bytes), loaded with ``weights_only=True``. Raises
    UnsafeCheckpoint: the bytes pickle an object other than tensors and primitives (refused, never run);
    CheckpointError: the bytes are not a ``torch.save`` file."""
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if "Weights only load failed" in str(err):
            raise UnsafeCheckpoint(f"its entry {name} holds code ({_load_failure(err)})") from None
        raise CheckpointError(f"its entry {name} does not read ({_load_failure(err)})") from None
    # Damaged bytes: RuntimeError, EOFError, KeyError, ... by where the damage is.
    except Exception as err:  # noqa: BLE001 - untrusted input: every failure to read it is this one line
        raise CheckpointError(f"its entry {name} does not read ({type(err).__name__}: {_load_failure(err)})") from None


def entry_problem(folder: Path, metadata: Metadata) -> Optional[str]:
    """What is wrong with the entries of ``metadata`` against the shards in ``folder``, or ``None``: a shard missing or
    cut short, a tensor declaring more bytes than its shards hold (refused before any allocation). Raises
    UnsafeCheckpoint: a non-tensor entry holds code; CheckpointError: a non-tensor entry does not read."""
    if (problem := _shard_problem(folder, metadata)) is not None:
        return problem
    stored: dict[str, list] = {}
    for index, info in (metadata.storage_data or {}).items():
        stored.setdefault(index.fqn, []).append(info)
    for key, entry in metadata.state_dict_metadata.items():
        if isinstance(entry, TensorStorageMetadata):
            declared = math.prod(entry.size) * torch.empty((), dtype=entry.properties.dtype).element_size()
            if declared > (held := sum(int(info.length) for info in stored.get(key, []))):
                return f"its entry {key} declares {declared} bytes, its shards hold {held}"
        elif isinstance(entry, BytesStorageMetadata):
            for info in stored.get(key, []):
                with open(folder / info.relative_path, "rb") as handle:
                    handle.seek(int(info.offset))
                    load_entry(handle.read(int(info.length)), key)
        else:
            return f"its entry {key} is a {type(entry).__name__}, not tensor or bytes metadata"
    return None


def _shard_problem(folder: Path, metadata: Metadata) -> Optional[str]:
    """A shard ``metadata`` names that ``folder`` lacks (or holds outside itself), or one shorter than its entries."""
    ends: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), int(info.offset) + int(info.length))
    for name, end in sorted(ends.items()):
        shard = folder / name
        if Path(name).name != name or not shard.is_file():
            return f"shard {name} is missing"
        if shard.stat().st_size < end:
            return f"shard {name} is cut short: {shard.stat().st_size} of {end} bytes"
    return None


class SafeReader(FileSystemReader):
    """DCP's ``FileSystemReader`` with ``.metadata`` read by :func:`read_metadata` (no pickled code runs)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = read_metadata(self.path)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's ``DefaultLoadPlanner`` with non-tensor entries read by :func:`load_entry` (``weights_only=True``)."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        name = read_item.dest_index.fqn
        loaded = load_entry(value.read(), name)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[name], loaded)
        else:
            self.state_dict[name] = loaded


def load(state: dict[str, Any], folder: str | Path) -> None:
    """``torch.distributed.checkpoint.load`` of ``folder`` into ``state`` (every rank calls it), reading it as data."""
    torch.distributed.checkpoint.load(state, storage_reader=SafeReader(str(folder)), planner=SafeLoadPlanner())


def load_whole(folder: str | Path) -> dict[str, Any]:
    """Every entry of the sharded checkpoint ``folder`` in this one process, nested as saved (``{"model": {...},
    "optimizer": {...}}``): what PyTorch's ``dcp_to_torch_save`` gathers, read as data. Raises UnsafeCheckpoint,
    CheckpointError: see :func:`read_metadata` and :func:`load_entry`."""
    metadata = read_metadata(folder)
    state: dict[str, Any] = {}
    for key, entry in metadata.state_dict_metadata.items():
        value = torch.empty(entry.size, dtype=entry.properties.dtype) if isinstance(entry, TensorStorageMetadata) \
            else None  # a non-tensor entry, replaced by SafeLoadPlanner.load_bytes
        set_element(state, (metadata.planner_data or {}).get(key, (key,)), value)
    torch.distributed.checkpoint.load(state, storage_reader=SafeReader(str(folder)), planner=SafeLoadPlanner(),
                                      no_dist=True)
    return state
