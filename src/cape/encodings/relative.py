"""*relpos*: learned relative position representations (Shaw et al. 2018), CAPE's ASR baseline.

Unlike the absolute encodings this is not added to the input: it lives inside attention. One
table of 2K+1 learned vectors (keys, and optionally values) is shared by the heads of a layer;
positions may be token indices or seconds (`step` = frame hop, `max_distance` in seconds, e.g.
CAPE's "26.8s to the left/right").
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from .._checks import check_float, check_int, check_tensor
from ..functional.relative import (
    bucket_index,
    num_buckets,
    relative_index,
    relative_logits,
    relative_values,
    relpos_attention,
)
from ..positions import as_positions, column_positions
from .in_attention import AttentionBias, PositionContext

__all__ = ["RelPos", "RelPosTable"]


@dataclasses.dataclass(frozen=True)
class RelPosTable:
    """One call's bucket per pair [B or 1, Tq, Tk] and the rows of the tables it uses."""

    index: torch.Tensor
    rel_key: torch.Tensor
    rel_value: torch.Tensor | None


def _index_positions(
    positions: torch.Tensor | None, length: int, device: torch.device, mask: torch.Tensor | None
) -> torch.Tensor:
    """Checked positions [B, T(, 1)] -> float32 [B, T], 0 at padding; None -> [1, T] indices."""
    if positions is None:
        return torch.arange(length, device=device, dtype=torch.float32)[None]
    return column_positions(positions, mask)[..., 0]


