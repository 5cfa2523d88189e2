"""Argument validation shared by every module: errors name the argument and what is allowed."""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import torch

FLOAT32_MAX = float(torch.finfo(torch.float32).max)
# The largest magnitude cape lets a phase (position x frequency), an augmented position or a
# positional option (hop, extent, amounts, scales) reach: float32 holds up to 3.4e38, and this
# margin keeps sums and products of such values finite.
LIMIT = 1e38


def check_int(name: str, value: object, *, minimum: int = 1) -> int:
    """`value` must be an int >= `minimum` (bools are rejected). A symbolic size (torch.export,
    dynamic shapes) passes: the bound becomes a check of the exported graph."""
    if isinstance(value, torch.SymInt):
        torch._check(value >= minimum, lambda: f"{name} must be an int >= {minimum}")
        return value  # type: ignore[return-value]
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
    if torch.compiler.is_compiling():
        # compiled with dynamic=True, a module's float options are symbolic: comparing them
        # would break the graph; they were checked when the module was built
        return value  # type: ignore[return-value]
    value = float(value)
    bad = value <= minimum if strict else value < minimum
    if not math.isfinite(value) or bad:
        op = ">" if strict else ">="
        raise ValueError(f"{name} must be a finite number {op} {minimum}, got {value}")
    return value


def check_limit(name: str, value: float, what: str = "") -> float:
    """A finite float whose magnitude is at most `LIMIT` (what float32 maths can carry)."""
    if abs(value) > LIMIT:
        raise ValueError(
            f"{name} must be at most {LIMIT:.0e} in magnitude{what} (float32 maths), got {value:g}"
        )
    return value


def check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value


def check_generator(name: str, value: object) -> None:
    if value is not None and not isinstance(value, torch.Generator):
        raise TypeError(f"{name} must be a torch.Generator or None, got {type(value).__name__}")


