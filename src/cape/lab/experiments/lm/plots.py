"""The language-model report's two plots, drawn here (matplotlib, the `plot` extra): perplexity
against the evaluation length and the loss by position, both with log axes where the range
asks for them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cape.lab.io import atomic_write
from cape.lab.viz.plots import series_style

__all__ = ["can_plot", "plot_lines"]

Cell = Mapping[str, Any]


def can_plot() -> bool:
    """Whether matplotlib is there: the report skips its PNGs without it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot_lines(
    cells: Sequence[Cell],
    path: Path,
    *,
    x: str,
    order: Sequence[str],
    x_label: str,
    y_label: str,
    title: str,
    vline: float,
    logy: bool = False,
) -> Path:
    """One line per row (`order`) of summary cells {"row", x, "mean", "std"} (error bars: std
    over seeds), log x, a dashed line at `vline` (the training context); PNG written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9.0, 4.8))
    shown = [n for n in order if any(c["row"] == n for c in cells)]
    for i, name in enumerate(shown):
        mine = sorted((c for c in cells if c["row"] == name), key=lambda c: c[x])
        style = series_style(i)  # the other reports' colours, markers and dashes: no two alike
        ax.errorbar(
            [c[x] for c in mine],
            [c["mean"] for c in mine],
            yerr=[c["std"] if c["n"] > 1 else 0.0 for c in mine],
            label=name,
            color=style["color"],
            linestyle=style["linestyle"],
            marker=style["marker"] if len(mine) < 12 else None,
            markersize=3,
            capsize=2,
        )
    ax.axvline(vline, color="grey", linestyle="--", linewidth=1, label="training context L")
    ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set(xlabel=x_label, ylabel=y_label, title=title)
    ax.grid(True, which="both", alpha=0.3)
    # beside the axes: 16 rows inside would hide the lines they name
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    try:
        return atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    finally:
        plt.close(fig)
