"""Multi-head attention hosting the in-attention encodings: *relpos*, `Rotary`, `ALiBi`, `FIRE`.

Absolute encodings are added to the input of the stack (see `cape.models.transformer`); the
relative families act on the heads: rotary rotates queries and keys before the dot products,
relpos replaces the attention itself (learned per-distance terms on the logits), the bias
encodings ALiBi and FIRE add a per-head bias to the logits (`cape.models.attention_bias`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import (
    check_bool,
    check_content,
    check_finite,
    check_int,
    check_mask,
    check_phases,
    check_rate,
    check_tensor,
    max_abs,
)
from ..encodings.alibi import ALiBi
from ..encodings.fire import FIRE
from ..encodings.relative import RelPos
from ..encodings.rotary import Rotary
from ..functional.relative import allowed_keys
from ..positions import token_positions
from .attention_bias import bias_for_call, biased_attention, cached_bias, check_position_bias
from .decode_cache import AttentionCache

__all__ = ["MultiheadAttention", "attention_mask"]


def attention_mask(
    key_mask: torch.Tensor | None, causal: bool, tq: int, tk: int, device: torch.device
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Boolean SDPA mask (True = may attend) and the rows with no visible key.

    key_mask: [B, Tk] bool, True at real keys. causal: key j visible from query i iff j <= i
    (top-left aligned, as SDPA's is_causal). Returns (mask [B or 1, 1, Tq or 1, Tk], dead
    [B or 1, 1, Tq or 1, 1]); dead rows are opened in the mask (a finite softmax, also in the
    backward) and must be zeroed in the output. (None, None) when nothing is masked.
    """
    check_int("tq", tq, minimum=0)
    check_int("tk", tk, minimum=0)
    check_bool("causal", causal)
    if key_mask is not None:
        check_tensor("key_mask", key_mask, ndims=(2,))
        check_mask("key_mask", key_mask, (key_mask.shape[0], tk))
    mask = allowed_keys(key_mask, causal, tq, tk, device)
    if mask is None:
        return None, None
    dead = ~mask.any(dim=-1, keepdim=True)
    return mask | dead, dead


def _ones(batch: int, length: int, device: torch.device) -> torch.Tensor:
    return torch.ones(batch, length, dtype=torch.bool, device=device)


