"""Learned absolute embedding tables: abspos 1D (Embed-1D), ViT's 2D grid, per-axis Embed-ND.

Tables are initialised N(0, init_std^2) truncated at two standard deviations. Lookups gather in
the parameters' dtype and return float32 (the base casts to the content dtype).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_choice, check_float, check_int
from ..augment import Augmentation
from ..positions import as_positions
from .base import PositionalEncoding, float32_region

__all__ = ["AbsPos1d", "AbsPos2d", "EmbedND"]


def _init_table(table: torch.Tensor, std: float) -> None:
    with torch.no_grad():
        if std == 0:
            table.zero_()
        else:
            nn.init.trunc_normal_(table, std=std, a=-2.0 * std, b=2.0 * std)


class AbsPos1d(PositionalEncoding):
    """abspos: one learned vector per token/frame index (LFF's Embed-1D over flattened positions).

    dim: D. num_positions: N, the table size. overflow: what an index outside [0, N) gets:
    "mod" -> E(t mod N), the CAPE paper's extrapolation for longer inputs (sec. 5.2; negative
    indices wrap the same way), "clamp" -> E(0) below, E(N-1) above.
    Positions [B, T(, 1)] are floored to integers; by default the token indices 0..T-1.
    forward(x: [B, T, D] | None, *, positions, lengths, mask, generator) -> [B, T, D].
    Units "index": a time in seconds means nothing to a table (`hop` is refused).
    """

    units = "index"

    def __init__(
        self,
        dim: int,
        num_positions: int,
        *,
        overflow: str = "mod",
        init_std: float = 0.02,
        augmentation: Augmentation | None = None,
    ) -> None:
        check_int("dim", dim)
        check_int("num_positions", num_positions)
        super().__init__(dim, 1, augmentation)
        self.num_positions = num_positions
        self.overflow = check_choice("overflow", overflow, ("mod", "clamp"))
        self.init_std = check_float("init_std", init_std)
        self.table = nn.Parameter(torch.empty(num_positions, dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _init_table(self.table, self.init_std)

    def index(self, positions: torch.Tensor) -> torch.Tensor:
        """positions: [...] float -> table rows [...] long, floor then mod N or clamp."""
        # clamp first: .long() of a float beyond int64 is undefined (floats > 2^24 are coarse
        # anyway)
        idx = torch.floor(positions).clamp(-(2.0**62), 2.0**62).long()
        if self.overflow == "mod":
            return torch.remainder(idx, self.num_positions)  # >= 0 for negative idx too
        return idx.clamp(0, self.num_positions - 1)

    def embed(self, positions: torch.Tensor) -> torch.Tensor:
        """positions: [B, T, 1] -> [B, T, D] float32."""
        return self.table[self.index(positions[..., 0])].to(torch.float32)

    def extra_repr(self) -> str:
        return (
            super().extra_repr()
            + f", num_positions={self.num_positions}, overflow={self.overflow!r}"
        )


def _grid(name: str, grid: object, minimum: int = 1) -> tuple[int, int]:
    if not isinstance(grid, (tuple, list)) or len(grid) != 2:
        raise ValueError(f"{name} must be a pair (H, W) of ints >= {minimum}, got {grid!r}")
    return (
        check_int(f"{name}[0]", grid[0], minimum=minimum),
        check_int(f"{name}[1]", grid[1], minimum=minimum),
    )


class AbsPos2d(PositionalEncoding):
    """ViT's learned grid of patch positions, resampled bicubically for other grids (CAPE app. B).

    dim: D. grid: (H0, W0), the table's grid. cls_token: also learn a position for a class token
    (never resampled: CAPE sec. 5.1, footnote 3).
    forward(x: [B, H, W, D] -> [B, H, W, D] (grid part only); or x: [B, T, D] with grid=(H, W),
    T = H*W or, with cls_token, 1 + H*W (row 0 = class token); or x=None with grid ->
    [1, H*W(+1), D] float32). grid defaults to the table's grid.
    positions: [B, T, 2] (x, y) in the table's frame: the image spans [-1, 1] on each axis and
    cell j of N sits at its centre (2j + 1) / N - 1 (`grid_positions`); the table is sampled
    there bicubically (`F.grid_sample`, align_corners=False, border padding), which at the
    centres of an H x W grid equals the resampled table up to float rounding.
    """

    def __init__(
        self, dim: int, grid: tuple[int, int], *, cls_token: bool = False, init_std: float = 0.02
    ) -> None:
        check_int("dim", dim)
        height, width = _grid("grid", grid)
        if not isinstance(cls_token, bool):
            raise TypeError(f"cls_token must be a bool, got {cls_token!r}")
        super().__init__(dim, 2, None)
        self.grid = (height, width)
        self.init_std = check_float("init_std", init_std)
        self.table = nn.Parameter(torch.empty(height, width, dim))
        self.cls_position = nn.Parameter(torch.empty(dim)) if cls_token else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _init_table(self.table, self.init_std)
        if self.cls_position is not None:
            _init_table(self.cls_position, self.init_std)

    def resample(self, grid: tuple[int, int]) -> torch.Tensor:
        """The table for grid (H, W) -> [H, W, D] in the table's dtype; the table itself if same
        (a 0-size grid: an empty table, as T = 0)."""
        height, width = _grid("grid", grid, minimum=0)
        if (height, width) == self.grid:
            return self.table
        if height * width == 0:
            return self.table.new_zeros(height, width, self.dim)
        with float32_region(self.table.device):
            src = self.table.to(torch.float32).permute(2, 0, 1)[None]  # [1, D, H0, W0]
            out = F.interpolate(src, size=(height, width), mode="bicubic", align_corners=False)
        return out[0].permute(1, 2, 0).to(self.table.dtype)

    def grid_positions(
        self,
        height: int,
        width: int,
        *,
        extent: float | None = None,
        batch: int = 1,
        device: torch.device | str | None = None,
    ) -> torch.Tensor:
        """Cell centres of an H x W grid in the table's frame -> [B, H*W, 2] (x, y)."""
        if extent is not None:
            raise ValueError(
                "extent applies to continuous encodings; AbsPos2d's table spans the image"
            )
        check_int("height", height, minimum=0)
        check_int("width", width, minimum=0)
        ys = (2 * torch.arange(height, device=device, dtype=torch.float32) + 1) / height - 1
        xs = (2 * torch.arange(width, device=device, dtype=torch.float32) + 1) / width - 1
        pos = torch.stack(torch.meshgrid(xs, ys, indexing="xy"), dim=-1).reshape(-1, 2)
        return pos[None].expand(check_int("batch", batch, minimum=0), -1, -1)

    def embed(self, positions: torch.Tensor) -> torch.Tensor:
        """positions: [B, T, 2] (x, y) -> [B, T, D] float32, the table sampled bicubically."""
        table = self.table.to(torch.float32).permute(2, 0, 1)[None]  # [1, D, H0, W0]
        batch, length = positions.shape[:2]
        # beyond +-2 every bicubic tap sits on the border (padding_mode border): clamping
        # changes nothing there and keeps grid_sample's unnormalisation finite
        grid = positions.reshape(1, batch * length, 1, 2).clamp(-2.0, 2.0)
        out = F.grid_sample(table, grid, mode="bicubic", padding_mode="border", align_corners=False)
        return out[0, :, :, 0].t().reshape(batch, length, self.dim)

    def grid_table(
        self, x: torch.Tensor | None, grid: tuple[int, int] | None, extent: float | None
    ) -> torch.Tensor:
        """The table resampled to the grid (the class token's row first, where x has one)."""
        if extent is not None:
            raise ValueError(
                "extent applies to continuous encodings; AbsPos2d's table spans the image"
            )
        if x is not None and x.dim() == 4:
            if grid is not None and tuple(grid) != tuple(x.shape[1:3]):
                raise ValueError(
                    f"grid {tuple(grid)} does not match x's grid {tuple(x.shape[1:3])}"
                )
            table = self.resample((x.shape[1], x.shape[2]))
            return table.to(x.dtype)[None].expand(x.shape)
        height, width = _grid("grid", self.grid if grid is None else grid, minimum=0)
        cells = height * width
        with_cls = self.cls_position is not None and (x is None or x.shape[1] == cells + 1)
        if x is not None and x.shape[1] != cells + with_cls:
            allowed = f"{cells} or {cells + 1}" if self.cls_position is not None else f"{cells}"
            raise ValueError(
                f"x has {x.shape[1]} tokens but grid {(height, width)} needs T = {allowed}"
                + ("" if grid is not None else "; pass grid=(H, W)")
            )
        emb = self.resample((height, width)).reshape(cells, self.dim)
        if with_cls:
            assert self.cls_position is not None
            emb = torch.cat([self.cls_position[None].to(emb.dtype), emb])
        dtype = torch.float32 if x is None else x.dtype
        batch = 1 if x is None else x.shape[0]
        return emb.to(dtype)[None].expand(batch, -1, -1)

    def forward(  # type: ignore[override]
        self,
        x: torch.Tensor | None = None,
        *,
        grid: tuple[int, int] | None = None,
        **kwargs: object,
    ) -> torch.Tensor:
        """As `PositionalEncoding.forward`; x [B, T, D] without positions means the table's grid."""
        if (
            grid is None
            and kwargs.get("positions") is None
            and isinstance(x, torch.Tensor)
            and x.dim() == 3
        ):
            grid = self.grid  # a full grid by default: [B, H0*W0(+1), D]
        return super().forward(x, grid=grid, **kwargs)  # type: ignore[arg-type]

    def extra_repr(self) -> str:
        return f"dim={self.dim}, grid={self.grid}, cls_token={self.cls_position is not None}"


