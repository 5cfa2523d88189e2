"""Key/value caches for incremental (token-by-token) decoding with `MultiheadAttention`.

`AttentionCache` holds one attention layer's state between calls:

- self-attention: the keys (rotary already applied: in eval mode without augmentation a key's
  rotation depends on its own position only), values, key positions (for relpos) and key
  padding mask seen so far, [N, H, T, d] / [N, T, 1] / [N, T]; each call appends the new ones.
- cross-attention: the projected memory keys/values, computed on the first call and reused.

`DecoderCache` holds one `AttentionCache` pair per decoder layer, plus the number of target
tokens already consumed (`length`, a Python int: positions of new tokens start there).
`reorder(index)` selects rows along the batch axis (beam search: the parents of the
surviving hypotheses; or the sentences still being decoded).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["AttentionCache", "DecoderCache"]


def _grow(old: torch.Tensor | None, new: torch.Tensor, dim: int) -> torch.Tensor:
    return new if old is None else torch.cat([old, new], dim=dim)


def _select(t: torch.Tensor | None, index: torch.Tensor) -> torch.Tensor | None:
    return None if t is None else t.index_select(0, index)


@dataclass
class AttentionCache:
    """One attention layer's cached keys/values (None until the first call fills them).

    k, v: [N, H, T, d]. positions: [N, T, 1] float32 key positions (self-attention; for relpos).
    mask: [N, T] bool key padding (None = all real). static: cross-attention (k/v computed once
    from the memory, never extended).
    """

    static: bool = False
    k: torch.Tensor | None = None
    v: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    mask: torch.Tensor | None = None

    @property
    def length(self) -> int:
        """Cached keys per row (0 when empty)."""
        return 0 if self.k is None else self.k.shape[2]

    def extend(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        positions: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Append the new tokens' keys, values [N, H, T, d], mask [N, T] (None = all real) and
        positions [N, T, M] -> everything cached now (k, v, mask, positions)."""
        past, (n, _, t, _) = self.length, k.shape
        if mask is not None or self.mask is not None:
            ones = torch.ones(n, max(past, t), dtype=torch.bool, device=k.device)
            old = self.mask if self.mask is not None else ones[:, :past]
            self.mask = torch.cat([old, mask if mask is not None else ones[:, :t]], dim=1)
        self.k, self.v = _grow(self.k, k, 2), _grow(self.v, v, 2)
        if positions is not None:
            self.positions = _grow(self.positions, positions, 1)
        return self.k, self.v, self.mask, self.positions

    def reorder(self, index: torch.Tensor) -> None:
        """Keep rows `index` ([N'] long, on the cache's device) in that order, in place."""
        self.k, self.v = _select(self.k, index), _select(self.v, index)
        self.positions, self.mask = _select(self.positions, index), _select(self.mask, index)


@dataclass
class DecoderCache:
    """Per-layer caches of a `TransformerDecoder` (`layers` of them) and the target length."""

    layers: int
    self_attn: list[AttentionCache] = field(default_factory=list)
    cross_attn: list[AttentionCache] = field(default_factory=list)
    length: int = 0

    def __post_init__(self) -> None:
        if not self.self_attn:
            self.self_attn = [AttentionCache() for _ in range(self.layers)]
        if not self.cross_attn:
            self.cross_attn = [AttentionCache(static=True) for _ in range(self.layers)]
        if len(self.self_attn) != self.layers or len(self.cross_attn) != self.layers:
            raise ValueError(f"DecoderCache needs {self.layers} caches of each kind")

    def reorder(self, index: torch.Tensor, *, cross: bool = True) -> None:
        """Keep batch rows `index` ([N'] long) in that order, in every layer, in place.

        cross=False leaves the cross-attention caches as they are: only valid when the
        batch size is unchanged and every row i's memory equals row index[i]'s (beam search
        reordering the hypotheses of each sentence, whose memories are copies of one).
        """
        for cache in (*self.self_attn, *(self.cross_attn if cross else ())):
            cache.reorder(index)