class MultiheadAttention(nn.Module):
    """Multi-head (self- or cross-) attention with optional relpos and/or rotary positions.

    dim: D, model width (divisible by `heads`); head_dim d = D / heads. dropout: on the
    attention probabilities (train mode only). bias: in the four projections.
    relative: a `RelPos(d, ...)` that computes the attention (learned relative terms).
    rotary: a `Rotary(d, ...)` that rotates q and k first. Both may be given (rotary, then relpos).
    position_bias: a bias encoding, `ALiBi(heads)` or `FIRE(heads)`, whose bias is added to
    the logits.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        *,
        dropout: float = 0.0,
        bias: bool = True,
        relative: RelPos | None = None,
        rotary: Rotary | None = None,
        position_bias: ALiBi | FIRE | None = None,
    ) -> None:
        super().__init__()
        check_int("dim", dim)
        check_int("heads", heads)
        if dim % heads:
            raise ValueError(f"dim must be divisible by heads ({heads}), got dim={dim}")
        self.dim, self.heads, self.head_dim = dim, heads, dim // heads
        self.dropout = check_rate("dropout", dropout)
        for name, mod, cls in (("relative", relative, RelPos), ("rotary", rotary, Rotary)):
            if mod is None:
                continue
            if not isinstance(mod, cls):
                raise TypeError(
                    f"{name} must be a cape.{cls.__name__} or None, got {type(mod).__name__}"
                )
            if mod.head_dim != self.head_dim:
                raise ValueError(
                    f"{name}.head_dim must equal dim / heads = {self.head_dim}, got {mod.head_dim}"
                )
        check_position_bias(position_bias, heads)
        self.relative = relative
        self.rotary = rotary
        self.position_bias = position_bias
        self.q_proj = nn.Linear(dim, dim, bias=bias)
        self.k_proj = nn.Linear(dim, dim, bias=bias)
        self.v_proj = nn.Linear(dim, dim, bias=bias)
        self.out_proj = nn.Linear(dim, dim, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # as torch.nn.MultiheadAttention: Xavier on the projections, zero biases
        for lin in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(lin.weight)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, D] -> [B, H, T, d]."""
        b, t, _ = x.shape
        return x.view(b, t, self.heads, self.head_dim).transpose(1, 2)

    def forward(
        self,
        query: torch.Tensor,
        key_value: torch.Tensor | None = None,
        *,
        key_mask: torch.Tensor | None = None,
        causal: bool = False,
        q_positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
        query_mask: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        cache: AttentionCache | None = None,
    ) -> torch.Tensor:
        """query: [B, Tq, D], key_value: [B, Tk, D] (None = self-attention) -> [B, Tq, D].

        key_mask: [B, Tk] bool, True at real keys; queries with no visible key give 0.
        causal: key j visible from query i iff j <= i. q_positions / k_positions: [B, T(, M)]
        for relpos/rotary/position_bias (None = token indices); in self-attention k_positions
        must be None (the keys are the queries). query_mask: [B, Tq], padding of the queries in
        cross-attention (their positions count as 0); in self-attention key_mask is used.
        generator: for rotary's and position_bias's augmentation draws.
        cache: incremental decoding (`AttentionCache`, see `_forward_cached`); None = off.
        """
        weight = self.q_proj.weight
        check_content("query", query, self.dim, weight.dtype)
        if key_value is not None:
            check_content("key_value", key_value, self.dim, weight.dtype)
        check_bool("causal", causal)
        if cache is not None:
            return self._forward_cached(
                query, key_value, cache, key_mask, causal, q_positions, generator
            )
        self_attn = key_value is None
        kv = query if self_attn else key_value
        assert kv is not None
        if kv.dim() != 3 or kv.shape[0] != query.shape[0] or kv.shape[-1] != self.dim:
            raise ValueError(
                f"key_value must have shape [{query.shape[0]}, Tk, {self.dim}], "
                f"got {tuple(kv.shape)}"
            )
        b, tq, tk = query.shape[0], query.shape[1], kv.shape[1]
        if key_mask is not None:
            check_mask("key_mask", key_mask, (b, tk))  # True at real keys
        if self_attn and (k_positions is not None or query_mask is not None):
            raise ValueError("k_positions and query_mask are for cross-attention (key_value given)")
        if query_mask is not None:
            check_mask("query_mask", query_mask, (b, tq))
        q_mask = key_mask if self_attn else query_mask
        for name, pos, pmask in (
            ("q_positions", q_positions, q_mask),
            ("k_positions", k_positions, key_mask),
        ):
            if pos is not None:  # named here: the encodings call them positions / k_positions
                check_tensor(name, pos, ndims=(2, 3))
                same = pmask is not None and tuple(pos.shape[:2]) == tuple(pmask.shape)
                check_finite(name, pos, pmask if same else None)
                if self.rotary is not None:  # angles |p| x frequency x the largest scaling
                    check_phases(name, pos, lambda: self._rotary_reach())
        q = self._split(self.q_proj(query))
        k = self._split(self.k_proj(kv))
        v = self._split(self.v_proj(kv))
        p_drop = self.dropout if self.training else 0.0

        if self.rotary is not None:
            if self_attn:  # one augmentation draw rotates both q and k
                q, k = self.rotary(q, k, positions=q_positions, mask=key_mask, generator=generator)
            else:  # cross-attention: Rotary needs both sides; default to token indices
                if q_positions is None:
                    q_positions = token_positions(b, tq, mask=query_mask, device=query.device)
                if k_positions is None:
                    k_positions = token_positions(b, tk, mask=key_mask, device=kv.device)
                q, k = self.rotary(
                    q,
                    k,
                    positions=q_positions,
                    k_positions=k_positions,
                    mask=query_mask,
                    k_mask=key_mask,
                    generator=generator,
                )

        bias = None
        if self.position_bias is not None:
            masks, pos = (key_mask, query_mask), (q_positions, k_positions)
            bias = bias_for_call(self.position_bias, q, k, self_attn, causal, pos, masks, generator)
        if self.relative is not None:
            out = self.relative(
                q,
                k,
                v,
                q_positions=q_positions,
                k_positions=k_positions,
                key_padding_mask=key_mask,
                attn_mask=bias,
                is_causal=causal,
                dropout_p=p_drop,
            )
        elif bias is not None:
            out = biased_attention(
                q, k, v, bias, attention_mask(key_mask, causal, tq, tk, q.device)[0], p_drop
            )
        elif key_mask is None:
            # nothing can leave a row without keys: let SDPA pick its fused kernels
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p_drop, is_causal=causal)
        else:
            mask, dead = attention_mask(key_mask, causal, tq, tk, query.device)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p_drop)
            assert dead is not None
            out = out.masked_fill(dead, 0.0)
        out = out.transpose(1, 2).reshape(b, tq, self.dim)
        return self.out_proj(out)

    def _rotary_reach(self) -> torch.Tensor:
        """The rotary's largest |frequency| per axis, times its augmentation's largest scaling."""
        assert self.rotary is not None
        aug = self.rotary.augmentation
        return max_abs(self.rotary.frequencies.t()) * (
            1.0 if aug is None else aug.max_global_scaling
        )

    def memory_cache(
        self, memory: torch.Tensor, memory_mask: torch.Tensor | None = None
    ) -> AttentionCache:
        """Cross-attention keys/values of memory [B, S, D] (mask [B, S] bool), projected once."""
        if memory.dim() != 3 or memory.shape[-1] != self.dim:
            raise ValueError(
                f"memory must have shape [B, S, {self.dim}], got {tuple(memory.shape)}"
            )
        b, s = memory.shape[:2]
        if memory_mask is not None and (
            memory_mask.dtype != torch.bool or tuple(memory_mask.shape) != (b, s)
        ):
            raise ValueError(
                f"memory_mask must be bool [{b}, {s}], got {memory_mask.dtype} "
                f"{tuple(memory_mask.shape)}"
            )
        k, v = self._split(self.k_proj(memory)), self._split(self.v_proj(memory))
        return AttentionCache(static=True, k=k, v=v, mask=memory_mask)

    def _forward_cached(
        self,
        query: torch.Tensor,
        key_value: torch.Tensor | None,
        cache: AttentionCache,
        key_mask: torch.Tensor | None,
        causal: bool,
        q_positions: torch.Tensor | None,
        generator: torch.Generator | None,
    ) -> torch.Tensor:
        """Incremental attention. `cache.static` (cross-attention): keys/values come from the
        cache, filled from key_value on first use (or by `memory_cache`); key_mask is taken
        from the cache then. Otherwise (self-attention, key_value None): query holds the Tq
        new tokens, whose keys/values (and positions, mask) are appended to the cache and who
        attend to every cached key (causal: new token i sees cached ones and new j <= i).
        q_positions: [B, Tq(, 1)] of the new tokens (None = indices from the cache length).
        Same results as the full computation; rotary must not augment (eval, no normalize), nor
        position_bias (eval: its bias only reads the cached positions).
        """
        b, tq = query.shape[:2]
        q = self._split(self.q_proj(query))
        p_drop = self.dropout if self.training else 0.0
        if cache.static:
            if (
                self.rotary is not None
                or self.relative is not None
                or self.position_bias is not None
            ):
                raise ValueError(
                    "a cached cross-attention must be content-only (no rotary/relpos/position_bias)"
                )
            if cache.k is None:
                if key_value is None:
                    raise ValueError("an empty cross-attention cache needs key_value (the memory)")
                filled = self.memory_cache(key_value, key_mask)
                cache.k, cache.v, cache.mask = filled.k, filled.v, filled.mask
            assert cache.k is not None and cache.v is not None
            if cache.k.shape[0] != b:
                raise ValueError(f"cached keys have {cache.k.shape[0]} rows, the query {b}")
            allowed = None if cache.mask is None else cache.mask[:, None, None, :]
            return self._finish(q, cache.k, cache.v, allowed, None, None, p_drop)
        if key_value is not None:
            raise ValueError(
                "a self-attention cache takes key_value=None (the keys are the queries)"
            )
        if key_mask is not None and (
            key_mask.dtype != torch.bool or tuple(key_mask.shape) != (b, tq)
        ):
            raise ValueError(
                f"key_mask must be bool [{b}, {tq}] (the new tokens), got "
                f"{key_mask.dtype} {tuple(key_mask.shape)}"
            )
        if cache.k is not None and cache.k.shape[0] != b:
            raise ValueError(f"cached keys have {cache.k.shape[0]} rows, the query {b}")
        past = cache.length
        k = self._split(self.k_proj(query))
        v = self._split(self.v_proj(query))
        positions = None
        if self.position_bias is not None:
            check_position_bias(self.position_bias, self.heads, causal, cached=True)
        if self.rotary is not None or self.relative is not None or self.position_bias is not None:
            if q_positions is None:
                q_positions = token_positions(b, tq, mask=key_mask, device=query.device) + past
            positions = q_positions if q_positions.dim() == 3 else q_positions[..., None]
            positions = positions.to(torch.float32)
            if key_mask is not None:
                positions = torch.where(key_mask[..., None], positions, 0.0)
        if self.rotary is not None:
            if not self.rotary.cacheable:
                raise ValueError(f"a self-attention cache needs {self.rotary.cacheable_rule}")
            q, k = self.rotary(q, k, positions=positions, mask=key_mask, generator=generator)
        mask = cache.mask
        if key_mask is not None or mask is not None:
            new = key_mask if key_mask is not None else _ones(b, tq, query.device)
            old = mask if mask is not None else _ones(b, past, query.device)
            mask = torch.cat([old, new], dim=1)

        def grow(old: torch.Tensor | None, new: torch.Tensor, dim: int) -> torch.Tensor:
            return new if old is None else torch.cat([old, new], dim=dim)

        cache.k, cache.v, cache.mask = grow(cache.k, k, 2), grow(cache.v, v, 2), mask
        if positions is not None:
            cache.positions = grow(cache.positions, positions, 1)
        tk = past + tq
        allowed = None if mask is None else mask[:, None, None, :]
        if causal and tq > 1:
            tri = torch.ones(tq, tk, dtype=torch.bool, device=query.device).tril(diagonal=past)
            allowed = tri[None, None] if allowed is None else allowed & tri
        return self._finish(q, cache.k, cache.v, allowed, positions, cache.positions, p_drop)

    def _finish(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        allowed: torch.Tensor | None,
        q_positions: torch.Tensor | None,
        k_positions: torch.Tensor | None,
        p_drop: float,
    ) -> torch.Tensor:
        """Attention of q over k/v given a bool mask (True = may attend; None = all), then the
        output projection. Rows with no visible key give 0 (before the projection)."""
        b, _, tq, _ = q.shape
        bias = None
        if self.position_bias is not None:  # positions [B, T, 1] float32 (of the cache when cached)
            bias = cached_bias(self.position_bias, q_positions, k_positions, allowed)
        if self.relative is not None:
            if bias is not None and allowed is not None:  # -inf: relpos finds the dead rows
                bias = bias.masked_fill(~allowed, float("-inf"))
            out = self.relative(
                q,
                k,
                v,
                q_positions=q_positions,
                k_positions=k_positions,
                attn_mask=allowed if bias is None else bias,
                dropout_p=p_drop,
            )
        elif bias is not None:
            out = biased_attention(q, k, v, bias, allowed, p_drop)
        elif allowed is None:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p_drop)
        else:
            dead = ~allowed.any(dim=-1, keepdim=True)
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=allowed | dead, dropout_p=p_drop
            )
            out = out.masked_fill(dead, 0.0)
        return self.out_proj(out.transpose(1, 2).reshape(b, tq, self.dim))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, heads={self.heads}, dropout={self.dropout}"
