"""No positions (the paper's *nopos*): a model that sees a bag of tokens."""

from __future__ import annotations

import torch
from torch import nn

from .._checks import check_float, check_generator, check_int, check_limit, check_real
from ..positions import resolve_mask
from .base import check_encoding_content
from .grids import check_grids, resolve_grid

__all__ = ["NoPos"]


class NoPos(nn.Module):
    """Returns a zero embedding `[B, T, D]` (a broadcast view: no memory, adding it is a no-op).

    Called like every absolute encoding (`cape.PositionalEncoding`); it reads no positions
    (`kind = "none"`), so models skip it altogether.
    forward(x: [B, T, D] or [B, H, W, D] | None, *, positions: [B, T(, M)], grid: (H, W), ...)
    -> zeros in x's shape and dtype, or float32 [B, T, D] from positions, [1, H*W, D] from grid.
    """

    kind = "none"
    units = "continuous"
    pos_dim = None  # any

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = check_int("dim", dim)
        self.augmentation = None

    def forward(
        self,
        x: torch.Tensor | None = None,
        *,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        lengths: torch.Tensor | None = None,
        hop: float | torch.Tensor | None = None,
        grid: tuple[int, int] | None = None,
        extent: float | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        # nothing is read, but the arguments are checked as every encoding checks them
        _check_unused(hop, extent, generator)
        if positions is not None:  # not read, but refused as the other encodings refuse them
            check_real("positions", positions, ndims=(2, 3))
        if isinstance(grid, list) and isinstance(positions, torch.Tensor):
            check_grids(grid, positions.shape[0])  # the grids packed positions come from
        elif grid is not None and (x is None or isinstance(x, torch.Tensor)):
            resolve_grid(x, grid, self.dim)
        check_encoding_content(x, self.dim, ndims=(3, 4))
        if x is not None:
            if mask is not None or lengths is not None:
                resolve_mask(x.shape[0], x.shape[1], lengths, mask)
            return x.new_zeros(()).expand(x.shape)
        if positions is not None:
            if mask is not None or lengths is not None:
                resolve_mask(positions.shape[0], positions.shape[1], lengths, mask)
            shape = (positions.shape[0], positions.shape[1], self.dim)
            return positions.new_zeros((), dtype=torch.float32).expand(shape)
        if grid is not None:
            shape = resolve_grid(None, grid, self.dim)[3]
            return torch.zeros((), dtype=torch.float32).expand(shape)
        raise ValueError("give x ([B, T, D]), positions ([B, T, M]) or grid=(H, W)")

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


def _check_unused(hop: object, extent: object, generator: object) -> None:
    if hop is not None and not isinstance(hop, torch.Tensor):
        if isinstance(hop, bool) or not isinstance(hop, (int, float)):
            raise TypeError(f"hop must be a float or a tensor [B] / [B, T], got {hop!r}")
        check_limit("hop", check_float("hop", hop, strict=True))
    if extent is not None:
        check_limit("extent", check_float("extent", extent, strict=True))
    check_generator("generator", generator)
