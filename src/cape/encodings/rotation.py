"""How the rotary family applies its rotation: eager, or one compiled kernel (`cape.fusion`).

The rotation R(theta) of each (c, c + hd/2) plane is orthogonal, so its backward is the same
rotation by -theta, and a magnitude equal on both channels of a plane (xPos, YaRN's temperature)
commutes with it: d/dx [R(theta)(m x)] applied to g is m R(-theta) g. When neither angles nor
magnitudes need a gradient (every rotary here but RoPE-Mixed's learned frequencies), both paths
run their forward rotation again for the backward, with negated angles: autograd's backward of
the eager ops (or inductor's, with masked loads of the two halves) is slower on a CPU and keeps
the halves of x for it. q and k as attention makes them (a [B, T, H, hd] projection viewed as
[B, H, T, hd]) are rotated in that memory layout, as contiguous tensors.
"""

from __future__ import annotations

import torch

from .._fusion import can_fuse, fused
from ..functional.rotary import _rotate_halves, apply_rotary

__all__ = ["rotate"]


def rotate(x: torch.Tensor, angles: torch.Tensor, magnitude: torch.Tensor | None) -> torch.Tensor:
    """x [B, H, T, hd] rotated by angles [(B or 1,) (H,) T, hd/2] and scaled by magnitude
    [B or 1, 1, T or 1, hd] (equal on both halves; None = 1), in x's dtype, the maths in
    float32. One compiled kernel where `cape.fusion` allows it. No checks: the angles come from a
    `Rotation` whose positions were checked when it was prepared."""
    fuse = can_fuse(x)
    constant = not (angles.requires_grad or (magnitude is not None and magnitude.requires_grad))
    if constant and x.requires_grad and torch.is_grad_enabled():
        if not torch.compiler.is_compiling():  # a compiled model differentiates the ops itself
            return _Rotation.apply(x, angles, magnitude, fuse)
    return _rotation(x, angles, magnitude, fuse)  # no gradient, or autograd through the ops


def _rotation(
    x: torch.Tensor, angles: torch.Tensor, magnitude: torch.Tensor | None, fuse: bool
) -> torch.Tensor:
    angles, magnitude = _four_d(angles), None if magnitude is None else _four_d(magnitude)
    if not _heads_inner(x):
        return _kernel(x, angles, magnitude, fuse)
    # q, k as attention makes them: [B, T, H, hd] memory viewed [B, H, T, hd]; rotated as
    # xt [B, T, H, hd] with the T axis of angles and magnitude in the heads' slot
    xt = x.transpose(1, 2)
    angles, magnitude = angles.transpose(1, 2), _transposed(magnitude)
    if fuse:  # `apply_rotary`'s per-head form: the compiled kernel reads the expanded view
        angles, magnitude = _over_heads(angles, xt), _over_heads(magnitude, xt)
    return _kernel(xt, angles, magnitude, fuse).transpose(1, 2)  # x's memory layout


def _kernel(
    x: torch.Tensor, angles: torch.Tensor, magnitude: torch.Tensor | None, fuse: bool
) -> torch.Tensor:
    """x [B, H, T, hd] (or xt) rotated, angles and magnitude 4-D and broadcastable to it."""
    if fuse:  # two compiled kernels: fewer variants (dtypes, ranks) for each
        if magnitude is None:
            return fused(apply_rotary, x, angles)
        return fused(_scale_rotate, x, angles, magnitude)
    x32 = x.to(torch.float32)
    if magnitude is not None:
        x32 = x32 * magnitude
    ang = angles.to(torch.float32)  # cos and sin once per (B, T), broadcast over the heads
    return _rotate_halves(x32, torch.cos(ang), torch.sin(ang)).to(x.dtype)


def _scale_rotate(x: torch.Tensor, angles: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    # magnitudes are equal on the two channels of a rotation plane: they commute with it, and
    # multiplying first keeps one cast to x's dtype (the maths in float32)
    return apply_rotary(x.to(torch.float32) * magnitude, angles).to(x.dtype)


def _heads_inner(x: torch.Tensor) -> bool:
    """x [B, H, T, hd] is a transposed view of a contiguous [B, T, H, hd] (the split of a
    projection into heads): rotate it in that layout, or the output and the gradient flowing
    back are made in the other layout, each op reading x across strides."""
    return x.dim() == 4 and not x.is_contiguous() and x.transpose(1, 2).is_contiguous()


def _four_d(t: torch.Tensor) -> torch.Tensor:
    """angles [T, c] / [B, T, c] -> [1, 1, T, c] / [B, 1, T, c] (every head); 4-D as it is."""
    while t.dim() < 4:
        t = t[None] if t.dim() == 2 else t[:, None]
    return t


def _transposed(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.transpose(1, 2)


def _over_heads(t: torch.Tensor | None, xt: torch.Tensor) -> torch.Tensor | None:
    """t [B or 1, T or 1, H or 1, c] expanded (a view) to xt [B, T, H, hd]'s T and H."""
    if t is None:
        return None
    return t.expand(t.shape[0], xt.shape[1], xt.shape[2], t.shape[3])


class _Rotation(torch.autograd.Function):
    """Forward: the rotation (eager or compiled); backward: the same with -angles (module doc).
    Nothing of x is kept: angles and magnitude are constants, no gradient flows to them. In the
    `setup_context` form, with a generated vmap rule, so `torch.func` (grad, vmap) takes it."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, angles, magnitude, fuse):  # type: ignore[override]
        return _rotation(x, angles, magnitude, fuse)

    @staticmethod
    def setup_context(ctx, inputs, output):  # type: ignore[override]
        _, angles, magnitude, fuse = inputs
        ctx.save_for_backward(angles, magnitude)  # kept (and counted) for the backward
        ctx.fuse = fuse

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        angles, magnitude = ctx.saved_tensors
        return _rotation(grad, -angles, magnitude, ctx.fuse), None, None, None
