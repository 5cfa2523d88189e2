"""cape.integrations.timm against the real timm: a cape 2-D encoding in place of a ViT's learned
pos_embed, 2-D rotary inside its attention blocks, stock checkpoints loaded afterwards.

Each check compares numbers with an independent computation: a stock timm ViT whose pos_embed
holds the same sinusoids, one block computed by hand with cape's Rotary, a stock checkpoint.
tests/conftest.py lets timm import beside a CPU-only torch with torchvision's CUDA wheel.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

import cape
from cape.integrations.timm import add_rotary, remove_pos_embed, replace_pos_embed

try:
    import timm  # noqa: F401
    from timm.models.vision_transformer import VisionTransformer
except (ImportError, RuntimeError) as error:  # RuntimeError: torchvision's C ops (conftest)
    pytest.skip(f"timm cannot be imported ({error}): pip install timm", allow_module_level=True)

SRC = Path(__file__).resolve().parents[2] / "src"
TINY = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2, num_classes=10)
GRID = (4, 4)  # the training grid of TINY


def _vit(seed: int = 0, **options: object) -> VisionTransformer:
    torch.manual_seed(seed)
    return VisionTransformer(**{**TINY, "dynamic_img_size": True, **options})


def _images(height: int = 32, width: int = 32, seed: int = 1) -> torch.Tensor:
    return torch.randn(2, 3, height, width, generator=torch.Generator().manual_seed(seed))


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def _prefix(model: VisionTransformer) -> int:
    return 0 if model.no_embed_class else model.num_prefix_tokens


# --- an absolute encoding in place of pos_embed ------------------------------------------------

PREFIXES = {  # timm's layouts of the prefix tokens
    "cls": dict(),
    "cls+2reg": dict(reg_tokens=2),
    "no_embed_class": dict(reg_tokens=1, no_embed_class=True),
    "no-cls-avg": dict(class_token=False, global_pool="avg"),
    "fixed-size": dict(dynamic_img_size=False),
}
ABSOLUTE = {"sinpos2d": {}, "cape2d": {"preset": "image"}, "sine-2d": {}}


@pytest.mark.parametrize("name", ABSOLUTE)
@pytest.mark.parametrize("layout", PREFIXES)
def test_eval_equals_a_stock_vit_with_the_sinusoids_in_pos_embed(name: str, layout: str) -> None:
    stock = _vit(**PREFIXES[layout]).eval()
    table = cape.build(name, 64, fit_grid=GRID, **ABSOLUTE[name]).eval()(grid=GRID)  # [1, 16, D]
    with torch.no_grad():
        stock.pos_embed[:, _prefix(stock) :] = table
        stock.pos_embed[:, : _prefix(stock)] = torch.randn(1, _prefix(stock), 64)
    model = copy.deepcopy(stock)
    replace_pos_embed(model, name, **ABSOLUTE[name])
    assert model.pos_embed is None
    with torch.no_grad():
        assert _err(model.eval()(_images()), stock(_images())) < 1e-5
    # what its state gives stock timm: the prefix rows folded (zero), the encoding's table
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # what a stock load loses: test_timm_saving.py
        saved = model.state_dict()["pos_embed"]
    assert saved.shape == stock.pos_embed.shape and _err(saved[:, _prefix(stock) :], table) == 0.0
    assert not saved[:, : _prefix(stock)].any()


@pytest.mark.parametrize("size", [(48, 40), (16, 24), (32, 32)])
def test_other_sizes_add_the_encoding_of_their_grid(size: tuple[int, int]) -> None:
    stock = _vit(reg_tokens=1).eval()
    model = copy.deepcopy(stock)
    encoding = replace_pos_embed(model, "cape2d", preset="image")
    seen = []
    model.patch_drop.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    images = _images(*size)
    with torch.no_grad():
        model.eval()(images)
        raw = stock.patch_embed(images).flatten(1, 2)  # the same weights, no hook
        grid = (size[0] // 8, size[1] // 8)
        want = raw + cape.build("cape2d", 64, preset="image", fit_grid=GRID).eval()(grid=grid)
    tokens = seen[0]
    assert tokens.shape == (2, 2 + grid[0] * grid[1], 64)
    assert _err(tokens[:, 2:], want) < 1e-5
    # the prefix tokens: cls and register tokens with their stock position rows folded in
    prefix = torch.cat([stock.cls_token, stock.reg_token], 1) + stock.pos_embed[:, :2]
    assert _err(tokens[:, :2], prefix.expand(2, -1, -1)) < 1e-6
    assert encoding is model.cape_pos_embed and encoding.fit_grid == GRID


def test_train_draws_differ_between_forwards_and_eval_is_deterministic() -> None:
    model = _vit()
    replace_pos_embed(model, "cape2d", preset="image")
    images = _images()
    with torch.no_grad():
        a, b = model.train()(images), model(images)
        c, d = model.eval()(images), model(images)
    assert _err(a, b) > 1e-3  # each forward draws new positions
    assert _err(c, d) == 0.0


def test_pos_drop_still_acts_without_pos_embed() -> None:
    model = _vit(pos_drop_rate=0.5)
    replace_pos_embed(model, "sinpos2d")
    out = []
    model.patch_drop.register_forward_hook(lambda m, args, y: out.append(y))
    with torch.no_grad():
        model.train()(_images())
        model.eval()(_images())
    assert 0.3 < (out[0] == 0).float().mean().item() < 0.7  # dropped: timm's p = 0.5
    assert (out[1] == 0).float().mean().item() < 0.01  # eval: none


@pytest.mark.parametrize("layout", ["cls", "cls+2reg", "no_embed_class"])
def test_a_stock_checkpoint_loads_strictly_after_the_conversion(layout: str) -> None:
    stock = _vit(seed=3, **PREFIXES[layout]).eval()
    checkpoint = copy.deepcopy(stock.state_dict())
    model = _vit(seed=4, **PREFIXES[layout])  # other weights, converted before loading
    replace_pos_embed(model, "sinpos2d")
    result = model.load_state_dict(checkpoint)  # strict: pos_embed folded and dropped
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert "pos_embed" in checkpoint  # the caller's dict is left as it was
    converted = copy.deepcopy(stock)
    replace_pos_embed(converted, "sinpos2d")  # converting after loading: the same model
    with torch.no_grad():
        assert _err(model.eval()(_images()), converted.eval()(_images())) == 0.0
    rows = stock.pos_embed[:, :1] if _prefix(stock) else 0.0
    assert _err(model.cls_token, stock.cls_token + rows) == 0.0
    again = _vit(seed=5, **PREFIXES[layout])
    replace_pos_embed(again, "sinpos2d")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state = model.state_dict()
    again.load_state_dict(state)  # the same record; its pos_embed folds zeros
    assert _err(again.cls_token, model.cls_token) == 0.0


def test_an_encoding_with_parameters_loads_a_stock_checkpoint_with_strict_false() -> None:
    model = _vit(seed=4)
    replace_pos_embed(model, "lff")
    with pytest.raises(RuntimeError, match="cape_pos_embed"):
        model.load_state_dict(_vit(seed=3).state_dict())
    result = model.load_state_dict(_vit(seed=3).state_dict(), strict=False)
    assert result.unexpected_keys == []
    assert result.missing_keys and all(k.startswith("cape_pos_embed.") for k in result.missing_keys)


# --- 2-D rotary inside attention ---------------------------------------------------------------

ROTARY = ["rotary2d", "rope-axial", "rope-mixed"]


def _reference_block(
    block: torch.nn.Module, x: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """timm's pre-norm block by hand, q and k rotated by a fresh cape rotary with the block's
    own frequencies; softmax attention written out (not SDPA)."""
    attn, (b, n, d) = block.attn, x.shape
    qkv = attn.qkv(block.norm1(x)).reshape(b, n, 3, attn.num_heads, attn.head_dim)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    # its frequencies (rope-mixed: learned); eval: the positions given are the drawn ones
    rotary = copy.deepcopy(attn.cape_rotary).eval()
    rotary.__dict__.pop("prepare", None)  # `_record`'s spy, bound to the model's own rotary
    q, k = rotary(q, k, positions=positions.expand(b, -1, -1))
    weights = (q @ k.transpose(-2, -1) * attn.head_dim**-0.5).softmax(-1)
    out = attn.proj((weights @ v).transpose(1, 2).reshape(b, n, d))
    x = x + block.ls1(out)
    return x + block.ls2(block.mlp(block.norm2(x)))


def _record(model: VisionTransformer) -> tuple[list, list]:
    """Capture block 0's input and output, and the positions every block's rotary reads."""
    io, used = [], []
    model.blocks[0].register_forward_hook(lambda m, args, y: io.append((args[0], y)))
    for i, block in enumerate(model.blocks):
        rotary = block.attn.cape_rotary
        prepare = rotary.prepare

        def spy(context, _i=i, _prepare=prepare):
            if context.augmented:  # the model's forward drew (not a test's own direct call)
                used.append((_i, context.q_positions))
            return _prepare(context)

        rotary.prepare = spy
    return io, used


@pytest.mark.parametrize("name", ROTARY)
def test_rotary_block_in_eval_equals_a_hand_computation(name: str) -> None:
    model = _vit(reg_tokens=1)
    add_rotary(model, name, max_global_scaling=1.4, max_global_shift=0.5)
    assert model.pos_embed is None and model.blocks[1].attn.cape_rotary.fit_grid == GRID
    io, used = _record(model)
    images = _images(48, 40)  # a 6 x 5 grid
    with torch.no_grad():
        model.eval()(images)
        grid = cape.grid_positions(6, 5, batch=1)  # [1, 30, 2]; the prefix tokens at (0, 0)
        positions = torch.cat([torch.zeros(1, 2, 2), grid], 1)
        want = _reference_block(model.blocks[0], io[0][0], positions)
    assert _err(io[0][1], want) < 1e-5
    assert [i for i, _ in used] == [0, 1] and all(_err(p, positions) == 0.0 for _, p in used)


@pytest.mark.parametrize("name", ROTARY)
def test_rotary_draws_once_per_forward_for_every_block(name: str) -> None:
    model = _vit()
    state = add_rotary(model, name, max_global_scaling=1.4, max_global_shift=0.5)
    state.generator = torch.Generator().manual_seed(0)
    io, used = _record(model)
    images = _images()
    with torch.no_grad():
        out = [model.train()(images) for _ in range(2)]
        want = _reference_block(model.blocks[0], io[0][0], used[0][1])
    first, second = used[:2], used[2:]
    assert [i for i, _ in used] == [0, 1, 0, 1]
    assert first[0][1] is first[1][1]  # one draw, read by both blocks
    assert first[0][1].shape == (2, 17, 2)  # per image: the class token + 16 patches
    assert _err(first[0][1][0], first[0][1][1]) > 1e-3  # the two images draw differently
    assert _err(first[0][1], second[0][1]) > 1e-3  # and so do the two forwards
    assert _err(out[0], out[1]) > 1e-5  # measured 2e-4 to 8e-4 (a random tiny ViT)
    assert _err(io[0][1], want) < 1e-5  # the drawn positions are the ones that rotate q, k
    with torch.no_grad():
        c, d = model.eval()(images), model(images)
    assert _err(c, d) == 0.0 and used[-1][1].shape == (1, 17, 2)


def test_rotary_keeps_timm_fused_attention_and_state_dict() -> None:
    stock = _vit(seed=3)
    model = _vit(seed=4)
    add_rotary(model, "rotary2d", max_global_scaling=1.4)
    result = model.load_state_dict(stock.state_dict())  # strict: no rotary parameters
    assert result.missing_keys == [] and result.unexpected_keys == []
    calls = []
    sdpa = F.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(1)
        return sdpa(*args, **kwargs)

    F.scaled_dot_product_attention = counting
    try:
        with torch.no_grad():
            model.eval()(_images())
    finally:
        F.scaled_dot_product_attention = sdpa
    assert all(block.attn.fused_attn for block in model.blocks) and len(calls) == 2


def test_cape_positions_and_rotary_together() -> None:
    model = _vit()
    replace_pos_embed(model, "cape2d", preset="image")
    add_rotary(model, "rope-axial", max_global_scaling=1.4)  # pos_embed already gone
    with torch.no_grad():
        assert model.train()(_images(40, 48)).shape == (2, 10)


# --- errors and imports ------------------------------------------------------------------------


def test_errors_name_the_argument_and_what_is_allowed() -> None:
    with pytest.raises(TypeError, match="model must be a timm VisionTransformer"):
        replace_pos_embed(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="2-D absolute encoding.*add_rotary"):
        replace_pos_embed(_vit(), "rotary2d")
    with pytest.raises(ValueError, match=r"position must be one of \['rotary2d'"):
        add_rotary(_vit(), "cape2d")
    with pytest.raises(ValueError, match="patch_drop_rate must be 0"):
        add_rotary(_vit(patch_drop_rate=0.5), "rotary2d")
    model = _vit()
    replace_pos_embed(model)
    with pytest.raises(ValueError, match="already has a cape encoding"):
        replace_pos_embed(model)
    remove_pos_embed(model)  # again: nothing to do


def test_cape_imports_neither_timm_nor_torchvision() -> None:
    code = (
        "import json, sys\nimport cape, cape.integrations.timm\n"
        "print(json.dumps(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('timm', 'torchvision'))))\n"
        "print('cape.integrations.timm' in sys.modules)\n"
    )
    path = os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    lines = out.stdout.splitlines()
    assert json.loads(lines[0]) == [] and lines[1] == "True"
