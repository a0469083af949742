"""ONNX export (``utils/onnx_export.py``; ``python -m scripts.export --format onnx``): every registered model with
an ``Export`` group (``Export.parts``) exports its inference path, and ONNX Runtime on the CPU gives the eager model's outputs
within 1e-4 on perturbed tiny weights, at the parts' example sizes and at other lengths and batch sizes; the files
declare those axes variable (a model's own loop over its files is tested with the model). A model without the hook, a part that cannot be exported, a length baked into the graph and a wrapper that does not
compute what the model does are each refused with a one-line :class:`ExportError`."""

import importlib.util

import pytest
import torch
from conftest import perturbed_tiny_model
from torch import nn

from models import MODELS
from parts import PARTS
from utils.onnx_export import Export, ExportError, ExportPart, export_model

pytestmark = pytest.mark.skipif(any(importlib.util.find_spec(name) is None for name in ("onnx", "onnxruntime")),
                                reason="ONNX export needs the onnx and onnxruntime packages")

EXPORTABLE = [name for name in sorted(MODELS) if name in PARTS.exports]
TOLERANCE = 1e-4


@pytest.mark.parametrize("name", EXPORTABLE)
def test_export_matches_eager_at_two_lengths(name, tmp_path):
    import onnx  # an optional dependency (the module is skipped without it)

    model, cfg = perturbed_tiny_model(name)
    parts = {part.name: part for part in PARTS.exports[name].parts(model.eval(), cfg)}
    rows = export_model(name, PARTS.exports[name], model, cfg, tmp_path, progress=False)
    assert [row["part"] for row in rows] == list(parts)
    for row in rows:
        part = parts[row["part"]]
        assert row["path"] == tmp_path / f"{part.name}.onnx" and row["path"].stat().st_size > 0
        assert 0 <= row["max_abs_diff"] < TOLERANCE, row
        first, second = row["inputs"]
        assert list(first) == list(second) == list(part.input_names) and first != second, row
        # Every axis the part calls dynamic is a named (variable) dimension of the file's inputs and outputs.
        graph = onnx.load(str(row["path"]), load_external_data=False).graph
        dims = {value.name: value.type.tensor_type.shape.dim for value in [*graph.input, *graph.output]}
        for tensor, axes in part.dynamic_axes.items():
            for axis, label in axes.items():
                assert dims[tensor][axis].dim_param == label, (part.name, tensor, axis)
        # The agreement is finer than the outputs vary (perturbed weights, random inputs): a file that dropped an
        # input, or gave a constant, would differ by about the spread. (The tiny HiFi-GAN's audio spreads ~2e-4.)
        with torch.no_grad():
            outputs = (part.reference or part.module)(*part.other_inputs)
        outputs = (outputs,) if isinstance(outputs, torch.Tensor) else outputs
        spread = max(float(out.std()) for out in outputs if out.is_floating_point())
        assert spread > max(1e-5, 100 * row["max_abs_diff"]), (part.name, spread, row["max_abs_diff"])


def test_model_without_export_parts_is_refused(tmp_path):
    name = sorted(MODELS)[0]
    with pytest.raises(ExportError) as err:
        export_model(name, None, nn.Linear(2, 2), None, tmp_path, progress=False)
    message = str(err.value)
    assert "\n" not in message and name in message and "no Export group" in message  # what is missing, and where
    assert "EXPORT = Export(parts=" in message and "parts.py" in message  # to add it
    assert not any(tmp_path.iterdir())


class Eigenvalues(nn.Module):
    def forward(self, x):
        return torch.linalg.eigh(x)[0]  # no ONNX operator


class FixedLength(nn.Module):
    def forward(self, x):
        return x + torch.arange(int(x.shape[1]), dtype=x.dtype)  # the example's length becomes a constant


BAD_PARTS = {
    "no_onnx_operator": (Eigenvalues(), None, "failed to export: UnsupportedOperatorError"),
    "baked_length": (FixedLength(), None, "ONNX Runtime fails on inputs x (2, 5, 5)"),
    "not_the_model": (nn.Identity(), lambda x: x + 1, "differs from eager by 1 (max abs)"),
}


@pytest.mark.parametrize("case", sorted(BAD_PARTS))
def test_bad_part_is_refused_naming_it(case, tmp_path):
    module, reference, expected = BAD_PARTS[case]
    part = ExportPart(name=case, module=module, inputs=(torch.rand(2, 3, 3),), other_inputs=(torch.rand(2, 5, 5),),
                      input_names=("x",), output_names=("y",), dynamic_axes={"x": {1: "n", 2: "m"}},
                      reference=reference)
    with pytest.raises(ExportError) as err:
        export_model(sorted(MODELS)[0], Export(parts=lambda model, cfg: [part]), nn.Linear(2, 2), None, tmp_path,
                     progress=False)
    message = str(err.value)
    assert "\n" not in message and f"export part {case!r}" in message and expected in message, message
