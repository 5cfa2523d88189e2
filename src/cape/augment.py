"""Step 2 of the data flow: CAPE's training-time augmentation of positions (CAPE sec. 4).

A pure function positions -> positions, applied in the paper's order:
i) mean-normalisation over real tokens, ii) global shift Delta ~ U(-Dmax, Dmax) per sample and
axis, iii) local shift eps ~ U(-emax, emax) per token and axis, iv) global scaling lambda with
log lambda ~ U(-log Lmax, log Lmax) per sample, shared by the axes:
``p' = (p - mean(p) + Delta + eps) * lambda``. In eval mode only the normalisation applies.

Random numbers are drawn on the positions' device (from `generator` if given) in a fixed order:
global shift `[B, M]`, scale `[B]`, local shift `[T, B, M]`. The local draw is token-major so
that, on a generator that fills tensors sequentially (the CPU one), extra padding appended at
the end of a batch leaves the draws of the real tokens unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ._checks import (
    LIMIT,
    _may_inspect_values,
    check_bool,
    check_finite,
    check_float,
    check_generator,
    check_limit,
    check_per_axis,
    check_tensor,
    max_abs,
)

__all__ = [
    "Augmentation",
    "check_augmentation",
    "AUGMENTATION_FIELDS",
    "mean_normalize",
    "augment_positions",
    "augment_pair",
]

Amount = float | Sequence[float] | torch.Tensor


@dataclass(frozen=True)
class Augmentation:
    """CAPE's augmentation settings, validated once.

    max_global_shift: Dmax, a float or one per axis (tokens, seconds or image units).
    max_local_shift: emax, a float or one per axis; <= half the spacing keeps the order.
    max_global_scaling: Lmax >= 1 (1 = no scaling).
    normalize: subtract the mean position of each sample's real tokens (train and eval).
    """

    max_global_shift: float | tuple[float, ...] = 0.0
    max_local_shift: float | tuple[float, ...] = 0.0
    max_global_scaling: float = 1.0
    normalize: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.max_local_shift, str) and self.max_local_shift == "auto":
            raise TypeError(
                "max_local_shift='auto' (emax = extent/N per axis of the grid being encoded) is "
                "not an Augmentation value: it is CAPE2d's option "
                "CAPE2d(dim, augmentation=..., auto_local_shift=True), or 'auto' among "
                "cape.build('cape2d', ...)'s fields"
            )
        object.__setattr__(
            self, "max_global_shift", _check_amount("max_global_shift", self.max_global_shift)
        )
        object.__setattr__(
            self, "max_local_shift", _check_amount("max_local_shift", self.max_local_shift)
        )
        object.__setattr__(self, "max_global_scaling", _check_scaling(self.max_global_scaling))
        if not isinstance(self.normalize, bool):
            raise TypeError(f"normalize must be a bool, got {self.normalize!r}")

    @property
    def random(self) -> bool:
        """True when training draws anything at all."""
        return (
            _nonzero(self.max_global_shift)
            or _nonzero(self.max_local_shift)
            or (self.max_global_scaling > 1.0)
        )

    def __call__(
        self,
        positions: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        training: bool = True,
        generator: torch.Generator | None = None,
        name: str = "positions",
    ) -> torch.Tensor:
        return augment_positions(
            positions,
            mask,
            max_global_shift=self.max_global_shift,
            max_local_shift=self.max_local_shift,
            max_global_scaling=self.max_global_scaling,
            normalize=self.normalize,
            training=training,
            generator=generator,
            name=name,
        )

    def pair(
        self,
        source: torch.Tensor,
        target: torch.Tensor,
        source_mask: torch.Tensor | None = None,
        target_mask: torch.Tensor | None = None,
        *,
        alpha: float = 1.0,
        training: bool = True,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`augment_pair` with these settings: one global shift and scale per sample for both
        sides, independent local shifts (mean-normalisation is the caller's)."""
        return augment_pair(
            source,
            target,
            source_mask,
            target_mask,
            alpha=alpha,
            max_global_shift=self.max_global_shift,
            max_local_shift=self.max_local_shift,
            max_global_scaling=self.max_global_scaling,
            training=training,
            generator=generator,
        )


# the fields, as keywords of `cape.build` and keys of config files (`cape.PRESETS` too)
AUGMENTATION_FIELDS = ("max_global_shift", "max_local_shift", "max_global_scaling", "normalize")


