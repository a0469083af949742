"""ONNX export of a model's inference path, each file checked with ONNX Runtime against the eager model.

A model says what to export through ``ModelSpec.export_parts(model, cfg)``: a list of :class:`ExportPart`, each an
``nn.Module`` wrapper around the model's own layers with example inputs, the names of its inputs and outputs and the
axes that vary from call to call (batch, text length, mel frames, audio samples). A model whose inference is a loop
exports the loop's body: Tacotron2 is split as NVIDIA deploys it (DeepLearningExamples'
``PyTorch/SpeechSynthesis/Tacotron2/tensorrt`` conversion script): an encoder, one decoder step whose recurrent state
and attention are explicit inputs and outputs, and a post-net; the caller runs the loop.

:func:`export_model` writes ``<folder>/<part>.onnx`` for each part, then runs every file with ONNX Runtime on the CPU
twice, on the part's example inputs and on a second set of other lengths (and batch size), and compares each output with
the eager model's. The second run is the proof that the dynamic axes work: a length the trace baked into the graph as a
constant fails there. This is what ``scripts/export.py --format onnx`` runs.

Exporter: the TorchScript-based ``torch.onnx.export(..., dynamo=False)`` (tracing, dynamic axes by name, opset
:data:`OPSET`). The ``torch.export``-based exporter (``dynamo=True``, PyTorch's default since 2.9) is not used: in
PyTorch 2.13 it specialises the time axis of ``nn.LSTM`` (Tacotron2's encoder) to the example's length (``torch.export``
cannot keep it symbolic; pytorch/pytorch#191855), and it takes several times longer. The traced exporter is deprecated
upstream; its deprecation warning is silenced here, and the second-length run above is what catches a trace that went
wrong.

Needs the ``onnx`` and ``onnxruntime`` packages (``requirements.txt``); nothing here imports them before
:func:`export_model` runs.
"""

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

OPSET = 17
"""ONNX opset of the exported files: ONNX Runtime >= 1.11 and TensorRT >= 8.6 read it."""


class ExportError(ValueError):
    """The model cannot be exported, a part failed to export, or ONNX Runtime disagrees with the eager model."""


Tensors = tuple[torch.Tensor, ...]


@dataclasses.dataclass
class ExportPart:
    """One ONNX file of a model's inference path: ``<folder>/<name>.onnx``.

    Attributes:
        name: the file's stem (an identifier: ``generator``, ``encoder``, ``decoder_step``).
        module: the wrapper to export; ``forward(*inputs)`` returns one tensor or a tuple of them, in the order of
            ``output_names``. It may hold sub-modules of the model (shared, not copied).
        inputs: example inputs, traced by the exporter and checked with ONNX Runtime.
        other_inputs: a second set of the same inputs with other sizes along (some of) the dynamic axes: other lengths,
            another batch size; the exported file must give the eager outputs for these too.
        input_names, output_names: the names in the ONNX graph (unique across both lists: ONNX names values).
        dynamic_axes: ``{input or output name: {axis: axis name}}``, the axes that vary (e.g. ``{"mel": {0: "batch", 2:
            "frames"}}``); the same axis name on several tensors means the same size.
        reference: the eager computation the outputs are checked against, called with the inputs (default: ``module``
            itself). A wrapper that reaches the same result by another route than the model (no packed sequences,
            inverse weights computed once) names the model's own route here.
        tolerance: the largest max-abs difference between ONNX Runtime and eager accepted, in output units (float32 on
            the CPU gives ~1e-6 on a tiny model; a full-size one accumulates more).
        description: one line on what goes in and out, with shapes, for the export log.
    """

    name: str
    module: nn.Module
    inputs: Tensors
    other_inputs: Tensors
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    dynamic_axes: dict[str, dict[int, str]]
    reference: Optional[Callable[..., Any]] = None
    tolerance: float = 1e-3
    description: str = ""

    def check(self) -> None:
        """Raise :class:`ExportError` (one line) if the part does not describe itself consistently: input counts, ranks and
        dtypes of the two example sets, duplicate names, dynamic axes of unknown tensors or out of range, or a second
        input set with the same shapes as the first (its run would prove nothing)."""
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


