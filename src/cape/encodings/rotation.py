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
    if _heads_inner(x):  # q, k as attention makes them: [B, T, H, hd] memory, viewed [B, H, T, hd]
        xt = x.transpose(1, 2)
        out = _fused_rotation(xt, _per_head(angles, xt), _per_head(magnitude, xt))
        return out.transpose(1, 2)  # the result, and its gradient, keep x's memory layout
    if magnitude is None:  # two kernels: fewer variants (dtypes, ranks) for each to compile
        return fused(apply_rotary, x, angles)
    return fused(_scale_rotate, x, angles, magnitude)


def _heads_inner(x: torch.Tensor) -> bool:
    """x [B, H, T, hd] is a transposed view of a contiguous [B, T, H, hd] (the split of a
    projection into heads): rotate it in that layout, or the kernel's output and the gradient
    flowing back are copied into the other layout outside it."""
    return x.dim() == 4 and not x.is_contiguous() and x.transpose(1, 2).is_contiguous()


def _per_head(t: torch.Tensor | None, xt: torch.Tensor) -> torch.Tensor | None:
    """angles [B or 1, (H or 1,) T, c] or magnitude [B or 1, 1, T or 1, hd] for x [B, H, T, hd],
    as `apply_rotary`'s per-head form for xt = x.transpose(1, 2) [B, T, H, hd]: the T axis in
    the heads' slot, expanded (a view) over xt's H in the tokens' slot."""
    if t is None:
        return None
    if t.dim() == 3:
        t = t[:, None]  # [B, 1, T, c]: every head
    t = t.transpose(1, 2)  # [B, T or 1, H or 1, c]
    return t.expand(t.shape[0], xt.shape[1], xt.shape[2], t.shape[3])


class _CompiledRotation(torch.autograd.Function):
    """Forward: the compiled rotation; backward: the same kernel with -angles (module doc)."""

    @staticmethod
    def forward(ctx, x, angles, magnitude):  # type: ignore[override]
        ctx.angles, ctx.magnitude = angles, magnitude  # constants: no gradient flows to them
        return _fused_rotation(x, angles, magnitude)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return _fused_rotation(grad, -ctx.angles, ctx.magnitude), None, None
