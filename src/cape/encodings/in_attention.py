"""The encodings that act inside attention: their two protocols, the base they share, and the
position context that is prepared once per forward and applied in every layer.

Prepare once, apply per layer (as timm's `rope.get_embed(shape)` and torchtune's one rotary
module): a stack (or a model) makes one `PositionContext` per forward from its positions, with
CAPE's augmentation drawn once; each encoding module turns it into its state once
(`context.state(encoding)`: a memo per module, so one rotary shared by every layer computes
its angles once), and each layer applies that state:

- `QKTransform` (the rotary family: `Rotary`, `RoPE2d`): `prepare(context) -> Rotation`, whose
  `apply(q, k)` rotates queries and keys. An attention has one such slot (`rotary=`).
- `AttentionBias` (`ALiBi`, `FIRE`, `RelPos` as Shaw's key term): `prepare(context) -> state`,
  then `bias(state, q, allowed) -> [B or 1, H, Tq, Tk]` added to the logits. An attention takes a
  list of them (`biases=`); their biases add up. A bias whose `adds_values` is True
  (`RelPos(values=True)`) also adds a term to the output (`value_term`).

Both hold CAPE's augmentation the same way (`InAttentionEncoding`): `augmentation=` a
`cape.Augmentation`, drawn in train mode when the module prepares positions of its own; inside a
model the stack draws once for every layer and the modules hold none. `cacheable` says whether
keys computed in one call stay valid in the next (a decoder's key/value cache).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .._checks import check_generator, check_int, check_tensor
from ..augment import Augmentation, check_augmentation
from ..positions import as_positions, column_positions, token_positions
from .base import Float32Buffers, float32_region

__all__ = [
    "InAttentionEncoding",
    "QKTransform",
    "AttentionBias",
    "PositionBias",
    "PositionContext",
    "bias_positions",
]


@dataclasses.dataclass(eq=False)
class PositionContext:
    """The positions of one attention call, as its in-attention encodings read them.

    batch, q_len, k_len: B, Tq, Tk; device: where the positions live. q_positions: [B or 1,
    Tq, M] float32 (augmented once when the stack draws) or None: token indices 0..Tq-1, 0 at
    padding. k_positions: [B or 1, Tk, M] or None: the keys' default (token indices), or, in
    self-attention, the queries'. self_attention: the keys are the queries (one rotation and one
    augmentation draw for both). mask / k_mask: [B, Tq] / [B, Tk] bool, True at real tokens
    (k_mask unused in self-attention). generator: the draws of modules holding an augmentation.
    dtype: the content's (q and k), for the checks of factors it must hold (xPos in float16).
    augmented: the positions come augmented (the stack or the model drew once for every
    layer): the modules do not apply their own augmentation.

    Made from checked inputs (a stack's or an attention's boundary): the encodings trust it.
    """

    batch: int
    q_len: int
    k_len: int
    device: torch.device
    q_positions: torch.Tensor | None = None
    k_positions: torch.Tensor | None = None
    self_attention: bool = True
    mask: torch.Tensor | None = None
    k_mask: torch.Tensor | None = None
    generator: torch.Generator | None = None
    dtype: torch.dtype = torch.float32
    augmented: bool = False
    _states: dict[int, Any] = dataclasses.field(default_factory=dict, repr=False)
    _keys: PositionContext | None = dataclasses.field(default=None, repr=False)

    def state(self, encoding: InAttentionEncoding) -> Any:
        """`encoding.prepare(self)`, once per module: every layer sharing it reads the same."""
        key = id(encoding)
        if key not in self._states:
            self._states[key] = encoding.prepare(self)
        return self._states[key]

    def with_keys(self, k_positions: torch.Tensor, k_mask: torch.Tensor | None) -> PositionContext:
        """The context of the same queries over a cache's keys (k_positions [B, Tk, M], k_mask
        [B, Tk]): the biases of a decoding step. Made once per forward: every layer's cache
        holds the same positions."""
        if self._keys is None:
            self._keys = dataclasses.replace(
                self, k_len=k_positions.shape[1], k_positions=k_positions, k_mask=k_mask,
                self_attention=False, _states={}, _keys=None,
            )  # fmt: skip
        return self._keys


class InAttentionEncoding(Float32Buffers):
    """What the in-attention encodings share: `kind`, the augmentation and its state."""

    kind = "attention"
    units = "continuous"
    pos_dim = 1
    per_head = False  # cape.build's dim is the head size (True: the number of heads)

    def __init__(self, augmentation: Augmentation | None = None) -> None:
        super().__init__()
        self.augmentation = check_augmentation(augmentation, pos_dim=type(self).pos_dim)

    @property
    def drawing(self) -> bool:
        """Whether a call draws random positions (train mode with a random augmentation, or an
        augmentation that samples at evaluation too)."""
        aug = self.augmentation
        return aug is not None and aug.draws(self.training)

    @property
    def cacheable(self) -> bool:
        """Whether what one call computes for a key stays valid in later calls: no draw and no
        mean-normalisation (which reads every position of the call)."""
        aug = self.augmentation
        return not self.drawing and not (aug is not None and aug.normalize)

    def prepare(self, context: PositionContext) -> Any:
        """The state every layer applies, from one call's positions (module docstring)."""
        raise NotImplementedError

    def extra_repr(self) -> str:
        return "" if self.augmentation is None else f"augmentation={self.augmentation}"


