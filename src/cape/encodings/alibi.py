"""ALiBi over continuous, optionally CAPE-augmented positions (Press et al., ICLR 2022).

A fixed bias -m_h |p_i - p_j| on the attention logits of head h: no parameters, nothing added to
the content. The bias depends on relative positions only, so CAPE's global shift (and
mean-normalisation) leave it unchanged; global scaling and local shifts do change it.
"""

from __future__ import annotations

import torch

from .._checks import check_bool, check_generator, check_tensor
from ..augment import Augmentation
from ..functional.alibi import alibi_bias, alibi_slopes, check_slopes
from ..positions import as_positions
from .base import float32_region
from .in_attention import AttentionBias

__all__ = ["ALiBi", "bias_positions"]


class ALiBi(AttentionBias):
    """Attention with linear biases: `ALiBi(heads)(q_positions, k_positions)` -> bias.

    heads: H, one slope per head (`cape.functional.alibi_slopes`, the paper's) unless `slopes`
    (a sequence or tensor [H], each > 0) is given. causal: the paper's causal form (see
    `alibi_bias`; keys ahead get 0, for attention that masks them). augmentation: CAPE's
    `Augmentation` of the positions, applied in train mode.

    It acts inside attention (the bias protocol, `cape.encodings.in_attention`:
    `MultiheadAttention(biases=[...])`): one module per layer; `dim` of `cape.build("alibi",
    dim)` is the number of heads H (not a width).
    """

    per_head = True  # cape.build's dim is H, not the head size (models.plan.attention_size)

    def __init__(
        self,
        heads: int,
        *,
        causal: bool = False,
        augmentation: Augmentation | None = None,
        slopes: torch.Tensor | list[float] | tuple[float, ...] | None = None,
    ) -> None:
        super().__init__(heads, augmentation)
        self.causal = check_bool("causal", causal)
        given = alibi_slopes(heads) if slopes is None else check_slopes(slopes, heads)
        self._slopes = given.detach().cpu().clone()
        self.register_buffer("slopes", self._slopes.clone(), persistent=False)

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        super()._apply(fn, recurse)
        # .to(bf16) must not round the slopes: they stay float32 wherever the module goes
        self.slopes = self._slopes.to(self.slopes.device)
        return self

    def forward(
        self,
        q_positions: torch.Tensor,
        k_positions: torch.Tensor | None = None,
        *,
        mask: torch.Tensor | None = None,
        k_mask: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """-> bias float32 [B, H, Tq, Tk] to add to the logits (B = 1: shared by the batch).

        q_positions: [B, Tq] or [B, Tq, 1]; k_positions: [B, Tk(, 1)], None = self-attention
        (the keys are the queries: one augmentation draw for both). mask / k_mask: [B, Tq] /
        [B, Tk] bool, True at real tokens (padded positions count as 0). In train mode the
        augmentation perturbs the positions (per sample: give [B, T] positions, not [1, T]);
        cross-attention draws one global shift and scale for both sides (`augment_pair`).
        """
        q, k, _, _ = bias_positions(
            self.augmentation, self.training, q_positions, k_positions, mask, k_mask, generator
        )
        with float32_region(q.device):
            return alibi_bias(q, k, self.slopes, self.causal)

    def bias_of(self, q_positions, k_positions, mask, k_mask, allowed, generator):
        return self(q_positions, k_positions, mask=mask, k_mask=k_mask, generator=generator)

    def extra_repr(self) -> str:
        return self._bias_repr(heads=self.heads, causal=self.causal)


def bias_positions(
    augmentation: Augmentation | None,
    training: bool,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor | None,
    mask: torch.Tensor | None,
    k_mask: torch.Tensor | None,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The query and key positions an attention bias (ALiBi, FIRE) reads -> (q [B, Tq, 1],
    k [B, Tk, 1], mask, k_mask), augmented in training. k_positions None: self-attention, the
    keys are the queries (one draw for both). Cross-attention draws one global shift and scale
    for both sides (`augment_pair`), per sample: a batch of 1 on one side is expanded."""
    check_generator("generator", generator)
    check_tensor("q_positions", q_positions, ndims=(2, 3))
    if k_positions is not None:
        check_tensor("k_positions", k_positions, ndims=(2, 3))
    elif k_mask is not None:
        raise ValueError("k_mask describes k_positions: give k_positions too")
    with float32_region(q_positions.device):  # autocast must not touch the positions
        q = as_positions(q_positions, mask=mask, dims=1, name="q_positions")
        aug = augmentation
        if k_positions is None:
            if aug is not None:
                q = aug(q, mask, training=training, generator=generator, name="q_positions")
            return q, q, mask, mask
        k = as_positions(k_positions, mask=k_mask, dims=1, name="k_positions", mask_name="k_mask")
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