class EmbedND(PositionalEncoding):
    """One learned table per axis, concatenated: LFF's Embed-2D (images) and Embed-4D (boxes).

    dim: D, divisible by M = len(sizes). sizes: bins per axis. Axis m owns channels
    [m D/M, (m+1) D/M). Positions [B, T, M]: integer tensors are bin indices (clamped to
    [0, n-1]); floats are quantised, bin = floor((p - low) / (high - low) * n), clamped. For
    Embed-2D on a grid pass integer row/column indices (or `grid_positions(H, W)`, which are
    (x, y) in [-1, 1], with sizes=(W, H): each patch then lands in its own bin). Integer index i
    enters the float path at its bin centre low + (i + 1/2)(high - low)/n, so an augmentation
    acts in the same units. Units "index": its grid positions are (column, row) indices.
    """

    units = "index"

    def __init__(
        self,
        dim: int,
        sizes: Sequence[int],
        *,
        low: float = -1.0,
        high: float = 1.0,
        init_std: float = 0.02,
        augmentation: Augmentation | None = None,
    ) -> None:
        check_int("dim", dim)
        if not isinstance(sizes, (tuple, list)) or not sizes:
            raise ValueError(f"sizes must be a non-empty sequence of ints >= 1, got {sizes!r}")
        sizes = tuple(check_int(f"sizes[{i}]", n) for i, n in enumerate(sizes))
        if dim % len(sizes):
            raise ValueError(f"dim must be divisible by len(sizes) = {len(sizes)}, got {dim}")
        low = check_float("low", low, minimum=-float("inf"))
        high = check_float("high", high, minimum=-float("inf"))
        if not high > low:
            raise ValueError(f"high must be > low, got low={low}, high={high}")
        super().__init__(dim, len(sizes), augmentation)
        self.sizes, self.low, self.high = sizes, low, high
        self.init_std = check_float("init_std", init_std)
        # All axes in one table [sum(n), D/M]: a single gather with per-axis row offsets.
        self.table = nn.Parameter(torch.empty(sum(sizes), dim // len(sizes)))
        starts = torch.tensor((0,) + sizes[:-1]).cumsum(0)
        self.register_buffer("offsets", starts, persistent=False)
        self.register_buffer("bins", torch.tensor(sizes), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _init_table(self.table, self.init_std)

    def axis_table(self, axis: int) -> torch.Tensor:
        """The rows of axis `axis`: [sizes[axis], D/M]."""
        start = sum(self.sizes[:axis])
        return self.table[start : start + self.sizes[axis]]

    def read_positions(self, positions: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Integer positions [B, T, M] are bin indices -> their bin centres, float32 (0 at
        padding); float positions pass as they are."""
        if isinstance(positions, torch.Tensor) and not (
            positions.is_floating_point() or positions.is_complex() or positions.dtype == torch.bool
        ):
            idx = as_positions(positions, mask=mask, dims=self.pos_dim)  # float32 integers
            idx = torch.minimum(idx.clamp_min(0), (self.bins - 1).to(idx))
            width = (self.high - self.low) / self.bins.to(idx)
            positions = self.low + (idx + 0.5) * width
            if mask is not None:
                positions = torch.where(mask[..., None], positions, 0.0)
        return positions

    def index(self, positions: torch.Tensor) -> torch.Tensor:
        """positions: [..., M] float -> bins [..., M] long in [0, n_m - 1]."""
        n = self.bins.to(torch.float32)
        b = torch.floor((positions.to(torch.float32) - self.low) / (self.high - self.low) * n)
        return torch.minimum(b.clamp_min(0), n - 1).long()

    def embed(self, positions: torch.Tensor) -> torch.Tensor:
        """positions: [B, T, M] -> [B, T, D] float32 (axis tables concatenated)."""
        rows = self.table[self.index(positions) + self.offsets]  # [B, T, M, D/M]
        return rows.flatten(-2).to(torch.float32)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", sizes={self.sizes}, low={self.low}, high={self.high}"
