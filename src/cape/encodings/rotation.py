"""How the rotary family applies its rotation: eager, or one compiled kernel (`cape.fusion`).

The rotation R(theta) of each (c, c + hd/2) plane is orthogonal, so its backward is the same
rotation by -theta, and a magnitude equal on both channels of a plane (xPos, YaRN's temperature)
commutes with it: d/dx [R(theta)(m x)] applied to g is m R(-theta) g. When neither angles nor
magnitudes need a gradient (every rotary here but RoPE-Mixed's learned frequencies), the fused
path runs the same compiled forward kernel for the backward with negated angles; inductor's
own backward of the rotation (masked loads of the two halves) is several times slower on a CPU.
"""

from __future__ import annotations

import torch

from .._checks import check_finite
from .._fusion import can_fuse, fused
from ..functional.rotary import apply_rotary

__all__ = ["rotate"]


def rotate(x: torch.Tensor, angles: torch.Tensor, magnitude: torch.Tensor | None) -> torch.Tensor:
    """x [B, H, T, hd] rotated by angles [B or 1, (H,) T, hd/2] and scaled by magnitude
    (broadcastable to x, equal on both halves; None = 1), in x's dtype, the maths in float32.
    One compiled kernel where `cape.fusion` allows it, after the eager path's value check."""
    if not can_fuse(x):
        return _rotation(x, angles, magnitude)
    check_finite("angles", angles.to(torch.float32), what=" in float32")
    constant = not (angles.requires_grad or (magnitude is not None and magnitude.requires_grad))
    if constant:
        return _CompiledRotation.apply(x, angles, magnitude)
    return _fused_rotation(x, angles, magnitude)  # autograd through the compiled graph


def _rotation(
    x: torch.Tensor, angles: torch.Tensor, magnitude: torch.Tensor | None
) -> torch.Tensor:
    if magnitude is None:
        return apply_rotary(x, angles)
    return _scale_rotate(x, angles, magnitude)


def _scale_rotate(x: torch.Tensor, angles: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    # magnitudes are equal on the two channels of a rotation plane: they commute with it, and
    # multiplying first keeps one cast to x's dtype (the maths in float32)
    return apply_rotary(x.to(torch.float32) * magnitude, angles).to(x.dtype)


def _fused_rotation(
    x: torch.Tensor, angles: torch.Tensor, magnitude: torch.Tensor | None
) -> torch.Tensor:
    if magnitude is None:  # two kernels: fewer variants (dtypes, ranks) for each to compile
        return fused(apply_rotary, x, angles)
    return fused(_scale_rotate, x, angles, magnitude)


class _CompiledRotation(torch.autograd.Function):
    """Forward: the compiled rotation; backward: the same kernel with -angles (module doc)."""

    @staticmethod
    def forward(ctx, x, angles, magnitude):  # type: ignore[override]
        ctx.angles, ctx.magnitude = angles, magnitude  # constants: no gradient flows to them
        return _fused_rotation(x, angles, magnitude)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return _fused_rotation(grad, -ctx.angles, ctx.magnitude), None, None
