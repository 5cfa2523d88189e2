"""ALiBi, attention with linear biases (Press et al., ICLR 2022, "Train Short, Test Long").

No embedding at all: every head h adds to its attention logits a penalty linear in the distance
between query i and key j,

    logits_hij = q_i . k_j / sqrt(d) - m_h |p_i - p_j|

with fixed head slopes m_h (`alibi_slopes`). Positions p are continuous here (token indices,
seconds, any 1-D coordinate), so CAPE's augmentation applies to them as to rotary's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .._checks import LIMIT, _may_inspect_values, check_bool, check_int, check_tensor, max_abs
from .relative import _flat_positions

__all__ = ["alibi_slopes", "alibi_bias"]


def _geometric(n: int) -> list[float]:
    """n a power of two: 2^(-8/n), 2^(-16/n), ..., 2^(-8): ratio and start 2^(-8/n)."""
    return [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)]


def alibi_slopes(heads: int) -> torch.Tensor:
    """The paper's head slopes -> float32 [H], all in (0, 1).

    H a power of two: the geometric sequence 2^(-8k/H), k = 1..H (H = 8: 1/2, 1/4, ..., 1/256).
    Otherwise, with n the largest power of two below H: the n slopes of n, then the first H - n
    of every other slope of 2n (2^(-8(2j+1)/2n), j = 0, 1, ...), as the authors' code does.
    """
    check_int("heads", heads)
    n = 2 ** int(math.floor(math.log2(heads)))
    slopes = _geometric(n) + _geometric(2 * n)[0::2][: heads - n]
    return torch.tensor(slopes, dtype=torch.float32, device="cpu")  # also under a device context


def check_slopes(slopes: object, heads: int | None = None) -> torch.Tensor:
    """Given slopes (a sequence of numbers or a tensor [H]) -> float32 [H], each finite and
    > 0 (a non-positive slope would reward distance); H = `heads` when given."""
    if isinstance(slopes, torch.Tensor):
        t = slopes
    elif isinstance(slopes, Sequence) and not isinstance(slopes, str):
        if not all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in slopes):
            raise TypeError(f"slopes must hold real numbers, got {list(slopes)!r}")
        t = torch.tensor([float(s) for s in slopes], dtype=torch.float64, device="cpu")
    else:
        raise TypeError(f"slopes must be a tensor [H] or a sequence of numbers, got {slopes!r}")
    check_tensor("slopes", t, ndims=(1,))
    if not t.is_floating_point() and (t.dtype == torch.bool or t.is_complex()):
        raise TypeError(f"slopes must be real, got {t.dtype}")
    if heads is not None and t.shape[0] != heads:
        raise ValueError(f"slopes must have one value per head ({heads}), got {t.shape[0]}")
    if t.shape[0] == 0:
        raise ValueError("slopes must hold at least one value (one per head)")
    if _may_inspect_values(t):
        t64 = t.detach().to(torch.float64)
        if not bool((torch.isfinite(t64) & (t64 > 0) & (t64 <= LIMIT)).all()):
            raise ValueError(f"slopes must be finite, > 0 and <= {LIMIT:.0e}, got {t.tolist()}")
    return t.to(torch.float32)


def alibi_bias(
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    slopes: torch.Tensor,
    causal: bool = False,
) -> torch.Tensor:
    """ALiBi's additive attention bias -> float32 [B, H, Tq, Tk].

    q_positions: [B, Tq] or [B, Tq, 1]; k_positions: [B, Tk] or [B, Tk, 1] (batch sizes equal
    or 1: positions shared by the batch give a [1, H, Tq, Tk] bias); any units. slopes: [H] > 0
    (`alibi_slopes`). bias_hij = -m_h |p_i - p_j| (bidirectional, as x-transformers).
    causal=True: -m_h max(p_i - p_j, 0), the paper's -m_h (i - j) for keys at or behind the
    query; keys ahead get 0 and must be masked by the caller (the causal mask). With ordered
    positions both forms agree on every key a causal query sees; they differ only if
    augmentation (local shifts) reorders positions, where a key ahead gets no bonus here.
    Computed in float32: (|q| + |k|)_max x m_max must stay within 1e38 (checked on the CPU).
    """
    check_bool("causal", causal)
    q = _flat_positions("q_positions", q_positions)
    k = _flat_positions("k_positions", k_positions)
    m = check_slopes(slopes).to(q.device)
    if q.shape[0] != k.shape[0] and 1 not in (q.shape[0], k.shape[0]):
        raise ValueError(
            f"q_positions and k_positions batch sizes must match or be 1, got "
            f"{tuple(q_positions.shape)} and {tuple(k_positions.shape)}"
        )
    if _may_inspect_values(q) and q.numel() and k.numel():
        reach = float((max_abs(q[..., None]) + max_abs(k[..., None])) * max_abs(m[:, None]))
        if reach > LIMIT:
            raise ValueError(
                f"q_positions / k_positions: the biases slope x |p_i - p_j| reach {reach:.3g}, "
                f"beyond {LIMIT:.0e} (float32 maths): smaller positions or slopes are needed"
            )
    ahead = q[:, :, None] - k[:, None, :]  # p_i - p_j: [B, Tq, Tk]
    dist = ahead.clamp(min=0.0) if causal else ahead.abs()
    return -m[None, :, None, None] * dist[:, None]
