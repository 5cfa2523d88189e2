"""2-D rotary frequencies of RoPE-ViT (Heo et al., ECCV 2024): axial and mixed (learnable).

Both rotate queries and keys by angle_c = w_x,c x + w_y,c y, as `rotary_angles(freqs=...)`
does; they differ in the frequencies [2, hd/2] (per head [H, 2, hd/2] when mixed):

- axial (RoPE-Axial): the first hd/4 rotation planes turn with x only, the last hd/4 with y
  only, both at the magnitudes r_c = theta^(-4c/hd), c = 0..hd/4-1 (theta = 100 in RoPE-ViT);
- mixed (RoPE-Mixed): every plane turns with both axes, by r_c along a direction per head:
  planes c and c + hd/4 take directions phi_h and phi_h + pi/2 with phi_h ~ U(0, 2 pi) drawn
  per head; the frequencies are then learned (theta = 10 in RoPE-ViT).

RoPE-ViT counts positions in patches; `spacing` (per axis, the distance between neighbouring
patches in the units of the positions: 2 / (n - 1) for cape's [-1, 1] grid of n patches)
turns its per-patch frequencies into frequencies per unit: w = r / spacing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .._checks import (
    check_even,
    check_float,
    check_generator,
    check_int,
    check_phases,
    check_real,
    check_tensor,
)

__all__ = ["rope2d_magnitudes", "axial_frequencies", "mixed_frequencies", "mixed_angles"]


def rope2d_magnitudes(head_dim: int, theta: float) -> torch.Tensor:
    """r_c = theta^(-4c/hd), c = 0..hd/4-1 -> [hd/4] float32 (RoPE-ViT's per-patch radians)."""
    check_even("head_dim", head_dim, multiple=4)
    theta = check_float("theta", theta, minimum=1.0, strict=True)
    exponent = torch.arange(0, head_dim, 4, dtype=torch.float64)[: head_dim // 4] / head_dim
    return (theta**-exponent).to(torch.float32)


def _spacing(spacing: Sequence[float]) -> tuple[float, float]:
    if not isinstance(spacing, (tuple, list)) or len(spacing) != 2:
        raise TypeError(f"spacing must be a pair (x, y) of reals > 0, got {spacing!r}")
    return (
        check_float("spacing[0]", spacing[0], strict=True),
        check_float("spacing[1]", spacing[1], strict=True),
    )


def axial_frequencies(
    head_dim: int, *, theta: float = 100.0, spacing: Sequence[float] = (1.0, 1.0)
) -> torch.Tensor:
    """RoPE-Axial's frequencies -> [2, hd/2] float32 (radians per unit of x and of y).

    Row 0 (x): [r / spacing_x, 0], row 1 (y): [0, r / spacing_y], r = `rope2d_magnitudes`."""
    r = rope2d_magnitudes(head_dim, theta)
    sx, sy = _spacing(spacing)
    zero = torch.zeros_like(r)
    return torch.stack([torch.cat([r / sx, zero]), torch.cat([zero, r / sy])])


def mixed_frequencies(
    head_dim: int,
    heads: int,
    *,
    theta: float = 10.0,
    spacing: Sequence[float] = (1.0, 1.0),
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """RoPE-Mixed's initial frequencies -> [H, 2, hd/2] float32 (radians per unit).

    Head h: phi_h ~ U(0, 2 pi); plane c < hd/4 has direction phi_h, plane c + hd/4 has
    phi_h + pi/2, both of length r_c: w_x = r cos(.) / spacing_x, w_y = r sin(.) / spacing_y."""
    check_int("heads", heads)
    check_generator("generator", generator)
    r = rope2d_magnitudes(head_dim, theta).to(torch.float64)
    sx, sy = _spacing(spacing)
    phi = torch.rand(heads, 1, generator=generator, dtype=torch.float64) * (2 * math.pi)
    direction = torch.cat([phi.expand(-1, r.numel()), phi.expand(-1, r.numel()) + math.pi / 2], 1)
    rr = torch.cat([r, r])
    wx, wy = rr * torch.cos(direction) / sx, rr * torch.sin(direction) / sy
    return torch.stack([wx, wy], dim=1).to(torch.float32)


def mixed_angles(positions: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """positions [B, T, 2] (x, y), freqs [H, 2, hd/2] -> angles [B, H, T, hd/2] float32.

    angle_{h,c} = w_x,h,c x + w_y,h,c y: linear in the position, so per head the logits
    depend on the relative position only (`apply_rotary` takes [B, H, T, hd/2] angles)."""
    check_real("positions", positions, ndims=(3,))
    if positions.shape[-1] != 2:
        raise ValueError(f"positions must be [B, T, 2] (x, y), got {tuple(positions.shape)}")
    check_tensor("freqs", freqs, ndims=(3,), floating=True)
    if freqs.shape[1] != 2:
        raise ValueError(f"freqs must have shape [H, 2, hd/2], got {tuple(freqs.shape)}")
    reach = freqs.detach().abs().amax(dim=(0, 2))  # the largest |w| per axis
    check_phases("positions", positions, reach)
    pos = positions.to(torch.float32)
    w = freqs.to(device=pos.device, dtype=torch.float32)
    return torch.einsum("btm,hmc->bhtc", pos, w)
