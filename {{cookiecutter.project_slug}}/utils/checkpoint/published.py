"""Published weights: this project's release checkpoints (:func:`release_checkpoint`), and weights another project
published, for ``train.py --init-from`` and ``scripts/import_weights.py`` (:class:`Readers`, asked by
:func:`utils.checkpoint.weights.read_weights` for a file that is not a checkpoint of ``train.py``), which a model's
:class:`Published` reader renames (its ``source``: the example models' references). Nothing in a file runs: a pickled
module (one of NVIDIA's files) is read as a :class:`Record` of attributes (a pickled call, as a Lightning
checkpoint's ``functools.partial``, as a :class:`Call` of its arguments), from a zip archive (``torch.save`` since
PyTorch 1.6) or from PyTorch's legacy format (before 1.6, as NVIDIA published some), which :class:`_LegacyUnpickler`
reads, once :func:`legacy_problem` (every loader's first check) found its sizes sound."""

from __future__ import annotations

import dataclasses
import mmap
import os
import pickle
import re
import struct
import warnings
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any, BinaryIO, Callable, Mapping, Optional

import torch

from utils.checkpoint.files import NEITHER, CheckpointError, _load_failure
from utils.checkpoint.state import RELEASE_FORMAT, in_modules
from utils.checkpoint.weights import Weights
from utils.run_log import one_line


@dataclasses.dataclass(frozen=True)
class Published:
    """A model's reader of the weights its reference project published (``models/<name>/published.py``'s
    ``PUBLISHED``, registered in ``parts.py``)."""

    read: Callable[[Any, Any], Optional[Weights]]  # (loaded file, cfg) -> Weights, or None for another format
    source: str  # what such a file is, for --help (whose checkpoint or generator)
    pickled_classes: tuple[str, ...] = ()  # "module.Class" names such a file pickles, read as inert records
    pickled_calls: tuple[str, ...] = ()  # "module.name" s such a file calls to build an object, read as inert Calls


class Record:
    """What a pickled module of a published file becomes: its attributes (``__dict__``), no behaviour."""


class Call(Record):
    """What a call a published file pickles (``functools.partial(...)``, ``collections.defaultdict(...)``) becomes,
    nothing called: its arguments (``args``), its state (``state``, a non-dict one included) and items (``items``)."""

    def __init__(self, *args: Any) -> None:
        self.args, self.state, self.items = args, None, {}

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __setitem__(self, key: Any, value: Any) -> None:
        self.items[key] = value


def record_parameters(record: Record, prefix: str = "") -> dict[str, torch.Tensor]:
    """The parameters and buffers of a pickled module's :class:`Record` and of its sub-modules, by the keys its
    ``state_dict`` would have."""
    found = {prefix + name: value.detach() for store in ("_parameters", "_buffers")
             for name, value in (getattr(record, store, None) or {}).items() if isinstance(value, torch.Tensor)}
    for name, child in (getattr(record, "_modules", None) or {}).items():
        if isinstance(child, Record):
            found.update(record_parameters(child, f"{prefix}{name}."))
    return found


def weight_norm_key(key: str) -> str:
    """Old-style weight norm's ``<layer>.weight_g``/``_v`` as ``torch.nn.utils.parametrizations.weight_norm`` names them
    (``...parametrizations.weight.original0``/``1``)."""
    return re.sub(r"\.weight_g$", ".parametrizations.weight.original0",
                  re.sub(r"\.weight_v$", ".parametrizations.weight.original1", key))


LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
"""The first pickle of a file in PyTorch's legacy format (then the version 1001, the writer's byte order, the object,
the list of storage keys, and each storage's element count (int64) and raw bytes)."""
_LEGACY_DTYPES = {"DoubleStorage": torch.float64, "FloatStorage": torch.float32, "HalfStorage": torch.float16,
                  "BFloat16Storage": torch.bfloat16, "LongStorage": torch.int64, "IntStorage": torch.int32,
                  "ShortStorage": torch.int16, "CharStorage": torch.int8, "ByteStorage": torch.uint8,
                  "BoolStorage": torch.bool}
_LEGACY_GLOBALS = {"collections.OrderedDict": OrderedDict, "builtins.set": set, "builtins.frozenset": frozenset,
                   "torch._utils._rebuild_tensor": lambda storage, offset, size, stride: storage.as_strided(
                       tuple(size), tuple(stride), offset),
                   "torch._utils._rebuild_tensor_v2": lambda storage, offset, size, stride, *_: storage.as_strided(
                       tuple(size), tuple(stride), offset),
                   "torch._utils._rebuild_parameter": lambda data, *_: data,
                   "torch.nn.backends.thnn._get_thnn_function_backend": lambda: None}  # PyTorch <= 1.0 modules
"""What a legacy file may name besides its records: containers and tensor rebuilds (views of a flat storage)."""