class RelPos(AttentionBias):
    """Attention with learned relative position embeddings.

    head_dim: d, channels per head. max_distance: K * step, the farthest distinguished offset
    (farther pairs share the edge embeddings), in the units of the positions.
    step: size of one bucket (1 for token indices, the frame hop for seconds).
    values: also learn value embeddings (Shaw's a^V); False = keys only (faster, fused SDPA).

    Parameters: rel_key [2K+1, d] (and rel_value [2K+1, d]), initialised N(0, 0.02^2) truncated.
    It acts inside attention: one module per layer, `dim` of `cape.build` is the head size;
    positions are 1-D in any units (`step` is one bucket in those units). Called directly,
    `forward(q, k, v)` is the whole attention; inside `MultiheadAttention(biases=[...])` it
    is the bias protocol (`cape.encodings.in_attention`): its key term q_i . a_ij is a bias on
    the logits (and, with `values`, `value_term` adds Shaw's value term to the output).
    """

    def __init__(
        self, head_dim: int, max_distance: float = 100, *, step: float = 1.0, values: bool = False
    ) -> None:
        super().__init__(None)
        self.head_dim = check_int("head_dim", head_dim)
        self.max_distance = check_float("max_distance", max_distance, strict=True)
        self.step = check_float("step", step, strict=True)
        if not isinstance(values, bool):
            raise TypeError(f"values must be a bool, got {type(values).__name__} {values!r}")
        self.k_max = num_buckets(self.max_distance, self.step)
        size = (2 * self.k_max + 1, head_dim)
        self.rel_key = nn.Parameter(torch.empty(size))
        self.rel_value = nn.Parameter(torch.empty(size)) if values else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for p in (self.rel_key, self.rel_value):
            if p is not None:
                nn.init.trunc_normal_(p, std=0.02, a=-0.04, b=0.04)

    @property
    def num_buckets(self) -> int:
        """2K + 1."""
        return 2 * self.k_max + 1

    def _positions(
        self,
        name: str,
        positions: torch.Tensor | None,
        length: int,
        device: torch.device,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """[B, T] or [B, T, 1] -> float32 [B, T]; None -> token indices [1, T] (shared by the
        batch)."""
        if positions is None:
            return torch.arange(length, device=device, dtype=torch.float32)[None]
        check_tensor(name, positions, ndims=(2, 3))
        if mask is not None:
            check_tensor("key_padding_mask", mask, ndims=(2,))
        if mask is not None and tuple(mask.shape) != tuple(positions.shape[:2]):
            mask = None  # the key mask does not describe these positions
        pos = as_positions(positions, mask=mask, dims=1, name=name, mask_name="key_padding_mask")
        pos = pos[..., 0]
        if pos.shape[1] != length:
            raise ValueError(
                f"{name} must have length {length}, got shape {tuple(positions.shape)}"
            )
        return pos

    def index(
        self, q_positions: torch.Tensor, k_positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Bucket per pair: q_positions [B, Tq(, 1)], k_positions [B, Tk(, 1)] (default: the
        query positions) -> LongTensor [B, Tq, Tk] in [0, 2K]."""
        k_positions = q_positions if k_positions is None else k_positions
        return relative_index(q_positions, k_positions, self.max_distance, self.step)

    @property
    def adds_values(self) -> bool:  # type: ignore[override]
        return self.rel_value is not None

    def prepare(self, context: PositionContext) -> RelPosTable:
        """The call's bucket index [B or 1, Tq, Tk] and the rows it uses of the key (and value)
        tables: with token indices, only the buckets a pair can use (known from the shape: no
        host sync)."""
        c = context
        q_pos, k_pos, mask, k_mask = c.q_positions, c.k_positions, c.mask, c.k_mask
        if c.self_attention:
            k_pos, k_mask = q_pos, mask
        qp = _index_positions(q_pos, c.q_len, c.device, mask)
        kp = _index_positions(k_pos, c.k_len, c.device, k_mask)
        index = bucket_index(qp, kp, self.k_max, self.step)
        rel_key, rel_value = self.rel_key, self.rel_value
        # token indices 0..T-1; not when traced, where T may be symbolic (torch.export): the
        # slice would tie the graph to T's side of K
        if q_pos is None and k_pos is None and not torch.compiler.is_compiling():
            used = min(self.k_max, round((max(c.q_len, c.k_len) - 1) / self.step))
            if used < self.k_max:
                lo, hi = self.k_max - used, self.k_max + used + 1
                index, rel_key = index - lo, rel_key[lo:hi]
                rel_value = None if rel_value is None else rel_value[lo:hi]
        return RelPosTable(index, rel_key, rel_value)

    def bias(self, state: RelPosTable, q: torch.Tensor, allowed: torch.Tensor | None):
        """Shaw's key term q_i . a_ij / sqrt(d) -> [B, H, Tq, Tk] in q's dtype (the bias
        protocol)."""
        return relative_logits(q, state.rel_key, state.index)

    def value_term(
        self, probs: torch.Tensor, state: RelPosTable, dtype: torch.dtype
    ) -> torch.Tensor:
        """Shaw's value term sum_j p_ij a^V_ij: probabilities [B, H, Tq, Tk] -> [B, H, Tq, d]
        in `dtype` (q's)."""
        assert state.rel_value is not None
        return relative_values(probs, state.rel_value, state.index, dtype)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        q_positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        dropout_p: float = 0.0,
    ) -> torch.Tensor:
        """q: [B, H, Tq, d], k: [B, H, Tk, d], v: [B, H, Tk, d] -> [B, H, Tq, d] in v's dtype.

        q_positions: [B, Tq] or [B, Tq, 1]; k_positions: [B, Tk] or [B, Tk, 1]. Missing ones
        default to the other side's (self-attention, Tq == Tk) or, with neither, to token
        indices 0..T-1. key_padding_mask: [B, Tk] bool, True at real keys. attn_mask: bool
        (True = may attend) or additive float, broadcastable to [B, H, Tq, Tk].
        is_causal: key j visible from query i iff j <= i. Dropout on probabilities in train mode.
        Positions must be finite at real tokens; where key_padding_mask is False they count as 0
        (also for the queries when Tq == Tk, i.e. the mask is taken to describe them too).
        """
        d = self.head_dim
        wanted = (("q", q, d), ("k", k, d), ("v", v, d if self.rel_value is not None else None))
        for name, t, last in wanted:
            check_tensor(name, t, ndims=(4,), floating=True)
            if last is not None and t.shape[-1] != last:
                raise ValueError(
                    f"{name} must have shape [B, H, T, head_dim={last}], got {tuple(t.shape)}"
                )
        tq, tk = q.shape[2], k.shape[2]
        if (q_positions is None) != (k_positions is None):
            if tq != tk:
                raise ValueError(
                    "give both q_positions and k_positions when query and key lengths differ "
                    f"(Tq={tq}, Tk={tk})"
                )
            q_positions = k_positions if q_positions is None else q_positions
            k_positions = q_positions
        elif q_positions is None and tq != tk:
            raise ValueError(
                f"q_positions and k_positions are required when Tq ({tq}) != Tk ({tk})"
            )
        qp = self._positions("q_positions", q_positions, tq, q.device, key_padding_mask)
        kp = self._positions("k_positions", k_positions, tk, k.device, key_padding_mask)
        index, rel_key, rel_value = self.index(qp, kp), self.rel_key, self.rel_value
        if q_positions is None:
            # token indices 0..T-1: |bucket| <= round((T-1)/step), known from the shape alone
            # (no host sync), so the q @ rel_key.T projection skips buckets no pair can use
            used = min(self.k_max, round((tq - 1) / self.step))
            if used < self.k_max:
                lo, hi = self.k_max - used, self.k_max + used + 1
                index, rel_key = index - lo, rel_key[lo:hi]
                rel_value = None if rel_value is None else rel_value[lo:hi]
        return relpos_attention(
            q,
            k,
            v,
            rel_key,
            index,
            rel_value=rel_value,
            key_padding_mask=key_padding_mask,
            attn_mask=attn_mask,
            is_causal=is_causal,
            dropout_p=dropout_p,
            training=self.training,
        )

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, max_distance={self.max_distance}, step={self.step}, "
            f"values={self.rel_value is not None}, num_buckets={self.num_buckets}"
        )
