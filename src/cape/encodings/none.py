"""No positions (the paper's *nopos*): a model that sees a bag of tokens."""

from __future__ import annotations

import torch
from torch import nn

from .._checks import check_int

__all__ = ["NoPos"]


class NoPos(nn.Module):
    """Returns a zero embedding `[B, T, D]` (a broadcast view: no memory, adding it is a no-op).

    Models may skip the addition altogether: `isinstance(enc, NoPos)`.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = check_int("dim", dim)

    def forward(self, x: torch.Tensor | None = None, **_: object) -> torch.Tensor:
        """x: [B, T, D] or [B, H, W, D] -> zeros of the same shape and dtype."""
        if x is None:
            raise ValueError("NoPos needs x to know the shape of the (zero) embedding")
        return x.new_zeros(()).expand(x.shape)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"
