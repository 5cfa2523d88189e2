"""`Rotary`'s options beyond the training length, checked once: the length extension (`scaling`,
any name of the rope-scaling registry `cape.functional.rope_registry`, with `train_length`,
`factor` and the scaling's own options) and xPos. The formulas live in `cape.functional`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import torch

from .._checks import _may_inspect_values, check_bool, check_float, check_limit
from ..functional.rope_registry import RopeScaling, rope_scaling
from ..functional.rope_scaling import joint_mask, position_midpoint, xpos_scale

__all__ = ["Extension", "check_extension", "check_half_range", "xpos_scales", "HALF_HEADROOM"]


@dataclasses.dataclass(frozen=True)
class Extension:
    """A rotary's extension options, validated (`check_extension`).

    scaling: the registry name (None: none); rule: its entry; options: every option the entry
    reads (factor, train_length, base, head_dim and its own). fixed: the factor of every call
    when the frequencies are one table (None: each call has its own value).
    """

    scaling: str | None
    rule: RopeScaling | None
    options: Mapping[str, Any]
    fixed: float | None
    xpos: bool
    xpos_scale_base: float
    xpos_center: float | None

    @property
    def per_call(self) -> bool:
        """Whether each call computes its own frequencies (no fixed factor)."""
        return self.rule is not None and self.fixed is None


def _optional(name: str, value: object, minimum: float = 0.0) -> float | None:
    if value is None:
        return None
    return check_limit(name, check_float(name, value, minimum=minimum, strict=minimum == 0.0))


def _scaling_options(
    scaling: str, rule: RopeScaling, given: Mapping[str, Any] | None, yarn: dict[str, float]
) -> dict[str, Any]:
    """The entry's own options: its defaults, then `yarn_alpha` / `yarn_beta` (the keywords of
    the paper's YaRN), then `scaling_options`; unknown names refused."""
    if given is not None and not isinstance(given, Mapping):
        raise TypeError(f"scaling_options must be a mapping or None, got {type(given).__name__}")
    out = dict(rule.options)
    out.update({k: v for k, v in yarn.items() if k in out})
    unknown = sorted(set(given or {}) - set(out))
    if unknown:
        raise ValueError(
            f"scaling_options {unknown} are not options of scaling={scaling!r}; it takes "
            f"{sorted(rule.options) or 'none'} (besides factor and train_length)"
        )
    return {**out, **(given or {})}


def _check_xpos(
    xpos: object, scale_base: object, center: object, pos_dim: int
) -> tuple[bool, float, float | None]:
    """xPos's options, checked -> (xpos, scale base, centre or None)."""
    xpos = check_bool("xpos", xpos)
    base = check_limit("xpos_scale_base", check_float("xpos_scale_base", scale_base, strict=True))
    if center is not None:
        center = check_limit("xpos_center", check_float("xpos_center", center, minimum=-math.inf))
    if xpos and pos_dim != 1:
        raise ValueError(f"xpos applies to pos_dim=1 (1-D positions), got pos_dim={pos_dim}")
    return xpos, base, center  # type: ignore[return-value]


