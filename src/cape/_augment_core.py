"""The kernels under `cape.augment`: checks of positions and amounts, device-side uniform draws,
and CAPE's steps (sec. 4): the per-sample global draws, the per-token local draw, their sum.

Public entry points (`cape.augment`, `cape.position_sampling`) check their arguments once here;
the kernels trust their callers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ._checks import (
    LIMIT,
    _may_inspect_values,
    check_finite,
    check_float,
    check_limit,
    check_per_axis,
    check_tensor,
    max_abs,
)

Amount = float | Sequence[float] | torch.Tensor


def check_amount(name: str, v: float | Sequence[float]) -> float | tuple[float, ...]:
    """A float amount, or one per axis: finite, >= 0 and at most `LIMIT` (float32 maths)."""
    v = check_per_axis(name, v)
    for x in v if isinstance(v, tuple) else (v,):
        check_limit(name, x)
    return v


def check_scaling(v: float) -> float:
    return check_limit("max_global_scaling", check_float("max_global_scaling", v, minimum=1.0))


def nonzero(v: Amount) -> bool:
    if isinstance(v, torch.Tensor):
        return True  # tensor amounts are never inspected (that would sync with the device)
    if isinstance(v, (list, tuple)):
        return any(x != 0 for x in v)
    return v != 0


def amount(name: str, v: Amount, pos: torch.Tensor) -> torch.Tensor | float:
    """A max amount as a float or a float32 tensor broadcastable to [B, 1, M]."""
    if isinstance(v, torch.Tensor):
        check_tensor(name, v, ndims=(0, 1, 2))
        batch, axes = pos.shape[0], pos.shape[-1]
        lead = (v.shape[0] in (1, batch),) if v.dim() == 2 else ()
        if v.dim() and (v.shape[-1] not in (1, axes) or not all(lead)):
            raise ValueError(
                f"{name} must be a tensor broadcastable to [B, M] = [{batch}, {axes}] (or [M]), "
                f"got shape {tuple(v.shape)}"
            )
        if v.is_complex() or v.dtype == torch.bool:
            raise TypeError(f"{name} must be a real tensor, got {v.dtype}")
        t = v.to(device=pos.device, dtype=torch.float32)
        if _may_inspect_values(t) and bool((~torch.isfinite(t) | (t < 0) | (t > LIMIT)).any()):
            raise ValueError(f"{name} must be finite, >= 0 and <= {LIMIT:.0e} everywhere")
        if t.dim() == 2:  # [B, M] or [B, 1]: per sample
            return t[:, None, :]
        return t
    v = check_amount(name, v)
    if isinstance(v, tuple):
        if len(v) != pos.shape[-1]:
            raise ValueError(f"{name} has {len(v)} values but positions have {pos.shape[-1]} axes")
        return torch.tensor(v, device=pos.device, dtype=torch.float32)
    return v


def check_generator_device(gen: torch.Generator | None, pos: torch.Tensor) -> None:
    if gen is not None and gen.device.type != pos.device.type:
        raise ValueError(
            f"generator is on {gen.device} but positions are on {pos.device}: "
            "random draws happen on the positions' device"
        )


def rand(
    shape: Sequence[int],
    gen: torch.Generator | None,
    pos: torch.Tensor,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """U[0, 1) of `shape` drawn on the positions' device (from `gen` when given)."""
    check_generator_device(gen, pos)
    # no generator keyword unless one is given: with it, torch.rand refuses symbolic shapes
    # (torch.compile with dynamic shapes); the default generator draws the same numbers
    extra = {} if gen is None else {"generator": gen}
    return torch.rand(shape, device=pos.device, dtype=dtype, **extra)


def uniform(shape: Sequence[int], gen: torch.Generator | None, pos: torch.Tensor) -> torch.Tensor:
    """U(-1, 1) drawn on the positions' device."""
    return rand(shape, gen, pos) * 2.0 - 1.0


def check_positions(
    positions: torch.Tensor,
    mask: torch.Tensor | None,
    name: str = "positions",
    mask_name: str = "mask",
) -> None:
    """positions [B, T, M] floating point, finite at valid tokens; mask [B, T] bool or None."""
    check_tensor(name, positions, ndims=(3,), floating=True)
    if mask is not None:
        check_tensor(mask_name, mask, ndims=(2,))
        if mask.dtype != torch.bool or tuple(mask.shape) != tuple(positions.shape[:2]):
            raise ValueError(
                f"{mask_name} must be bool of shape {tuple(positions.shape[:2])}, "
                f"got {mask.dtype} {tuple(mask.shape)}"
            )
    if _may_inspect_values(positions):
        check_finite(name, positions.to(torch.float32), mask)


def mean_normalize(positions: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return positions - positions.mean(dim=1, keepdim=True)
    # Accumulate in float64 (where the device has it): a float32 sum's rounding depends on the
    # padded length through the reduction order, and padding must not move real tokens.
    acc = torch.float32 if positions.device.type == "mps" else torch.float64
    m = mask[..., None].to(acc)
    count = m.sum(dim=1, keepdim=True).clamp_min(1.0)
    total = torch.where(mask[..., None], positions.to(acc), 0.0).sum(dim=1, keepdim=True)
    return positions - (total / count).to(positions.dtype)


def check_reach(
    names: str,
    pos: torch.Tensor,
    mask: torch.Tensor | None,
    amounts: Sequence[torch.Tensor | float],
    scaling: float,
) -> None:
    """(max |p| + Dmax + emax) x Lmax must stay within `LIMIT`: augmented positions, and the
    phases made of them, stay finite in float32 (when values may be read)."""
    if not _may_inspect_values(pos) or pos.numel() == 0:
        return
    reach = float(max_abs(pos, mask).max())
    for a in amounts:
        reach += float(a.max()) if isinstance(a, torch.Tensor) and a.numel() else float(a or 0)
    if reach * scaling > LIMIT:
        raise ValueError(
            f"{names}: augmented positions could reach (max |p| + max_global_shift + "
            f"max_local_shift) x max_global_scaling = {reach * scaling:.3g}, beyond {LIMIT:.0e} "
            "(float32 maths)"
        )


def global_draws(
    pos: torch.Tensor,
    dmax: torch.Tensor | float,
    lmax: float,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Per-sample shift [B, 1, M] and scale [B, 1, 1] (None when switched off)."""
    batch, _, axes = pos.shape
    shift = scale = None
    if nonzero(dmax):
        shift = uniform((batch, axes), generator, pos)[:, None, :] * dmax
    if lmax > 1.0:
        scale = torch.exp(uniform((batch,), generator, pos) * math.log(lmax))[:, None, None]
    return shift, scale


def local_draw(
    pos: torch.Tensor, emax: torch.Tensor | float, generator: torch.Generator | None
) -> torch.Tensor | None:
    """Per-token shift [B, T, M] (None when switched off), drawn token-major."""
    if not nonzero(emax):
        return None
    batch, length, axes = pos.shape
    return uniform((length, batch, axes), generator, pos).transpose(0, 1) * emax


def apply(
    pos: torch.Tensor,
    mask: torch.Tensor | None,
    shift: torch.Tensor | None,
    local: torch.Tensor | None,
    scale: torch.Tensor | None,
) -> torch.Tensor:
    if shift is not None:
        pos = pos + shift
    if local is not None:
        pos = pos + local
    if scale is not None:
        pos = pos * scale
    return zero_padding(pos, mask)


def zero_padding(pos: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """pos [B, T, M] with 0 at padding (mask [B, T] False)."""
    return pos if mask is None else torch.where(mask[..., None], pos, 0.0)
