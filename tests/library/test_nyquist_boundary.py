"""`count_aliased` and `fit_grid` at the Nyquist limit: a frequency whose phase steps by exactly
pi between neighbouring samples counts as aliased (the sampling theorem represents |w| D < pi
only), and the frequencies an encoding fits to a grid alias on none of that grid's axes, for
every grid and width, yet stay what the fitting formula gives to float32 rounding."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import cape
from cape.functional.frequencies import aliased, grid_radii, grid_sampling

FITTED = ("cape2d", "sinpos2d", "sine-2d", "rotary2d", "rope-axial", "rope-mixed")
GRIDS = [g for g in itertools.product((1, 2, 3, 4, 5, 7, 8, 14, 16), repeat=2) if max(g) > 1]


def test_at_the_limit_a_frequency_is_its_own_mirror() -> None:
    # Samples x_n = x0 + n D: w and w - 2 pi / D give the same samples up to a constant phase.
    # At w D = pi that alias is -w: the relative phases w n D = pi n have sine 0 at every
    # offset, so the sign of each offset is lost. Below the limit, it is not.
    d, x0 = 0.5, 0.3
    x = x0 + d * torch.arange(-6, 7, dtype=torch.float64)
    for w, lost in ((math.pi / d, True), (0.9 * math.pi / d, False)):
        ratio = torch.exp(1j * w * x) / torch.exp(1j * (w - 2 * math.pi / d) * x)
        assert torch.allclose(ratio, ratio[0].expand_as(ratio))  # an alias at any w
        mirror = math.isclose(w - 2 * math.pi / d, -w, rel_tol=0.0, abs_tol=1e-15)
        offsets = torch.sin(w * (x - x0))
        assert mirror is lost and bool((offsets.abs() < 1e-12).all()) is lost
        assert aliased(torch.tensor([[w]], dtype=torch.float64), (d,)).tolist() == [lost]
    below = torch.tensor([[math.pi / d, math.nextafter(math.pi, 0.0) / d]], dtype=torch.float64)
    assert aliased(below, (d,)).tolist() == [True, False]  # strictly below: represented


def test_the_issue_grid_counts_none() -> None:
    for dim in (2, 4, 8, 32):
        assert cape.count_aliased(cape.build("cape2d", dim, fit_grid=(2, 2)), (2, 2)) == 0


@pytest.mark.parametrize("name", FITTED)
def test_fitted_frequencies_alias_on_no_axis_of_their_grid(name: str) -> None:
    dims = (2, 4, 8, 16) if name in ("rotary2d", "rope-axial", "rope-mixed") else (2, 4, 6, 16, 64)
    for dim, grid in itertools.product(dims, GRIDS):
        options: dict = {"heads": 2} if name == "rope-mixed" else {}
        try:
            enc = cape.build(name, dim, fit_grid=grid, **options)
        except ValueError as e:  # one sample on an axis fitted alone, a width per axis
            assert any(w in str(e) for w in ("fit_grid", "dim")), e
            continue
        assert cape.count_aliased(enc, grid) == 0, (dim, grid)


@pytest.mark.parametrize("grid", [(2, 2), (2, 5), (5, 2), (3, 3), (8, 8), (14, 14), (1, 9)])
@pytest.mark.parametrize("dim", [2, 4, 16, 64])
def test_cape2d_fit_is_the_formula_moved_below_the_limit_only(grid: tuple, dim: int) -> None:
    # CAPE's directions (angle k for frequency k) times `grid_radii` of the coarser axis, in
    # float64; each component then lies strictly under pi / D of its axis, within one float32
    # step of the formula
    enc = cape.build("cape2d", dim, fit_grid=grid)
    spacing, span = grid_sampling(enc.grid_positions(*grid)[0])
    finite = [(float(a), float(b)) for a, b in zip(spacing, span, strict=True) if a < math.inf]
    r = grid_radii(dim // 2, max(a for a, _ in finite), max(b for _, b in finite))
    k = torch.arange(dim // 2, dtype=torch.float64)
    formula = torch.stack([r * torch.cos(k), r * torch.sin(k)])
    fitted = enc.frequencies.double()
    ulp = formula.abs().float().double() * 2.0**-23 + 1e-30
    assert bool(((fitted - formula).abs() <= ulp).all())
    for axis in range(2):
        if math.isfinite(float(spacing[axis])):
            assert bool((fitted[axis].abs() * float(spacing[axis]) < math.pi).all())
