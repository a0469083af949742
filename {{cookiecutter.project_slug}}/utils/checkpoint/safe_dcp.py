"""Sharded checkpoint folders read as data. DCP reads a folder's ``.metadata`` with ``pickle.load`` and its non-tensor
entries (an optimizer's ``lr``) with ``torch.load(weights_only=False)``: either runs whatever code was pickled into it.
Here ``.metadata`` is read by an unpickler that resolves only DCP's metadata classes (Python's "Restricting Globals",
https://docs.python.org/3/library/pickle.html), and every non-tensor entry by ``torch.load(weights_only=True)``. What
it holds is checked before anything is allocated from it (DCP and its ``set_element`` trust it: a size, an offset, a
list index of its choosing): the types and dtypes of its entries, its records' places in the shards, its paths, and
that its tensors declare no more bytes than the shards hold (bytes that several records share counted once), and that
each record is a ``torch.save`` archive of stored members within its bytes (one compressed could unpack to any size)."""

from __future__ import annotations

import collections
import io
import math
import pickle
import struct
import zipfile
from pathlib import Path
from typing import Any, BinaryIO, Optional

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, Metadata, MetadataIndex, StorageMeta,
                                                   TensorStorageMetadata)

from utils.checkpoint.files import CheckpointError, UnsafeCheckpoint, _load_failure, few
from utils.run_log import one_line

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
    """The DCP ``Metadata`` of the sharded checkpoint ``folder``, read by :class:`MetadataUnpickler` and checked by
    :func:`metadata_problem`. Raises UnsafeCheckpoint: the file pickles a global that checkpoint metadata never holds
    (nothing was run); CheckpointError: the file is missing, cut short, not DCP metadata, or holds what no save
    writes."""
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
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"its .metadata is not DCP's metadata (it holds {_a(type(metadata))})")
    if not isinstance(entries := getattr(metadata, "state_dict_metadata", None), dict):
        raise CheckpointError(f"its .metadata holds its entries as {_a(type(entries))}, not a dict")
    if (problem := metadata_problem(metadata)) is not None:
        raise CheckpointError(f"its .metadata {problem}")
    return metadata


def metadata_problem(metadata: Metadata) -> Optional[str]:
    """What in ``metadata`` no DCP save writes (``"gives <entry> the dtype 'float32' (a str), not a torch dtype"``), or
    ``None``. Checked: every entry is tensor or bytes metadata, named by a string; a tensor's dtype is a ``torch.dtype``,
    its size and chunks are counts, each chunk inside the size with a storage record; a record names a file at an
    offset and length of integers >= 0, without stream transforms (this project writes none: a compressed record
    could unpack to any size); a ``planner_data`` path spells its entry's name, nests alike to every other (a leaf is
    no container, a container is a list or a dict for all), and places it at a list index below the count of entries
    under that list (DCP's ``set_element`` pads a list with ``None`` up to the index). Reads no shard."""
    return _entries_problem(metadata) or _records_problem(metadata) or _paths_problem(metadata)


def _shown(value: Any) -> str:
    """``value`` for a message: its repr, cut at 60 characters, and its type (``"'float32' (a str)"``)."""
    text = repr(value)
    return f"{text[:60]}{'...' if len(text) > 60 else ''} ({_a(type(value))})"


def _a(kind: type) -> str:
    """A type's name with its article: ``"a list"``, ``"an int"``."""
    return f"{'an' if kind.__name__[:1].lower() in 'aeiou' else 'a'} {kind.__name__}"


def _counts(value: Any) -> bool:
    """Whether ``value`` is a tuple or list (``torch.Size``) of integers from 0 to 2**63 - 1 (not bools)."""
    return isinstance(value, (tuple, list)) and all(type(n) is int and 0 <= n < 2**63 for n in value)


def _entries_problem(metadata: Metadata) -> Optional[str]:
    """:func:`metadata_problem` of the entries: their kinds, dtypes, sizes, chunks and the chunks' records."""
    for key, entry in metadata.state_dict_metadata.items():
        if not isinstance(key, str):
            return f"names an entry by {_shown(key)}, not a string"
        if isinstance(entry, BytesStorageMetadata):
            continue
        if not isinstance(entry, TensorStorageMetadata):
            return f"gives {key} {_a(type(entry))}, not tensor or bytes metadata"
        dtype, size = getattr(getattr(entry, "properties", None), "dtype", None), getattr(entry, "size", None)
        if not isinstance(dtype, torch.dtype):
            return f"gives {key} the dtype {_shown(dtype)}, not a torch dtype"
        if not _counts(size):
            return f"gives {key} the size {_shown(size)}, not counts"
        chunks = getattr(entry, "chunks", None)
        if not isinstance(chunks, list) or not all(_chunk_fits(chunk, size) for chunk in chunks):
            return f"gives {key} a chunk that is not a part of its size {tuple(size)}"
        if not isinstance(metadata.storage_data, dict) or not all(
                MetadataIndex(key, chunk.offsets) in metadata.storage_data for chunk in chunks):
            return f"gives {key} a chunk without a storage record"
    return None


