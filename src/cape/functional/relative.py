"""Learned relative position representations (Shaw et al. 2018, CAPE's *relpos*) as pure functions.

Every query/key pair (i, j) gets a bucket `index_ij = clamp(round((p_j - p_i) / step), -K, K) + K`
in [0, 2K], and the attention becomes

    logits_ij = (q_i . k_j + q_i . rel_key[index_ij]) / sqrt(d)
    out_i     = sum_j p_ij (v_j + rel_value[index_ij])

Memory: the naive form builds a `[B, H, Tq, Tk, d]` table of `rel_key[index]`. Here the key term is
`q @ rel_key.T` (`[B, H, Tq, 2K+1]`) gathered by the index, and the value term buckets the
probabilities per relative distance (`[B, H, Tq, 2K+1]`) before one matmul with `rel_value`:
O(Tq Tk + (2K+1) d) per head, the same order as plain attention's logits.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .._checks import (
    _may_inspect_values,
    check_bool,
    check_finite,
    check_float,
    check_rate,
    check_tensor,
)

__all__ = ["num_buckets", "relative_index", "relpos_attention", "allowed_keys", "MAX_STEPS"]

# The largest K = round(max_distance / step): a table of 2K+1 = 131,073 rows per layer, and
# every query projected on all of them ([B, H, Tq, 2K+1]); farther offsets share edge buckets.
MAX_STEPS = 65536


def num_buckets(max_distance: float, step: float = 1.0) -> int:
    """K = round(max_distance / step), the clipping distance in steps, 1 <= K <= `MAX_STEPS`
    (65,536); 2K+1 buckets."""
    max_distance = check_float("max_distance", max_distance, strict=True)
    step = check_float("step", step, strict=True)
    ratio = max_distance / step
    if not ratio <= MAX_STEPS + 0.5:  # also inf, when step underflows the division
        raise ValueError(
            f"max_distance / step must round to at most {MAX_STEPS} steps (2K+1 = "
            f"{2 * MAX_STEPS + 1} buckets), got max_distance={max_distance}, step={step}: "
            f"{ratio:.3g} steps, {2 * ratio + 1:.3g} buckets"
        )
    k = round(ratio)
    if k < 1:
        raise ValueError(
            f"max_distance / step must round to >= 1, got max_distance={max_distance}, step={step}"
        )
    return k


def _flat_positions(name: str, p: torch.Tensor) -> torch.Tensor:
    """[B, T] or [B, T, 1] -> float32 [B, T]."""
    check_tensor(name, p, ndims=(2, 3))
    if p.dim() == 3:
        if p.shape[-1] != 1:
            raise ValueError(f"{name} must have shape [B, T] or [B, T, 1], got {tuple(p.shape)}")
        p = p[..., 0]
    if p.dtype.is_complex or p.dtype == torch.bool:
        raise TypeError(f"{name} must be a real tensor, got {p.dtype}")
    p = p.to(torch.float32)
    check_finite(name, p)
    return p


def relative_index(
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    max_distance: float,
    step: float = 1.0,
) -> torch.Tensor:
    """Bucket of every query/key pair -> LongTensor [B, Tq, Tk] with values in [0, 2K].

    q_positions: [B, Tq] (or [B, Tq, 1]); k_positions: [B, Tk] (or [B, Tk, 1]); batch sizes
    broadcast (use B = 1 to share one index across the batch). Positions are token indices
    (step 1) or times in seconds (step = frame hop, max_distance in seconds).
    index_ij = clamp(round((k_j - q_i) / step), -K, K) + K with K = round(max_distance / step):
    pairs farther apart than K steps share the edge buckets 0 and 2K.
    """
    k_max = num_buckets(max_distance, step)
    q = _flat_positions("q_positions", q_positions)
    k = _flat_positions("k_positions", k_positions)
    if q.shape[0] != k.shape[0] and 1 not in (q.shape[0], k.shape[0]):
        raise ValueError(
            f"q_positions and k_positions batch sizes must match or be 1, got "
            f"{tuple(q_positions.shape)} and {tuple(k_positions.shape)}"
        )
    return bucket_index(q, k, k_max, step)


def bucket_index(q: torch.Tensor, k: torch.Tensor, k_max: int, step: float) -> torch.Tensor:
    """`relative_index`'s kernel: checked float32 positions q [B, Tq], k [B, Tk] -> [B, Tq, Tk]
    buckets in [0, 2K]; no checks."""
    # float32 differences; clamp before round so huge offsets cannot overflow the int cast
    rel = (k[:, None, :] - q[:, :, None]) / step
    rel = rel.clamp(-k_max - 1.0, k_max + 1.0).round().clamp(-k_max, k_max)
    return rel.to(torch.long) + k_max


def allowed_keys(
    key_mask: torch.Tensor | None,
    causal: bool,
    tq: int,
    tk: int,
    device: torch.device,
    past: int = 0,
) -> torch.Tensor | None:
    """Which keys each query may see: bool [B or 1, 1, Tq or 1, Tk], None when all may.

    key_mask: [B, Tk] bool, True at real keys. causal: key j visible from query i iff
    j <= i + past (top-left aligned, as scaled_dot_product_attention's is_causal, when past is
    0; past: keys cached before the queries, which every query sees).
    """
    mask = None if key_mask is None else key_mask[:, None, None, :]
    if causal:
        tril = torch.ones(tq, tk, dtype=torch.bool, device=device).tril(diagonal=past)
        mask = tril[None, None] if mask is None else mask & tril
    return mask


def _mask_logits(
    logits: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Add masks to fresh logits [B, H, Tq, Tk] as -inf; rows with no allowed key are set to 0
    (finite softmax) and returned as `dead` [B, H, Tq, 1] so the caller zeroes their output."""
    tq, tk = logits.shape[-2:]
    neg = float("-inf")
    masked = False
    if attn_mask is not None:
        masked = True
        if attn_mask.dtype == torch.bool:
            logits = logits.masked_fill(~attn_mask, neg)
        else:
            logits = logits + attn_mask.to(logits.dtype)
    allowed = allowed_keys(key_padding_mask, is_causal, tq, tk, logits.device)
    if allowed is not None:
        masked = True
        logits = logits.masked_fill(~allowed, neg)
    if not masked:
        return logits, None
    dead = torch.isneginf(logits).all(dim=-1, keepdim=True)
    # all -inf rows would give NaN (also in the backward): attend anywhere, zero the output later
    return logits.masked_fill(dead, 0.0), dead


