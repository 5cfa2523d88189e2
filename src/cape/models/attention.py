"""Multi-head attention hosting the in-attention encodings through their two protocols.

Absolute encodings are added to the input of the stack (see `cape.models.transformer`); the
relative families act on the heads (`cape.encodings.in_attention`):

- one q/k slot, `rotary=`: a `QKTransform` (`Rotary`, `RoPE2d`) rotates queries and keys before
  the dot products;
- a list of biases, `biases=`: each `AttentionBias` (`ALiBi`, `FIRE`, `RelPos`) adds a bias to
  the logits; the biases add up, so rotary and ALiBi, say, combine.

One path: a call without a cache is a call on an empty cache (`AttentionCache`) that is thrown
away afterwards; a decoder's incremental call is the same computation on the cache it keeps.
Inputs are checked once at this boundary (`validate=False` from a caller that checked them).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_bool, check_int, check_mask, check_rate, check_tensor, checked_inputs
from ..encodings.in_attention import AttentionBias, QKTransform
from ..functional.relative import allowed_keys
from ..positions import token_positions
from .attend import attend, check_call, check_modules
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
    `RelPos(d, ...)`; at most one with `values=True`). relative / position_bias: the former
    slots of relpos and ALiBi/FIRE, deprecated: they are appended to `biases`.
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
        relative: AttentionBias | None = None,
        position_bias: AttentionBias | None = None,
    ) -> None:
        super().__init__()
        check_int("dim", dim)
        check_int("heads", heads)
        if dim % heads:
            raise ValueError(f"dim must be divisible by heads ({heads}), got dim={dim}")
        self.dim, self.heads, self.head_dim = dim, heads, dim // heads
        self.dropout = check_rate("dropout", dropout)
        old = [m for m in (relative, position_bias) if m is not None]
        if old:
            warnings.warn(
                "MultiheadAttention(relative=..., position_bias=...) is deprecated: pass "
                "biases=[...] (every in-attention bias takes that one list)",
                DeprecationWarning,
                stacklevel=2,
            )
        biases = [*check_modules(rotary, biases, heads, self.head_dim), *old]
        check_modules(None, old, heads, self.head_dim)
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
        validate: bool = True,
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
        validate: False when the caller has checked these inputs (a stack's layers).
        """
        if validate:
            check_call(self, query, key_value, key_mask, causal, (q_positions, k_positions),
                       query_mask, cache)  # fmt: skip
        with checked_inputs():  # the encodings' own value checks would repeat these per layer
            if cache is not None and cache.static:
                return self._cross_cached(query, key_value, key_mask, cache)
            if key_value is not None:
                return self._cross(query, key_value, key_mask, causal, q_positions, k_positions,
                                   query_mask, generator)  # fmt: skip
            return self._self(query, key_mask, causal, q_positions, generator, cache)

    def _self(
        self,
        query: torch.Tensor,
        key_mask: torch.Tensor | None,
        causal: bool,
        positions: torch.Tensor | None,
        generator: torch.Generator | None,
        cache: AttentionCache | None,
    ) -> torch.Tensor:
        """Self-attention of the new tokens over the cache's keys and their own (no cache: an
        empty one). Without a kept cache, positions None stay the encodings' defaults."""
        b, tq, device = query.shape[0], query.shape[1], query.device
        q, k, v = (self._split(p(query)) for p in (self.q_proj, self.k_proj, self.v_proj))
        past = 0 if cache is None else cache.length
        if cache is not None and self.positional:  # kept with the keys: float32, 0 at padding
            if positions is None:
                positions = token_positions(b, tq, mask=key_mask, device=device) + past
            positions = _as_column(positions)
            if key_mask is not None:
                positions = torch.where(key_mask[..., None], positions, 0.0)
        if self.rotary is not None:
            q, k = self.rotary(
                q, k, positions=positions, mask=key_mask, generator=generator, validate=False
            )
        keys_mask, k_positions = key_mask, None
        if cache is not None:
            k, v, keys_mask, k_positions = cache.extend(k, v, key_mask, positions)
        tk = k.shape[2]
        # one new token sees every cached key and itself: no causal mask to build
        allowed = allowed_keys(keys_mask, causal and tq > 1, tq, tk, device, past)
        if not self.biases and causal and past == 0 and keys_mask is None:
            # nothing can leave a row without keys: let SDPA pick its fused causal kernels
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=self._p(), is_causal=True)
            return self._merge(out)
        own = past == 0  # the keys are the queries: one augmentation draw for both
        ctx = dict(self_attention=own, mask=key_mask, k_mask=None if own else keys_mask)
        out = attend(self, q, k, v, allowed, (positions, None if own else k_positions), ctx,
                     generator, self._p())  # fmt: skip
        return self._merge(out)

    def _cross(
        self,
        query: torch.Tensor,
        key_value: torch.Tensor,
        key_mask: torch.Tensor | None,
        causal: bool,
        q_positions: torch.Tensor | None,
        k_positions: torch.Tensor | None,
        query_mask: torch.Tensor | None,
        generator: torch.Generator | None,
    ) -> torch.Tensor:
        """Cross-attention of query over key_value, with in-attention encodings if any (their
        positions default to token indices on each side)."""
        b, tq, tk, device = query.shape[0], query.shape[1], key_value.shape[1], query.device
        q = self._split(self.q_proj(query))
        k, v = self._split(self.k_proj(key_value)), self._split(self.v_proj(key_value))
        if self.rotary is not None:  # Rotary needs both sides; default to token indices
            if q_positions is None:
                q_positions = token_positions(b, tq, mask=query_mask, device=device)
            if k_positions is None:
                k_positions = token_positions(b, tk, mask=key_mask, device=device)
            q, k = self.rotary(q, k, positions=q_positions, k_positions=k_positions,
                               mask=query_mask, k_mask=key_mask, generator=generator,
                               validate=False)  # fmt: skip
        allowed = allowed_keys(key_mask, causal and tq > 1, tq, tk, device)
        ctx = dict(self_attention=False, mask=query_mask, k_mask=key_mask)
        out = attend(self, q, k, v, allowed, (q_positions, k_positions), ctx, generator, self._p())
        return self._merge(out)

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
        ctx = dict(self_attention=False, mask=None, k_mask=cache.mask)
        out = attend(self, q, cache.k, cache.v, allowed, (None, None), ctx, None, self._p())
        return self._merge(out)

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

    def extra_repr(self) -> str:
        return f"dim={self.dim}, heads={self.heads}, dropout={self.dropout}"


def _as_column(positions: torch.Tensor) -> torch.Tensor:
    """Positions [B, T] or [B, T, M] -> float32 [B, T, M] (what a cache keeps)."""
    pos = positions if positions.dim() == 3 else positions[..., None]
    return pos.to(torch.float32)