def _chunk_fits(chunk: Any, size: tuple) -> bool:
    """Whether ``chunk`` has counts for offsets and sizes, one per dimension of ``size``, and lies inside it."""
    offsets, sizes = getattr(chunk, "offsets", None), getattr(chunk, "sizes", None)
    return (_counts(offsets) and _counts(sizes) and len(offsets) == len(sizes) == len(size)
            and all(start + length <= dim for start, length, dim in zip(offsets, sizes, size)))


def _records_problem(metadata: Metadata) -> Optional[str]:
    """:func:`metadata_problem` of the storage records: DCP's own types, places of integers >= 0, no transforms."""
    records = metadata.storage_data
    if not isinstance(records, dict):
        return f"holds its storage records as {_shown(records)}, not a dict"
    for index, info in records.items():
        if not isinstance(index, MetadataIndex) or not isinstance(index.fqn, str) or not isinstance(info, _StorageInfo):
            return f"holds a storage record that is not DCP's ({type(index).__name__}: {type(info).__name__})"
        name, offset, length = (getattr(info, field, None) for field in ("relative_path", "offset", "length"))
        if not isinstance(name, str) or type(offset) is not int or type(length) is not int:
            return f"gives {index.fqn} a storage record of {_shown(name)} at {_shown(offset)}, {_shown(length)} bytes"
        if min(offset, length) < 0:
            return f"places {index.fqn} at offset {offset} ({length} bytes) of shard {name}: not a place in a file"
        if transforms := getattr(info, "transform_descriptors", None):
            return f"gives {index.fqn} the stream transforms {_shown(transforms)}, which this project never writes"
    return None


def _paths_problem(metadata: Metadata) -> Optional[str]:
    """:func:`metadata_problem` of the paths that place each entry in the state (``planner_data``; ``(name,)`` for an
    entry without one): see there."""
    planner_data = metadata.planner_data if metadata.planner_data is not None else {}
    if not isinstance(planner_data, dict):
        return f"holds its planner_data as {_shown(planner_data)}, not a dict"
    if stray := sorted(str(key) for key in planner_data if key not in metadata.state_dict_metadata):
        return f"gives a planner_data path to entries it does not hold: {few(stray)}"
    paths = {key: planner_data.get(key, (key,)) for key in metadata.state_dict_metadata}
    for key, path in paths.items():
        if not isinstance(path, tuple) or not path or not isinstance(path[0], str) or \
                any(type(part) not in (str, int) for part in path) or ".".join(map(str, path)) != key:
            return f"places {key} at {_shown(path)}, not a path that spells its name"
    return _nesting_problem(paths)


def _nesting_problem(paths: dict[str, tuple]) -> Optional[str]:
    """Where the entries' ``paths`` (each spelling its name) do not nest as one state: a leaf that is also a container,
    a container that is a list for one path and a dict for another, a list index at or past the count of entries
    under that list."""
    under: collections.Counter = collections.Counter()  # a container's path -> the entries inside it
    kinds: dict[tuple, type] = {}  # a container's path -> int (a list) or str (a dict)
    for key, path in paths.items():
        for depth in range(1, len(path)):
            under[path[:depth]] += 1
            if kinds.setdefault(path[:depth], type(path[depth])) is not type(path[depth]):
                return f"places {key} in {'.'.join(map(str, path[:depth]))} as in a list and a dict at once"
    for key, path in paths.items():
        if path in kinds:
            return f"places {key} where other entries are inside it"
        for depth in range(1, len(path)):
            if type(path[depth]) is int and path[depth] >= under[path[:depth]]:
                return f"places {key} at index {path[depth]} of a list that holds {under[path[:depth]]} entries"
    return None


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
    """What is wrong with the entries of ``metadata`` (:func:`read_metadata`'s) against the shards in ``folder``, or
    ``None``: :func:`size_problem`, a record that is no ``torch.save`` archive of stored members within its bytes
    (:func:`archive_problem`), or a non-tensor entry that does not read. Raises UnsafeCheckpoint: a non-tensor entry
    holds code; CheckpointError: a non-tensor entry does not read."""
    if (problem := size_problem(folder, metadata)) is not None:
        return problem
    by_shard: dict[str, list] = {}
    for key, ranges in _records_by_entry(metadata).items():
        for name, start, end in ranges:
            by_shard.setdefault(name, []).append((start, end, key))
    for name, records in sorted(by_shard.items()):
        with open(folder / name, "rb") as handle:
            for start, end, key in sorted(records):
                if (problem := archive_problem(handle, start, end)) is not None:
                    return f"its entry {key} in shard {name} {problem}"
                if isinstance(metadata.state_dict_metadata.get(key), BytesStorageMetadata):
                    handle.seek(start)
                    load_entry(handle.read(end - start), key)
    return None