def check_mask(name: str, mask: object, shape: Sequence[int]) -> torch.Tensor:
    """`mask` must be a bool tensor of `shape` (True at real tokens)."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(f"{name} must be a bool tensor (True at real tokens), got {got}")
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(mask.shape)}")
    return mask


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


def check_real(name: str, t: object, ndims: Sequence[int] = range(1, 9)) -> torch.Tensor:
    """A real (not complex, not bool) tensor of rank in `ndims`: positions, phases."""
    check_tensor(name, t, ndims=ndims)
    assert isinstance(t, torch.Tensor)
    if t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{name} must be a real tensor, got {t.dtype}")
    return t


def check_content(
    name: str,
    x: object,
    dim: int,
    dtype: torch.dtype | None = None,
    ndims: Sequence[int] = (3,),
) -> torch.Tensor:
    """Content `x`: a floating-point tensor of rank in `ndims` whose last axis is `dim`, in
    `dtype` (the parameters') unless autocast is on."""
    check_tensor(name, x, ndims=ndims, floating=True)
    assert isinstance(x, torch.Tensor)
    if x.shape[-1] != dim:
        raise ValueError(f"{name} must end with D = {dim} features, got shape {tuple(x.shape)}")
    if dtype is not None and x.dtype != dtype and not _autocast(x.device.type):
        raise TypeError(f"{name} must be {dtype} like the model's parameters, got {x.dtype}")
    return x


def _autocast(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4 cannot say per device: leave the dtype to torch
        return True


class _ValueChecks(threading.local):
    # per thread, as torch.set_grad_enabled: the user's switch, and how deep we are inside
    # calls whose inputs a public boundary has already checked
    enabled = True
    inner = 0


_STATE = _ValueChecks()


class value_checks:  # noqa: N801 - used like torch.set_grad_enabled, as a function or a `with`
    """Turn cape's checks of tensor values (finite positions, phases that float32 holds,
    lengths in range, ...) on or off for this thread. On by default, on every device, so CPU
    and accelerators refuse the same inputs; each check reads a value, which on an accelerator
    waits for it (a host sync, a few per forward: the public boundary checks once, layers do not).

    `cape.value_checks(False)` turns them off until turned on again; `with
    cape.value_checks(False): ...` only inside the block. Under torch.compile and while a CUDA
    graph is captured they are off by themselves. Shapes, dtypes and options are always checked.
    """

    def __init__(self, enabled: bool) -> None:
        self.previous = _STATE.enabled
        _STATE.enabled = check_bool("enabled", enabled)

    def __enter__(self) -> value_checks:
        return self

    def __exit__(self, *exc: object) -> None:
        _STATE.enabled = self.previous


def value_checks_enabled() -> bool:
    """Whether `value_checks` is on in this thread."""
    return _STATE.enabled


@contextlib.contextmanager
def _inner_calls() -> Iterator[None]:
    _STATE.inner += 1
    try:
        yield
    finally:
        _STATE.inner -= 1


def checked_inputs() -> contextlib.AbstractContextManager[Any]:
    """A block whose inputs a public boundary has checked: the value checks of the calls inside
    it (each layer's rotary, biases, ...) are skipped. A no-op under torch.compile."""
    if torch.compiler.is_compiling():
        return contextlib.nullcontext()
    return _inner_calls()


def _may_inspect_values(t: torch.Tensor) -> bool:
    # Values are read on every device (the same inputs refused everywhere), but never while
    # compiling (no graph break) or capturing a CUDA graph (no sync allowed), nor on meta
    # tensors (no values), nor inside a block a boundary has checked, nor when turned off.
    if torch.compiler.is_compiling() or not _STATE.enabled or _STATE.inner or t.is_meta:
        return False
    return not (t.is_cuda and torch.cuda.is_current_stream_capturing())


def check_finite(
    name: str, t: torch.Tensor, mask: torch.Tensor | None = None, what: str = ""
) -> None:
    """Raise ValueError when `t` has NaN/inf at valid tokens (when values may be read: see
    `_may_inspect_values`). what: how the values were made (overflow hints)."""
    if not _may_inspect_values(t):
        return
    bad = ~torch.isfinite(t)
    if mask is not None:
        bad = bad & mask.reshape(mask.shape + (1,) * (t.dim() - mask.dim()))
    if bool(bad.any()):
        raise ValueError(
            f"{name} must be finite at valid tokens{what}; found NaN or inf "
            f"(float32 holds up to {FLOAT32_MAX:.3g})"
        )


def max_abs(t: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per last-axis max |t| over finite entries (valid tokens of `mask` [B, T] only) ->
    float64 [M] (t: [..., M]; zeros when empty). Reads values: callers check
    `_may_inspect_values` first."""
    # float64 before abs: |int32 min| does not fit int32 (abs would leave it negative)
    a = t.detach().to(torch.float64).abs().nan_to_num(0.0, 0.0, 0.0)
    if mask is not None:
        a = a * mask.reshape(mask.shape + (1,) * (a.dim() - mask.dim()))
    if a.dim() == 0:
        return a.reshape(1)
    if a.numel() == 0:
        return a.new_zeros(a.shape[-1])
    return a.amax(dim=tuple(range(a.dim() - 1))) if a.dim() > 1 else a


def check_phases(name: str, positions: torch.Tensor, scale: object, what: str = "") -> None:
    """The phases sum_m |p_m| x scale_m (scale: the largest |frequency| per coordinate, a float
    or a tensor [M], or a function giving it, called only when checking) must stay within
    `LIMIT`, or cos/sin turn them into NaN. Nothing at all under torch.compile."""
    if not _may_inspect_values(positions) or positions.numel() == 0:
        return
    if callable(scale):
        scale = scale()
    if isinstance(scale, torch.Tensor):
        scale = scale.detach().to("cpu", torch.float64).abs()
    reach = float((max_abs(positions).cpu() * scale).sum())
    if reach > LIMIT:
        raise ValueError(
            f"{name}: the phases |position| x frequency reach {reach:.3g}{what}, beyond "
            f"{LIMIT:.0e} (float32 maths): smaller {name} or frequencies (freq_scale) are needed"
        )


def check_lengths(name: str, lengths: torch.Tensor, batch: int, maximum: int) -> None:
    """lengths: [B] integers in [0, maximum]."""
    if lengths.dim() != 1 or lengths.shape[0] != batch:
        raise ValueError(f"{name} must have shape [{batch}], got {tuple(lengths.shape)}")
    if lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got {lengths.dtype}")
    if _may_inspect_values(lengths) and bool(((lengths < 0) | (lengths > maximum)).any()):
        raise ValueError(f"{name} must lie in [0, {maximum}], got {lengths.tolist()}")


def check_positive_tensor(name: str, t: torch.Tensor, mask: torch.Tensor | None = None) -> None:
    """Every entry of `t` (at `mask`'s True entries, same shape) must be finite and > 0 (when
    values may be read, like `check_finite`: else nothing is computed, not even the selection)."""
    if not _may_inspect_values(t):
        return
    bad = ~torch.isfinite(t) | (t <= 0)
    if bool((bad if mask is None else bad & mask).any()):
        raise ValueError(f"{name} must be finite and > 0 everywhere")
