"""ONNX export of a model's inference path, each file checked with ONNX Runtime against the eager model; a loop exports
its body (a decoder is split as NVIDIA's DeepLearningExamples deploy theirs). Exporter: the traced
``torch.onnx.export(..., dynamo=False)``: the ``torch.export``-based one specialises ``nn.LSTM``'s time axis to the
example's length in PyTorch 2.13 (pytorch/pytorch#191855); a run on inputs of other lengths catches a trace that baked a
length in. Needs ``onnx`` and ``onnxruntime``, imported only when :func:`export_model` runs."""

from __future__ import annotations

import dataclasses
import inspect
import math
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
from torch import nn

from utils.run_log import one_line

OPSET = 17  # ONNX opset of the exported files: ONNX Runtime >= 1.11 and TensorRT >= 8.6 read it
Tensors = tuple[torch.Tensor, ...]


class ExportError(ValueError):
    """The model cannot be exported, a part failed to export, or ONNX Runtime disagrees with the eager model."""


@dataclasses.dataclass
class ExportPart:
    """One ONNX file of a model's inference path, ``<folder>/<name>.onnx``: a wrapper around the model's layers, example
    inputs, the graph's names and the axes that vary (one axis name on several tensors: one size)."""

    name: str  # the file's stem, an identifier (``generator``, ``encoder``, ``decoder_step``)
    module: nn.Module  # forward(*inputs) -> a tensor or a tuple of them, in the order of output_names
    inputs: Tensors  # example inputs, traced by the exporter and checked with ONNX Runtime
    other_inputs: Tensors  # the same with other sizes along (some) dynamic axes, lengths or batch: checked too
    input_names: tuple[str, ...]  # the names in the ONNX graph, unique across inputs and outputs
    output_names: tuple[str, ...]
    dynamic_axes: dict[str, dict[int, str]]  # {name: {axis: axis name}}, e.g. {"mel": {0: "batch", 2: "frames"}}
    reference: Optional[Callable[..., Any]] = None  # the eager computation checked against (default: module)
    tolerance: float = 1e-3  # the max abs difference accepted, in output units (float32 on a CPU: ~1e-6, tiny model)
    description: str = ""  # one line on what goes in and out, with shapes, for the export log

    def check(self) -> None:
        """Raise :class:`ExportError` (one line) on inconsistent input counts, ranks or dtypes, duplicate names, dynamic
        axes of unknown tensors or out of range, or ``other_inputs`` of the same shapes (a run that proves nothing)."""
        where = f"export part {self.name!r}"
        if not self.name.isidentifier():
            raise ExportError(f"{where}: the name must be an identifier (it names the file)")
        if not (len(self.inputs) == len(self.other_inputs) == len(self.input_names)):
            raise ExportError(f"{where}: {len(self.inputs)} example inputs, {len(self.other_inputs)} other inputs and "
                              f"{len(self.input_names)} input names; they must be as many")
        names = [*self.input_names, *self.output_names]
        if len(set(names)) != len(names):
            raise ExportError(f"{where}: input and output names must be unique, got {names}")
        for name, first, second in zip(self.input_names, self.inputs, self.other_inputs):
            if first.dim() != second.dim() or first.dtype != second.dtype:
                raise ExportError(f"{where}: input {name!r} is {first.dtype} {tuple(first.shape)} in one example set "
                                  f"and {second.dtype} {tuple(second.shape)} in the other")
        self._check_dynamic_axes(where, names)
        if all(first.shape == second.shape for first, second in zip(self.inputs, self.other_inputs)):
            raise ExportError(f"{where}: other_inputs have the shapes of inputs; give other lengths to check the "
                              "dynamic axes")

    def _check_dynamic_axes(self, where: str, names: list[str]) -> None:
        for name, axes in self.dynamic_axes.items():
            if name not in names:
                raise ExportError(f"{where}: dynamic_axes names {name!r}, which is no input or output")
            if name in self.input_names:
                rank = self.inputs[self.input_names.index(name)].dim()
                if any(not 0 <= axis < rank for axis in axes):
                    raise ExportError(f"{where}: dynamic axes {sorted(axes)} of {name!r} out of range for rank {rank}")


@dataclasses.dataclass(frozen=True)
class Export:
    """What ``scripts/export.py --format onnx`` needs of a model (``models/<name>/export.py``'s ``EXPORT``, registered in
    ``parts.py``)."""

    parts: Callable[..., list]  # (model, cfg) -> [ExportPart]: one checked ONNX file each


def export_model(name: str, export: Optional[Export], model: nn.Module, cfg: Any, folder: Path,
                 progress: bool = True) -> list[dict]:
    """Export each :class:`ExportPart` of model ``name``'s ``export.parts(model, cfg)`` to ``<folder>/<part>.onnx`` (opset
    :data:`OPSET`, weights inside; same-named files replaced), run it with ONNX Runtime's CPU provider on both input
    sets and compare every output with the eager reference. ``model``: on the CPU in float32. Method: NVIDIA
    DeepLearningExamples' ONNX export for TensorRT.

    Returns:
        One row per part: ``{"part", "path", "max_abs_diff" (over both runs, in output units), "inputs": [{input name:
        shape}, {...}]}``.

    Raises:
        ExportError: one line: no ``Export`` group, not on the CPU in float32, ``onnx`` or ``onnxruntime`` missing, a
            part malformed, failing to export or load, or off eager beyond its tolerance.
    """
    onnxruntime = _checked_exportable(name, export, model)
    model.eval()
    parts = export.parts(model, cfg)
    if not parts:
        raise ExportError(f"model {name!r}: Export.parts returned no part")
    for i, part in enumerate(parts):
        part.check()
        if part.name in (other.name for other in parts[:i]):
            raise ExportError(f"model {name!r}: two export parts are named {part.name!r}")
    Path(folder).mkdir(parents=True, exist_ok=True)
    rows = []
    for part in parts:
        path = Path(folder) / f"{part.name}.onnx"
        begin = time.monotonic()
        _export(part, path)
        session = _session(onnxruntime, part, path)
        diff = max(_compare(part, session, inputs) for inputs in (part.inputs, part.other_inputs))
        if not diff <= part.tolerance:  # also a NaN
            raise ExportError(f"export part {part.name!r}: ONNX Runtime differs from eager by {diff:.3g} (max abs), "
                              f"more than the tolerance {part.tolerance:g}")
        shapes = [{n: tuple(t.shape) for n, t in zip(part.input_names, inputs)}
                  for inputs in (part.inputs, part.other_inputs)]
        rows.append({"part": part.name, "path": path, "max_abs_diff": diff, "inputs": shapes})
        if progress:
            print(f"exported {part.name} to {path} in {time.monotonic() - begin:.1f} s; ONNX Runtime vs eager: "
                  f"max abs diff {diff:.2e}" + (f" ({part.description})" if part.description else ""), flush=True)
    return rows


