"""The protocols of the encodings that act inside attention, and the base they share.

Two ways to put positions inside attention, each one protocol that `MultiheadAttention` calls
without knowing the class:

- `QKTransform` (the rotary family: `Rotary`, `RoPE2d`): transforms queries and keys before the
  dot products, `forward(q, k, *, positions, k_positions, mask, k_mask, generator) -> (q, k)`.
  An attention has one such slot (`rotary=`).
- `AttentionBias` (`ALiBi`, `FIRE`, `RelPos` as Shaw's key term): adds a bias to the logits,
  `attention_bias(call) -> [B or 1, H, Tq, Tk]` of one call (`BiasCall`). An attention
  takes a list of them (`biases=`); their biases add up. A bias whose `adds_values` is True
  (`RelPos(values=True)`) also adds a term to the output (`value_term`).

Both hold CAPE's augmentation the same way (`InAttentionEncoding`): `augmentation=` a
`cape.Augmentation`, applied in train mode when the module is called with positions of its own;
inside a model, the position plan (`cape.models.plan`) usually takes it over and draws once per
forward for every layer. `cacheable` says whether keys computed in one call stay valid in the
next (a decoder's key/value cache).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from .._checks import check_generator, check_int, check_tensor
from ..augment import Augmentation, check_augmentation
from ..positions import as_positions, token_positions
from .base import float32_region

__all__ = [
    "InAttentionEncoding",
    "QKTransform",
    "AttentionBias",
    "BiasCall",
    "PositionBias",
    "bias_positions",
]


class InAttentionEncoding(nn.Module):
    """What the in-attention encodings share: `kind`, the augmentation and its state."""

    kind = "attention"
    units = "continuous"
    pos_dim = 1
    per_head = False  # cape.build's dim is the head size (True: the number of heads)

    def __init__(self, augmentation: Augmentation | None = None) -> None:
        super().__init__()
        self.augmentation = check_augmentation(augmentation)

    @property
    def drawing(self) -> bool:
        """Whether a call draws random positions (train mode with a random augmentation)."""
        aug = self.augmentation
        return aug is not None and self.training and aug.random

    @property
    def cacheable(self) -> bool:
        """Whether what one call computes for a key stays valid in later calls: no draw and no
        mean-normalisation (which reads every position of the call)."""
        aug = self.augmentation
        return not self.drawing and not (aug is not None and aug.normalize)

    def extra_repr(self) -> str:
        return "" if self.augmentation is None else f"augmentation={self.augmentation}"


class QKTransform(InAttentionEncoding):
    """Protocol: transform q [B, H, Tq, d] and k [B, H, Tk, d] by their positions (rotary)."""

    protocol = "qk"
    head_dim: int


@dataclasses.dataclass(frozen=True)
class BiasCall:
    """One attention call as its biases see it.

    q: [B, H, Tq, d], k: [B, H, Tk, d]. q_positions / k_positions: [B or 1, T(, M)] or None
    (token indices). self_attention: the keys are the queries (k_positions unused: one
    augmentation draw for both). mask / k_mask: [B, Tq] / [B, Tk] bool, True at real tokens,
    used where they describe the positions. allowed: [B or 1, 1, Tq or 1, Tk] bool, the keys
    each query sees (None = all). generator: for augmentation draws.
    """

    q: torch.Tensor
    k: torch.Tensor
    q_positions: torch.Tensor | None
    k_positions: torch.Tensor | None
    self_attention: bool
    mask: torch.Tensor | None = None
    k_mask: torch.Tensor | None = None
    allowed: torch.Tensor | None = None
    generator: torch.Generator | None = None


class AttentionBias(InAttentionEncoding):
    """Protocol: an additive bias on the logits of `heads` heads, from positions (ALiBi, FIRE)
    or from the queries and positions (relpos).

    Subclasses implement `bias_of(q_positions, k_positions, mask, k_mask, allowed, generator)`
    (positions [B or 1, T, 1]; k_positions None = self-attention: the keys are the queries, one
    augmentation draw for both), or override `attention_bias` when the bias reads q.
    """

    protocol = "bias"
    adds_values = False  # True: the bias also adds a term to the output (`value_term`)
    causal = False  # True: the causal form, for attention that hides the keys ahead
    reads_mask = False  # True: the bias depends on which keys each query sees (FIRE)

    def __init__(self, heads: int | None, augmentation: Augmentation | None = None) -> None:
        super().__init__(augmentation)
        self.heads = None if heads is None else check_int("heads", heads)

    def check_attention(self, heads: int, head_dim: int, causal: bool | None = None) -> None:
        """Refuse an attention this bias cannot serve: another number of heads, or a causal
        form in bidirectional attention (keys ahead would go unpenalised)."""
        if self.heads is not None and self.heads != heads:
            raise ValueError(f"bias.heads must equal heads ({heads}), got {self.heads}")
        if causal is False and self.causal:
            raise ValueError(
                "bias.causal=True leaves keys ahead of a query unpenalised: use it with causal "
                f"attention (causal=True), or {type(self).__name__}(causal=False)"
            )

    def bias_of(
        self,
        q_positions: torch.Tensor,
        k_positions: torch.Tensor | None,
        mask: torch.Tensor | None,
        k_mask: torch.Tensor | None,
        allowed: torch.Tensor | None,
        generator: torch.Generator | None,
    ) -> torch.Tensor:
        raise NotImplementedError

    def attention_bias(self, call: BiasCall) -> torch.Tensor:
        """The bias of one attention call (`BiasCall`) -> float32 [1, H, Tq, Tk] when the
        positions are shared by the batch (None without a draw: token indices 0..T-1) and the
        bias reads no key mask, else [B, H, Tq, Tk]."""
        (b, _, tq, _), tk, device = call.q.shape, call.k.shape[2], call.q.device

        def default(t: int, m: torch.Tensor | None) -> torch.Tensor:
            if self.drawing:  # per-sample draws: one row of positions per sample
                return token_positions(b, t, mask=m, device=device)
            return torch.arange(t, device=device, dtype=torch.float32)[None]

        def fits(pos: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor | None:
            return m if m is not None and tuple(pos.shape[:2]) == tuple(m.shape) else None

        mask, k_mask = call.mask, call.k_mask
        qp = default(tq, mask) if call.q_positions is None else call.q_positions
        kp = None if call.self_attention else call.k_positions
        for name, pos, t in (("q_positions", qp, tq), ("k_positions", kp, tk)):
            if pos is not None and (pos.shape[0] not in (1, b) or pos.shape[1] != t):
                raise ValueError(
                    f"{name} must have shape [{b} or 1, {t}(, 1)] for the attention bias, "
                    f"got {tuple(pos.shape)}"
                )
        if call.self_attention:
            return self.bias_of(qp, None, fits(qp, mask), None, call.allowed, call.generator)
        kp = default(tk, k_mask) if kp is None else kp
        masks = (fits(qp, mask), fits(kp, k_mask))
        return self.bias_of(qp, kp, *masks, call.allowed, call.generator)

    def value_term(self, probs: torch.Tensor, call: BiasCall) -> torch.Tensor:
        """The output term of a bias with `adds_values`: probabilities [B, H, Tq, Tk] of the
        call -> [B, H, Tq, dv]."""
        raise NotImplementedError(f"{type(self).__name__} adds no value term")

    def _bias_repr(self, **fields: Any) -> str:
        parts = [f"{k}={v}" for k, v in fields.items()]
        aug = super().extra_repr()
        return ", ".join(parts + ([aug] if aug else []))


class PositionBias(AttentionBias):
    """A bias from positions alone (ALiBi, FIRE): `bias(q_positions, k_positions=None, *, mask,
    k_mask, attn_mask, generator)` -> [B, H, Tq, Tk]. Subclasses implement `bias_from(q, k,
    k_mask, attn_mask, q_positions, k_positions)` over the augmented float32 positions."""

    def forward(
        self,
        q_positions: torch.Tensor,
        k_positions: torch.Tensor | None = None,
        *,
        mask: torch.Tensor | None = None,
        k_mask: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        validate: bool = True,
    ) -> torch.Tensor:
        """-> bias float32 [B, H, Tq, Tk] to add to the logits (B = 1: shared by the batch).

        q_positions: [B, Tq] or [B, Tq, 1]; k_positions: [B, Tk(, 1)], None = self-attention
        (the keys are the queries: one augmentation draw for both). mask / k_mask: [B, Tq] /
        [B, Tk] bool, True at real tokens (padded positions count as 0). attn_mask: [B or 1,
        (1,) Tq or 1, Tk] bool, True where query i sees key j (the attention's mask), for the
        biases that read it (`reads_mask`: FIRE's normaliser). In train mode the augmentation
        perturbs the positions (per sample: give [B, T] positions, not [1, T]);
        cross-attention draws one global shift and scale for both sides (`augment_pair`).
        validate: False when the caller checked these inputs (`MultiheadAttention`).
        """
        q, k, _, k_mask = bias_positions(
            self.augmentation, self.training, q_positions, k_positions, mask, k_mask, generator,
            validate,
        )  # fmt: skip
        with float32_region(q.device):
            return self.bias_from(q, k, k_mask, attn_mask, q_positions, k_positions)

    def bias_from(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        k_mask: torch.Tensor | None,
        attn_mask: torch.Tensor | None,
        q_positions: torch.Tensor,
        k_positions: torch.Tensor | None,
    ) -> torch.Tensor:
        """q [B, Tq, 1], k [B, Tk, 1] float32 (augmented) -> the bias [B, H, Tq, Tk]."""
        raise NotImplementedError

    def bias_of(self, q_positions, k_positions, mask, k_mask, allowed, generator):
        return self(
            q_positions, k_positions, mask=mask, k_mask=k_mask, attn_mask=allowed,
            generator=generator, validate=False,
        )  # fmt: skip


def bias_positions(
    augmentation: Augmentation | None,
    training: bool,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor | None,
    mask: torch.Tensor | None,
    k_mask: torch.Tensor | None,
    generator: torch.Generator | None,
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The query and key positions an attention bias (ALiBi, FIRE) reads -> (q [B, Tq, 1],
    k [B, Tk, 1], mask, k_mask), augmented in training. k_positions None: self-attention, the
    keys are the queries (one draw for both). Cross-attention draws one global shift and scale
    for both sides (`augment_pair`), per sample: a batch of 1 on one side is expanded."""
    if validate:
        check_generator("generator", generator)
        check_tensor("q_positions", q_positions, ndims=(2, 3))
        if k_positions is not None:
            check_tensor("k_positions", k_positions, ndims=(2, 3))
        elif k_mask is not None:
            raise ValueError("k_mask describes k_positions: give k_positions too")
    with float32_region(q_positions.device):  # autocast must not touch the positions
        q = as_positions(q_positions, mask=mask, dims=1, name="q_positions", validate=validate)
        aug = augmentation
        if k_positions is None:
            if aug is not None:
                q = aug(q, mask, training=training, generator=generator, name="q_positions")
            return q, q, mask, mask
        k = as_positions(
            k_positions, mask=k_mask, dims=1, name="k_positions", mask_name="k_mask",
            validate=validate,
        )  # fmt: skip
        if aug is None or not (training and aug.random):
            return q, k, mask, k_mask  # mean-normalisation is a common offset: a bias ignores it
        if q.shape[0] != k.shape[0]:  # per-sample draws need the batch on both sides
            if 1 not in (q.shape[0], k.shape[0]):
                raise ValueError(
                    "q_positions and k_positions batch sizes must match or be 1, got "
                    f"{tuple(q_positions.shape)} and {tuple(k_positions.shape)}"
                )
            b = max(q.shape[0], k.shape[0])
            q, k = q.expand(b, -1, -1), k.expand(b, -1, -1)
            mask = None if mask is None else mask.expand(b, -1)
            k_mask = None if k_mask is None else k_mask.expand(b, -1)
        q, k = aug.pair(q, k, mask, k_mask, generator=generator)
        return q, k, mask, k_mask
