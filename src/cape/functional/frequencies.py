"""Frequencies a grid can carry: the sampling of a grid, aliasing, and frequencies fitted to it.

A sinusoid of angular frequency w (radians per position unit) sampled every D units is
indistinguishable from one of frequency w + 2 pi / D: it ALIASES once |w| >= pi / D (the Nyquist
limit; at the limit itself its sine is 0 at every sample). For 2D frequencies (w_x, w_y) on a
grid with spacings (D_x, D_y), the band that survives sampling is |w_x| < pi / D_x and
|w_y| < pi / D_y: a frequency outside it looks, on that grid, like a lower one, so two positions
far apart get the same phase and the encoding cannot tell them apart.

CAPE's 2D frequencies (`cape2d_frequencies`: |w| up to 10 pi) were chosen for a 14 x 14 grid
over [-1, 1] (spacing 2/13, Nyquist 6.5 pi): several already alias there, and more on a coarser
grid (an 8 x 8 grid allows 3.5 pi). `grid_radii` derives the range from the grid instead:

- the highest radius sits at the Nyquist limit of the coarser axis, divided by the largest
  global scaling of training (CAPE's augmentation stretches positions by up to lambda, which
  multiplies every phase by lambda: the same as frequencies lambda times higher);
- the lowest radius makes half a period across the grid's span (cos runs monotonically from one
  edge to the other: the slowest frequency that still tells the two edges apart);
- radii in between are geometric, as the paper's `10^(j / half)`.
"""

from __future__ import annotations

import math

import torch

from .._checks import LIMIT, check_choice, check_finite, check_float, check_int, check_tensor

__all__ = [
    "grid_sampling",
    "aliased",
    "count_aliased",
    "grid_radii",
    "grid_frequencies_2d",
    "grid_frequencies_1d",
]


