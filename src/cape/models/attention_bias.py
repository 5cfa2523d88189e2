"""The bias encodings (`ALiBi`, `FIRE`) inside `MultiheadAttention`: their bias for one call,
and SDPA with an additive bias. Both take the attention's one bias slot, `position_bias=`.

Memory: the bias is [1, H, Tq, Tk] when the positions are shared by the batch (the default
token indices without active augmentation, or positions of batch 1) and no key mask is given;
a key mask or per-sample positions make it [B, H, Tq, Tk], as SDPA's float mask must then hold
every pair. FIRE's normaliser reads the attention's mask (only the keys a query sees count), so
a key mask always makes its bias [B, H, Tq, Tk], and a bidirectional FIRE in causal attention
never reads the positions of keys ahead.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..encodings.alibi import ALiBi
from ..encodings.fire import FIRE
from ..functional.relative import allowed_keys
from ..positions import token_positions

__all__ = [
    "bias_for_call",
    "biased_attention",
    "cached_bias",
    "check_position_bias",
    "BIAS_ENCODINGS",
]

BIAS_ENCODINGS = (ALiBi, FIRE)  # the encodings that MultiheadAttention(position_bias=...) takes


def check_position_bias(
    position_bias: object, heads: int, causal: bool | None = None, *, cached: bool = False
) -> None:
    """`position_bias` is None or a bias encoding (`ALiBi`, `FIRE`) of `heads` heads; causal:
    the attention's (None = unknown yet), refused with `position_bias.causal` off; cached: a
    decoding cache (no active augmentation)."""
    if position_bias is None:
        return
    if not isinstance(position_bias, BIAS_ENCODINGS):
        got = type(position_bias).__name__
        raise TypeError(f"position_bias must be a cape.ALiBi, cape.FIRE or None, got {got}")
    if position_bias.heads != heads:
        raise ValueError(
            f"position_bias.heads must equal heads ({heads}), got {position_bias.heads}"
        )
    if causal is False and position_bias.causal:
        raise ValueError(
            "position_bias.causal=True leaves keys ahead of a query unpenalised: use it with "
            f"causal attention (causal=True), or {type(position_bias).__name__}(causal=False)"
        )
    aug = position_bias.augmentation
    if cached and aug is not None and position_bias.training and aug.random:
        raise ValueError("a self-attention cache needs position_bias without (active) augmentation")


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


def cached_bias(
    enc: ALiBi | FIRE,
    q_positions: torch.Tensor | None,
    k_positions: torch.Tensor | None,
    allowed: torch.Tensor | None,
) -> torch.Tensor:
    """The bias of a cached (decoding) call: positions [B, T, 1] float32 of the new tokens and
    of the cache; allowed [B or 1, 1, Tq or 1, Tk] bool (None = all), FIRE's visible keys."""
    if isinstance(enc, FIRE):
        return enc(q_positions, k_positions, attn_mask=allowed)
    return enc(q_positions, k_positions)


def bias_for_call(
    position_bias: ALiBi | FIRE,
    q: torch.Tensor,
    k: torch.Tensor,
    self_attn: bool,
    causal: bool,
    positions: tuple[torch.Tensor | None, torch.Tensor | None],
    masks: tuple[torch.Tensor | None, torch.Tensor | None],
    generator: torch.Generator | None,
) -> torch.Tensor:
    """The bias (ALiBi's or FIRE's) of one attention call of q [B, H, Tq, d] over k [B, H, Tk, d]:
    [1, H, Tq, Tk] when the positions are shared by the batch (None without active
    augmentation: token indices 0..T-1) and FIRE sees no key mask, else [B, H, Tq, Tk].
    positions: (q_positions, k_positions); masks: (key_mask, query_mask)."""
    check_position_bias(position_bias, position_bias.heads, causal)
    (b, _, tq, _), tk, device = q.shape, k.shape[2], q.device
    (q_positions, k_positions), (key_mask, query_mask) = positions, masks
    aug = position_bias.augmentation
    drawn = aug is not None and position_bias.training and aug.random
    q_mask = key_mask if self_attn else query_mask

    def default(t: int, mask: torch.Tensor | None) -> torch.Tensor:
        if drawn:  # per-sample draws: one row of positions per sample
            return token_positions(b, t, mask=mask, device=device)
        return torch.arange(t, device=device, dtype=torch.float32)[None]

    def fits(pos: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor | None:
        return mask if mask is not None and tuple(pos.shape[:2]) == tuple(mask.shape) else None

    qp = default(tq, q_mask) if q_positions is None else q_positions
    for name, pos, t in (("q_positions", qp, tq), ("k_positions", k_positions, tk)):
        if pos is not None and (pos.shape[0] not in (1, b) or pos.shape[1] != t):
            raise ValueError(
                f"{name} must have shape [{b} or 1, {t}(, 1)] for position_bias, "
                f"got {tuple(pos.shape)}"
            )
    extra = {}
    if isinstance(position_bias, FIRE):  # its normaliser counts the keys each query sees
        extra["attn_mask"] = allowed_keys(key_mask, causal, tq, tk, device)
    if self_attn:
        return position_bias(qp, mask=fits(qp, q_mask), generator=generator, **extra)
    kp = default(tk, key_mask) if k_positions is None else k_positions
    km = fits(kp, key_mask)
    return position_bias(qp, kp, mask=fits(qp, q_mask), k_mask=km, generator=generator, **extra)
