"""Properties every encoding shares, through `cape.build`: devices, dtypes, compile, state."""

from __future__ import annotations

import pytest
import torch

import cape

# name -> (options, how to call it)
ABSOLUTE = {
    "sinpos": {},
    "cape1d": {"preset": "text"},
    "sine-1d": {},
    "abspos": {"num_positions": 16},
    "embed-1d": {"num_positions": 16},
}
GRID = {"sinpos2d": {}, "cape2d": {"preset": "image"}, "abspos2d": {"grid": (4, 6)}}
GIVEN = {
    "lff": ({"pos_dim": 2}, 2),
    "sine-2d": ({}, 2),
    "sine-4d": ({}, 4),
    "embed-2d": ({"sizes": (8, 8)}, 2),
    "embed-4d": ({"sizes": (8, 8, 8, 8)}, 4),
}


def _call(name: str, enc: torch.nn.Module, dtype=torch.float32) -> torch.Tensor:
    torch.manual_seed(0)
    if name in ABSOLUTE:
        return enc(torch.randn(2, 10, 32, dtype=dtype))
    if name in GRID:
        return enc(torch.randn(2, 4, 6, 32, dtype=dtype))
    _, m = GIVEN[name]
    pos = torch.rand(2, 10, m) * 2 - 1
    return enc(torch.randn(2, 10, 32, dtype=dtype), positions=pos)


def _build(name: str) -> torch.nn.Module:
    opts = ABSOLUTE.get(name) or GRID.get(name)
    if opts is None and name in GIVEN:
        opts = GIVEN[name][0]
    return cape.build(name, 32, **(opts or {}))


ALL = list(ABSOLUTE) + list(GRID) + list(GIVEN)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_output_dtype_and_finite(name: str, dtype: torch.dtype) -> None:
    enc = _build(name).eval()
    out = _call(name, enc, dtype)
    assert out.dtype == dtype
    assert torch.isfinite(out).all()
    ref = _call(name, enc, torch.float32)
    # fixed (sinusoidal) maths run in float32, then cast: identical to the float32 result cast
    if name in ("sinpos", "cape1d", "sine-1d", "sinpos2d", "cape2d", "sine-2d", "sine-4d"):
        assert torch.equal(out, ref.to(dtype))


@pytest.mark.parametrize("name", ALL)
def test_meta_device_and_state_dict_round_trip(name: str) -> None:
    with torch.device("meta"):
        meta = _build(name)
    assert all(p.device.type == "meta" for p in meta.parameters())
    torch.manual_seed(1)
    a = _build(name).eval()
    torch.manual_seed(2)
    b = _build(name).eval()
    b.load_state_dict(a.state_dict())
    assert torch.equal(_call(name, a), _call(name, b))
    if list(a.parameters()):  # learned encodings: the two inits differed before loading
        torch.manual_seed(2)
        assert not torch.equal(_call(name, a), _call(name, _build(name).eval()))


def test_build_errors_name_what_is_allowed() -> None:
    with pytest.raises(ValueError, match="name must be one of"):
        cape.build("fancy", 32)
    with pytest.raises(TypeError, match="unknown option.*max_global_shft"):
        cape.build("cape1d", 32, max_global_shft=3)
    with pytest.raises(TypeError, match="max_global_shift.*'sinpos'"):
        cape.build("sinpos", 32, max_global_shift=3)
    with pytest.raises(TypeError, match="'sinpos' has no augmentation"):
        cape.ENCODINGS["sinpos"](32, max_global_shift=3)
    with pytest.raises(ValueError, match="dim"):
        cape.build("cape2d", 31)


@pytest.mark.slow
@pytest.mark.parametrize("train", [False, True])
def test_compile_fullgraph_no_recompile(train: bool) -> None:
    torch._dynamo.reset()
    enc1 = cape.CAPE1d.preset("text", 32).train(train)
    enc2 = cape.CAPE2d.preset(32).train(train)

    def f(x1, x2):
        return enc1.add_to(x1), enc2(x2)

    compiled = torch.compile(f, fullgraph=True, dynamic=False)
    x1, x2 = torch.randn(2, 12, 32), torch.randn(2, 4, 4, 32)
    out1, out2 = compiled(x1, x2)
    if not train:  # deterministic: compiled == eager
        torch.testing.assert_close(out1, enc1.add_to(x1))
        torch.testing.assert_close(out2, enc2(x2))
    else:  # augmented: positions differ per call, but the result is a finite embedding
        assert torch.isfinite(out1).all() and torch.isfinite(out2).all()
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled(torch.randn(2, 12, 32), torch.randn(2, 4, 4, 32))  # same shapes: no recompile


@pytest.mark.parametrize("name", ["sinpos", "cape1d", "sinpos2d", "cape2d", "sine-2d"])
def test_model_cast_to_bf16_keeps_float32_frequencies(name: str) -> None:
    # model.to(bf16) must not round the frequencies: positions up to 2000 need float32 phases
    enc = _build(name).eval()
    ref = _call(name, enc, torch.float32)
    enc.to(torch.bfloat16)
    assert torch.equal(_call(name, enc, torch.bfloat16), ref.to(torch.bfloat16))
    long = cape.CAPE1d(64).eval()
    x = torch.randn(1, 2000, 64)
    ref = long(x)
    long.to(torch.bfloat16)
    assert torch.equal(long(x.bfloat16()), ref.bfloat16())


@pytest.mark.parametrize("name", ALL)
def test_content_of_the_wrong_width_names_x(name: str) -> None:
    enc = _build(name)
    bad = torch.randn(2, 4, 6, 31) if name in GRID else torch.randn(2, 10, 31)
    kwargs = {"positions": torch.rand(2, 10, GIVEN[name][1])} if name in GIVEN else {}
    with pytest.raises(ValueError, match="x"):
        enc(bad, **kwargs)
