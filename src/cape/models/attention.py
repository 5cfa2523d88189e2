"""Multi-head attention hosting the in-attention encodings through their two protocols.

Absolute encodings are added to the input of the stack (see `cape.models.transformer`); the
relative families act on the heads (`cape.encodings.in_attention`):

- one q/k slot, `rotary=`: a `QKTransform` (`Rotary`, `RoPE2d`) rotates queries and keys before
  the dot products;
- a list of biases, `biases=`: each `AttentionBias` (`ALiBi`, `FIRE`, `RelPos`) adds a bias to
  the logits; the biases add up, so rotary and ALiBi, say, combine.

Their state comes from a `PositionContext`: a stack makes one per forward and hands it to
every layer (the encodings prepare once); a direct call makes its own from its positions.
One path: a call without a cache is a call on an empty cache (`AttentionCache`) that is thrown
away afterwards; a decoder's incremental call is the same computation on the cache it keeps.
Inputs are checked once, at the public boundary: a call given a `context` comes from a stack
that has checked them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_bool, check_content, check_int, check_mask, check_rate, check_tensor
from ..encodings.in_attention import AttentionBias, PositionContext, QKTransform
from ..functional.relative import allowed_keys
from ..positions import column_positions, token_positions
from .attend import attend, check_modules, check_positions
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


class MultiheadAttention(nn.Module):
    """Multi-head (self- or cross-) attention with in-attention positions.

    dim: D, model width (divisible by `heads`); head_dim d = D / heads. dropout: on the
    attention probabilities (train mode only). bias: in the four projections.
    rotary: the q/k slot, a `QKTransform` of head_dim d (`Rotary(d, ...)`, `RoPE2d`).
    biases: `AttentionBias`es whose biases add to the logits (`ALiBi(heads)`, `FIRE(heads)`,
    `RelPos(d, ...)`; at most one with `values=True`). A module without parameters (Rotary,
    ALiBi) may serve every layer of a stack.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        *,
        dropout: float = 0.0,
        bias: bool = True,
        rotary: QKTransform | None = None,
        biases: Sequence[AttentionBias] = (),
    ) -> None:
        super().__init__()
        check_int("dim", dim)
        check_int("heads", heads)
        if dim % heads:
            raise ValueError(f"dim must be divisible by heads ({heads}), got dim={dim}")
        self.dim, self.heads, self.head_dim = dim, heads, dim // heads
        self.dropout = check_rate("dropout", dropout)
        biases = check_modules(rotary, biases, heads, self.head_dim)
        self.rotary = rotary
        self.biases = nn.ModuleList(biases)
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

    @property
    def positional(self) -> bool:
        """Whether any encoding acts in this attention."""
        return self.rotary is not None or len(self.biases) > 0

    @property
    def encodings(self) -> list:
        """The in-attention encodings: the rotary (if any), then the biases."""
        return [*([] if self.rotary is None else [self.rotary]), *self.biases]

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
        context: PositionContext | None = None,
    ) -> torch.Tensor:
        """query: [B, Tq, D], key_value: [B, Tk, D] (None = self-attention) -> [B, Tq, D].

        key_mask: [B, Tk] bool, True at real keys; queries with no visible key give 0.
        causal: key j visible from query i iff j <= i. q_positions / k_positions: [B, T(, M)]
        for the in-attention encodings (None = token indices); in self-attention k_positions
        must be None (the keys are the queries). query_mask: [B, Tq], padding of the queries in
        cross-attention (their positions count as 0); in self-attention key_mask is used.
        generator: for the encodings' augmentation draws.
        cache: incremental decoding. Self-attention (`AttentionCache()`): query holds the new
        tokens, whose keys/values (positions, mask) are appended; they attend to every cached
        key (causal: new token i sees the cached ones and new j <= i); q_positions None =
        indices from the cache length; the encodings must be `cacheable`. Cross-attention
        (`AttentionCache(static=True)` or `memory_cache`): keys/values of the memory, filled
        from key_value on first use, content-only. Same results as the full computation.
        context: the positions a stack prepared for every layer (instead of q_positions,
        k_positions, query_mask and generator); its inputs are then taken as checked.
        """
        if context is None:
            self.check_inputs(query, key_value, key_mask, causal, (q_positions, k_positions),
                              query_mask, cache)  # fmt: skip
            context = self.context(query, key_value, key_mask, q_positions, k_positions,
                                   query_mask, generator, cache)  # fmt: skip
        if cache is not None and cache.static:
            return self._cross_cached(query, key_value, key_mask, cache)
        if key_value is not None:
            return self._cross(query, key_value, key_mask, causal, context)
        return self._self(query, key_mask, causal, context, cache)

    def context(
        self,
        query: torch.Tensor,
        key_value: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
        q_positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
        query_mask: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        cache: AttentionCache | None = None,
    ) -> PositionContext:
        """The `PositionContext` of a call with these (checked) arguments (`forward`'s)."""
        b, tq = query.shape[:2]
        if key_value is not None:
            tk = key_value.shape[1]
            q = None if q_positions is None else column_positions(q_positions, query_mask)
            k = None if k_positions is None else column_positions(k_positions, key_mask)
            return PositionContext(b, tq, tk, query.device, q, k, self_attention=False,
                                   mask=query_mask, k_mask=key_mask, generator=generator,
                                   dtype=query.dtype)  # fmt: skip
        q = None if q_positions is None else column_positions(q_positions, key_mask)
        if cache is not None and q is None and self.positional:  # kept with the keys
            q = token_positions(b, tq, mask=key_mask, device=query.device, start=cache.length)
        return PositionContext(b, tq, tq, query.device, q, mask=key_mask, generator=generator,
                               dtype=query.dtype)  # fmt: skip

    def _self(
        self,
        query: torch.Tensor,
        key_mask: torch.Tensor | None,
        causal: bool,
        context: PositionContext,
        cache: AttentionCache | None,
    ) -> torch.Tensor:
        """Self-attention of the new tokens over the cache's keys and their own (no cache: an
        empty one)."""
        tq, device = query.shape[1], query.device
        q, k, v = (self._split(p(query)) for p in (self.q_proj, self.k_proj, self.v_proj))
        past = 0 if cache is None else cache.length
        if self.rotary is not None:
            q, k = context.state(self.rotary).apply(q, k)
        keys_mask = key_mask
        if cache is not None:
            kept = context.q_positions if self.positional else None
            k, v, keys_mask, k_positions = cache.extend(k, v, key_mask, kept)
            if past and self.biases:  # the new queries over every cached key
                assert k_positions is not None
                context = context.with_keys(k_positions, keys_mask)
        tk = k.shape[2]
        # one new token sees every cached key and itself: no causal mask to build
        allowed = allowed_keys(keys_mask, causal and tq > 1, tq, tk, device, past)
        if not self.biases and causal and past == 0 and keys_mask is None:
            # nothing can leave a row without keys: let SDPA pick its fused causal kernels
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=self._p(), is_causal=True)
            return self._merge(out)
        biases = [(enc, context.state(enc)) for enc in self.biases]
        return self._merge(attend(q, k, v, biases, allowed, self._p()))

    def _cross(
        self,
        query: torch.Tensor,
        key_value: torch.Tensor,
        key_mask: torch.Tensor | None,
        causal: bool,
        context: PositionContext,
    ) -> torch.Tensor:
        """Cross-attention of query over key_value, with in-attention encodings if any (their
        positions default to token indices on each side)."""
        tq, tk, device = query.shape[1], key_value.shape[1], query.device
        q = self._split(self.q_proj(query))
        k, v = self._split(self.k_proj(key_value)), self._split(self.v_proj(key_value))
        if self.rotary is not None:
            q, k = context.state(self.rotary).apply(q, k)
        allowed = allowed_keys(key_mask, causal and tq > 1, tq, tk, device)
        biases = [(enc, context.state(enc)) for enc in self.biases]
        return self._merge(attend(q, k, v, biases, allowed, self._p()))

    def _cross_cached(
        self,
        query: torch.Tensor,
        key_value: torch.Tensor | None,
        key_mask: torch.Tensor | None,
        cache: AttentionCache,
    ) -> torch.Tensor:
        """Content-only cross-attention over a static cache (filled from key_value and key_mask
        if empty; the cache's mask is used afterwards)."""
        if cache.k is None:
            assert key_value is not None
            filled = self.memory_cache(key_value, key_mask)
            cache.k, cache.v, cache.mask = filled.k, filled.v, filled.mask
        assert cache.k is not None and cache.v is not None
        q = self._split(self.q_proj(query))
        allowed = None if cache.mask is None else cache.mask[:, None, None, :]
        return self._merge(attend(q, cache.k, cache.v, [], allowed, self._p()))

    def _p(self) -> float:
        return self.dropout if self.training else 0.0

    def _merge(self, out: torch.Tensor) -> torch.Tensor:
        """[B, H, Tq, d] -> the output projection of [B, Tq, D]."""
        b, _, tq, _ = out.shape
        if torch.compiler.is_compiling():
            # traced (export, ONNX): SDPA's traced layout can differ from its decomposition's,
            # and the reshape below would be recorded as a view that fails on the other one
            out = out.clone(memory_format=torch.contiguous_format)
        return self.out_proj(out.transpose(1, 2).reshape(b, tq, self.dim))

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

    # -- the boundary ------------------------------------------------------------------------
    def check_inputs(
        self,
        query: object,
        key_value: object,
        key_mask: object,
        causal: object,
        positions: tuple[object, object],
        query_mask: object,
        cache: AttentionCache | None,
        names: tuple[str, str] = ("q_positions", "k_positions"),
    ) -> None:
        """The checks of one call (`forward`'s arguments); names: what the caller calls the
        positions (a layer's `positions`)."""
        weight = self.q_proj.weight
        check_content("query", query, self.dim, weight.dtype)
        if key_value is not None:
            check_content("key_value", key_value, self.dim, weight.dtype)
        check_bool("causal", causal)
        assert isinstance(query, torch.Tensor)
        for bias in self.biases:
            bias.check_attention(self.heads, self.head_dim, causal)  # type: ignore[arg-type]
        if cache is not None:
            self._check_cache(query, key_value, key_mask, cache)
            if not cache.static:
                check_positions(self.encodings, (positions[0], None), (key_mask, None), names)  # type: ignore[arg-type]
            return
        self_attn = key_value is None
        kv = query if self_attn else key_value
        assert isinstance(kv, torch.Tensor)
        b, tq, tk = query.shape[0], query.shape[1], kv.shape[1]
        if kv.shape[0] != b:
            raise ValueError(
                f"key_value must have shape [{b}, Tk, {self.dim}], got {tuple(kv.shape)}"
            )
        if key_mask is not None:
            check_mask("key_mask", key_mask, (b, tk))  # True at real keys
        if self_attn and (positions[1] is not None or query_mask is not None):
            raise ValueError("k_positions and query_mask are for cross-attention (key_value given)")
        if query_mask is not None:
            check_mask("query_mask", query_mask, (b, tq))
        q_mask = key_mask if self_attn else query_mask
        check_positions(self.encodings, positions, (q_mask, key_mask), names)  # type: ignore[arg-type]
        for name, pos, t in zip(names, positions, (tq, tk), strict=True):
            if isinstance(pos, torch.Tensor) and (pos.shape[0] not in (1, b) or pos.shape[1] != t):
                raise ValueError(
                    f"{name} must have shape [{b} or 1, {t}(, M)], got {tuple(pos.shape)}"
                )

    def _check_cache(self, query, key_value, key_mask, cache: AttentionCache) -> None:
        b, tq = query.shape[:2]
        if cache.k is not None and cache.k.shape[0] != b:
            raise ValueError(f"cached keys have {cache.k.shape[0]} rows, the query {b}")
        if cache.static:
            if self.positional:
                raise ValueError(
                    "a cached cross-attention must be content-only (no rotary or biases)"
                )
            if cache.k is None and key_value is None:
                raise ValueError("an empty cross-attention cache needs key_value (the memory)")
            return
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
        if self.rotary is not None and not self.rotary.cacheable:
            rule = getattr(self.rotary, "cacheable_rule", "a rotary without (active) augmentation")
            raise ValueError(f"a self-attention cache needs {rule}")
        if any(not bias.cacheable for bias in self.biases):
            raise ValueError("a self-attention cache needs biases without (active) augmentation")

    def extra_repr(self) -> str:
        return f"dim={self.dim}, heads={self.heads}, dropout={self.dropout}"