def archive_problem(handle: BinaryIO, start: int, end: int) -> Optional[str]:
    """Why the bytes ``[start, end)`` of the open file ``handle`` are no ``torch.save`` archive that unpacks to at
    most those bytes, or ``None``: its zip directory does not read, or a member is compressed (``torch.save`` stores
    them; ``torch.load`` allocates a member's unpacked size before it checks it: a compressed member of 1 MB unpacks
    to 1 GB), or its members declare more bytes than the record holds. Reads the directory only: the record's last
    8 KiB (a save's directory lists 7 members in under 1 KiB)."""
    tail = min(end - start, 1 << 13)
    handle.seek(end - tail)
    try:
        with zipfile.ZipFile(io.BytesIO(handle.read(tail))) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, ValueError, EOFError, OSError, struct.error) as err:  # what its damage raises
        return f"is not a torch.save archive ({one_line(err)})"
    if packed := [member.filename for member in members if member.compress_type != zipfile.ZIP_STORED]:
        return f"holds compressed members, which torch.save never writes: {few(packed)}"
    if (unpacked := sum(member.file_size for member in members)) > end - start:
        return f"declares {unpacked} bytes in its members, in a record of {end - start}"
    return None


def size_problem(folder: Path, metadata: Metadata) -> Optional[str]:
    """What of ``metadata`` (:func:`read_metadata`'s) the shards in ``folder`` do not hold, or ``None``: a shard missing
    (or outside the folder) or shorter than its records, a tensor entry declaring more bytes than its records cover,
    or all tensor entries together more than all their records cover; bytes that several records share count once
    (thousands of records on the same bytes hold those bytes, not thousands of times as many). A load allocates what
    the entries declare: after this, no more than the shards' own bytes. Reads no shard's contents."""
    if (problem := _shard_problem(folder, metadata)) is not None:
        return problem
    stored = _records_by_entry(metadata)
    declared_total, all_records = 0, []
    for key, entry in metadata.state_dict_metadata.items():
        if isinstance(entry, TensorStorageMetadata):
            declared = math.prod(entry.size) * entry.properties.dtype.itemsize
            if declared > (held := _covered(stored.get(key, []))):
                return f"its entry {key} declares {declared} bytes, its shards hold {held}{_once(stored.get(key, []))}"
            declared_total += declared
            all_records += stored.get(key, [])
    if declared_total > (held := _covered(all_records)):
        return f"its tensor entries declare {declared_total} bytes together, its shards hold {held}{_once(all_records)}"
    return None


def _once(ranges: list[tuple[str, int, int]]) -> str:
    """``" (bytes that N records share, counted once)"`` where the ``(shard, start, end)`` ranges overlap, else ``""``."""
    shared = sum(end - start for _, start, end in ranges) - _covered(ranges)
    return f" (bytes that {len(ranges)} records share, counted once)" if shared else ""


def _records_by_entry(metadata: Metadata) -> dict[str, list[tuple[str, int, int]]]:
    """``{entry: [(shard, start, end), ...]}``: the byte ranges of each entry's storage records."""
    stored: dict[str, list] = {}
    for index, info in metadata.storage_data.items():
        stored.setdefault(index.fqn, []).append((info.relative_path, info.offset, info.offset + info.length))
    return stored


def _covered(ranges: list[tuple[str, int, int]]) -> int:
    """The bytes that the ``(shard, start, end)`` ranges cover, each byte once however many ranges share it."""
    total, reached = 0, {}
    for name, start, end in sorted(ranges):
        if end > (done := reached.get(name, 0)):
            total += end - max(start, done)
            reached[name] = end
    return total


def _shard_problem(folder: Path, metadata: Metadata) -> Optional[str]:
    """A shard ``metadata`` names that ``folder`` lacks (or holds outside itself), or one shorter than its entries."""
    ends: dict[str, int] = {}
    for info in metadata.storage_data.values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    for name, end in sorted(ends.items()):
        shard = folder / name
        if Path(name).name != name or name in ("", ".", "..") or not shard.is_file():
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
    CheckpointError: see :func:`read_metadata`, :func:`size_problem` (checked before anything is allocated) and
    :func:`load_entry`."""
    metadata = read_metadata(folder)
    if (problem := size_problem(Path(folder), metadata)) is not None:
        raise CheckpointError(f"{folder} is damaged ({problem})")
    state: dict[str, Any] = {}
    for key, entry in metadata.state_dict_metadata.items():
        value = torch.empty(entry.size, dtype=entry.properties.dtype) if isinstance(entry, TensorStorageMetadata) \
            else None  # a non-tensor entry, replaced by SafeLoadPlanner.load_bytes
        set_element(state, (metadata.planner_data or {}).get(key, (key,)), value)
    torch.distributed.checkpoint.load(state, storage_reader=SafeReader(str(folder)), planner=SafeLoadPlanner(),
                                      no_dist=True)
    return state
