"""Rotary position embeddings (RoFormer, CAPE's ref. [38]) over continuous positions.

Queries and keys are rotated by position-dependent angles so that their dot product depends on
the positions only through their difference: <R(p) q, R(p') k> = <q, R(p' - p) k>, for any real
p, p' (token indices, seconds, or 2D image coordinates). Layout is half-split: channel c and
c + hd/2 form the rotation plane of frequency c (same convention as the `[cos || sin]` sinusoids).
"""

from __future__ import annotations

import math

import torch

from .._checks import (
    check_choice,
    check_even,
    check_finite,
    check_float,
    check_phases,
    check_real,
    check_tensor,
)
from .sinusoidal import cape2d_frequencies, sinusoid_frequencies

__all__ = ["rotary_angles", "apply_rotary"]


def rotary_angles(
    positions: torch.Tensor,
    head_dim: int,
    *,
    base: float = 10000.0,
    freq_scale: float = 1.0,
    mode: str = "1d",
    freqs: torch.Tensor | None = None,
) -> torch.Tensor:
    """positions: [B, T, M] (any leading dims) -> angles [B, T, head_dim/2] float32.

    mode "1d" (M = 1): angle_c = p * omega_c, omega from `sinusoid_frequencies(head_dim, base,
    freq_scale)` (freq_scale = 30 for seconds, CAPE sec. 3).
    mode "2d" (M = 2, (x, y)): angle_c = freq_scale * pi * (w_x,c x + w_y,c y), CAPE's rotated
    2D frequencies (`cape2d_frequencies`), so that every rotation plane mixes both axes;
    `base` is unused. The angle is linear in the position, hence the relative property in 2D.
    freqs: [M, head_dim/2] frequencies (radians per unit) instead, for M >= 1 coordinates of
    any number (e.g. fitted to a grid, `cape.functional.frequencies.grid_frequencies_2d`, or
    a box's 4 edges); mode's frequencies, base and freq_scale are then unused.
    """
    check_even("head_dim", head_dim)
    check_choice("mode", mode, ("1d", "2d"))
    check_real("positions", positions, ndims=range(2, 8))
    if freqs is not None:  # M axes of any number: mode's default frequencies are not used
        if freqs.dim() != 2 or freqs.shape[0] < 1 or freqs.shape[1] != head_dim // 2:
            raise ValueError(
                f"freqs must have shape [M, {head_dim // 2}] (M >= 1 coordinates), "
                f"got {tuple(freqs.shape)}"
            )
        if not freqs.is_floating_point():
            raise TypeError(f"freqs must be a floating tensor, got {freqs.dtype}")
    axes = (1 if mode == "1d" else 2) if freqs is None else freqs.shape[0]
    if positions.shape[-1] != axes:
        how = f"mode={mode!r}" if freqs is None else f"freqs of shape {tuple(freqs.shape)}"
        raise ValueError(
            f"positions must end with {axes} coordinate(s) for {how}, got {tuple(positions.shape)}"
        )
    freq_scale = check_float("freq_scale", freq_scale, strict=True)
    pos = positions.to(torch.float32)
    if freqs is not None:
        w = freqs.to(device=pos.device, dtype=torch.float32)
        check_phases("positions", positions, lambda: w.detach().abs().amax(dim=1))
        # a sum over axes rather than pos @ w: for M = 2 it is p_x w_x + p_y w_y in float32, the
        # rounding of the 1-D and 2-D forms (a matmul accumulates in another order)
        return sum(pos[..., m : m + 1] * w[m] for m in range(axes))
    # the highest frequency: freq_scale in 1D (k = 0), at most 10 pi freq_scale in 2D (rho <= 10)
    check_phases("positions", positions, freq_scale * (1.0 if mode == "1d" else 10 * math.pi))
    if mode == "1d":
        omega = sinusoid_frequencies(head_dim, base=base, freq_scale=freq_scale, device=pos.device)
        return pos * omega  # [..., 1] * [hd/2]
    sinusoid_frequencies(head_dim, base=base, freq_scale=freq_scale)  # validates base, freq_scale
    w = cape2d_frequencies(
        head_dim, freq_scale=freq_scale, device=pos.device
    )  # [2, hd/2], pi included
    return pos[..., 0:1] * w[0] + pos[..., 1:2] * w[1]


def apply_rotary(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate x: [B, H, T, hd] by angles [B or 1, T, hd/2] (or [T, hd/2]; or per head
    [B or 1, H or 1, T, hd/2], as RoPE-Mixed's) -> [B, H, T, hd].

    out = [x1 cos - x2 sin || x1 sin + x2 cos] with x1 = x[..., :hd/2], x2 = x[..., hd/2:].
    The rotation is done in float32 (bf16 angles would be off by whole radians at large
    positions) and the result cast back to x's dtype.
    """
    check_tensor("x", x, ndims=(4,), floating=True)
    check_tensor("angles", angles, ndims=(2, 3, 4), floating=True)
    b, h, t, hd = x.shape
    if hd % 2:
        raise ValueError(f"x's last axis (head_dim) must be even, got {hd}")
    if angles.dim() == 2:
        angles = angles[None]
    if angles.dim() == 3:
        angles = angles[:, None]  # the same angles for every head
    if (
        angles.shape[0] not in (1, b)
        or angles.shape[1] not in (1, h)
        or tuple(angles.shape[2:]) != (t, hd // 2)
    ):
        raise ValueError(
            f"angles must have shape [{b} or 1, {t}, {hd // 2}] or [{b} or 1, {h} or 1, {t}, "
            f"{hd // 2}] for x of shape {tuple(x.shape)}, got {tuple(angles.shape)}"
        )
    ang = angles.to(torch.float32)
    check_finite("angles", ang, what=" in float32")
    return _rotate_halves(x.to(torch.float32), torch.cos(ang), torch.sin(ang)).to(x.dtype)


def _rotate_halves(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """[x1 cos - x2 sin || x1 sin + x2 cos] for x = [x1 || x2]: [..., hd], cos and sin
    broadcastable to [..., hd/2], in x's dtype. No checks: `apply_rotary` is the checked form.

    Compiled, the halves' products fuse into one kernel. In eager mode, where each op is a pass
    over memory, it is written as x [cos || cos] + [x2 || x1] [-sin || sin]: three whole-width
    passes over x, the small tables widened instead (half the time of the halves' six passes on
    a CPU; inductor compiles this form several times slower, hence two forms)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    if torch.compiler.is_compiling():
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    swapped = torch.cat([x2, x1], dim=-1)
    return torch.addcmul(x * torch.cat([cos, cos], dim=-1), swapped, torch.cat([-sin, sin], dim=-1))