def check_extension(
    *,
    head_dim: int,
    pos_dim: int,
    base: float,
    scaling: str | None,
    train_length: float | None,
    factor: float | None,
    scaling_options: Mapping[str, Any] | None,
    yarn_alpha: float,
    yarn_beta: float,
    xpos: bool,
    xpos_scale_base: float,
    xpos_center: float | None,
) -> Extension:
    """Check `Rotary`'s extension options (ValueError/TypeError naming the argument)."""
    train_length = _optional("train_length", train_length)
    factor = _optional("factor", factor, minimum=1.0)
    yarn = {"yarn_alpha": check_float("yarn_alpha", yarn_alpha)}
    yarn["yarn_beta"] = check_limit("yarn_beta", check_float("yarn_beta", yarn_beta))
    if not yarn["yarn_alpha"] < yarn["yarn_beta"]:
        raise ValueError(f"yarn_alpha must be < yarn_beta, got {yarn_alpha} and {yarn_beta}")
    xpos, scale_base, center = _check_xpos(xpos, xpos_scale_base, xpos_center, pos_dim)
    if scaling is None:
        for name, value in (("train_length", train_length), ("factor", factor)):
            if value is not None:
                raise ValueError(
                    f"{name} applies with scaling (e.g. 'pi', 'ntk', 'yarn'), got None"
                )
        if scaling_options:
            raise ValueError("scaling_options apply with scaling (e.g. 'yarn-hf'), got None")
        return Extension(None, None, {}, None, xpos, scale_base, center)
    if not isinstance(scaling, str):
        raise TypeError(f"scaling must be None or a str, got {type(scaling).__name__}")
    rule = rope_scaling(scaling)
    if pos_dim != 1:
        raise ValueError("scaling applies to pos_dim=1 (1-D positions), got pos_dim=2")
    given = {"factor": factor, "train_length": train_length}
    for name in rule.needs:
        if given[name] is None:
            raise ValueError(f"{name} is required for scaling={scaling!r}")
    if rule.per_call == "span" and train_length is None and factor is None:
        raise ValueError(f"scaling={scaling!r} needs train_length (a factor per call) or factor")
    options = {
        **_scaling_options(scaling, rule, scaling_options, yarn),
        **given,
        "base": base,
        "head_dim": head_dim,
    }
    options = rule.check(options, head_dim)
    return Extension(scaling, rule, options, rule.fixed_value(options), xpos, scale_base, center)


# float16 holds up to 65504: a factor on q and k must leave room for their entries, taken to
# reach this magnitude (activations after a projection rarely do)
HALF_HEADROOM = 256.0


def check_half_range(dtype: torch.dtype, *magnitudes: torch.Tensor | None) -> None:
    """xPos's scales (times YaRN's temperature, with both) multiply q and k in float32 before
    the cast back to their dtype: in float16, the largest factor x `HALF_HEADROOM` must stay
    within 65504, or the cast gives inf. Refused by name (when values may be read)."""
    if dtype != torch.float16:
        return
    for mag in magnitudes:
        if mag is None or not mag.numel() or not _may_inspect_values(mag):
            continue
        top = float(mag.max())
        if top * HALF_HEADROOM > torch.finfo(torch.float16).max:
            raise ValueError(
                f"positions: xPos scales q and k by up to {top:.3g} over these positions; float16 "
                f"holds up to 65504, which leaves entries up to {65504 / top:.3g} (at least "
                f"{HALF_HEADROOM:g} needed): use bfloat16 or float32, a larger xpos_scale_base, "
                "or a shorter span"
            )


def xpos_scales(
    ext: Extension,
    head_dim: int,
    q: torch.Tensor,
    k: torch.Tensor,
    q_mask: torch.Tensor | None,
    k_mask: torch.Tensor | None,
    s: torch.Tensor | None,
    center: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """xPos's magnitudes of q and k (`Rotary`'s docstring) at positions q [B, Tq, 1], k [B, Tk,
    1] (k is q in self-attention) -> [B, 1, Tq, hd], [B, 1, Tk, hd]; s [B]: the extension
    factor, whose interpolated positions xPos reads with "pi"; center: the common offset (None:
    the valid positions' midpoint, per call)."""
    if ext.scaling == "pi":  # xPos on the interpolated positions
        assert s is not None
        same = k is q
        q = q / s[:, None, None]
        k = q if same else k / s[:, None, None]
    if center is not None:
        n0: Any = center
    elif k is q:
        n0 = position_midpoint(q, q_mask)
    else:
        n0 = position_midpoint(torch.cat([q, k], dim=1), joint_mask(q, k, q_mask, k_mask))
    qs = xpos_scale(q, head_dim, scale_base=ext.xpos_scale_base, center=n0)
    ks = 1 / xpos_scale(k, head_dim, scale_base=ext.xpos_scale_base, center=n0)
    return qs[:, None], ks[:, None]