def _check_attention_args(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rel_key: torch.Tensor,
    index: torch.Tensor,
    rel_value: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
) -> torch.Tensor:
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, ndims=(4,), floating=True)
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    b, _, tq, d = q.shape
    tk = k.shape[2]
    if k.shape[:2] != q.shape[:2] or k.shape[-1] != d or v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"q, k, v must be [B, H, Tq, d], [B, H, Tk, d], [B, H, Tk, dv], got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    check_tensor("rel_key", rel_key, ndims=(2,), floating=True)
    if rel_key.shape[-1] != d:
        raise ValueError(f"rel_key must have shape [2K+1, {d}], got {tuple(rel_key.shape)}")
    if rel_value is not None:
        check_tensor("rel_value", rel_value, ndims=(2,), floating=True)
        if tuple(rel_value.shape) != (rel_key.shape[0], v.shape[-1]):
            raise ValueError(
                f"rel_value must have shape [{rel_key.shape[0]}, {v.shape[-1]}], "
                f"got {tuple(rel_value.shape)}"
            )
    index = _check_index(index, b, tq, tk, rel_key.shape[0])
    if key_padding_mask is not None:
        check_tensor("key_padding_mask", key_padding_mask, ndims=(2,))
        if key_padding_mask.dtype != torch.bool or tuple(key_padding_mask.shape) != (b, tk):
            raise ValueError(
                f"key_padding_mask must be bool [{b}, {tk}] (True at real keys), got "
                f"{key_padding_mask.dtype} {tuple(key_padding_mask.shape)}"
            )
    return index


def _check_index(index: torch.Tensor, b: int, tq: int, tk: int, buckets: int) -> torch.Tensor:
    """index: long [B or 1, Tq, Tk] (or [Tq, Tk]) in [0, buckets) -> [B or 1, Tq, Tk]."""
    check_tensor("index", index, ndims=(2, 3))
    if index.dtype != torch.long:
        raise TypeError(
            f"index must be a torch.long tensor (see relative_index), got {index.dtype}"
        )
    if index.dim() == 2:
        index = index[None]
    if index.shape[0] not in (1, b) or tuple(index.shape[1:]) != (tq, tk):
        raise ValueError(f"index must have shape [{b} or 1, {tq}, {tk}], got {tuple(index.shape)}")
    if (
        _may_inspect_values(index)
        and index.numel()
        and not 0 <= index.min() <= index.max() < buckets
    ):
        raise ValueError(f"index must lie in [0, {buckets - 1}] (rows of rel_key)")
    return index