class _LegacyUnpickler(pickle.Unpickler):
    """A pickle of PyTorch's legacy format: only :data:`_LEGACY_GLOBALS`, storage types and ``records`` (``{"module.
    Class": Record subclass}``) resolve; every other name raises before anything runs. A storage becomes an empty flat
    tensor, filled by :func:`_read_legacy` after the object; a pickled module's source text is ignored. ``budget``: the
    file's size, which the storages' bytes may not exceed (no huge allocation for a few bytes of pickle)."""

    def __init__(self, file: BinaryIO, records: dict[str, type], budget: int = 0):
        super().__init__(file, encoding="utf-8")
        self.records, self.storages, self.budget = records, {}, budget

    def find_class(self, module: str, name: str) -> Any:
        module = "builtins" if module == "__builtin__" else module  # pickle protocol 2's name
        found = self.records.get(f"{module}.{name}", _LEGACY_GLOBALS.get(f"{module}.{name}"))
        if found is None and module in ("torch", "torch.cuda"):
            found = _LEGACY_DTYPES.get(name)
        if found is None:
            raise pickle.UnpicklingError(f"it holds code: it names {module}.{name}, which is refused, nothing was run "
                                         "(only tensors, containers and "
                                         f"{', '.join(sorted(self.records)) or 'no classes'} are read)")
        return found

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and len(pid) == 4 and pid[0] == "module" and pid[1] in self.records.values():
            return pid[1]
        if not (isinstance(pid, tuple) and len(pid) in (5, 6) and pid[0] == "storage"
                and isinstance(pid[1], torch.dtype) and (len(pid) == 5 or pid[5] is None)):  # (no view: torch < 0.4)
            raise pickle.UnpicklingError(f"an unknown reference {str(pid)[:60]}")
        if str(pid[2]) not in self.storages:
            self.budget -= int(pid[4]) * pid[1].itemsize
            if self.budget < 0:
                raise ValueError("its tensors need more bytes than the file holds (cut short or damaged)")
            self.storages[str(pid[2])] = torch.empty(int(pid[4]), dtype=pid[1])
        return self.storages[str(pid[2])]


def _read_legacy(file: BinaryIO, records: dict[str, type]) -> Any:
    """The object of a file in PyTorch's legacy format, its pickled classes as ``records``.

    Raises:
        pickle.UnpicklingError, ValueError, struct.error, RuntimeError: not that format, damaged, or naming code.
    """
    header = [_LegacyUnpickler(file, {}).load() for _ in range(3)]
    if header[:2] != [LEGACY_MAGIC, 1001] or not isinstance(header[2], dict) or not header[2].get("little_endian"):
        raise ValueError("neither a zip archive nor PyTorch's legacy format (little-endian, version 1001)")
    unpickler = _LegacyUnpickler(file, records, budget=os.fstat(file.fileno()).st_size)
    loaded = unpickler.load()
    keys = _LegacyUnpickler(file, {}).load()
    if not isinstance(keys, list) or set(keys) != set(unpickler.storages):
        raise ValueError("its list of storages is not the one its tensors use")
    for key in keys:
        storage = unpickler.storages[key]
        (count,) = struct.unpack("<q", file.read(8))
        data = file.read(count * storage.element_size())
        if count != storage.numel() or len(data) != storage.numel() * storage.element_size():
            raise ValueError(f"storage {key} holds {count} elements of {storage.numel()}, or is cut short")
        if count:
            storage.view(torch.uint8).copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    return loaded


_ITEM_BYTES = {**{name: dtype.itemsize for name, dtype in _LEGACY_DTYPES.items()}, "ComplexFloatStorage": 8,
               "ComplexDoubleStorage": 16}  # element bytes of the legacy format's storages


class _Inert:
    """What every class a legacy pickle names becomes in :func:`legacy_problem`: takes any arguments, state or items."""

    def _ignore(self, *args: Any, **kwargs: Any) -> None:
        """Takes anything, keeps nothing."""

    __init__ = __setstate__ = __setitem__ = append = _ignore


class _StorageScan(pickle._Unpickler):  # the Python unpickler: its memo is a dict, so an index allocates nothing
    """One pickle of a legacy file, built of :class:`_Inert` s (a storage type: its element size), each storage it
    names put in ``storages`` (key -> bytes; the first of a key counts, as in ``torch.load``). Reads a memory map: a
    length field allocates nothing."""

    dispatch = {code: load for code, load in pickle._Unpickler.dispatch.items() if code != pickle.BYTEARRAY8[0]}

    def __init__(self, file: mmap.mmap, storages: dict[Any, int]):
        super().__init__(file, encoding="latin1")
        self.storages = storages

    def find_class(self, module: str, name: str) -> Any:
        return _ITEM_BYTES.get(name, 1) if module in ("torch", "torch.cuda") and name.endswith("Storage") else _Inert

    def persistent_load(self, pid: Any) -> type:
        if isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage":
            item = pid[1] if isinstance(pid[1], int) else 1
            self.storages.setdefault(pid[2], max(0, int(pid[4])) * item)
        return _Inert  # a storage, or a pickled module's class


_SCAN_ERRORS = (pickle.UnpicklingError, ValueError, TypeError, AttributeError, IndexError, KeyError, EOFError,
                OverflowError, struct.error)  # what a pickle of arbitrary bytes may raise (any opcode's checks)


