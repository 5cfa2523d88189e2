"""FIRE over continuous, optionally CAPE-augmented positions (Li et al., ICLR 2024).

A learned bias f(psi(d_ij) / psi(n_i)) on the attention logits of every head (the maths and
our bidirectional form: `cape.functional.fire`). Its parameters: psi's scale c, the threshold
L and the MLP f (1 -> hidden -> H, ReLU). The bias depends on position differences only, so a
global shift (and mean-normalisation) leaves it unchanged; scaling and local shifts change it.
"""

from __future__ import annotations

import torch
from torch import nn

from .._checks import check_bool, check_float, check_int, check_tensor
from ..augment import Augmentation
from ..functional.fire import fire_distance, mlp_bias, normalised_distance
from .in_attention import PositionBias

__all__ = ["FIRE"]


class FIRE(PositionBias):
    """Functional interpolation for relative positions: `FIRE(heads)(q_positions)` -> bias.

    heads: H, the MLP's outputs (one bias per head). hidden: the MLP's width (the paper: 32).
    causal: the paper's causal form d_ij = max(p_i - p_j, 0) (keys ahead must be masked).
    c, threshold: initial psi scale and threshold L, both learned (defaults: the authors' code,
    c = 0.1, L = 512 in position units; seconds want a smaller L). augmentation: CAPE's
    `Augmentation` of the positions, applied in train mode.

    It acts inside attention (the bias protocol, `cape.encodings.in_attention`:
    `MultiheadAttention(biases=[...])`): one module per layer; `dim` of `cape.build("fire",
    dim)` is H.
    """

    per_head = True  # cape.build's dim is H, not the head size (models.plan.attention_size)
    reads_mask = True  # its normaliser counts the keys each query sees

    def __init__(
        self,
        heads: int,
        *,
        hidden: int = 32,
        causal: bool = False,
        c: float = 0.1,
        threshold: float = 512.0,
        augmentation: Augmentation | None = None,
    ) -> None:
        check_int("heads", heads)  # its MLP has one output per head: a number is needed
        super().__init__(heads, augmentation)
        self.hidden = check_int("hidden", hidden)
        self.causal = check_bool("causal", causal)
        check_float("c", c, strict=True)
        check_float("threshold", threshold, strict=True)
        self.c = nn.Parameter(torch.tensor(float(c), dtype=torch.float32))
        # L = |scale| x threshold0: the learned factor starts at 1 (the authors' parametrisation)
        self.threshold0 = float(threshold)
        self.threshold_scale = nn.Parameter(torch.tensor(1.0, dtype=torch.float32))
        self.mlp = nn.Sequential(nn.Linear(1, hidden), nn.ReLU(), nn.Linear(hidden, heads))

    @property
    def threshold(self) -> torch.Tensor:
        """The current threshold L = |threshold_scale| x the initial one (a 0-dim tensor)."""
        return self.threshold_scale.float().abs() * self.threshold0

    def bias_from(self, q, k, k_mask, attn_mask, q_positions, k_positions):
        """f(psi(d_ij) / psi(n_i)) (`cape.functional.fire_bias`'s maths); only visible keys
        (`k_mask`, `attn_mask`) set the normaliser n_i."""
        seen = None if k_mask is None else k_mask[:, None, :]
        if attn_mask is not None:  # its shape is checked against the given positions
            attn_mask = self._visible(attn_mask, q_positions, k_positions)
            seen = attn_mask if seen is None else seen & attn_mask
        lin1, lin2 = self.mlp[0], self.mlp[2]
        weights = (lin1.weight, lin1.bias, lin2.weight, lin2.bias)
        c, lim = self.c.float().abs(), self.threshold.abs()
        r = normalised_distance(q[..., 0], k[..., 0], c, lim, self.causal, seen)
        return mlp_bias(r, weights)

    def check_values(self, q: torch.Tensor, k: torch.Tensor) -> None:
        """A direct call's reach: |c| x |p_i - p_j| within float32 (`fire_distance`)."""
        fire_distance(q, k, self.c.detach(), self.threshold.detach(), self.causal)

    @staticmethod
    def _visible(
        attn_mask: object, q_positions: torch.Tensor, k_positions: torch.Tensor | None
    ) -> torch.Tensor:
        """attn_mask [B or 1, (1,) Tq or 1, Tk] bool -> [B or 1, Tq or 1, Tk]."""
        check_tensor("attn_mask", attn_mask, ndims=(3, 4))
        assert isinstance(attn_mask, torch.Tensor)
        if attn_mask.dtype != torch.bool:
            raise TypeError(f"attn_mask must be a bool tensor, got {attn_mask.dtype}")
        keys = q_positions if k_positions is None else k_positions
        b = max(q_positions.shape[0], keys.shape[0])
        m = attn_mask[:, 0] if attn_mask.dim() == 4 and attn_mask.shape[1] == 1 else attn_mask
        tq, tk = q_positions.shape[1], keys.shape[1]
        if (
            m.dim() != 3
            or m.shape[1] not in (1, tq)
            or m.shape[2] != tk
            or (b > 1 and m.shape[0] not in (1, b))
        ):
            raise ValueError(
                f"attn_mask must have shape [{b} or 1, (1,) {tq} or 1, {tk}], got "
                f"{list(attn_mask.shape)}"
            )
        return m

    def extra_repr(self) -> str:
        return self._bias_repr(heads=self.heads, hidden=self.hidden, causal=self.causal)
