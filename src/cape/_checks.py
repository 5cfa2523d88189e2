"""Argument validation shared by every module: errors name the argument and what is allowed."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def check_int(name: str, value: object, *, minimum: int = 1) -> int:
    """`value` must be an int >= `minimum` (bools are rejected)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int >= {minimum}, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value}")
    return value


def check_even(name: str, value: object, *, multiple: int = 2) -> int:
    """`value` must be a positive int divisible by `multiple`."""
    check_int(name, value)
    assert isinstance(value, int)
    if value % multiple:
        raise ValueError(f"{name} must be divisible by {multiple}, got {value}")
    return value


def check_float(name: str, value: object, *, minimum: float = 0.0, strict: bool = False) -> float:
    """`value` must be a finite real >= `minimum` (> when `strict`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    value = float(value)
    bad = value <= minimum if strict else value < minimum
    if not math.isfinite(value) or bad:
        op = ">" if strict else ">="
        raise ValueError(f"{name} must be a finite number {op} {minimum}, got {value}")
    return value


def check_rate(name: str, value: object, *, one: bool = False) -> float:
    """A probability in [0, 1) (a dropout rate), or [0, 1] with `one` (a layer-drop rate)."""
    value = check_float(name, value)
    if value > 1.0 or (value == 1.0 and not one):
        raise ValueError(f"{name} must lie in [0, 1{']' if one else ')'}, got {value}")
    return value


def check_per_axis(
    name: str, value: float | Sequence[float], *, minimum: float = 0.0
) -> float | tuple[float, ...]:
    """A scalar or one value per axis, each finite and >= `minimum`."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"{name} must be a number or a non-empty sequence of numbers")
        return tuple(check_float(f"{name}[{i}]", v, minimum=minimum) for i, v in enumerate(value))
    return check_float(name, value, minimum=minimum)


def check_choice(name: str, value: object, allowed: Sequence[object]) -> object:
    # compare types too: True == 1 and 1.0 == 1 must not pass for 1
    if not any(type(value) is type(a) and value == a for a in allowed):
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")
    return value


def check_tensor(
    name: str, value: object, *, ndims: Sequence[int], floating: bool = False
) -> torch.Tensor:
    """`value` must be a tensor of one of the ranks `ndims` (and floating point if asked)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dim() not in ndims:
        raise ValueError(f"{name} must have rank in {list(ndims)}, got shape {tuple(value.shape)}")
    if floating and not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {value.dtype}")
    return value


def _may_inspect_values(t: torch.Tensor) -> bool:
    # Looking at values needs the host: only on CPU and outside torch.compile, so that
    # forward never syncs with an accelerator nor breaks a compiled graph.
    return t.device.type == "cpu" and not torch.compiler.is_compiling()


def check_finite(name: str, t: torch.Tensor, mask: torch.Tensor | None = None) -> None:
    """Raise ValueError when `t` has NaN/inf at valid tokens (CPU only; see
    `_may_inspect_values`)."""
    if not _may_inspect_values(t):
        return
    bad = ~torch.isfinite(t)
    if mask is not None:
        bad = bad & mask.reshape(mask.shape + (1,) * (t.dim() - mask.dim()))
    if bool(bad.any()):
        raise ValueError(f"{name} must be finite at valid tokens; found NaN or inf")


def check_lengths(name: str, lengths: torch.Tensor, batch: int, maximum: int) -> None:
    """lengths: [B] integers in [0, maximum]."""
    if lengths.dim() != 1 or lengths.shape[0] != batch:
        raise ValueError(f"{name} must have shape [{batch}], got {tuple(lengths.shape)}")
    if lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got {lengths.dtype}")
    if _may_inspect_values(lengths) and bool(((lengths < 0) | (lengths > maximum)).any()):
        raise ValueError(f"{name} must lie in [0, {maximum}], got {lengths.tolist()}")


def check_positive_tensor(name: str, t: torch.Tensor) -> None:
    """Every entry of `t` must be finite and > 0 (CPU only, like `check_finite`)."""
    if _may_inspect_values(t) and bool((~torch.isfinite(t) | (t <= 0)).any()):
        raise ValueError(f"{name} must be finite and > 0 everywhere")