class QKTransform(InAttentionEncoding):
    """Protocol: `prepare(context) -> Rotation`, whose `apply(q, k)` transforms q [B, H, Tq, d]
    and k [B, H, Tk, d] by their positions (rotary)."""

    protocol = "qk"
    head_dim: int


class AttentionBias(InAttentionEncoding):
    """Protocol: an additive bias on the logits of `heads` heads, from positions (ALiBi, FIRE)
    or from the queries and positions (relpos): `prepare(context) -> state`, then
    `bias(state, q, allowed)`.
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

    def bias(self, state: Any, q: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
        """The bias of one layer: the prepared state, q [B, H, Tq, d], allowed [B or 1, 1, Tq
        or 1, Tk] bool (the keys each query sees; None = all) -> [B or 1, H, Tq, Tk]."""
        raise NotImplementedError

    def value_term(self, probs: torch.Tensor, state: Any, dtype: torch.dtype) -> torch.Tensor:
        """The output term of a bias with `adds_values`: probabilities [B, H, Tq, Tk] of the
        call -> [B, H, Tq, dv] in `dtype` (q's)."""
        raise NotImplementedError(f"{type(self).__name__} adds no value term")

    def _bias_repr(self, **fields: Any) -> str:
        parts = [f"{k}={v}" for k, v in fields.items()]
        aug = super().extra_repr()
        return ", ".join(parts + ([aug] if aug else []))


@dataclasses.dataclass(frozen=True)
class BiasPositions:
    """What a position bias reads of one call: the augmented float32 positions q [B or 1, Tq,
    1], k [B or 1, Tk, 1], the keys' mask [B, Tk] (None: all real) and, for biases that check
    a mask against them, the positions as given (k_given None: self-attention). bias: the bias
    itself when it reads no mask (ALiBi), made once for every layer."""

    q: torch.Tensor
    k: torch.Tensor
    k_mask: torch.Tensor | None
    q_given: torch.Tensor
    k_given: torch.Tensor | None
    bias: torch.Tensor | None = None


class PositionBias(AttentionBias):
    """A bias from positions alone (ALiBi, FIRE): `bias(q_positions, k_positions=None, *, mask,
    k_mask, attn_mask, generator)` -> [B, H, Tq, Tk]. Subclasses implement `bias_from(q, k,
    k_mask, attn_mask, q_positions, k_positions)` over the augmented float32 positions;
    `mask_free` subclasses (the bias reads neither mask) have it made once per forward."""

    mask_free = False  # True: the bias reads no mask, so one tensor serves every layer

    def forward(
        self,
        q_positions: torch.Tensor,
        k_positions: torch.Tensor | None = None,
        *,
        mask: torch.Tensor | None = None,
        k_mask: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """-> bias float32 [B, H, Tq, Tk] to add to the logits (B = 1: shared by the batch).

        q_positions: [B, Tq] or [B, Tq, 1]; k_positions: [B, Tk(, 1)], None = self-attention
        (the keys are the queries: one augmentation draw for both). mask / k_mask: [B, Tq] /
        [B, Tk] bool, True at real tokens (padded positions count as 0). attn_mask: [B or 1,
        (1,) Tq or 1, Tk] bool, True where query i sees key j (the attention's mask), for the
        biases that read it (`reads_mask`: FIRE's normaliser). In train mode the augmentation
        perturbs the positions (per sample: give [B, T] positions, not [1, T]);
        cross-attention draws one global shift and scale for both sides (`augment_pair`).
        """
        check_generator("generator", generator)
        check_tensor("q_positions", q_positions, ndims=(2, 3))
        if k_positions is not None:
            check_tensor("k_positions", k_positions, ndims=(2, 3))
        elif k_mask is not None:
            raise ValueError("k_mask describes k_positions: give k_positions too")
        q = as_positions(q_positions, mask=mask, dims=1, name="q_positions")
        k = None
        if k_positions is not None:
            k = as_positions(
                k_positions, mask=k_mask, dims=1, name="k_positions", mask_name="k_mask"
            )
        q, k, _, k_mask = bias_positions(
            self.augmentation, self.training, q, k, mask, k_mask, generator
        )
        self.check_values(q, k)
        with float32_region(q.device):
            return self.bias_from(q, k, k_mask, attn_mask, q_positions, k_positions)

    def check_values(self, q: torch.Tensor, k: torch.Tensor) -> None:
        """A direct call's checks of the values the bias reads (augmented positions q [B, Tq,
        1], k [B, Tk, 1]); inside a model the stack's boundary has checked them."""

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

    def prepare(self, context: PositionContext) -> BiasPositions:
        """The positions of the call, augmented once when this module draws; [1, T] token
        indices when they are shared by the batch (no draw, no positions given)."""
        b, device = context.batch, context.device
        aug = None if context.augmented else self.augmentation
        draws = aug is not None and self.drawing

        def default(t: int, m: torch.Tensor | None) -> torch.Tensor:
            if draws:  # per-sample draws: one row of positions per sample
                return token_positions(b, t, mask=m, device=device)
            return torch.arange(t, device=device, dtype=torch.float32)[None]

        def fits(pos: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor | None:
            return m if m is not None and tuple(pos.shape[:2]) == tuple(m.shape) else None

        mask, k_mask = context.mask, context.k_mask
        qp = default(context.q_len, mask) if context.q_positions is None else context.q_positions
        kp = None
        if not context.self_attention:
            kp = context.k_positions
            kp = default(context.k_len, k_mask) if kp is None else kp
        q_mask, k_mask = fits(qp, mask), None if kp is None else fits(kp, k_mask)
        with float32_region(device):
            q = column_positions(qp, q_mask)
            k = None if kp is None else column_positions(kp, k_mask)
            q, k, _, k_mask = bias_positions(
                aug, self.training, q, k, q_mask, k_mask, context.generator
            )
            state = BiasPositions(q, k, k_mask, qp, kp)
            if self.mask_free:
                made = self.bias_from(q, k, k_mask, None, qp, kp)
                state = dataclasses.replace(state, bias=made)
        return state

    def bias(self, state: BiasPositions, q: torch.Tensor, allowed: torch.Tensor | None):
        if state.bias is not None:
            return state.bias
        with float32_region(state.q.device):
            return self.bias_from(
                state.q, state.k, state.k_mask, allowed, state.q_given, state.k_given
            )


def bias_positions(
    augmentation: Augmentation | None,
    training: bool,
    q: torch.Tensor,
    k: torch.Tensor | None,
    mask: torch.Tensor | None,
    k_mask: torch.Tensor | None,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Checked float32 positions q [B, Tq, 1], k [B, Tk, 1] (None: self-attention, the keys
    are the queries: one draw for both) -> (q, k, mask, k_mask), augmented in training.
    Cross-attention draws one global shift and scale for both sides (`augment_pair`), per
    sample: a batch of 1 on one side is expanded."""
    with float32_region(q.device):  # autocast must not touch the positions
        aug = augmentation
        if k is None:
            if aug is not None:
                q = aug(q, mask, training=training, generator=generator, name="q_positions")
            return q, q, mask, mask
        if aug is None or not aug.draws(training):
            return q, k, mask, k_mask  # mean-normalisation is a common offset: a bias ignores it
        if q.shape[0] != k.shape[0]:  # per-sample draws need the batch on both sides
            if 1 not in (q.shape[0], k.shape[0]):
                raise ValueError(
                    "q_positions and k_positions batch sizes must match or be 1, got "
                    f"{tuple(q.shape)} and {tuple(k.shape)}"
                )
            b = max(q.shape[0], k.shape[0])
            q, k = q.expand(b, -1, -1), k.expand(b, -1, -1)
            mask = None if mask is None else mask.expand(b, -1)
            k_mask = None if k_mask is None else k_mask.expand(b, -1)
        q, k = aug.pair(q, k, mask, k_mask, generator=generator)
        return q, k, mask, k_mask