def check_augmentation(value: object, name: str = "augmentation") -> Augmentation | None:
    """The one check of an encoding's `augmentation=` argument: a `cape.Augmentation` or None,
    returned as it is. Anything else (a mapping of the fields included: that is the form of
    `cape.build` and config files) raises TypeError naming the argument `name`."""
    if value is None or isinstance(value, Augmentation):
        return value
    raise TypeError(f"{name} must be a cape.Augmentation or None, got {value!r}")


def _check_amount(name: str, v: float | Sequence[float]) -> float | tuple[float, ...]:
    """A float amount, or one per axis: finite, >= 0 and at most `LIMIT` (float32 maths)."""
    v = check_per_axis(name, v)
    for x in v if isinstance(v, tuple) else (v,):
        check_limit(name, x)
    return v


def _check_scaling(v: float) -> float:
    return check_limit("max_global_scaling", check_float("max_global_scaling", v, minimum=1.0))


def _nonzero(v: Amount) -> bool:
    if isinstance(v, torch.Tensor):
        return True  # tensor amounts are never inspected (that would sync with the device)
    if isinstance(v, (list, tuple)):
        return any(x != 0 for x in v)
    return v != 0


def _amount(name: str, v: Amount, pos: torch.Tensor) -> torch.Tensor | float:
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
    v = _check_amount(name, v)
    if isinstance(v, tuple):
        if len(v) != pos.shape[-1]:
            raise ValueError(f"{name} has {len(v)} values but positions have {pos.shape[-1]} axes")
        return torch.tensor(v, device=pos.device, dtype=torch.float32)
    return v


def _uniform(shape: Sequence[int], gen: torch.Generator | None, pos: torch.Tensor) -> torch.Tensor:
    """U(-1, 1) drawn on the positions' device."""
    if gen is not None and gen.device.type != pos.device.type:
        raise ValueError(
            f"generator is on {gen.device} but positions are on {pos.device}: "
            "random draws happen on the positions' device"
        )
    # no generator keyword unless one is given: with it, torch.rand refuses symbolic shapes
    # (torch.compile with dynamic shapes); the default generator draws the same numbers
    extra = {} if gen is None else {"generator": gen}
    return torch.rand(shape, device=pos.device, dtype=torch.float32, **extra) * 2.0 - 1.0


def mean_normalize(positions: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Subtract each sample's mean over real tokens. positions: [B, T, M] floating point,
    mask: [B, T] bool -> [B, T, M] in positions' dtype (integer positions: convert them first,
    e.g. with `cape.as_positions`)."""
    _check_positions(positions, mask)
    out = _mean_normalize(positions, mask)
    check_finite("positions", out, mask, what=" once mean-normalised (|p - mean| overflows)")
    return out


def _mean_normalize(positions: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return positions - positions.mean(dim=1, keepdim=True)
    # Accumulate in float64 (where the device has it): a float32 sum's rounding depends on the
    # padded length through the reduction order, and padding must not move real tokens.
    acc = torch.float32 if positions.device.type == "mps" else torch.float64
    m = mask[..., None].to(acc)
    count = m.sum(dim=1, keepdim=True).clamp_min(1.0)
    total = torch.where(mask[..., None], positions.to(acc), 0.0).sum(dim=1, keepdim=True)
    return positions - (total / count).to(positions.dtype)


def _check_positions(
    positions: torch.Tensor,
    mask: torch.Tensor | None,
    name: str = "positions",
    mask_name: str = "mask",
) -> None:
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


def _check_reach(
    names: str,
    pos: torch.Tensor,
    mask: torch.Tensor | None,
    amounts: Sequence[torch.Tensor | float],
    scaling: float,
) -> None:
    """(max |p| + Dmax + emax) x Lmax must stay within `LIMIT`: augmented positions, and the
    phases made of them, stay finite in float32 (CPU only: it reads the values)."""
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


def _global_draws(
    pos: torch.Tensor,
    dmax: torch.Tensor | float,
    lmax: float,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Per-sample shift [B, 1, M] and scale [B, 1, 1] (None when switched off)."""
    batch, _, axes = pos.shape
    shift = scale = None
    if _nonzero(dmax):
        shift = _uniform((batch, axes), generator, pos)[:, None, :] * dmax
    if lmax > 1.0:
        scale = torch.exp(_uniform((batch,), generator, pos) * math.log(lmax))[:, None, None]
    return shift, scale


