"""FIRE, functional interpolation for relative positions (Li et al., ICLR 2024).

A learned attention bias: every pair (query i, key j) gets a normalised distance

    r_ij = psi(d_ij) / (psi(n_i) + eps),    psi(x) = log(|c| x + 1),

with d_ij = max(p_i - p_j, 0) (causal) or |p_i - p_j| (bidirectional) and n_i = max(L, the
largest d_ij over the valid keys of query i), and an MLP f: R -> R^H turns r_ij into one bias
per head (`fire_bias`). c > 0 and the threshold L > 0 are learned in the paper (|c| and |L|
are used here, as in the authors' code, so that a learned value crossing 0 stays valid).

Causal attention over token indices 0..T-1: the farthest key of query i is the first one,
n_i = max(L, i): the paper's psi(i - j) / psi(max(L, i)). Bidirectional attention (our
extension): n_i is the distance to the farthest valid key on either side, so r_ij stays in
[0, 1] for every pair, as the paper's interpolation wants. Positions are continuous (token
indices, seconds): CAPE's augmentation applies to them as to ALiBi's.
"""

from __future__ import annotations

import torch

from .._checks import LIMIT, _may_inspect_values, check_bool, check_tensor, max_abs
from .relative import _flat_positions

__all__ = ["fire_distance", "fire_bias"]

EPS = 1e-6  # the paper's code: keeps r finite where psi(n_i) = 0 (c or L learned to 0)


def _scalar(name: str, value: object) -> torch.Tensor:
    """A real number or a 0-dim / one-element real tensor (may require grad) -> float32."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dim() > 1:
            raise ValueError(f"{name} must be a number or a one-element tensor, got {value.shape}")
        if value.dtype == torch.bool or value.is_complex():
            raise TypeError(f"{name} must be real, got {value.dtype}")
        t = value.reshape(()).to(torch.float32)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        t = torch.tensor(float(value), dtype=torch.float32)
    else:
        raise TypeError(f"{name} must be a real number or a tensor, got {type(value).__name__}")
    if _may_inspect_values(t):
        v = float(t.detach())
        if not (v == v and abs(v) <= LIMIT):
            raise ValueError(f"{name} must be finite, got {v}")
    return t


def fire_distance(
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    c: float | torch.Tensor = 0.1,
    threshold: float | torch.Tensor = 512.0,
    causal: bool = False,
    k_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """FIRE's normalised distances r_ij (module docstring) -> float32 [B, Tq, Tk], in [0, 1].

    q_positions: [B, Tq] or [B, Tq, 1]; k_positions: [B, Tk] or [B, Tk, 1] (batch sizes equal
    or 1); any units. c: psi's scale (a number or a one-element tensor, learnable); threshold:
    L, the smallest normaliser (same units as the positions). causal: d_ij = max(p_i - p_j, 0)
    (keys ahead get 0 and must be masked by the caller). k_mask: [B or 1, Tk] bool, True at
    real keys, or [B or 1, Tq or 1, Tk] bool, True where query i sees key j (the attention's
    mask): only those keys count towards n_i (None = all keys count). With a causal mask, a
    bidirectional FIRE thus never reads the positions of keys ahead.
    """
    check_bool("causal", causal)
    q = _flat_positions("q_positions", q_positions)
    k = _flat_positions("k_positions", k_positions)
    c_t = _scalar("c", c).to(q.device).abs()
    lim = _scalar("threshold", threshold).to(q.device).abs()
    if q.shape[0] != k.shape[0] and 1 not in (q.shape[0], k.shape[0]):
        raise ValueError(
            f"q_positions and k_positions batch sizes must match or be 1, got "
            f"{tuple(q_positions.shape)} and {tuple(k_positions.shape)}"
        )
    if k_mask is not None:
        check_tensor("k_mask", k_mask, ndims=(2, 3))
        if k_mask.dtype != torch.bool:
            raise TypeError(f"k_mask must be a bool tensor (True = visible), got {k_mask.dtype}")
        b, tq = max(q.shape[0], k.shape[0]), q.shape[1]
        rows = (1, tq) if k_mask.dim() == 3 else ()
        if (
            (b > 1 and k_mask.shape[0] not in (1, b))  # shared positions: any batch of masks
            or k_mask.shape[-1] != k.shape[1]
            or (rows and k_mask.shape[1] not in rows)
        ):
            want = f"[{b} or 1, {tq} or 1, {k.shape[1]}]" if rows else f"[{b} or 1, {k.shape[1]}]"
            raise ValueError(f"k_mask must have shape {want}, got {list(k_mask.shape)}")
        if k_mask.dim() == 2:
            k_mask = k_mask[:, None, :]
    if _may_inspect_values(q) and q.numel() and k.numel():
        reach = float((max_abs(q[..., None]) + max_abs(k[..., None])).max())
        if reach * max(float(c_t.detach()), 1.0) > LIMIT:
            raise ValueError(
                f"q_positions / k_positions: |c| x |p_i - p_j| reaches {reach:.3g} x "
                f"{float(c_t.detach()):.3g}, beyond {LIMIT:.0e} (float32 maths)"
            )
    return normalised_distance(q, k, c_t, lim, causal, k_mask)


def normalised_distance(
    q: torch.Tensor,
    k: torch.Tensor,
    c: torch.Tensor,
    threshold: torch.Tensor,
    causal: bool,
    k_mask: torch.Tensor | None,
) -> torch.Tensor:
    """`fire_distance`'s kernel: checked float32 positions q [B, Tq], k [B, Tk], |c| and |L| as
    float32 0-dim tensors, k_mask None or [B or 1, Tq or 1, Tk] bool -> r [B, Tq, Tk]; no checks."""
    ahead = q[:, :, None] - k[:, None, :]  # p_i - p_j: [B, Tq, Tk]
    dist = ahead.clamp(min=0.0) if causal else ahead.abs()
    seen = dist if k_mask is None else dist * k_mask.to(dist.dtype)
    far = seen.amax(dim=-1, keepdim=True) if seen.shape[-1] else seen.new_zeros(seen.shape[:2])
    norm = torch.maximum(far.reshape(seen.shape[0], seen.shape[1], 1), threshold)
    return torch.log1p(c * dist) / (torch.log1p(c * norm) + EPS)


def mlp_bias(r: torch.Tensor, weights: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """FIRE's MLP over r [B, Tq, Tk] with weights (w1, b1, w2, b2) -> [B, H, Tq, Tk] float32."""
    w1, b1, w2, b2 = (w.to(device=r.device, dtype=torch.float32) for w in weights)
    h = torch.relu(r[..., None] * w1[:, 0] + b1)  # [B, Tq, Tk, hidden]
    return (h @ w2.t() + b2).permute(0, 3, 1, 2)  # [B, H, Tq, Tk]