def _checked_exportable(name: str, export: Optional[Export], model: nn.Module) -> Any:
    """The ``onnxruntime`` module once the model can be exported; else :class:`ExportError`."""
    if export is None:
        raise ExportError(f"model {name!r} cannot be exported to ONNX: it has no Export group; write EXPORT = "
                          "Export(parts=(model, cfg) -> [utils.onnx_export.ExportPart, ...]) in its export.py and "
                          "register it in parts.py")
    params = list(model.parameters()) + list(model.buffers())
    if any(p.device.type != "cpu" for p in params):
        raise ExportError(f"model {name!r} must be on the CPU to be exported and checked: call model.cpu() first")
    if any(p.is_floating_point() and p.dtype != torch.float32 for p in params):
        raise ExportError(f"model {name!r} must be float32 to be exported and checked: call model.float() first")
    return onnx_runtime()


def onnx_runtime() -> Any:
    """The ``onnxruntime`` module once ``onnx`` imports too: ask before creating anything. Raises ExportError: either
    package is missing (what to install)."""
    try:
        import onnx  # noqa: F401
        import onnxruntime
    except ImportError as exc:
        raise ExportError(f"ONNX export needs the onnx and onnxruntime packages ({one_line(exc)}): "
                          "pip install onnx onnxruntime") from exc
    return onnxruntime


def _export(part: ExportPart, path: Path) -> None:
    """Trace ``part.module`` on its example inputs and write the ONNX file; :class:`ExportError` on failure."""
    part.module.eval()
    try:
        with warnings.catch_warnings(), torch.no_grad():
            # The deprecation notice, tracer warnings and the LSTM's: the run on other_inputs checks what they warn of.
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            warnings.filterwarnings("ignore", message="Exporting a model to ONNX with a batch_size other than 1")
            warnings.filterwarnings("ignore", message="Constant folding - Only steps=1")  # a strided slice: kept as is
            # torch < 2.5 has no dynamo argument: its export is the traced one.
            legacy = {"dynamo": False} if "dynamo" in inspect.signature(torch.onnx.export).parameters else {}
            torch.onnx.export(part.module, part.inputs, str(path), opset_version=OPSET,
                              input_names=list(part.input_names), output_names=list(part.output_names),
                              dynamic_axes=part.dynamic_axes, do_constant_folding=True, **legacy)
    except Exception as exc:  # the exporter raises many types (RuntimeError, torch.onnx errors, ...)
        raise ExportError(f"export part {part.name!r} failed to export: {type(exc).__name__}: {one_line(exc)}"
                          ) from exc


def _session(onnxruntime: Any, part: ExportPart, path: Path) -> Any:
    """An ONNX Runtime CPU session of ``path``; :class:`ExportError` if the file does not load."""
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # errors only: not the shape-annotation warnings of every run
    try:
        return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's own exception types (Fail, InvalidGraph, ...)
        raise ExportError(f"export part {part.name!r}: ONNX Runtime cannot load {path}: {one_line(exc)}") from exc


def _compare(part: ExportPart, session: Any, inputs: Sequence[torch.Tensor]) -> float:
    """Max abs difference between ONNX Runtime's and the eager reference's outputs on ``inputs``."""
    feed = {name: tensor.numpy() for name, tensor in zip(part.input_names, inputs)}
    shapes = ", ".join(f"{n} {tuple(t.shape)}" for n, t in zip(part.input_names, inputs))
    try:
        got = session.run(list(part.output_names), feed)
    except Exception as exc:  # onnxruntime's own exception types
        raise ExportError(f"export part {part.name!r}: ONNX Runtime fails on inputs {shapes}: {one_line(exc)}"
                          ) from exc
    with torch.no_grad():
        expected = (part.reference or part.module)(*inputs)
    expected = (expected,) if isinstance(expected, torch.Tensor) else expected
    if len(expected) != len(got):
        raise ExportError(f"export part {part.name!r}: eager gives {len(expected)} outputs, ONNX Runtime {len(got)}")
    diff = 0.0
    for name, want, have in zip(part.output_names, expected, got):
        if tuple(want.shape) != tuple(have.shape):
            raise ExportError(f"export part {part.name!r}: output {name!r} is {tuple(have.shape)} in ONNX Runtime, "
                              f"{tuple(want.shape)} in eager, on inputs {shapes}")
        if want.numel():
            error = float((torch.from_numpy(have).double() - want.double()).abs().max())
            diff = max(diff, error if error == error else math.inf)  # a NaN counts as the largest difference
    return diff
