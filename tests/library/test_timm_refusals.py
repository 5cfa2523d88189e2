"""cape.integrations.timm refuses what it cannot use in one line naming the argument (or the
object given in place of a model), and a refused call leaves the model exactly as it was:
the same tensors, attributes and hooks.

tests/conftest.py lets timm import beside a CPU-only torch with torchvision's CUDA wheel.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import cape
from cape.integrations.timm import add_rotary, remove_pos_embed, replace_pos_embed

try:
    from timm.models.vision_transformer import VisionTransformer
except (ImportError, RuntimeError) as error:  # RuntimeError: torchvision's C ops (conftest)
    pytest.skip(f"timm cannot be imported ({error}): pip install timm", allow_module_level=True)

TINY = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2, num_classes=10)


def _vit(**options: Any) -> VisionTransformer:
    torch.manual_seed(0)
    return VisionTransformer(**{**TINY, "dynamic_img_size": True, "reg_tokens": 1, **options})


def _hooks(m: nn.Module) -> tuple[dict, ...]:
    return m._forward_hooks, m._forward_pre_hooks, m._state_dict_hooks, m._load_state_dict_pre_hooks


def _snapshot(model: nn.Module) -> dict[str, Any]:
    """Everything a call could change: tensors, attributes and hooks of every module."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a converted model's state names what stock timm loses
        state = model.state_dict(keep_vars=True)
    return {
        "tensors": {k: v.detach().clone() for k, v in state.items()},
        "modules": [
            (name, sorted(vars(m)), sorted(m._modules), [len(h) for h in _hooks(m)])
            for name, m in model.named_modules()
        ],
    }


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (
        a["modules"] == b["modules"]
        and a["tensors"].keys() == b["tensors"].keys()
        and all(torch.equal(v, b["tensors"][k]) for k, v in a["tensors"].items())
    )


# (call on a fresh ViT, exception, words of the message)
REFUSED: dict[str, tuple[Callable[[nn.Module], Any], type, str]] = {
    "drop_pos_embed str": (
        lambda m: add_rotary(m, "rotary2d", drop_pos_embed="no"), TypeError,
        "drop_pos_embed must be a bool, got str 'no'"),
    "drop_pos_embed int": (
        lambda m: add_rotary(m, "rotary2d", drop_pos_embed=1), TypeError, "drop_pos_embed"),
    "rotary position int": (lambda m: add_rotary(m, 2), TypeError, r"position must be one of \["),
    "rotary position name": (lambda m: add_rotary(m, "cape2d"), ValueError, "position must be"),
    "rotary fit_grid str": (lambda m: add_rotary(m, fit_grid="4x4"), TypeError, "fit_grid must"),
    "rotary fit_grid bool": (
        lambda m: add_rotary(m, fit_grid=(True, 4)), TypeError, r"fit_grid\[0\] must be an int"),
    "rotary fit_grid 0": (lambda m: add_rotary(m, fit_grid=(0, 4)), ValueError, r"fit_grid\[0\]"),
    "rotary option type": (
        lambda m: add_rotary(m, max_global_scaling="x"), TypeError,
        "max_global_scaling must be a real number, got str"),
    "rotary augmentation": (
        lambda m: add_rotary(m, augmentation="no"), TypeError, "augmentation must be a cape"),
    "rotary unknown option": (lambda m: add_rotary(m, bogus=1), TypeError, r"unknown option"),
    "encoding position int": (
        lambda m: replace_pos_embed(m, 3), TypeError, "position must be a cape.build name"),
    "encoding rotary": (lambda m: replace_pos_embed(m, "rotary2d"), ValueError, "add_rotary"),
    "encoding unknown": (lambda m: replace_pos_embed(m, "nope"), ValueError, "nope"),
    "encoding preset": (
        lambda m: replace_pos_embed(m, "cape2d", preset=3), ValueError, "preset must be one of"),
    "encoding fit_grid": (
        lambda m: replace_pos_embed(m, fit_grid=[4]), TypeError, "fit_grid must be True"),
    "encoding fit_grid float": (
        lambda m: replace_pos_embed(m, "lff", fit_grid=(4, 4.0)), TypeError, r"fit_grid\[1\]"),
    "encoding dim": (
        lambda m: replace_pos_embed(m, cape.build("cape2d", 32)), ValueError, "embed_dim 64"),
    "module with options": (
        lambda m: replace_pos_embed(m, cape.build("cape2d", 64), preset="image"), TypeError,
        "apply to a name"),
}  # fmt: skip


