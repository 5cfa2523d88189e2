"""ALiBi over continuous, optionally CAPE-augmented positions (Press et al., ICLR 2022).

A fixed bias -m_h |p_i - p_j| on the attention logits of head h: no parameters, nothing added to
the content. The bias depends on relative positions only, so CAPE's global shift (and
mean-normalisation) leave it unchanged; global scaling and local shifts do change it.
"""

from __future__ import annotations

import torch

from .._checks import check_bool
from ..augment import Augmentation
from ..functional.alibi import alibi_bias, alibi_slopes, check_slopes
from .in_attention import PositionBias

__all__ = ["ALiBi"]


class ALiBi(PositionBias):
    """Attention with linear biases: `ALiBi(heads)(q_positions, k_positions)` -> bias.

    heads: H, one slope per head (`cape.functional.alibi_slopes`, the paper's) unless `slopes`
    (a sequence or tensor [H], each > 0) is given. causal: the paper's causal form (see
    `alibi_bias`; keys ahead get 0, for attention that masks them). augmentation: CAPE's
    `Augmentation` of the positions, applied in train mode.

    It acts inside attention (the bias protocol, `cape.encodings.in_attention`:
    `MultiheadAttention(biases=[...])`); having no parameters, one module (and one bias per
    forward) serves every layer of a stack. `dim` of `cape.build("alibi", dim)` is the number
    of heads H (not a width).
    """

    per_head = True  # cape.build's dim is H, not the head size (models.plan.attention_size)
    mask_free = True  # -m_h |p_i - p_j| reads no mask: one bias per forward serves every layer

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
        if slopes is None:
            with torch.device("cpu"):  # the float32 master, also under a meta device
                given = alibi_slopes(heads)
        else:
            given = check_slopes(slopes, heads)
        self.register_float32("slopes", given)  # .to(bf16) must not round them

    def bias_from(self, q, k, k_mask, attn_mask, q_positions, k_positions):
        """-alpha_h |q_i - k_j| (`alibi_bias`): it reads neither mask (every key is penalised
        by its distance alone)."""
        return alibi_bias(q, k, self.slopes, self.causal)

    def extra_repr(self) -> str:
        return self._bias_repr(heads=self.heads, causal=self.causal)
