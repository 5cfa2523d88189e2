"""torch.export (non-strict, dynamic batch and length), ONNX through onnxruntime, torch.compile
with dynamic shapes in training: the exported or compiled model against eager on inputs of
another shape than the ones it was traced with."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

import cape
from cape.models import TransformerEncoder, ViT

DIM, HEADS = 32, 4


def _encoder(name: str, **options) -> TransformerEncoder:
    torch.manual_seed(0)
    return TransformerEncoder(2, DIM, HEADS, 2 * DIM, position=name, position_options=options)


def _vit(name: str) -> ViT:
    torch.manual_seed(0)
    return ViT(5, image_size=16, patch=4, dim=DIM, depth=2, heads=HEADS, position=name)


SEQ_DYNAMIC = ({0: Dim("B", max=64), 1: Dim("T", min=2, max=4096)},)


def _image_dynamic() -> tuple[dict, ...]:
    # at least 2 patches a side: torch's convolution specialises an output size of 1
    h, w = Dim("h", min=2, max=64), Dim("w", min=2, max=64)
    return ({0: Dim("B", max=64), 2: 4 * h, 3: 4 * w},)


@pytest.mark.parametrize("name", ["sinpos", "cape1d", "rotary", "relpos", "alibi", "fire"])
def test_export_dynamic_length_matches_eager(name: str) -> None:
    model = _encoder(name).eval()
    program = torch.export.export(
        model, (torch.randn(2, 10, DIM),), dynamic_shapes=SEQ_DYNAMIC, strict=False
    )
    for shape in [(3, 17), (1, 2), (5, 300)]:  # relpos: past its 100-step clipping too
        x = torch.randn(*shape, DIM)
        torch.testing.assert_close(program.module()(x), model(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["cape2d", "rotary2d", "rope-mixed"])
def test_export_dynamic_image_size_matches_eager(name: str) -> None:
    # the grid positions of a symbolic size are computed without linspace: float rounding only
    model = _vit(name).eval()
    program = torch.export.export(
        model, (torch.randn(2, 3, 16, 12),), dynamic_shapes=_image_dynamic(), strict=False
    )
    for shape in [(3, 24, 20), (1, 8, 36), (2, 16, 16)]:
        x = torch.randn(shape[0], 3, *shape[1:])
        torch.testing.assert_close(program.module()(x), model(x), rtol=1e-5, atol=1e-5)


def test_symbolic_grid_axis_matches_linspace() -> None:
    # the traced axis of `grid_positions` against eager's, for every size the export allows
    program = torch.export.export(
        _Grid(), (torch.zeros(5, 7),), dynamic_shapes=({0: Dim("h", min=1), 1: Dim("w", min=1)},),
        strict=False,
    )  # fmt: skip
    for h, w in [(1, 1), (1, 9), (2, 3), (7, 5), (64, 33)]:
        got = program.module()(torch.zeros(h, w))
        torch.testing.assert_close(got, cape.grid_positions(h, w, extent=1.5), rtol=0, atol=2e-7)


class _Grid(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cape.grid_positions(x.shape[0], x.shape[1], extent=1.5)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rotary", "relpos"])
def test_onnx_export_runs_in_onnxruntime(name: str, tmp_path) -> None:
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is in the test extra")
    pytest.importorskip("onnxscript", reason="torch.onnx.export(dynamo=True) needs onnxscript")
    model = _encoder(name).eval()
    program = torch.onnx.export(
        model, (torch.randn(2, 10, DIM),), dynamo=True, dynamic_shapes=SEQ_DYNAMIC, verbose=False
    )
    program.save(str(tmp_path / "model.onnx"))
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    x = torch.randn(3, 23, DIM)
    (out,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    torch.testing.assert_close(torch.from_numpy(out), model(x), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rotary", "cape1d"])
def test_compile_dynamic_training_one_graph(name: str) -> None:
    # CAPE's draws inside the graph: one graph, no recompile for a new batch and length
    torch._dynamo.reset()
    options = {"augmentation": cape.Augmentation(max_global_shift=4.0)} if name == "rotary" else {}
    if name == "cape1d":
        options = {"preset": "text"}
    model = _encoder(name, **options).train()
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    losses = []
    for shape in [(2, 10), (3, 17)]:
        x = torch.randn(*shape, DIM)
        loss = compiled(x).square().mean()
        loss.backward()
        losses.append(loss)
        assert torch.isfinite(loss)
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled(torch.randn(4, 29, DIM))  # another shape: the dynamic graph serves it
    x = torch.randn(2, 10, DIM)
    assert not torch.equal(compiled(x), compiled(x))  # the augmentation draws anew per call