@pytest.mark.parametrize("case", REFUSED)
def test_a_refused_call_names_its_argument_and_leaves_the_model(case: str) -> None:
    call, kind, words = REFUSED[case]
    model = _vit()
    before = _snapshot(model)
    with pytest.raises(kind, match=words) as error:
        call(model)
    assert "\n" not in str(error.value)
    assert _same(before, _snapshot(model))


NOT_MODELS = {
    "state_dict": (lambda: _vit().state_dict(), "got OrderedDict (a state_dict?"),
    "name": (lambda: "vit_tiny_patch16_224", "got str (a name?"),
    "class": (lambda: VisionTransformer, "got type"),
    "None": (lambda: None, "got NoneType"),
    "Linear": (lambda: nn.Linear(2, 2), "Linear has no"),
}


@pytest.mark.parametrize("what", NOT_MODELS)
@pytest.mark.parametrize("install", [replace_pos_embed, add_rotary, remove_pos_embed])
def test_what_is_not_a_vit_is_named(install: Callable, what: str) -> None:
    make, words = NOT_MODELS[what]
    with pytest.raises(TypeError, match="model must be a timm VisionTransformer") as error:
        install(make())
    assert words in str(error.value) and "\n" not in str(error.value)


def test_a_block_that_is_not_timm_attention_refuses_before_any_block_changes() -> None:
    model = _vit()
    model.blocks[1].attn.q_norm = None  # block 0 is fine: it must not be hooked either
    before = _snapshot(model)
    with pytest.raises(TypeError, match=r"model.blocks\[1\].attn must be timm's Attention"):
        add_rotary(model, "rope-mixed")
    assert _same(before, _snapshot(model)) and not hasattr(model.blocks[0].attn, "cape_rotary")


def test_patch_drop_and_pos_drop_refusals_leave_the_model() -> None:
    model = _vit(patch_drop_rate=0.5)
    before = _snapshot(model)
    with pytest.raises(ValueError, match="patch_drop_rate must be 0"):
        add_rotary(model)
    assert _same(before, _snapshot(model))
    model = _vit(pos_drop_rate=0.1)
    del model.patch_drop  # a ViT whose pos_drop cannot act after pos_embed is gone
    before = _snapshot(model)
    with pytest.raises(ValueError, match="pos_drop has p > 0 but the model has no patch_drop"):
        replace_pos_embed(model, "cape2d")
    assert _same(before, _snapshot(model)) and model.pos_embed is not None


def test_a_distillation_token_is_refused_before_the_removal() -> None:
    model = _vit()
    model.num_prefix_tokens = 3  # as timm's distilled ViT counts its dist_token
    before = _snapshot(model)
    with pytest.raises(ValueError, match="must count cls_token and reg_token's rows"):
        remove_pos_embed(model)
    assert _same(before, _snapshot(model))


def test_a_second_install_is_refused_and_the_first_kept() -> None:
    model = _vit()
    replace_pos_embed(model, "cape2d", preset="image")
    add_rotary(model, "rotary2d")
    before = _snapshot(model)
    with pytest.raises(ValueError, match="already has a cape encoding"):
        replace_pos_embed(model, "sinpos2d")
    with pytest.raises(ValueError, match="already has cape's rotary"):
        add_rotary(model, "rope-axial")
    remove_pos_embed(model)  # done already: nothing to do
    assert _same(before, _snapshot(model))
