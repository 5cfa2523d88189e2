"""Learned tables: abspos 1D (mod N / clamp), ViT's 2D grid with bicubic resampling, Embed-ND."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from cape.encodings.learned import AbsPos1d, AbsPos2d, EmbedND
from cape.positions import grid_positions

# -- AbsPos1d -------------------------------------------------------------------------------------


def test_abspos1d_mod_rule_against_python_modulo():
    torch.manual_seed(0)
    enc = AbsPos1d(6, 5)
    t = [-7.0, -1.0, -0.5, 0.0, 2.7, 4.0, 5.0, 9.99, 12.0, 1000.0]
    out = enc(positions=torch.tensor(t)[None]).detach()
    expected = torch.stack([enc.table.detach()[math.floor(v) % 5] for v in t])
    torch.testing.assert_close(out[0], expected, rtol=0, atol=0)
    # E(t) == E(t + N) for the default token indices of a sequence longer than the table
    long = enc(torch.zeros(2, 13, 6)).detach()
    torch.testing.assert_close(long[:, 5:10], long[:, 0:5], rtol=0, atol=0)
    torch.testing.assert_close(long[0], enc.table.detach()[torch.arange(13) % 5], rtol=0, atol=0)


def test_abspos1d_clamp():
    torch.manual_seed(1)
    enc = AbsPos1d(4, 3, overflow="clamp")
    out = enc(positions=torch.tensor([[-2.0, 0.0, 1.5, 2.0, 3.0, 50.0]])).detach()[0]
    rows = enc.table.detach()
    torch.testing.assert_close(out, rows[[0, 0, 1, 2, 2, 2]], rtol=0, atol=0)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(-10_000, 10_000), min_size=1, max_size=8), st.integers(1, 50))
def test_abspos1d_mod_property(ts, n):
    enc = AbsPos1d(3, n)
    pos = torch.tensor(ts, dtype=torch.float32)[None]
    with torch.no_grad():
        torch.testing.assert_close(enc(positions=pos), enc(positions=pos + n), rtol=0, atol=0)
        torch.testing.assert_close(enc(positions=pos)[0], enc.table[[t % n for t in ts]])


def test_abspos1d_padding_dtype_gradient_and_state_dict():
    torch.manual_seed(2)
    enc = AbsPos1d(8, 10)
    x = torch.randn(2, 4, 8, dtype=torch.bfloat16)
    out = enc(x, lengths=torch.tensor([4, 2]))
    assert out.dtype == torch.bfloat16
    assert float(out[1, 2:].detach().abs().sum()) == 0.0
    torch.testing.assert_close(out[0], enc.table[:4].to(torch.bfloat16), rtol=0, atol=0)
    out.float().sum().backward()
    used = enc.table.grad.abs().sum(-1) > 0
    assert used[:4].all() and not used[4:].any()

    other = AbsPos1d(8, 10)
    other.load_state_dict(enc.state_dict())
    assert torch.equal(other.table, enc.table)
    assert float(enc.table.detach().abs().max()) <= 2 * 0.02  # truncated at 2 std


@pytest.mark.parametrize(
    "args, kwargs, exc, words",
    [
        ((8, 0), {}, ValueError, ["num_positions"]),
        ((8, 4), dict(overflow="wrap"), ValueError, ["overflow", "mod", "clamp"]),
        ((0, 4), {}, ValueError, ["dim"]),
        ((8, 4.0), {}, TypeError, ["num_positions"]),
        ((8, 4), dict(init_std=-1.0), ValueError, ["init_std"]),
    ],
)
def test_abspos1d_bad_arguments(args, kwargs, exc, words):
    with pytest.raises(exc) as info:
        AbsPos1d(*args, **kwargs)
    assert all(w in str(info.value) for w in words)


def test_abspos1d_nan_positions():
    with pytest.raises(ValueError, match="positions"):
        AbsPos1d(4, 3)(positions=torch.tensor([[0.0, float("nan")]]))


# -- AbsPos2d -------------------------------------------------------------------------------------


def _cubic(t: float, a: float = -0.75) -> list[float]:
    """Keys' cubic convolution weights for taps x0-1..x0+2 at fraction t (PyTorch's A = -0.75)."""

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def np_bicubic_axis(table: np.ndarray, size: int, axis: int) -> np.ndarray:
    """Resample one axis, align_corners=False, border taps clamped (independent of torch)."""
    n = table.shape[axis]
    moved = np.moveaxis(table, axis, 0)
    out = np.zeros((size,) + moved.shape[1:])
    for i in range(size):
        src = (i + 0.5) * n / size - 0.5
        x0 = math.floor(src)
        for k, w in enumerate(_cubic(src - x0)):
            out[i] += w * moved[min(max(x0 - 1 + k, 0), n - 1)]
    return np.moveaxis(out, 0, axis)


def test_abspos2d_same_grid_is_identity():
    torch.manual_seed(3)
    enc = AbsPos2d(6, (3, 4))
    assert enc.resample((3, 4)) is enc.table
    out = enc(torch.zeros(2, 3, 4, 6))
    torch.testing.assert_close(out, enc.table.detach().expand(2, 3, 4, 6), rtol=0, atol=0)
    torch.testing.assert_close(
        enc(torch.zeros(1, 12, 6))[0], enc.table.detach().reshape(12, 6), rtol=0, atol=0
    )


@pytest.mark.parametrize("grid", [(5, 7), (2, 3), (3, 9)])
def test_abspos2d_resample_matches_interpolate_and_numpy(grid):
    torch.manual_seed(4)
    enc = AbsPos2d(5, (3, 4))
    table = enc.table.detach()
    got = enc.resample(grid).detach()
    direct = F.interpolate(
        table.permute(2, 0, 1)[None], size=grid, mode="bicubic", align_corners=False
    )
    torch.testing.assert_close(got, direct[0].permute(1, 2, 0), rtol=0, atol=0)
    ref = np_bicubic_axis(np_bicubic_axis(table.double().numpy(), grid[0], 0), grid[1], 1)
    np.testing.assert_allclose(got.numpy(), ref, atol=1e-5)
    out = enc(torch.zeros(2, *grid, 5))
    torch.testing.assert_close(out, got.expand(2, *grid, 5), rtol=0, atol=0)


def test_abspos2d_class_token_never_resampled():
    torch.manual_seed(5)
    enc = AbsPos2d(4, (2, 3), cls_token=True)
    cls = enc.cls_position.detach()
    for grid in [(2, 3), (4, 4), (1, 5), (7, 2)]:
        h, w = grid
        out = enc(torch.zeros(3, 1 + h * w, 4), grid=grid).detach()
        torch.testing.assert_close(out[:, 0], cls.expand(3, 4), rtol=0, atol=0)
        torch.testing.assert_close(out[0, 1:], enc.resample(grid).detach().reshape(h * w, 4))
        assert tuple(enc(torch.zeros(3, h * w, 4), grid=grid).shape) == (3, h * w, 4)
        assert tuple(enc(grid=grid).shape) == (1, 1 + h * w, 4)


def test_abspos2d_bf16_equals_fp32_cast():
    torch.manual_seed(6)
    enc = AbsPos2d(8, (3, 3), cls_token=True)
    for grid in [(3, 3), (5, 4)]:
        n = 1 + grid[0] * grid[1]
        fp32 = enc(torch.zeros(2, n, 8), grid=grid)
        bf16 = enc(torch.zeros(2, n, 8, dtype=torch.bfloat16), grid=grid)
        assert bf16.dtype == torch.bfloat16
        torch.testing.assert_close(bf16, fp32.to(torch.bfloat16), rtol=0, atol=0)


def test_abspos2d_gradient_add_to_and_state_dict():
    torch.manual_seed(7)
    enc = AbsPos2d(4, (2, 2), cls_token=True)
    enc(torch.zeros(1, 10, 4), grid=(3, 3)).sum().backward()
    assert enc.table.grad is not None and enc.cls_position.grad is not None
    before = enc.table.detach().clone()
    with torch.no_grad():  # the output is a view of the table: add_to must not write into it
        y = enc.add_to(torch.ones(1, 2, 2, 4))
    enc.requires_grad_(False)  # a frozen model
    y2 = enc.add_to(torch.ones(1, 2, 2, 4))
    enc.requires_grad_(True)
    assert torch.equal(enc.table.detach(), before)
    torch.testing.assert_close(y, before[None] + 1)
    torch.testing.assert_close(y2, before[None] + 1)
    other = AbsPos2d(4, (2, 2), cls_token=True)
    other.load_state_dict(enc.state_dict())
    assert set(enc.state_dict()) == {"table", "cls_position"}
    torch.testing.assert_close(other(grid=(3, 5)), enc(grid=(3, 5)), rtol=0, atol=0)


def test_abspos2d_bad_arguments():
    for grid in [(0, 3), (3,), "33", (2, 2, 2)]:
        with pytest.raises(ValueError, match="grid"):
            AbsPos2d(4, grid)
    with pytest.raises(TypeError, match=r"grid\[1\]"):
        AbsPos2d(4, (2, 2.5))
    enc = AbsPos2d(4, (2, 3), cls_token=True)
    with pytest.raises(ValueError, match="positions"):
        enc(torch.zeros(1, 6, 4), positions=torch.zeros(1, 6, 3))  # (x, y) needed
    with pytest.raises(ValueError, match="grid"):
        enc(torch.zeros(1, 8, 4))  # 8 tokens fit neither 6 nor 7
    with pytest.raises(ValueError, match="grid"):
        enc(torch.zeros(1, 12, 4), grid=(3, 3))
    with pytest.raises(ValueError, match="D = 4"):
        enc(torch.zeros(1, 2, 3, 5))
    with pytest.raises(ValueError, match="grid"):
        enc()
    with pytest.raises(ValueError, match="mask"):
        enc(torch.zeros(1, 6, 4), mask=torch.ones(1, 6, dtype=torch.bool))


# -- EmbedND --------------------------------------------------------------------------------------


def test_embednd_concatenates_one_table_per_axis():
    torch.manual_seed(8)
    enc = EmbedND(12, (5, 4, 3))
    idx = torch.tensor([[[0, 0, 0], [4, 0, 0], [0, 3, 0], [0, 0, 2], [2, 1, 1]]])
    out = enc(positions=idx).detach()[0]
    for t, (i, j, k) in enumerate(idx[0].tolist()):
        expected = torch.cat([enc.axis_table(0)[i], enc.axis_table(1)[j], enc.axis_table(2)[k]])
        torch.testing.assert_close(out[t], expected.detach(), rtol=0, atol=0)
    # changing one axis changes only that axis' channels
    torch.testing.assert_close(out[1, 4:], out[0, 4:], rtol=0, atol=0)
    torch.testing.assert_close(out[2, :4], out[0, :4], rtol=0, atol=0)
    torch.testing.assert_close(out[2, 8:], out[0, 8:], rtol=0, atol=0)
    assert not torch.equal(out[3, 8:], out[0, 8:])


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16])
def test_embednd_integers_index_directly_and_clamp(dtype):
    torch.manual_seed(9)
    n = 3000
    enc = EmbedND(4, (n, 7), low=-3.0, high=11.0)
    i = torch.arange(-5, n + 5)
    j = torch.arange(-5, n + 5) % 13 - 3
    out = enc(positions=torch.stack([i, j], -1)[None].to(dtype)).detach()[0]
    torch.testing.assert_close(
        out[:, :2], enc.axis_table(0).detach()[i.clamp(0, n - 1)], rtol=0, atol=0
    )
    torch.testing.assert_close(
        out[:, 2:], enc.axis_table(1).detach()[j.clamp(0, 6)], rtol=0, atol=0
    )


@pytest.mark.parametrize("height, width", [(1, 1), (3, 5), (14, 14), (64, 37)])
def test_embednd_grid_positions_land_in_their_own_bins(height, width):
    enc = EmbedND(4, (width, height))
    bins = enc.index(grid_positions(height, width))
    rows, cols = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    assert torch.equal(bins, torch.stack([cols.flatten(), rows.flatten()], -1))


def _bins(p: float, low: float, high: float, n: int) -> set[int]:
    """floor((p - low) / (high - low) * n) clamped, in exact arithmetic; within float32 rounding
    (1e-4 bins) of a bin edge both neighbours are accepted."""
    u = (p - low) / (high - low) * n
    cands = {math.floor(u)} if abs(u - round(u)) > 1e-4 else {round(u) - 1, round(u)}
    return {min(max(b, 0), n - 1) for b in cands}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-2.0, 2.0, width=32), min_size=1, max_size=10), st.integers(1, 64))
def test_embednd_quantises_floats(ps, n):
    enc = EmbedND(2, (n,))
    pos = torch.tensor(ps)[None, :, None]
    got = enc.index(pos)[0, :, 0].tolist()
    assert all(b in _bins(p, -1.0, 1.0, n) for p, b in zip(ps, got, strict=True))
    with torch.no_grad():
        torch.testing.assert_close(enc(positions=pos)[0], enc.table[got], rtol=0, atol=0)


def test_embednd_float_boundaries_padding_bf16_and_state_dict():
    torch.manual_seed(10)
    enc = EmbedND(4, (4, 2), low=0.0, high=1.0)
    pos = torch.tensor([[[0.0, 0.0], [0.2499, 0.49], [0.25, 0.5], [1.0, 1.0], [-3.0, 7.0]]])
    bins = enc.index(pos)[0].tolist()
    assert bins == [[0, 0], [0, 0], [1, 1], [3, 1], [0, 1]]
    x = torch.zeros(1, 5, 4, dtype=torch.bfloat16)
    out = enc(x, positions=pos, mask=torch.tensor([[True, True, True, True, False]]))
    assert out.dtype == torch.bfloat16 and float(out[0, 4].detach().abs().sum()) == 0.0
    other = EmbedND(4, (4, 2), low=0.0, high=1.0)
    other.load_state_dict(enc.state_dict())
    assert set(enc.state_dict()) == {"table"}
    torch.testing.assert_close(other(positions=pos), enc(positions=pos), rtol=0, atol=0)


def test_embednd_bad_arguments():
    with pytest.raises(ValueError, match="dim"):
        EmbedND(10, (4, 4, 4))
    with pytest.raises(ValueError, match="sizes"):
        EmbedND(8, ())
    with pytest.raises(ValueError, match=r"sizes\[1\]"):
        EmbedND(8, (4, 0))
    with pytest.raises(ValueError, match="high"):
        EmbedND(8, (4, 4), low=1.0, high=1.0)
    enc = EmbedND(8, (4, 4))
    with pytest.raises(ValueError, match="positions"):
        enc(positions=torch.zeros(1, 3, 3))
    with pytest.raises(ValueError, match="positions"):
        enc(positions=torch.tensor([[[0.0, float("inf")]]]))
    with pytest.raises(ValueError, match="reads 2-D positions"):
        enc(torch.zeros(1, 3, 8))
