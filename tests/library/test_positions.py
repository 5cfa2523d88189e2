"""Step 1 of the data flow: position builders (token indices, timestamps, grids, given coordinates).

Every expected value is recomputed here independently (NumPy float64 / Python loops).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cape.positions import (
    as_positions,
    grid_positions,
    lengths_to_mask,
    resolve_mask,
    timestamps,
    token_positions,
)

# -- token positions ----------------------------------------------------------------------


def test_token_positions_values_shape_dtype():
    pos = token_positions(3, 7)
    assert pos.shape == (3, 7, 1)
    assert pos.dtype == torch.float32
    expected = np.broadcast_to(np.arange(7, dtype=np.float64)[None, :, None], (3, 7, 1))
    np.testing.assert_array_equal(pos.numpy(), expected)


def test_token_positions_padding_is_zero_lengths_and_mask():
    lengths = torch.tensor([5, 0, 7, 2])
    pos = token_positions(4, 7, lengths=lengths)
    assert pos.shape == (4, 7, 1) and pos.dtype == torch.float32
    for b, n in enumerate(lengths.tolist()):
        for t in range(7):
            assert pos[b, t, 0].item() == (t if t < n else 0.0)
    mask = torch.tensor([[True, False, True], [False, False, True]])
    pos = token_positions(2, 3, mask=mask)
    expected = np.where(mask.numpy(), np.arange(3.0)[None, :], 0.0)[..., None]
    np.testing.assert_array_equal(pos.numpy(), expected)


def test_token_positions_large_indices_exact_in_float32():
    # bf16 holds only 256 consecutive integers; positions are float32 and exact up to 2^24
    pos = token_positions(1, 5000)
    assert torch.equal(pos[0, :, 0], torch.arange(5000, dtype=torch.float32))


def test_lengths_to_mask_matches_loop():
    lengths = torch.tensor([0, 3, 5])
    mask = lengths_to_mask(lengths, 5)
    assert mask.dtype == torch.bool
    expected = [[t < n for t in range(5)] for n in lengths.tolist()]
    assert mask.tolist() == expected


@pytest.mark.parametrize("lengths", [torch.tensor([3, 8]), torch.tensor([-1, 2])])
def test_lengths_out_of_range_raise_naming_lengths(lengths):
    with pytest.raises(ValueError, match="lengths"):
        token_positions(2, 7, lengths=lengths)
    with pytest.raises(ValueError, match="lengths"):
        timestamps(2, 7, 0.01, lengths=lengths)
    with pytest.raises(ValueError, match="lengths"):
        lengths_to_mask(lengths, 7)


def test_lengths_wrong_shape_or_dtype():
    with pytest.raises(ValueError, match="lengths"):
        token_positions(2, 7, lengths=torch.tensor([3, 4, 5]))
    with pytest.raises(ValueError, match="lengths"):
        token_positions(2, 7, lengths=torch.tensor([[3, 4]]))
    with pytest.raises(TypeError, match="lengths"):
        token_positions(2, 7, lengths=torch.tensor([3.0, 4.0]))


def test_mask_checks():
    with pytest.raises(ValueError, match="mask"):
        resolve_mask(2, 3, mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask"):
        resolve_mask(2, 3, mask=torch.ones(2, 3, 1, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask"):
        resolve_mask(2, 3, mask=torch.ones(2, 3))
    with pytest.raises(ValueError):
        resolve_mask(2, 3, lengths=torch.tensor([1, 2]), mask=torch.ones(2, 3, dtype=torch.bool))
    assert resolve_mask(2, 3) is None


def test_bad_batch_length_types():
    with pytest.raises(TypeError, match="batch"):
        token_positions(2.0, 3)
    with pytest.raises(ValueError, match="length"):
        token_positions(2, -1)
    assert token_positions(0, 3).shape == (0, 3, 1)
    assert token_positions(2, 0).shape == (2, 0, 1)


# -- timestamps ---------------------------------------------------------------------------


@pytest.mark.parametrize("hop", [0.01, 0.03, 0.0125, 1.7])
@pytest.mark.parametrize("offset", [0.5, 0.0, 0.25])
def test_timestamps_float_hop_frame_centres(hop, offset):
    pos = timestamps(2, 50, hop, offset=offset)
    assert pos.shape == (2, 50, 1) and pos.dtype == torch.float32
    expected = (np.arange(50, dtype=np.float64) + offset) * hop
    for b in range(2):
        np.testing.assert_allclose(pos[b, :, 0].numpy(), expected, rtol=1e-6, atol=1e-7)


def test_timestamps_per_sample_hop():
    hop = torch.tensor([0.01, 0.012, 0.03])
    lengths = torch.tensor([40, 25, 0])
    pos = timestamps(3, 40, hop, lengths=lengths)
    assert pos.shape == (3, 40, 1) and pos.dtype == torch.float32
    for b in range(3):
        h = float(hop[b].double())
        expected = [(i + 0.5) * h if i < lengths[b] else 0.0 for i in range(40)]
        np.testing.assert_allclose(pos[b, :, 0].numpy(), expected, rtol=1e-6, atol=1e-7)


def test_timestamps_per_step_constant_equals_per_sample():
    hop = torch.tensor([0.01, 0.03])
    per_sample = timestamps(2, 300, hop)
    per_step = timestamps(2, 300, hop[:, None].expand(2, 300).contiguous())
    # cumulative sums in float32 drift by a few ulps of the largest time (~9 s)
    torch.testing.assert_close(per_step, per_sample, rtol=0, atol=1e-5)
    expected = (np.arange(300) + 0.5)[None, :] * hop.double().numpy()[:, None]
    np.testing.assert_allclose(per_step[..., 0].numpy(), expected, rtol=0, atol=1e-5)


def test_timestamps_per_step_hop_does_not_drift_over_long_audio():
    # 100k frames (1000 s at 10 ms): the cumulative sum must stay within ~2 float32 ulps
    t, h = 100_000, 0.01
    hop = torch.full((1, t), h)
    pos = timestamps(1, t, hop)[0, :, 0].double().numpy()
    expected = (np.arange(t) + 0.5) * float(torch.tensor(h).double())
    ulp = float(np.spacing(np.float32(expected[-1])))
    assert np.abs(pos - expected).max() <= 2 * ulp


def test_timestamps_per_step_variable_hop():
    g = torch.Generator().manual_seed(0)
    hop = 0.005 + 0.02 * torch.rand(2, 30, generator=g, dtype=torch.float64)
    for offset in (0.5, 0.0, 1.0):
        pos = timestamps(2, 30, hop, offset=offset)
        h = hop.numpy()
        for b in range(2):
            for i in range(30):
                start = sum(float(v) for v in h[b, :i])  # previous hops
                assert pos[b, i, 0].item() == pytest.approx(start + offset * h[b, i], abs=2e-6)


def test_timestamps_per_step_hop_with_padding():
    hop = torch.full((2, 6), 0.02)
    hop[1, 4:] = 0.0  # padded steps may hold anything, even 0
    pos = timestamps(2, 6, hop, lengths=torch.tensor([6, 4]))
    assert torch.all(pos[1, 4:] == 0)
    np.testing.assert_allclose(pos[1, :4, 0].numpy(), (np.arange(4) + 0.5) * 0.02, atol=1e-7)


@pytest.mark.parametrize(
    "hop",
    [
        0.0,
        -0.01,
        math.nan,
        math.inf,
        torch.tensor([0.01, 0.0]),
        torch.tensor([0.01, -1.0]),
        torch.tensor([[0.01, 0.01, 0.0], [0.01, 0.01, 0.01]]),
        torch.tensor([0.01, math.nan]),
    ],
)
def test_timestamps_nonpositive_hop_raises_naming_hop(hop):
    with pytest.raises(ValueError, match="hop"):
        timestamps(2, 3, hop)


def test_timestamps_hop_shape_errors():
    with pytest.raises(ValueError, match="hop"):
        timestamps(2, 3, torch.tensor([0.01, 0.01, 0.01]))
    with pytest.raises(ValueError, match="hop"):
        timestamps(2, 3, torch.full((2, 4), 0.01))
    with pytest.raises(ValueError, match="hop"):
        timestamps(2, 3, torch.full((2, 3, 1), 0.01))
    with pytest.raises(TypeError, match="hop"):
        timestamps(2, 3, "0.01")


# -- grids --------------------------------------------------------------------------------


@pytest.mark.parametrize("height,width", [(3, 5), (4, 2), (1, 6), (5, 1), (1, 1), (7, 7)])
@pytest.mark.parametrize("extent", [1.0, 2.5])
def test_grid_positions_against_meshgrid(height, width, extent):
    grid = grid_positions(height, width, extent=extent)
    assert grid.shape == (height * width, 2) and grid.dtype == torch.float32

    def axis(n):
        return np.zeros(1) if n == 1 else np.linspace(-extent, extent, n)

    yy, xx = np.meshgrid(axis(height), axis(width), indexing="ij")  # [H, W]
    expected = np.stack([xx, yy], axis=-1).reshape(height * width, 2)
    np.testing.assert_allclose(grid.numpy(), expected, rtol=0, atol=1e-6)
    # spans exactly [-extent, extent] along any axis with more than one patch
    if width > 1:
        assert grid[:, 0].min().item() == -extent and grid[:, 0].max().item() == extent
    else:
        assert torch.all(grid[:, 0] == 0)
    if height > 1:
        assert grid[:, 1].min().item() == -extent and grid[:, 1].max().item() == extent
    else:
        assert torch.all(grid[:, 1] == 0)


def test_grid_positions_row_major_matches_flatten():
    height, width = 3, 4
    # a [B, H, W, 2] tensor holding (column, row) per patch, flattened like content patches
    rows, cols = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    idx = torch.stack([cols, rows], dim=-1)[None].expand(2, -1, -1, -1).flatten(1, 2)
    grid = grid_positions(height, width, batch=2)
    assert grid.shape == (2, height * width, 2)
    lin_w = np.linspace(-1, 1, width)
    lin_h = np.linspace(-1, 1, height)
    for t in range(height * width):
        c, r = idx[0, t].tolist()
        assert grid[1, t, 0].item() == pytest.approx(lin_w[c], abs=1e-6)  # x along the width
        assert grid[1, t, 1].item() == pytest.approx(lin_h[r], abs=1e-6)  # y along the height


def test_grid_positions_bad_args():
    with pytest.raises(ValueError, match="extent"):
        grid_positions(3, 3, extent=0.0)
    with pytest.raises(ValueError, match="extent"):
        grid_positions(3, 3, extent=-1.0)
    with pytest.raises(ValueError, match="height"):
        grid_positions(-1, 3)
    assert grid_positions(0, 3).shape == (0, 2)  # a 0-size grid: no positions, as T = 0
    with pytest.raises(TypeError, match="width"):
        grid_positions(3, 2.0)


# -- given coordinates --------------------------------------------------------------------


def test_as_positions_shapes_and_dtype():
    p = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    out = as_positions(p)
    assert out.shape == (2, 3, 1) and out.dtype == torch.float32
    assert out[..., 0].tolist() == p.tolist()
    p3 = torch.randn(2, 3, 4, dtype=torch.bfloat16)
    out3 = as_positions(p3, dims=4)
    assert out3.dtype == torch.float32 and torch.equal(out3, p3.float())
    ints = as_positions(torch.tensor([[1, 2, 3]]))
    assert ints.dtype == torch.float32 and ints[0, :, 0].tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="positions"):
        as_positions(p3, dims=2)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_as_positions_nonfinite_raises_naming_positions(bad):
    p = torch.zeros(2, 4, 2)
    p[1, 2, 0] = bad
    with pytest.raises(ValueError, match="positions"):
        as_positions(p)
    # still an error when the bad value sits at a valid token
    mask = torch.ones(2, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match="positions"):
        as_positions(p, mask=mask)


def test_as_positions_nan_at_padding_allowed_and_zeroed():
    p = torch.arange(8.0).reshape(2, 4, 1)
    p[0, 3] = math.nan
    p[1, 1:] = math.inf
    mask = torch.tensor([[True, True, True, False], [True, False, False, False]])
    out = as_positions(p, mask=mask)
    assert torch.isfinite(out).all()
    expected = np.where(mask.numpy()[..., None], np.arange(8.0).reshape(2, 4, 1), 0.0)
    np.testing.assert_array_equal(out.numpy(), expected)


@pytest.mark.parametrize("shape", [(5,), (2, 3, 4, 1), ()])
def test_as_positions_wrong_rank_raises(shape):
    with pytest.raises(ValueError, match="positions"):
        as_positions(torch.zeros(shape))


def test_as_positions_bad_types():
    with pytest.raises(TypeError):
        as_positions(torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(TypeError):
        as_positions(torch.zeros(2, 3, dtype=torch.complex64))
    with pytest.raises(TypeError):
        as_positions([[0.0, 1.0]])
