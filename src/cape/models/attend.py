"""How `MultiheadAttention` attends: its checks at the boundary, the biases of its encodings
added up, and the one dispatch to PyTorch's scaled dot-product attention.

Memory: a bias is [1, H, Tq, Tk] when the positions are shared by the batch (the default token
indices without an active draw, or positions of batch 1) and no key mask is read; a key mask or
per-sample positions make it [B, H, Tq, Tk], as SDPA's float mask must then hold every pair.
FIRE's normaliser reads which keys each query sees, so a key mask makes its bias [B, H, Tq, Tk].
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from .._checks import (
    check_bool,
    check_content,
    check_finite,
    check_mask,
    check_phases,
    check_tensor,
    max_abs,
)
from ..encodings.in_attention import AttentionBias, BiasCall, QKTransform
from ..positions import token_positions

if TYPE_CHECKING:
    from .attention import MultiheadAttention
    from .decode_cache import AttentionCache

__all__ = ["attend", "biased_attention", "check_call", "check_modules"]


def check_modules(
    rotary: object, biases: Sequence[object], heads: int, head_dim: int
) -> list[AttentionBias]:
    """The q/k slot holds a `QKTransform` of `head_dim` (or None); every bias is an
    `AttentionBias` for `heads` heads (and `head_dim` where it has one); at most one adds
    values. -> the biases as a list."""
    if rotary is not None:
        if not isinstance(rotary, QKTransform):
            raise TypeError(
                f"rotary must be a q/k transform (cape.Rotary, cape.RoPE2d) or None, got "
                f"{type(rotary).__name__}"
            )
        if rotary.head_dim != head_dim:
            raise ValueError(
                f"rotary.head_dim must equal dim / heads = {head_dim}, got {rotary.head_dim}"
            )
    if isinstance(biases, AttentionBias) or not isinstance(biases, (list, tuple)):
        raise TypeError(f"biases must be a list of attention biases, got {type(biases).__name__}")
    for i, bias in enumerate(biases):
        if not isinstance(bias, AttentionBias):
            raise TypeError(
                f"biases[{i}] must be an attention bias (cape.ALiBi, cape.FIRE, cape.RelPos), "
                f"got {type(bias).__name__}"
            )
        if bias.heads is not None and bias.heads != heads:
            raise ValueError(f"biases[{i}].heads must equal heads ({heads}), got {bias.heads}")
        if getattr(bias, "head_dim", head_dim) != head_dim:
            raise ValueError(
                f"biases[{i}].head_dim must equal dim / heads = {head_dim}, got {bias.head_dim}"
            )
    if sum(bias.adds_values for bias in biases) > 1:
        raise ValueError("at most one bias may add values (RelPos(values=True))")
    return list(biases)


def _check_positions(
    attn: MultiheadAttention, positions: tuple, masks: tuple, names: tuple[str, str]
) -> None:
    dims = {enc.pos_dim for enc in (attn.rotary, *attn.biases) if enc is not None}
    for name, pos, pmask in zip(names, positions, masks, strict=True):
        if pos is None:  # named here: the encodings call them positions / k_positions
            continue
        check_tensor(name, pos, ndims=(2, 3))
        given = pos.shape[-1] if pos.dim() == 3 else 1
        if dims and dims != {given}:
            want = " and ".join(f"{m}" for m in sorted(dims))
            raise ValueError(
                f"{name} must have {want} coordinate(s) per token for this attention's "
                f"encodings ([B, T, M]), got shape {tuple(pos.shape)}"
            )
        same = pmask is not None and tuple(pos.shape[:2]) == tuple(pmask.shape)
        check_finite(name, pos, pmask if same else None)
        rot = attn.rotary
        if rot is not None:  # angles |p| x frequency x the largest scaling
            aug = rot.augmentation
            scaling = 1.0 if aug is None else aug.max_global_scaling
            check_phases(name, pos, lambda r=rot, s=scaling: max_abs(r.frequencies.t()) * s)


def _check_cache(
    attn: MultiheadAttention,
    query: torch.Tensor,
    key_value: torch.Tensor | None,
    key_mask: torch.Tensor | None,
    cache: AttentionCache,
) -> None:
    b, tq = query.shape[:2]
    if cache.k is not None and cache.k.shape[0] != b:
        raise ValueError(f"cached keys have {cache.k.shape[0]} rows, the query {b}")
    if cache.static:
        if attn.positional:
            raise ValueError("a cached cross-attention must be content-only (no rotary or biases)")
        if cache.k is None and key_value is None:
            raise ValueError("an empty cross-attention cache needs key_value (the memory)")
        return
    if key_value is not None:
        raise ValueError("a self-attention cache takes key_value=None (the keys are the queries)")
    if key_mask is not None and (key_mask.dtype != torch.bool or tuple(key_mask.shape) != (b, tq)):
        raise ValueError(
            f"key_mask must be bool [{b}, {tq}] (the new tokens), got "
            f"{key_mask.dtype} {tuple(key_mask.shape)}"
        )
    if attn.rotary is not None and not attn.rotary.cacheable:
        rule = getattr(attn.rotary, "cacheable_rule", "a rotary without (active) augmentation")
        raise ValueError(f"a self-attention cache needs {rule}")
    if any(not bias.cacheable for bias in attn.biases):
        raise ValueError("a self-attention cache needs biases without (active) augmentation")


def check_call(
    attn: MultiheadAttention,
    query: object,
    key_value: object,
    key_mask: object,
    causal: object,
    positions: tuple[Any, Any],
    query_mask: object,
    cache: AttentionCache | None,
    names: tuple[str, str] = ("q_positions", "k_positions"),
) -> None:
    """The checks of one `MultiheadAttention.forward` call (its docstring: the arguments);
    names: what the caller calls the positions."""
    weight = attn.q_proj.weight
    check_content("query", query, attn.dim, weight.dtype)
    if key_value is not None:
        check_content("key_value", key_value, attn.dim, weight.dtype)
    check_bool("causal", causal)
    assert isinstance(query, torch.Tensor)
    for bias in attn.biases:
        bias.check_attention(attn.heads, attn.head_dim, causal)  # type: ignore[arg-type]
    if cache is not None:
        _check_cache(attn, query, key_value, key_mask, cache)  # type: ignore[arg-type]
        if not cache.static:
            _check_positions(attn, (positions[0], None), (key_mask, None), names)
        return
    self_attn = key_value is None
    kv = query if self_attn else key_value
    assert isinstance(kv, torch.Tensor)
    b, tq, tk = query.shape[0], query.shape[1], kv.shape[1]
    if kv.shape[0] != b:
        raise ValueError(f"key_value must have shape [{b}, Tk, {attn.dim}], got {tuple(kv.shape)}")
    if key_mask is not None:
        check_mask("key_mask", key_mask, (b, tk))  # True at real keys
    if self_attn and (positions[1] is not None or query_mask is not None):
        raise ValueError("k_positions and query_mask are for cross-attention (key_value given)")
    if query_mask is not None:
        check_mask("query_mask", query_mask, (b, tq))
    q_mask = key_mask if self_attn else query_mask
    _check_positions(attn, positions, (q_mask, key_mask), names)
    check_dtype = getattr(attn.rotary, "check_dtype", None)  # xPos in float16
    if check_dtype is not None and self_attn:
        pos = positions[0]
        pos = token_positions(b, tq, mask=key_mask, device=query.device) if pos is None else pos
        check_dtype(query.dtype, pos, key_mask if tuple(pos.shape[:2]) == (b, tq) else None)


def biased_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor,
    allowed: torch.Tensor | None,
    p_drop: float,
) -> torch.Tensor:
    """SDPA with an additive float bias [B or 1, H, Tq, Tk] and a bool mask (True = may attend,
    None = all) -> [B, H, Tq, dv]. Rows with no visible key give 0. The bias is float32 until
    this call; SDPA wants a float mask in q's dtype (bf16 under autocast: far pairs, whose
    weights are negligible anyway, lose digits; near ones keep bf16's 3 digits).
    """
    dead = None
    if allowed is not None:
        dead = ~allowed.any(dim=-1, keepdim=True)
        bias = bias.masked_fill(~(allowed | dead), float("-inf"))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), dropout_p=p_drop)
    return out if dead is None else out.masked_fill(dead, 0.0)


def _explicit_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    allowed: torch.Tensor | None,
    p_drop: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention with the probabilities made explicit (for a bias that adds values): float32
    softmax -> (output [B, H, Tq, dv], probabilities [B, H, Tq, Tk])."""
    logits = torch.matmul(q, k.transpose(-2, -1)).float() / math.sqrt(q.shape[-1])
    if bias is not None:
        logits = logits + bias.float()
    dead = None
    if allowed is not None:
        dead = ~allowed.any(dim=-1, keepdim=True)
        logits = logits.masked_fill(~(allowed | dead), float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if dead is not None:
        probs = probs.masked_fill(dead, 0.0)
    probs = F.dropout(probs, p_drop, training=p_drop > 0.0)
    return torch.matmul(probs.to(v.dtype), v), probs


def attend(
    attn: MultiheadAttention,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor | None,
    positions: tuple[torch.Tensor | None, torch.Tensor | None],
    ctx: dict[str, Any],
    generator: torch.Generator | None,
    p_drop: float,
) -> torch.Tensor:
    """Attention of q [B, H, Tq, d] over k, v [B, H, Tk, d] with the biases of `attn` added ->
    [B, H, Tq, dv]. allowed: [B or 1, 1, Tq or 1, Tk] bool (None = all); rows with no visible
    key give 0. positions: (q, k) of the biases; ctx: `self_attention`, `mask`, `k_mask`."""
    call = BiasCall(q, k, *positions, allowed=allowed, generator=generator, **ctx)
    bias = None
    for enc in attn.biases:
        term = enc.attention_bias(call)
        bias = term if bias is None else bias + term
    if any(enc.adds_values for enc in attn.biases):
        out, probs = _explicit_attention(q, k, v, bias, allowed, p_drop)
        for enc in attn.biases:
            if enc.adds_values:
                out = out + enc.value_term(probs, call).to(out.dtype)
        return out
    if bias is not None:
        return biased_attention(q, k, v, bias, allowed, p_drop)
    if allowed is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p_drop)
    dead = ~allowed.any(dim=-1, keepdim=True)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed | dead, dropout_p=p_drop)
    return out.masked_fill(dead, 0.0)