def export_model(spec: Any, model: nn.Module, cfg: Any, folder: Path, progress: bool = True) -> list[dict]:
    """Export the inference path of the model of ``spec`` (a :class:`model.ModelSpec`) to ONNX, one file per part, each
    checked against the eager model.

    Builds the parts with ``Export.parts(model, cfg)`` of the spec (:class:`ExportPart`), exports each with the
    TorchScript-based ``torch.onnx.export`` (opset :data:`OPSET`, constants folded, weights inside the file) to
    ``<folder>/<part>.onnx``, then runs it with ONNX Runtime's CPU provider on the part's example inputs and on its
    second input set of other lengths, and compares every output with the eager reference (the same inputs, under
    ``torch.no_grad``). Method: NVIDIA DeepLearningExamples' Tacotron2/WaveGlow ONNX export for TensorRT (its
    ``tensorrt`` conversion scripts), with PyTorch's ``torch.onnx`` and ONNX Runtime's ``InferenceSession``.

    Args:
        spec: the model's spec.
        model: the model, on the CPU, float32; it is put in evaluation mode (export is of inference).
        cfg: the run's :class:`utils.config.Config` (the model's section and ``audio``).
        folder: where the files go (created if missing; files of the same names are replaced).
        progress: print one line per part as it is exported and checked.

    Returns:
        One row per part: ``{"part": name, "path": Path of the .onnx file, "max_abs_diff": float (largest
        |ONNX Runtime - eager| over every output of both runs, in output units), "inputs": [{input name: shape}, {input
        name: shape}] (the two runs' input shapes)}``.

    Raises:
        ExportError: one line: the model has no ``Export`` group (and what to add), it is not on the CPU in float32,
            ``onnx`` or ``onnxruntime`` is not installed, a part is malformed, fails to export (naming the part and the
            exporter's error) or to load, or differs from eager by more than its tolerance.
    """
    onnxruntime = _checked_exportable(spec, model)
    model.eval()
    parts = spec.export.parts(model, cfg)
    if not parts:
        raise ExportError(f"model {spec.name!r}: Export.parts returned no part")
    seen = set()
    for part in parts:
        part.check()
        if part.name in seen:
            raise ExportError(f"model {spec.name!r}: two export parts are named {part.name!r}")
        seen.add(part.name)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for part in parts:
        path = folder / f"{part.name}.onnx"
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


def _checked_exportable(spec: Any, model: nn.Module) -> Any:
    """The ``onnxruntime`` module, once the model can be exported: it has an ``Export`` group, is on the CPU in float32,
    and ONNX's packages are installed (an optional dependency).

    Raises:
        ExportError: what is missing, in one line.
    """
    name = spec.name
    if spec.export is None:
        raise ExportError(f"model {name!r} cannot be exported to ONNX: its spec has no Export group; add "
                          "export=Export(parts=(model, cfg) -> [utils.onnx_export.ExportPart, ...]) to its ModelSpec")
    params = list(model.parameters()) + list(model.buffers())
    if any(p.device.type != "cpu" for p in params):
        raise ExportError(f"model {name!r} must be on the CPU to be exported and checked: call model.cpu() first")
    if any(p.is_floating_point() and p.dtype != torch.float32 for p in params):
        raise ExportError(f"model {name!r} must be float32 to be exported and checked: call model.float() first")
    try:
        import onnx  # noqa: F401  (torch.onnx.export writes with it)
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
            # The traced exporter's deprecation notice; tracer warnings about Python values taken from tensors and
            # the LSTM export's warning about batch sizes other than the example's: the run on other_inputs (other
            # lengths, another batch size) checks what they warn about.
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            warnings.filterwarnings("ignore", message="Exporting a model to ONNX with a batch_size other than 1")
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
    if isinstance(expected, torch.Tensor):
        expected = (expected,)
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