def _check_attn_mask(attn_mask: object, shape: tuple[int, ...]) -> None:
    """bool or floating, broadcastable to `shape` = [B, H, Tq, Tk]."""
    check_tensor("attn_mask", attn_mask, ndims=range(5))
    assert isinstance(attn_mask, torch.Tensor)
    if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
        raise TypeError(f"attn_mask must be bool or floating point, got {attn_mask.dtype}")
    tail = shape[len(shape) - attn_mask.dim() :]
    if any(n not in (1, want) for n, want in zip(attn_mask.shape, tail, strict=True)):
        raise ValueError(
            f"attn_mask must broadcast to [B, H, Tq, Tk] = {list(shape)}, "
            f"got {list(attn_mask.shape)}"
        )


def relative_logits(
    q: torch.Tensor, rel_key: torch.Tensor, index: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """Shaw's key term: q [B, H, Tq, d], rel_key [2K+1, d], index [B or 1, Tq, Tk] ->
    scale * q_i . rel_key[index_ij], [B, H, Tq, Tk] in q's dtype (scale: 1/sqrt(d) if None)."""
    b, h, tq, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    # stride-0 expansion over heads (and batch): no copy of the [Tq, Tk] index
    idx = index[:, None].expand(b, h, tq, index.shape[-1])
    # key term without a [.., Tq, Tk, d] table: project q on every bucket, then pick per pair
    qr = torch.matmul(q * scale, rel_key.to(q.dtype).transpose(0, 1))  # [B, H, Tq, 2K+1]
    return torch.gather(qr, -1, idx)


def relative_values(
    probs: torch.Tensor, rel_value: torch.Tensor, index: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Shaw's value term: probabilities [B, H, Tq, Tk], rel_value [2K+1, dv], index [B or 1,
    Tq, Tk] -> sum_j p_ij rel_value[index_ij], [B, H, Tq, dv] in `dtype`."""
    b, h, tq, tk = probs.shape
    idx = index[:, None].expand(b, h, tq, tk)
    # bucket the probabilities by relative distance: P[.., i, r] = sum_j p_ij [index_ij == r]
    per_bucket = probs.new_zeros(b, h, tq, rel_value.shape[0]).scatter_add(-1, idx, probs)
    return torch.matmul(per_bucket.to(dtype), rel_value.to(dtype))


def relpos_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rel_key: torch.Tensor,
    index: torch.Tensor,
    rel_value: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    training: bool = True,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention with learned relative position representations (Shaw et al. 2018).

    q: [B, H, Tq, d], k: [B, H, Tk, d], v: [B, H, Tk, dv]; rel_key: [2K+1, d] and
    rel_value: [2K+1, dv] (None = keys only), shared by the heads; index: [B or 1, Tq, Tk] long
    in [0, 2K] (`relative_index`). key_padding_mask: [B, Tk] bool, True at real keys.
    attn_mask: bool (True = may attend) or additive float, broadcastable to [B, H, Tq, Tk].
    is_causal: key j visible from query i iff j <= i (top-left aligned).
    scale: defaults to 1/sqrt(d). Returns [B, H, Tq, dv] in v's dtype; queries with no visible
    key give 0. Dropout acts on the probabilities (of both terms) when `training`.
    """
    index = _check_attention_args(q, k, v, rel_key, index, rel_value, key_padding_mask)
    check_rate("dropout_p", dropout_p, one=True)
    check_bool("is_causal", is_causal)
    check_bool("training", training)
    b, h, tq, d = q.shape
    if attn_mask is not None:
        _check_attn_mask(attn_mask, (b, h, tq, k.shape[2]))
    scale = 1.0 / math.sqrt(d) if scale is None else check_float("scale", scale, strict=True)
    bias = relative_logits(q, rel_key, index, scale)  # [B, H, Tq, Tk]
    p_drop = dropout_p if training else 0.0

    if rel_value is None:
        bias, dead = _mask_logits(bias, key_padding_mask, attn_mask, is_causal)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=bias.to(q.dtype), dropout_p=p_drop, scale=scale
        )
        return out if dead is None else out.masked_fill(dead, 0.0)

    # values on: the probabilities are needed explicitly; softmax in float32 for low precision
    logits = torch.matmul(q, k.transpose(-2, -1)).float() * scale + bias.float()
    logits, dead = _mask_logits(logits, key_padding_mask, attn_mask, is_causal)
    probs = torch.softmax(logits, dim=-1)
    if dead is not None:
        probs = probs.masked_fill(dead, 0.0)
    probs = F.dropout(probs, p_drop, training=p_drop > 0.0)
    out = torch.matmul(probs.to(v.dtype), v)
    return out + relative_values(probs, rel_value, index, v.dtype)
