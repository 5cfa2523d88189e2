"""How `MultiheadAttention` attends: the checks of its encodings and positions, the biases of
its encodings added up, and the one dispatch to PyTorch's scaled dot-product attention. Every
function takes what it reads as arguments.

Memory: a bias is [1, H, Tq, Tk] when the positions are shared by the batch (the default token
indices without an active draw, or positions of batch 1) and no key mask is read; a key mask or
per-sample positions make it [B, H, Tq, Tk], as SDPA's float mask must then hold every pair.
FIRE's normaliser reads which keys each query sees, so a key mask makes its bias [B, H, Tq, Tk].
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from .._checks import check_finite, check_tensor
from ..encodings.in_attention import AttentionBias, InAttentionEncoding, QKTransform

__all__ = ["attend", "biased_attention", "check_modules", "check_positions"]


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


def check_positions(
    encodings: Sequence[InAttentionEncoding],
    positions: tuple[object, object],
    masks: tuple[torch.Tensor | None, torch.Tensor | None],
    names: tuple[str, str],
) -> None:
    """Given positions [B, T(, M)] (None: token indices) must have the M the `encodings` read
    and be finite at real tokens (`masks` where they describe them). Their phases are checked
    where they are made, once per forward (`Rotary.prepare`)."""
    dims = {enc.pos_dim for enc in encodings}
    for name, pos, pmask in zip(names, positions, masks, strict=True):
        if pos is None:  # named here: the encodings call them positions / k_positions
            continue
        check_tensor(name, pos, ndims=(2, 3))
        assert isinstance(pos, torch.Tensor)
        given = pos.shape[-1] if pos.dim() == 3 else 1
        if dims and dims != {given}:
            want = " and ".join(f"{m}" for m in sorted(dims))
            raise ValueError(
                f"{name} must have {want} coordinate(s) per token for this attention's "
                f"encodings ([B, T, M]), got shape {tuple(pos.shape)}"
            )
        same = pmask is not None and tuple(pos.shape[:2]) == tuple(pmask.shape)
        check_finite(name, pos, pmask if same else None)


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
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    biases: Sequence[tuple[AttentionBias, Any]],
    allowed: torch.Tensor | None,
    p_drop: float,
) -> torch.Tensor:
    """Attention of q [B, H, Tq, d] over k, v [B, H, Tk, d] with the biases added ->
    [B, H, Tq, dv]. biases: (encoding, its prepared state) pairs; allowed: [B or 1, 1, Tq or 1,
    Tk] bool (None = all); rows with no visible key give 0."""
    bias = None
    for enc, state in biases:
        term = enc.bias(state, q, allowed)
        bias = term if bias is None else bias + term
    if any(enc.adds_values for enc, _ in biases):
        out, probs = _explicit_attention(q, k, v, bias, allowed, p_drop)
        for enc, state in biases:
            if enc.adds_values:
                out = out + enc.value_term(probs, state, q.dtype).to(out.dtype)
        return out
    if bias is not None:
        return biased_attention(q, k, v, bias, allowed, p_drop)
    if allowed is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p_drop)
    dead = ~allowed.any(dim=-1, keepdim=True)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed | dead, dropout_p=p_drop)
    return out.masked_fill(dead, 0.0)