def grid_sampling(positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [T, M] of a regular grid -> (spacing [M], span [M]) float64 per axis.

    spacing: the smallest gap between distinct coordinates of an axis (inf for an axis with one
    value: a single sample sees no frequency); span: max - min of the axis.
    """
    check_tensor("positions", positions, ndims=(2,))
    check_finite("positions", positions.to(torch.float64))
    spacing, span = [], []
    for m in range(positions.shape[1]):
        values = torch.unique(positions[:, m].to(torch.float64))
        gaps = values[1:] - values[:-1]
        spacing.append(float(gaps.min()) if len(gaps) else math.inf)
        span.append(float(values[-1] - values[0]) if len(values) else 0.0)
    return torch.tensor(spacing, dtype=torch.float64), torch.tensor(span, dtype=torch.float64)


def aliased(freqs: torch.Tensor, spacing: torch.Tensor | tuple[float, ...]) -> torch.Tensor:
    """Which frequencies alias on a grid: freqs [M, K] (radians per unit, one row per axis),
    spacing [M] -> bool [K], True where some |w_mk| * D_m >= pi."""
    check_tensor("freqs", freqs, ndims=(2,), floating=True)
    if not isinstance(spacing, torch.Tensor) and not (
        isinstance(spacing, (tuple, list))
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in spacing)
    ):
        raise TypeError(f"spacing must be a tensor or a sequence of numbers, got {spacing!r}")
    d = torch.as_tensor(spacing, dtype=torch.float64).reshape(-1)
    if d.shape[0] != freqs.shape[0]:
        raise ValueError(
            f"spacing must have one value per axis of freqs ({freqs.shape[0]}), "
            f"got {tuple(d.shape)}"
        )
    if bool((d <= 0).any()) or bool(torch.isnan(d).any()):
        raise ValueError(f"spacing must be > 0 on every axis, got {d.tolist()}")
    # an axis with one sample (spacing inf) has no neighbours: no phase step, nothing aliases
    d = torch.where(torch.isinf(d), torch.zeros_like(d), d)
    phase_step = freqs.to(torch.float64).abs() * d[:, None]
    # A step of exactly pi counts as aliased (>=), by the sampling theorem: samples determine a
    # sinusoid only below the Nyquist limit, |w| < pi / D strictly. At the limit the phase
    # differences are w n D = pi n, whose sine is 0 at every offset n: w and -w (= w - 2 pi / D)
    # give the same samples up to a constant phase, so the encoding loses the sign of every
    # offset (a cos-only channel, the "sine is 0 at every sample" of the module docstring).
    return (phase_step >= math.pi).any(dim=0)


def count_aliased(freqs: torch.Tensor, positions: torch.Tensor) -> int:
    """How many of freqs [M, K] (radians per unit) alias on the grid whose positions [T, M] are
    given (`grid_sampling`): an int in [0, K]."""
    return int(aliased(freqs, grid_sampling(positions)[0]).sum())


def grid_radii(
    count: int,
    spacing: float,
    span: float,
    *,
    max_scaling: float = 1.0,
    rho: str = "exact",
) -> torch.Tensor:
    """`count` radii (radians per unit) fitted to a grid -> [count] float64, increasing.

    hi = pi / (spacing * max_scaling) (Nyquist, through the training's largest scaling),
    lo = pi / span (half a period across the grid). rho "exact": lo (hi / lo)^(j / count),
    j = 1..count (the highest is hi), as the paper's 10^(j/half); "linspace": lo (hi / lo)^t,
    t = linspace(0, 1, count); "midpoint": t = (j - 1/2) / count, strictly inside (lo, hi)
    (for frequencies along an axis, where hi itself would alias: its sine is 0 at every sample).
    """
    check_int("count", count)
    check_choice("rho", rho, ("exact", "linspace", "midpoint"))
    max_scaling = check_float("max_scaling", max_scaling, minimum=1.0)
    for name, value in (("spacing", spacing), ("span", span)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    if not (0 < spacing < math.inf and spacing <= span < math.inf):
        raise ValueError(
            "a grid needs at least two samples on an axis (finite spacing > 0 and span >= "
            f"spacing): got spacing {spacing}, span {span}"
        )
    hi, lo = math.pi / (spacing * max_scaling), math.pi / span
    lo = min(lo, hi)  # a grid of two samples with a large scaling: one radius
    if rho == "exact":
        t = torch.arange(1, count + 1, dtype=torch.float64) / count
    elif rho == "midpoint":
        t = (torch.arange(count, dtype=torch.float64) + 0.5) / count
    else:
        t = torch.linspace(0.0, 1.0, count, dtype=torch.float64)
    return lo * (hi / lo) ** t


def grid_frequencies_2d(
    dim: int,
    spacing: tuple[float, float],
    span: tuple[float, float],
    *,
    max_scaling: float = 1.0,
    rho: str = "exact",
) -> torch.Tensor:
    """CAPE's 2D frequencies with radii fitted to a grid -> [2, dim/2] float32, radians per unit.

    Directions as the paper's (angle k radians for frequency k); radii `grid_radii` of the
    coarser axis (largest spacing) and the longer span, so the band fits both axes.
    """
    check_int("dim", dim)
    if dim % 2:
        raise ValueError(f"dim must be even, got {dim}")
    for name, pair in (("spacing", spacing), ("span", span)):
        if (
            not isinstance(pair, (tuple, list))
            or len(pair) != 2
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in pair)
        ):
            raise TypeError(f"{name} must be a pair (x, y) of numbers, got {pair!r}")
    axes = [(d, s) for d, s in zip(spacing, span, strict=True) if math.isfinite(d)]
    if not axes:
        raise ValueError(
            f"spacing must be finite on some axis (a grid with at least two samples there) to "
            f"fit frequencies, got spacing {tuple(spacing)}"
        )
    r = grid_radii(
        dim // 2,
        max(d for d, _ in axes),
        max(s for _, s in axes),
        max_scaling=max_scaling,
        rho=rho,
    )
    k = torch.arange(dim // 2, dtype=torch.float64)
    return _inside_band(_float32(torch.stack([r * torch.cos(k), r * torch.sin(k)])), spacing)


def grid_frequencies_1d(
    count: int, spacing: float, span: float, *, max_scaling: float = 1.0
) -> torch.Tensor:
    """`count` frequencies of one axis fitted to its sampling -> [count] float32, highest first
    (the order of `sinusoid_frequencies`: base^(-2k/dim) decreases with k), all strictly inside
    the band (`grid_radii` with rho="midpoint")."""
    radii = grid_radii(count, spacing, span, max_scaling=max_scaling, rho="midpoint")
    return _inside_band(_float32(radii.flip(0))[None], (spacing,))[0]


def _below_nyquist(spacing: float) -> float:
    """The largest float32 w with w * spacing < pi, as `aliased` computes it (float64)."""
    w = torch.tensor(math.pi / spacing, dtype=torch.float32)
    while float(w.double()) * spacing >= math.pi:  # a float32 step or two below pi / spacing
        w = torch.nextafter(w, torch.zeros_like(w))
    return float(w)


def _inside_band(freqs: torch.Tensor, spacing: tuple[float, ...]) -> torch.Tensor:
    """freqs [M, K] float32 with every |w_mk| strictly below axis m's Nyquist limit pi / D_m
    (`aliased`: the limit itself aliases). The radii reach the limit where the grid leaves
    no room: the top radius `hi` along an axis (k = 0 when dim = 2), every radius when an axis
    of two samples makes lo = hi, or float32 rounding of a radius just under it; those are
    moved to the largest float32 below the limit, every other frequency kept as it is. An axis
    of one sample (D inf) has no limit."""
    out = freqs.clone()
    for m, d in enumerate(spacing):
        if math.isfinite(d) and d > 0:
            top = _below_nyquist(d)
            out[m] = out[m].clamp(-top, top)
    return out


def _float32(freqs: torch.Tensor) -> torch.Tensor:
    """Frequencies (float64) -> float32, refused by name when they would not fit there."""
    top = float(freqs.abs().max()) if freqs.numel() else 0.0
    if top > LIMIT:
        raise ValueError(
            f"spacing: the fitted frequencies reach pi / (spacing x max_scaling) = {top:.3g}, "
            f"beyond {LIMIT:.0e} (float32)"
        )
    return freqs.to(torch.float32)
