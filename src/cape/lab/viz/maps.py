"""`plot_maps`: a grid of 2D maps of any sizes, written as PNG (CAPE Figure 13: embedding
components at three resolutions; LFF Figure 2: similarity of the centre position to every other).
Validated, drawn by `_maps_figure` (tests read the images back from it), written atomically."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from cape.lab.viz.plots import _is_real, _plotter, _pyplot

if TYPE_CHECKING:
    import torch
    from matplotlib.figure import Figure

__all__ = ["plot_maps"]


def _as_image(m: object, name: str) -> np.ndarray:
    if hasattr(m, "detach"):  # torch.Tensor
        m = m.detach().cpu().float().numpy()  # type: ignore[union-attr]
    a = np.asarray(m, dtype=np.float64)
    if a.ndim != 2 or 0 in a.shape:
        raise ValueError(f"maps{name} must be a non-empty 2D array [H, W], got shape {a.shape}")
    return a


def _as_images(
    maps: Mapping[str, Mapping[str, torch.Tensor | np.ndarray]],
) -> dict[str, dict[str, np.ndarray]]:
    """The maps of each row checked and as float64 arrays, row and column keys as strings."""
    images: dict[str, dict[str, np.ndarray]] = {}
    for row, inner in maps.items():
        if not isinstance(inner, Mapping) or not inner:
            raise ValueError(f"maps[{row!r}] must be a non-empty mapping column -> [H, W] array")
        images[str(row)] = {str(c): _as_image(m, f"[{row!r}][{c!r}]") for c, m in inner.items()}
    return images


def _maps_figure(
    maps: Mapping[str, Mapping[str, torch.Tensor | np.ndarray]],
    *,
    title: str = "",
    cmap: str = "viridis",
    symmetric: bool = True,
    col_titles: bool = True,
    vmin: float | None = None,
    vmax: float | None = None,
) -> Figure:
    """The `plot_maps` figure: axes[r * ncols + c] shows maps[row r][column c]."""
    if not isinstance(maps, Mapping) or not maps:
        raise ValueError("maps must be a non-empty mapping row -> {column: [H, W] array}")
    if (vmin is None) != (vmax is None):
        raise ValueError(f"vmin and vmax must be given together, got vmin={vmin!r}, vmax={vmax!r}")
    if vmin is not None and not (_is_real(vmin) and _is_real(vmax) and vmin < vmax):
        raise ValueError(f"vmin must be a number below vmax, got vmin={vmin!r}, vmax={vmax!r}")
    images = _as_images(maps)
    nrows, ncols = len(images), max(len(inner) for inner in images.values())
    labels = any(images)  # a row label column when some row is named
    plt = _pyplot()
    fig, axes = plt.subplots(
        nrows,
        ncols,
        squeeze=False,
        figsize=(
            2.6 * ncols + 0.4 * labels,
            2.6 * nrows + (0.5 if title else 0.1) + 0.2 * col_titles,
        ),
    )
    for i, (row, inner) in enumerate(images.items()):
        for j, (col, a) in enumerate(inner.items()):
            ax = axes[i][j]
            lo, hi = vmin, vmax
            if lo is None and symmetric:
                m = float(np.nanmax(np.abs(a))) if np.isfinite(a).any() else 0.0
                lo, hi = (-m, m) if m > 0 else (-1.0, 1.0)
            ax.imshow(a, cmap=cmap, vmin=lo, vmax=hi, interpolation="nearest")
            if col_titles:
                ax.set_title(col, fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
            if j == 0 and row:
                ax.set_ylabel(row, fontsize=9)
        for j in range(len(inner), ncols):
            axes[i][j].axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


plot_maps = _plotter(
    _maps_figure,
    """A grid of 2D maps: one row per outer key (its label at the left; "" for none), one image
    per inner key (titled with it when `col_titles`). Images may have different shapes [H, W].
    Colour limits: `vmin`/`vmax` when given (shared), else ±max|v| per image when `symmetric`,
    else each image's own range. Returns `path`.""",
)
