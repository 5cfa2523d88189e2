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

Beyond images (ours, e.g. a box's 4 edges): `spacing` of M entries gives M axes. Axial splits
the planes into M groups of hd/(2M), one per axis, at r_c = theta^(-2Mc/hd) (the 2-D rule);
mixed draws per head two orthonormal directions u, v in R^M (Gram-Schmidt of two Gaussian
vectors) for the planes c < hd/4 and c >= hd/4, the 2-D construction's pair phi, phi + pi/2.
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


def rope2d_magnitudes(head_dim: int, theta: float, *, axes: int = 2) -> torch.Tensor:
    """r_c = theta^(-2 axes c/hd), c = 0..hd/(2 axes)-1 -> [hd/(2 axes)] float32 (RoPE-ViT's
    per-patch radians: theta^(-4c/hd) in 2-D)."""
    check_int("axes", axes)
    check_even("head_dim", head_dim, multiple=2 * max(axes, 2))
    theta = check_float("theta", theta, minimum=1.0, strict=True)
    n = head_dim // (2 * axes)
    exponent = torch.arange(n, dtype=torch.float64) * (2 * axes) / head_dim
    return (theta**-exponent).to(torch.float32)


def _spacing(spacing: Sequence[float]) -> tuple[float, ...]:
    if not isinstance(spacing, (tuple, list)) or len(spacing) < 2:
        raise TypeError(
            f"spacing must be a sequence of >= 2 reals > 0 (one per axis), got {spacing!r}"
        )
    return tuple(check_float(f"spacing[{i}]", s, strict=True) for i, s in enumerate(spacing))


def axial_frequencies(
    head_dim: int, *, theta: float = 100.0, spacing: Sequence[float] = (1.0, 1.0)
) -> torch.Tensor:
    """RoPE-Axial's frequencies -> [M, hd/2] float32 (radians per unit of each axis; M =
    len(spacing), 2 for (x, y)).

    Row m: r / spacing_m on its own hd/(2M) planes, 0 elsewhere, r = `rope2d_magnitudes`. In
    2-D: row 0 (x) [r / spacing_x, 0], row 1 (y) [0, r / spacing_y]."""
    steps = _spacing(spacing)
    r = rope2d_magnitudes(head_dim, theta, axes=len(steps))
    out = torch.zeros(len(steps), head_dim // 2)
    for m, step in enumerate(steps):
        out[m, m * r.numel() : (m + 1) * r.numel()] = r / step
    return out


def mixed_frequencies(
    head_dim: int,
    heads: int,
    *,
    theta: float = 10.0,
    spacing: Sequence[float] = (1.0, 1.0),
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """RoPE-Mixed's initial frequencies -> [H, M, hd/2] float32 (radians per unit; M =
    len(spacing)).

    2-D: head h draws phi_h ~ U(0, 2 pi); plane c < hd/4 has direction phi_h, plane c + hd/4
    has phi_h + pi/2, both of length r_c: w_x = r cos(.) / spacing_x, w_y = r sin(.) /
    spacing_y. M-D: the two directions are orthonormal u_h, v_h (module docstring)."""
    check_int("heads", heads)
    check_generator("generator", generator)
    r = rope2d_magnitudes(head_dim, theta).to(torch.float64)
    steps = torch.tensor(_spacing(spacing), dtype=torch.float64)
    if len(steps) == 2:
        phi = torch.rand(heads, 1, generator=generator, dtype=torch.float64) * (2 * math.pi)
        direction = torch.cat(
            [phi.expand(-1, r.numel()), phi.expand(-1, r.numel()) + math.pi / 2], 1
        )
        rr = torch.cat([r, r])
        wx, wy = rr * torch.cos(direction) / steps[0], rr * torch.sin(direction) / steps[1]
        return torch.stack([wx, wy], dim=1).to(torch.float32)
    g = torch.randn(heads, 2, len(steps), generator=generator, dtype=torch.float64)
    u = g[:, 0] / g[:, 0].norm(dim=-1, keepdim=True)
    v = g[:, 1] - (g[:, 1] * u).sum(-1, keepdim=True) * u
    v = v / v.norm(dim=-1, keepdim=True)
    planes = torch.cat(
        [u[..., None].expand(-1, -1, r.numel()), v[..., None].expand(-1, -1, r.numel())], -1
    )
    return (planes * torch.cat([r, r]) / steps[:, None]).to(torch.float32)  # [H, M, hd/2]


def mixed_angles(positions: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """positions [B, T, M] ((x, y) for M = 2), freqs [H, M, hd/2] -> angles [B, H, T, hd/2]
    float32.

    angle_{h,c} = sum_m w_m,h,c p_m: linear in the position, so per head the logits depend on
    the relative position only (`apply_rotary` takes [B, H, T, hd/2] angles)."""
    check_real("positions", positions, ndims=(3,))
    check_tensor("freqs", freqs, ndims=(3,), floating=True)
    if positions.shape[-1] != freqs.shape[1]:
        raise ValueError(
            f"positions [B, T, M] and freqs [H, M, hd/2] must share M, got "
            f"{tuple(positions.shape)} and {tuple(freqs.shape)}"
        )
    reach = freqs.detach().abs().amax(dim=(0, 2))  # the largest |w| per axis
    check_phases("positions", positions, reach)
    pos = positions.to(torch.float32)
    w = freqs.to(device=pos.device, dtype=torch.float32)
    return torch.einsum("btm,hmc->bhtc", pos, w)
