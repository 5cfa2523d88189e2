"""timm ViTs with cape inside, through torch.export and ONNX with a dynamic image size: the
exported program and onnxruntime against eager at image sizes other than the traced one, as a
stock timm ViT with `dynamic_img_size=True` exports.

tests/conftest.py lets timm import beside a CPU-only torch with torchvision's CUDA wheel.
"""

from __future__ import annotations

import copy
import io
import warnings
from pathlib import Path

import pytest
import torch
from torch.export import Dim

from cape.integrations.timm import add_rotary, replace_pos_embed

try:
    from timm.models.vision_transformer import VisionTransformer
except (ImportError, RuntimeError) as error:  # RuntimeError: torchvision's C ops (conftest)
    pytest.skip(f"timm cannot be imported ({error}): pip install timm", allow_module_level=True)

TINY = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2, num_classes=10)
TRACED = (2, 3, 32, 32)  # a 4 x 4 grid
OTHERS = [(3, 3, 48, 40), (1, 3, 16, 56), (2, 3, 32, 32)]  # 6 x 5, 2 x 7 and the traced grid
INSTALLS = {
    "stock": lambda m: None,
    "cape2d": lambda m: replace_pos_embed(m, "cape2d", preset="image"),
    "rotary2d": lambda m: add_rotary(m, "rotary2d", max_global_scaling=1.4),
    "rope-mixed": lambda m: add_rotary(m, "rope-mixed"),
    "cape2d+rope-axial": lambda m: (replace_pos_embed(m, "sinpos2d"), add_rotary(m, "rope-axial")),
}


def _model(install: str) -> VisionTransformer:
    torch.manual_seed(0)
    model = VisionTransformer(**TINY, dynamic_img_size=True, reg_tokens=1)
    INSTALLS[install](model)
    return model.eval()


def _dynamic() -> tuple[dict, ...]:
    # at least 2 patches a side: torch's convolution specialises an output size of 1
    h, w = Dim("h", min=2, max=64), Dim("w", min=2, max=64)
    return ({0: Dim("B", max=64), 2: 8 * h, 3: 8 * w},)


@pytest.mark.parametrize("install", INSTALLS)
def test_export_runs_at_every_image_size(install: str) -> None:
    model = _model(install)
    program = torch.export.export(
        model, (torch.randn(*TRACED),), dynamic_shapes=_dynamic(), strict=False
    )
    for shape in OTHERS:
        x = torch.randn(*shape)
        with torch.no_grad():
            torch.testing.assert_close(program.module()(x), model(x), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("install", ["cape2d", "rotary2d", "rope-mixed"])
def test_onnx_runs_at_every_image_size(install: str, tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is in the test extra")
    pytest.importorskip("onnxscript", reason="torch.onnx.export(dynamo=True) needs onnxscript")
    model = _model(install)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's notes on its own progress
        program = torch.onnx.export(
            model, (torch.randn(*TRACED),), dynamo=True, dynamic_shapes=_dynamic(), verbose=False
        )
    program.save(str(tmp_path / "model.onnx"))
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    for shape in OTHERS:
        x = torch.randn(*shape)
        (out,) = session.run(None, {name: x.numpy()})
        with torch.no_grad():
            torch.testing.assert_close(torch.from_numpy(out), model(x), rtol=1e-5, atol=1e-5)


def test_a_traced_model_copies_and_pickles_without_its_traced_positions() -> None:
    # one forward's positions and angles are not the model's: a copy or pickle leaves them out
    model = _model("cape2d+rope-axial")
    torch.export.export(model, (torch.randn(*TRACED),), dynamic_shapes=_dynamic(), strict=False)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    x = torch.randn(*OTHERS[0])
    with torch.no_grad():
        want = model(x)
        for other in (copy.deepcopy(model), torch.load(buffer, weights_only=False)):
            assert torch.equal(other(x), want)


@pytest.mark.parametrize("install", ["cape2d", "rotary2d"])
def test_fx_tracing_is_refused_by_name_and_forward_intermediates_sees_the_positions(
    install: str,
) -> None:
    from timm.models import create_feature_extractor

    model = _model(install)
    with pytest.raises(TypeError, match="torch.fx symbolic tracing .*forward_intermediates"):
        create_feature_extractor(model, return_nodes=["blocks.1"])
    model.eval()  # the extractor traces in train mode and does not restore it when it fails
    x = torch.randn(*OTHERS[0])
    with torch.no_grad():
        (last,) = model.forward_intermediates(
            x, indices=[1], norm=True, intermediates_only=True, output_fmt="NLC"
        )
        features = model.forward_features(x)[:, model.num_prefix_tokens :]
        stock = _model("stock").forward_features(x)[:, model.num_prefix_tokens :]
    assert torch.equal(last, features) and (features - stock).abs().max() > 1e-3