def fire_bias(
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    weights: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    c: float | torch.Tensor = 0.1,
    threshold: float | torch.Tensor = 512.0,
    causal: bool = False,
    k_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """FIRE's additive attention bias -> float32 [B, H, Tq, Tk].

    weights: the MLP f (w1 [hidden, 1], b1 [hidden], w2 [H, hidden], b2 [H]): bias_hij =
    (w2 relu(w1 r_ij + b1) + b2)_h with r = `fire_distance(q_positions, k_positions, c,
    threshold, causal, k_mask)`. Computed in float32 whatever the weights' dtype.
    """
    if not isinstance(weights, (tuple, list)) or len(weights) != 4:
        raise TypeError("weights must be a tuple (w1, b1, w2, b2) of tensors")
    for name, w, nd in zip(("w1", "b1", "w2", "b2"), weights, (2, 1, 2, 1), strict=True):
        check_tensor(f"weights.{name}", w, ndims=(nd,), floating=True)
    w1, b1, w2, b2 = (w.to(torch.float32) for w in weights)
    hidden, heads = w1.shape[0], w2.shape[0]
    if w1.shape != (hidden, 1) or b1.shape != (hidden,) or w2.shape != (heads, hidden):
        raise ValueError(
            f"weights must have shapes [hidden, 1], [hidden], [H, hidden], [H], got "
            f"{[tuple(w.shape) for w in weights]}"
        )
    if b2.shape != (heads,) or hidden == 0 or heads == 0:
        raise ValueError(f"weights.b2 must have shape [{heads}] (H >= 1), got {tuple(b2.shape)}")
    r = fire_distance(q_positions, k_positions, c, threshold, causal, k_mask)
    return mlp_bias(r, (w1, b1, w2, b2))