def _local_draw(
    pos: torch.Tensor, emax: torch.Tensor | float, generator: torch.Generator | None
) -> torch.Tensor | None:
    """Per-token shift [B, T, M] (None when switched off), drawn token-major."""
    if not _nonzero(emax):
        return None
    batch, length, axes = pos.shape
    return _uniform((length, batch, axes), generator, pos).transpose(0, 1) * emax


def _apply(
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
    return pos if mask is None else torch.where(mask[..., None], pos, 0.0)


def augment_positions(
    positions: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    max_global_shift: Amount = 0.0,
    max_local_shift: Amount = 0.0,
    max_global_scaling: float = 1.0,
    normalize: bool = False,
    training: bool = True,
    generator: torch.Generator | None = None,
    name: str = "positions",
) -> torch.Tensor:
    """CAPE augmentation. positions: [B, T, M] float, mask: [B, T] bool -> [B, T, M] float32.

    Amounts are floats, one float per axis, or tensors broadcastable to `[B, M]` (per sample,
    e.g. emax = 1/N for images of different grids in one batch). Padded tokens are ignored by
    the mean and set to 0 in the output. In eval mode (`training=False`) only `normalize` acts.
    name: what errors call the positions (a caller's argument, e.g. "q_positions").
    """
    _check_positions(positions, mask, name=name)
    check_bool("normalize", normalize)
    check_bool("training", training)
    check_generator("generator", generator)
    pos = positions.to(torch.float32)
    # the options are checked in eval mode too, where they draw nothing
    dmax = _amount("max_global_shift", max_global_shift, pos)
    emax = _amount("max_local_shift", max_local_shift, pos)
    lmax = _check_scaling(max_global_scaling)
    if normalize:
        pos = mean_normalize(pos, mask)
    if not training:
        return pos if mask is None else torch.where(mask[..., None], pos, 0.0)
    _check_reach(name, pos, mask, (dmax, emax), lmax)
    shift, scale = _global_draws(pos, dmax, lmax, generator)
    local = _local_draw(pos, emax, generator)
    return _apply(pos, mask, shift, local, scale)


def augment_pair(
    source: torch.Tensor,
    target: torch.Tensor,
    source_mask: torch.Tensor | None = None,
    target_mask: torch.Tensor | None = None,
    *,
    alpha: float = 1.0,
    max_global_shift: Amount = 0.0,
    max_local_shift: Amount = 0.0,
    max_global_scaling: float = 1.0,
    training: bool = True,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Synchronised augmentation for encoder-decoder pairs (CAPE sec. 5.3, appendix D.1).

    source: [B, S, M], target: [B, T, M]. Source positions are scaled by `alpha` (target/source
    token ratio of the training corpus) so both sides span about the same interval; no
    mean-normalisation (both start aligned at the first position); the same global shift and
    scale for the source and target of a sample; independent local shifts.
    """
    check_limit("alpha", check_float("alpha", alpha, strict=True))
    _check_positions(source, source_mask, "source", "source_mask")
    _check_positions(target, target_mask, "target", "target_mask")
    check_bool("training", training)
    check_generator("generator", generator)
    if source.shape[0] != target.shape[0] or source.shape[-1] != target.shape[-1]:
        raise ValueError(
            f"source {tuple(source.shape)} and target {tuple(target.shape)} must share B and M"
        )
    src = source.to(torch.float32) * alpha
    tgt = target.to(torch.float32)
    dmax = _amount("max_global_shift", max_global_shift, src)
    emax = _amount("max_local_shift", max_local_shift, src)
    lmax = _check_scaling(max_global_scaling)
    check_finite("source", src, source_mask, what=" once scaled by alpha")
    if not training:
        return _apply(src, source_mask, None, None, None), _apply(
            tgt, target_mask, None, None, None
        )
    _check_reach("source", src, source_mask, (dmax, emax), lmax)
    _check_reach("target", tgt, target_mask, (dmax, emax), lmax)
    shift, scale = _global_draws(src, dmax, lmax, generator)
    src_local = _local_draw(src, emax, generator)
    tgt_local = _local_draw(tgt, emax, generator)
    return (
        _apply(src, source_mask, shift, src_local, scale),
        _apply(tgt, target_mask, shift, tgt_local, scale),
    )
