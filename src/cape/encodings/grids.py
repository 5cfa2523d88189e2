"""Patch grids as the encodings read them: the grid arguments (`grid=(H, W)`, one per sample
of a packed batch, `fit_grid=(H, W)`), the positions an encoding reads on a grid (by its
`pos_dim` and `units`) and the sampling of that grid that fitted frequencies are derived from."""

from __future__ import annotations

import torch
from torch import nn

from .._checks import check_float, check_int
from ..augment import Augmentation
from ..functional.frequencies import aliased, grid_sampling
from ..positions import grid_indices, grid_positions

__all__ = [
    "resolve_grid",
    "check_grids",
    "layout_grid",
    "fit_grid_pair",
    "sampling_of",
    "count_aliased",
    "max_scaling_of",
]


def check_grids(grids: list, batch: int) -> list[tuple[int, int]]:
    """grids: one (H, W) per sample (a packed batch) -> a list of int pairs."""
    if len(grids) != batch:
        raise ValueError(f"grid must hold one (H, W) per sample ({batch}), got {len(grids)}")
    out = []
    for i, g in enumerate(grids):
        if not isinstance(g, (tuple, list)) or len(g) != 2:
            raise TypeError(f"grid[{i}] must be a pair (H, W) of ints >= 1, got {g!r}")
        out.append((check_int(f"grid[{i}][0]", g[0]), check_int(f"grid[{i}][1]", g[1])))
    return out


def layout_grid(
    module: nn.Module,
    height: int,
    width: int,
    *,
    extent: float | None,
    batch: int,
    device: torch.device | str | None,
) -> torch.Tensor:
    """The grid positions `module` reads (by its `pos_dim` and `units`) -> [B, H*W, 2]."""
    name = type(module).__name__
    if module.pos_dim != 2:
        raise ValueError(f"grid: {name} reads {module.pos_dim}-D positions, a grid needs 2 (x, y)")
    if module.units == "index":
        if extent is not None:
            raise ValueError(
                f"extent applies to continuous coordinates; {name} reads integer (column, row) "
                "indices"
            )
        return grid_indices(height, width, batch=batch, device=device)
    ext = 1.0 if extent is None else check_float("extent", extent, strict=True)
    return grid_positions(height, width, extent=ext, batch=batch, device=device)


class GridLayout:
    """`grid_positions(H, W)`, for an encoding that says what it reads (`pos_dim`, `units`)."""

    def grid_positions(
        self,
        height: int,
        width: int,
        *,
        extent: float | None = None,
        batch: int = 1,
        device: torch.device | str | None = None,
    ) -> torch.Tensor:
        """Positions of an H x W patch grid, row-major -> [B, H*W, M] (a broadcast view).

        Continuous units: (x, y) in [-extent, extent] (`cape.grid_positions`; extent: the
        module's own `extent` if it has one, else 1); index units: integer (column, row)
        indices (`cape.grid_indices`).
        """
        if extent is None:
            extent = getattr(self, "extent", None)
        return layout_grid(self, height, width, extent=extent, batch=batch, device=device)


def fit_grid_pair(grid: object, *, every_axis: bool = False) -> tuple[int, int] | None:
    """fit_grid: None or a pair (H, W) of ints -> None or the pair as a tuple. every_axis: the
    encoding fits each axis to its own spacing, so each needs two samples."""
    if grid is None:
        return None
    if not isinstance(grid, (tuple, list)) or len(grid) != 2:
        raise TypeError(f"fit_grid must be a pair (H, W) of ints >= 1, got {grid!r}")
    pair = check_int("fit_grid[0]", grid[0]), check_int("fit_grid[1]", grid[1])
    if max(pair) < 2:  # frequencies are fitted to the gaps between samples: one needs two
        raise ValueError(f"fit_grid must have at least 2 samples on some axis, got {pair}")
    if every_axis and min(pair) < 2:
        raise ValueError(
            f"fit_grid must have at least 2 samples on every axis (each axis's frequencies are "
            f"fitted to its own spacing), got {pair}"
        )
    return pair


def sampling_of(module: nn.Module, grid: object) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(spacing, span) per axis of the positions `module` reads for the patch grid (H, W)
    (`grid_positions`): what frequencies fitted to that grid are derived from."""
    height, width = fit_grid_pair(grid)  # type: ignore[misc]
    spacing, span = grid_sampling(module.grid_positions(height, width)[0])
    return tuple(spacing.tolist()), tuple(span.tolist())


def count_aliased(encoding: nn.Module, grid: object, *, extent: float | None = None) -> int:
    """How many of `encoding`'s frequencies (`.frequencies`, radians per unit) alias on the
    H x W patch grid it reads (`grid_positions(H, W, extent=extent)`): a frequency aliases when
    its phase steps by pi or more between neighbouring patches on some axis
    (`cape.functional.frequencies.aliased`). CAPE2d, SineND and 2-D Rotary have frequencies."""
    if not hasattr(encoding, "frequencies"):
        raise TypeError(
            f"encoding must have frequencies (CAPE2d, SineND, Rotary), got {encoding!r}"
        )
    if not isinstance(grid, (tuple, list)) or len(grid) != 2:
        raise TypeError(f"grid must be a pair (H, W) of ints >= 1, got {grid!r}")
    height, width = check_int("grid[0]", grid[0]), check_int("grid[1]", grid[1])
    positions = encoding.grid_positions(height, width, extent=extent)[0]
    return int(aliased(encoding.frequencies, grid_sampling(positions)[0]).sum())


def max_scaling_of(augmentation: Augmentation | None) -> float:
    """The largest global scaling of training (1 without augmentation, or for an augmentation
    that scales nothing: CAPE's is the one with a `max_global_scaling`): it multiplies phases."""
    return float(getattr(augmentation, "max_global_scaling", 1.0))


def resolve_grid(
    x: torch.Tensor | None, grid: object, dim: int
) -> tuple[int, int, int, tuple[int, ...]]:
    """x [B, H, W, D] or [B, H*W, D] (or None) and grid (H, W) -> (H, W, B, output shape).

    The output shape is x's ([B, H, W, D] or [B, H*W, D]); [1, H*W, D] without x.
    """
    if x is not None and x.dim() == 4:
        if grid is not None and tuple(grid) != tuple(x.shape[1:3]):  # type: ignore[arg-type]
            raise ValueError(f"grid {tuple(grid)} does not match x's grid {tuple(x.shape[1:3])}")  # type: ignore[arg-type]
        return x.shape[1], x.shape[2], x.shape[0], tuple(x.shape)
    if grid is None:
        shape = None if x is None else tuple(x.shape)
        raise ValueError(f"x of shape {shape} needs grid=(H, W) or positions")
    if not isinstance(grid, (tuple, list)) or len(grid) != 2:
        raise TypeError(f"grid must be a pair (H, W) of ints >= 0, got {grid!r}")
    height = check_int("grid[0]", grid[0], minimum=0)  # a 0-size grid: empty, as T = 0
    width = check_int("grid[1]", grid[1], minimum=0)
    if x is None:
        return height, width, 1, (1, height * width, dim)
    if x.dim() != 3 or x.shape[1] != height * width:
        raise ValueError(
            f"x must be [B, {height * width}, D] for grid {(height, width)}, got {tuple(x.shape)}"
        )
    return height, width, x.shape[0], tuple(x.shape)