def legacy_problem(path: Path) -> Optional[str]:
    """What is wrong with ``path``, a file starting as a pickle does, as a file of PyTorch's legacy format (before 1.6:
    pickles of the magic number, version, system's sizes and object, then each storage's bytes), or ``None`` (also for
    a pickle of something else: the loaders refuse it). The pickles are scanned without building anything: the bytes
    the tensors declare must be in the file, so that no loader allocates terabytes for a few bytes of pickle. Asked by
    :func:`utils.checkpoint.files.torch_file_problem`, every loader's first check."""
    storages: dict[Any, int] = {}
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        try:
            magic = _StorageScan(mapped, storages).load()
        except _SCAN_ERRORS:  # random bytes after a first 0x80
            return f"is not a checkpoint: {NEITHER}"
        if magic != LEGACY_MAGIC:
            return None  # a pickle of something else: the loaders name what they refuse in it
        try:
            for _ in range(3):  # the format's version, the system's sizes, the object
                _StorageScan(mapped, storages).load()
        except _SCAN_ERRORS as err:
            return f"is damaged (a file of PyTorch's legacy format whose pickle does not read: {one_line(err)})"
        left = len(mapped) - mapped.tell()
    if (declared := sum(storages.values())) > left:
        return (f"is damaged (its tensors need more bytes than the file holds: {declared} declared, {left} left after "
                "its pickles)")
    return None


def _load(path: Path, pickled_classes: tuple[str, ...], label: str, pickled_calls: tuple[str, ...] = ()) -> Any:
    """``torch.load(weights_only=True)`` (a zip archive) or :func:`_read_legacy` (the legacy format), with
    ``pickled_classes`` (``module.Class``) read as :class:`Record` s and ``pickled_calls`` as :class:`Call` s; a
    :class:`CheckpointError` for anything else that is not plain data (named), or a damaged file (``label``: the option
    that named it)."""
    records = {**{name: type(name.rsplit(".", 1)[1], (Record,), {}) for name in pickled_classes},
               **{name: type(name.rsplit(".", 1)[1], (Call,), {}) for name in pickled_calls}}
    try:
        if path.is_file() and not zipfile.is_zipfile(path):
            with open(path, "rb") as file:
                return _read_legacy(file, records)
        with warnings.catch_warnings(), torch.serialization.safe_globals(
                [*((cls, name) for name, cls in records.items()), OrderedDict]):
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - untrusted input: every failure is this one line
        why = _load_failure(err) if zipfile.is_zipfile(path) else (str(err) or type(err).__name__).splitlines()[0]
        raise CheckpointError(f"{label} {path}: cannot load it safely: {why}") from None


@dataclasses.dataclass(frozen=True)
class Readers:
    """The published formats the models read (``{model name: Published}``), as ``Formats.published``: the file of
    PyTorch's legacy format checked (:func:`legacy_problem`), a published file read (:meth:`read`)."""

    readers: Mapping[str, Published]
    legacy_problem = staticmethod(legacy_problem)

    @property
    def sources(self) -> str:
        """What the files the models read are, for ``--help``: each reader's ``source``, comma-separated."""
        return ", ".join(published.source for published in self.readers.values())

    def read(self, path: Path, cfg: Any, label: str) -> Weights:
        """The weights of ``path``, a file in a published format that some model's reader takes (given the loaded
        file and ``cfg``, whose sizes it may set), in this project's key names; ``label`` names the file in errors.

        Raises:
            CheckpointError: an unsafe or damaged file, a format no model reads, or what a reader refuses in it.
        """
        readers = self.readers
        loaded = _load(path, tuple(name for published in readers.values() for name in published.pickled_classes), label,
                       tuple(name for published in readers.values() for name in published.pickled_calls))
        for published in readers.values():
            try:
                weights = published.read(loaded, cfg)
            except CheckpointError as err:  # the reader says what is wrong with the file, not which file
                raise CheckpointError(f"{label} {path}: {err}") from None
            if weights is not None:
                return weights
        raise CheckpointError(f"{label} {path}: not a checkpoint of this project, nor a published checkpoint a model "
                              f"of models/ reads ({', '.join(sorted(readers)) or 'none reads any'}: Published.read)")


def release_checkpoint(model_name: str, model_state: Mapping[str, torch.Tensor], modules: tuple[str, ...],
                       config: Mapping[str, Any], saved: Mapping[str, Any], source: str) -> dict[str, Any]:
    """What inference (and ``train.py --init-from``) needs alone: the weights of the sub-modules ``modules`` (all when
    empty) of ``model_state`` (EMA weights in place), the model's name, config and source, and from ``saved`` (the
    entries of the checkpoint at ``source``: a file's, or a sharded folder's train state) its step and whether it held
    EMA weights; ``weights_only`` loads it."""
    weights = {key: value.detach().cpu().clone() for key, value in model_state.items() if in_modules(key, modules)}
    ema_weights = bool(saved.get("ema_saved") or isinstance(saved.get("ema"), dict) or saved.get("ema_weights"))
    return {"format": RELEASE_FORMAT, "model_name": model_name, "config": dict(config), "step": saved.get("step"),
            "model": weights, "ema_weights": ema_weights, "source": source, "torch_version": str(torch.__version__)}
