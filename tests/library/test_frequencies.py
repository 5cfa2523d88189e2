"""cape.functional.frequencies: a grid's sampling, aliasing, frequencies fitted to a grid.

Expected values are closed forms written here: spacing 2e/(N-1) of an N-point axis over [-e, e],
the Nyquist limit pi/D, CAPE's frequencies pi 10^(j/half) (cos k, sin k) counted with numpy.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cape.functional.frequencies import (
    aliased,
    grid_frequencies_1d,
    grid_frequencies_2d,
    grid_radii,
    grid_sampling,
)
from cape.functional.sinusoidal import cape2d_frequencies
from cape.positions import grid_indices, grid_positions


@pytest.mark.parametrize(("h", "w", "extent"), [(8, 8, 1.0), (14, 10, 1.0), (6, 3, 2.0)])
def test_sampling_of_a_grid_is_the_closed_form(h: int, w: int, extent: float) -> None:
    spacing, span = grid_sampling(grid_positions(h, w, extent=extent))
    np.testing.assert_allclose(spacing, [2 * extent / (w - 1), 2 * extent / (h - 1)], rtol=1e-6)
    np.testing.assert_allclose(span, [2 * extent, 2 * extent], rtol=1e-6)
    spacing, span = grid_sampling(grid_indices(h, w))
    assert spacing.tolist() == [1.0, 1.0] and span.tolist() == [w - 1, h - 1]


def test_an_axis_with_one_sample_has_infinite_spacing() -> None:
    spacing, span = grid_sampling(grid_positions(1, 5))
    assert spacing[1] == math.inf and span[1] == 0.0


def _paper_count(dim: int, n: int) -> int:
    """CAPE's frequencies that alias on an n x n grid over [-1, 1], counted with numpy."""
    half = dim // 2
    rho = 10.0 ** (np.arange(1, half + 1) / half)
    k = np.arange(half)
    wx, wy = np.pi * rho * np.cos(k), np.pi * rho * np.sin(k)
    step = 2.0 / (n - 1)
    return int(np.sum((np.abs(wx) * step >= np.pi) | (np.abs(wy) * step >= np.pi)))


@pytest.mark.parametrize(("dim", "n"), [(96, 8), (96, 14), (192, 8), (64, 4), (768, 14)])
def test_count_of_aliased_paper_frequencies(dim: int, n: int) -> None:
    spacing, _ = grid_sampling(grid_positions(n, n))
    assert int(aliased(cape2d_frequencies(dim), spacing).sum()) == _paper_count(dim, n)


def test_counts_the_project_reported() -> None:
    """20 of CAPE-2D's 48 frequencies alias on the 8 x 8 training grid, 8 on 14 x 14."""
    assert _paper_count(96, 8) == 20 and _paper_count(96, 14) == 8


def test_aliasing_starts_at_the_nyquist_limit() -> None:
    d = 0.25
    at = torch.tensor([[math.pi / d, math.pi / d * (1 - 1e-6), 0.0]], dtype=torch.float32)
    assert aliased(at, [d]).tolist() == [True, False, False]
    two_d = torch.tensor([[0.0, 3.0], [3.0, 0.0]])  # (0, 3) and (3, 0) rad per unit
    assert aliased(two_d, [1.0, 2.0]).tolist() == [True, False]  # y spacing 2: 3 * 2 >= pi
    with pytest.raises(ValueError, match="spacing must have one value per axis"):
        aliased(two_d, [1.0])
    with pytest.raises(ValueError, match="spacing must be > 0"):
        aliased(two_d, [1.0, 0.0])


@pytest.mark.parametrize("rho", ["exact", "linspace"])
def test_radii_run_from_half_a_period_to_nyquist(rho: str) -> None:
    r = grid_radii(16, 0.25, 2.0, max_scaling=1.4, rho=rho).numpy()
    hi, lo = math.pi / (0.25 * 1.4), math.pi / 2.0
    assert r[-1] == pytest.approx(hi)
    ratios = r[1:] / r[:-1]
    np.testing.assert_allclose(ratios, ratios[0], rtol=1e-9)  # geometric
    first = lo * (hi / lo) ** (1 / 16) if rho == "exact" else lo
    assert r[0] == pytest.approx(first)


@pytest.mark.parametrize(("h", "w"), [(8, 8), (14, 14), (6, 10), (2, 3)])
@pytest.mark.parametrize("dim", [16, 96, 192])
def test_fitted_frequencies_never_alias_even_scaled(h: int, w: int, dim: int) -> None:
    spacing, span = grid_sampling(grid_positions(h, w))
    f = grid_frequencies_2d(dim, tuple(spacing.tolist()), tuple(span.tolist()), max_scaling=1.4)
    assert f.shape == (2, dim // 2) and f.dtype == torch.float32
    assert not bool(aliased(f, spacing).any())
    assert not bool(aliased(1.4 * f, spacing).any())  # CAPE's largest global scaling
    top = f.norm(dim=0).max().item()
    assert top == pytest.approx(math.pi / (float(spacing.max()) * 1.4), rel=1e-5)


def test_fitted_1d_frequencies_lie_strictly_inside_the_band() -> None:
    f = grid_frequencies_1d(8, 1.0, 7.0, max_scaling=1.2).double()
    hi, lo = math.pi / 1.2, math.pi / 7.0
    assert bool((f[1:] < f[:-1]).all())  # highest first
    expect = lo * (hi / lo) ** ((np.arange(8)[::-1] + 0.5) / 8)
    np.testing.assert_allclose(f.numpy(), expect, rtol=1e-6)
    assert not bool(aliased(1.2 * f.float()[None], [1.0]).any())


def test_bad_grids_are_named() -> None:
    with pytest.raises(ValueError, match="at least two samples"):
        grid_radii(4, math.inf, 0.0)
    with pytest.raises(ValueError, match="at least two samples"):
        grid_frequencies_2d(8, (math.inf, math.inf), (0.0, 0.0))
    with pytest.raises(ValueError, match="max_scaling"):
        grid_radii(4, 0.5, 2.0, max_scaling=0.5)
