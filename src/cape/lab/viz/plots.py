"""The plots of every experiment, drawn from `cape.lab.report.summarize` cells and written as PNG.

- `plot_curves`: a measure over a swept variable, one line per series (CAPE Figure 2: top-1
  accuracy vs evaluation resolution per encoding; WER vs utterance length).
- `plot_tradeoff`: one summary against another, points matched by (series, key) (CAPE Figure 4:
  accuracy vs throughput, each point labelled with its resolution).
- `plot_maps` (`cape.lab.viz.maps`): a grid of 2D maps of any sizes.

Each `plot_*` validates its arguments (ValueError), builds the figure with a private
`_*_figure` function (tests read the plotted data back from it), writes it atomically
(`cape.lab.io.atomic_write`) at 100 dpi and closes it; `_plotter` makes it from the figure
function, whose keywords it takes. matplotlib is imported lazily (Agg backend).
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cape.lab.io import atomic_write

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["plot_curves", "plot_tradeoff"]

DPI = 100
DENSE = 12  # more points than this in a series: a line without markers
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
Cell = Mapping[str, Any]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Figure, path: str | Path) -> Path:
    """Write `fig` to `path` as PNG atomically, then close it."""
    try:
        return atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=DPI))
    finally:
        _pyplot().close(fig)


def _plotter(figure: Callable[..., Figure], doc: str) -> Callable[..., Path]:
    """The public `plot_*` of a `_*_figure` function, its keywords written once: `figure`'s
    arguments with `path` after the positional ones (the data); it draws the figure, writes it to
    `path` (`_save`) and returns `path`. The signature (`inspect`, `help`) shows all of them."""
    sig = inspect.signature(figure)
    params = list(sig.parameters.values())
    data = sum(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)
    path = inspect.Parameter(
        "path", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="str | Path"
    )
    signature = sig.replace(parameters=[*params[:data], path, *params[data:]])
    signature = signature.replace(return_annotation="Path")

    def plot(*args: Any, **kwargs: Any) -> Path:
        arguments = signature.bind(*args, **kwargs).arguments
        out = arguments.pop("path")
        return _save(figure(**arguments), out)

    name = figure.__name__.removeprefix("_").removesuffix("_figure")
    plot.__name__ = plot.__qualname__ = f"plot_{name}"
    plot.__module__, plot.__doc__ = figure.__module__, doc
    plot.__signature__ = signature  # type: ignore[attr-defined]
    return plot


def _check_cells(summary: Sequence[Cell], name: str, keys: Sequence[str]) -> None:
    if not summary:
        raise ValueError(f"{name} must hold at least one cell (summarize() of no records is empty)")
    for i, cell in enumerate(summary):
        if not isinstance(cell, Mapping):
            raise ValueError(
                f"{name}[{i}] must be a mapping (a summarize() cell), got {type(cell).__name__}"
            )
        for k in keys:
            if k not in cell:
                raise ValueError(f"{name}[{i}] has no key {k!r} (keys: {sorted(map(str, cell))})")


def _is_real(v: object) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _sort_key(v: Any) -> tuple[int, Any]:
    return (0, float(v), "") if _is_real(v) else (1, 0.0, str(v))


def _mean_std(cell: Cell) -> tuple[float, float]:
    """The cell's mean and its std where n > 1 (0.0 otherwise: no error bar)."""
    mean = float(cell["mean"]) if cell["mean"] is not None else float("nan")
    std = cell.get("std")
    if int(cell.get("n", 1)) > 1 and std is not None and np.isfinite(float(std)):
        return mean, float(std)
    return mean, 0.0


def _order(seen: list[Any], order: Sequence[Any] | None) -> list[Any]:
    """`order`'s values that occur, then the others in first-appearance order."""
    if order is None:
        return seen
    return [v for v in order if v in seen] + [v for v in seen if v not in list(order)]


def _fmt(v: Any) -> str:
    return f"{v:g}" if _is_real(v) else str(v)


def _series(
    summary: Sequence[Cell], name: str, x: str, series: str, order: Sequence[Any] | None
) -> dict[Any, list[tuple[Any, Cell]]]:
    """series value -> [(x value, cell)] sorted by x; two cells for one (series, x) raise."""
    groups: dict[Any, dict[Any, Cell]] = {}
    for cell in summary:
        s, v = cell[series], cell[x]
        if v in groups.setdefault(s, {}):
            raise ValueError(
                f"{name} has two cells for {series}={s!r}, {x}={v!r}: summarize by "
                f"exactly [{series!r}, {x!r}] (or filter the records) first"
            )
        groups[s][v] = cell
    return {
        s: sorted(groups[s].items(), key=lambda kv: _sort_key(kv[0]))
        for s in _order(list(groups), order)
    }


def _plain(v: float) -> str:
    """A tick label without exponents: 70, 20,000, 0.05."""
    return f"{v:,.0f}" if v >= 1 and v == round(v) else f"{v:g}"


def _plain_log_ticks(ax: Any, axis: str = "x") -> None:
    """A log `axis` ("x" or "y") with plain labels; minor ticks labelled when the data span few
    decades."""
    from matplotlib.ticker import FuncFormatter

    lo, hi = sorted(ax.dataLim.intervalx if axis == "x" else ax.dataLim.intervaly)
    decades = np.log10(hi / lo) if lo > 0 else np.inf
    keep = set(range(2, 10)) if decades <= 0.6 else {2, 5} if decades <= 2 else set()

    def minor(v: float, _: int) -> str:
        mantissa = round(v / 10 ** np.floor(np.log10(v)), 6) if v > 0 else 0
        return _plain(v) if mantissa in keep else ""

    which = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    which.set_major_formatter(FuncFormatter(lambda v, _: _plain(v)))
    which.set_minor_formatter(FuncFormatter(minor))


def _line(ax: Any, i: int, label: str, xs: Sequence[float], ys: Sequence[float]) -> str:
    """Series i's line -> its colour. Colour, marker and line style are unique for the first 30
    series (ten colours, each run of ten with its own line style and markers offset, so C0 never
    repeats with "o")."""
    run, color = i // 10, f"C{i % 10}"
    # a curve of many points (loss by position): markers would hide it
    marker = "None" if len(xs) > DENSE else MARKERS[(i + 3 * run) % len(MARKERS)]
    linestyle = ("-", "--", ":")[run % 3]
    ax.plot(xs, ys, color=color, marker=marker, linestyle=linestyle, label=label, markersize=5)
    return color


def _style(
    ax: Any, *, title: str, x_label: str, y_label: str, logx: bool, logy: bool = False
) -> None:
    if logx:
        _plain_log_ticks(ax)
    if logy:
        _plain_log_ticks(ax, "y")
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if len(ax.get_legend_handles_labels()[1]) > 8:  # many series: legend beside the axes
        ax.figure.set_size_inches(9.0, 4.8)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    else:
        ax.legend(fontsize=8)


def _curves_figure(
    summary: Sequence[Cell],
    *,
    x: str,
    series: str,
    y_label: str,
    x_label: str,
    title: str = "",
    series_order: Sequence[Any] | None = None,
    vline: float | None = None,
    vline_label: str = "train size",
    logx: bool = False,
    logy: bool = False,
    percent: bool = False,
    band: tuple[str, str] | None = None,
) -> Figure:
    """The `plot_curves` figure (one axes; a Line2D labelled str(series value) per series; with
    `band`, one filled PolyCollection per series)."""
    if band is not None and not (
        isinstance(band, (tuple, list)) and len(band) == 2 and all(isinstance(k, str) for k in band)
    ):
        raise ValueError(f"band must be None or a pair of cell keys (low, high), got {band!r}")
    _check_cells(summary, "summary", [x, series, "mean", *(band or ())])
    for i, cell in enumerate(summary):
        if not _is_real(cell[x]):
            raise ValueError(f"summary[{i}][{x!r}] must be a number (the x axis), got {cell[x]!r}")
    if vline is not None and not _is_real(vline):
        raise ValueError(f"vline must be a number or None, got {vline!r}")
    groups = _series(summary, "summary", x, series, series_order)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    xs_all: set[float] = set()
    for i, (s, points) in enumerate(groups.items()):
        xs = [float(v) for v, _ in points]
        ys, err = zip(*(_mean_std(c) for _, c in points), strict=True)
        color = _line(ax, i, str(s), xs, ys)
        if band is not None:
            # None: NaN after a JSON round trip
            lo, hi = ([np.nan if c[k] is None else float(c[k]) for _, c in points] for k in band)
            ax.fill_between(xs, lo, hi, color=color, alpha=0.2, linewidth=0)
        elif any(e > 0 for e in err):
            ax.errorbar(xs, ys, yerr=err, fmt="none", ecolor=color, capsize=3, elinewidth=1)
        xs_all.update(xs)
    if vline is not None:
        ax.axvline(float(vline), linestyle="--", color="0.4", linewidth=1, label=vline_label)
    if percent:
        from matplotlib.ticker import PercentFormatter

        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
    _style(ax, title=title, x_label=x_label, y_label=y_label, logx=logx, logy=logy)
    if len(xs_all) <= 12:  # label every measured x (resolutions, lengths)
        from matplotlib.ticker import NullFormatter

        ticks = sorted(xs_all)
        ax.set_xticks(ticks, [_fmt(t) for t in ticks])
        ax.xaxis.set_minor_formatter(NullFormatter())
    fig.tight_layout()
    return fig


plot_curves = _plotter(
    _curves_figure,
    """One line (with markers) per `series` value of the cells' mean over `x` (numbers, sorted);
    error bars of one std where n > 1; a dashed vertical line at `vline` (e.g. the training
    resolution). `series_order` puts those series first (and in that order). `logx` / `logy`:
    log axes (plain tick labels on x); a series of more than 12 points is drawn without
    markers. With `percent` the
    means are fractions shown as percentages. `band=(low, high)` names two keys of every cell
    (e.g. a confidence interval's ends): a shaded band between them replaces the error bars.
    Returns `path`.""",
)


def _tradeoff_points(
    summary_x: Sequence[Cell],
    summary_y: Sequence[Cell],
    key: str,
    series: str,
    annotate: str | None,
) -> dict[Any, list[tuple[Any, Cell, Cell]]]:
    """series -> [(key value, x cell, y cell)] for the (series, key) pairs in both summaries."""
    _check_cells(summary_x, "summary_x", [key, series, "mean"])
    _check_cells(summary_y, "summary_y", [key, series, "mean"])
    xs = {
        s: dict(points) for s, points in _series(summary_x, "summary_x", key, series, None).items()
    }
    out: dict[Any, list[tuple[Any, Cell, Cell]]] = {}
    for s, points in _series(summary_y, "summary_y", key, series, None).items():
        matched = [(k, xs[s][k], cy) for k, cy in points if k in xs.get(s, {})]
        if matched:
            out[s] = matched
    if not out:
        raise ValueError(f"summary_x and summary_y share no ({series!r}, {key!r}) pair to plot")
    if annotate is not None:
        for s, points in out.items():
            for k, cx, cy in points:
                if annotate not in cy and annotate not in cx:
                    raise ValueError(
                        f"annotate {annotate!r} is not a key of the cells for "
                        f"{series}={s!r}, {key}={k!r}"
                    )
    return out


def _tradeoff_figure(
    summary_x: Sequence[Cell],
    summary_y: Sequence[Cell],
    *,
    key: str,
    series: str,
    x_label: str,
    y_label: str,
    title: str = "",
    logx: bool = True,
    annotate: str | None = None,
) -> Figure:
    """The `plot_tradeoff` figure (a Line2D labelled str(series value) per series)."""
    groups = _tradeoff_points(summary_x, summary_y, key, series, annotate)
    if logx:
        bad = [(s, k) for s, pts in groups.items() for k, cx, _ in pts if not float(cx["mean"]) > 0]
        if bad:
            raise ValueError(
                f"logx=True needs positive x means; not so for (series, key) {bad}: pass logx=False"
            )
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for i, (s, points) in enumerate(groups.items()):
        xs, xerr = zip(*(_mean_std(cx) for _, cx, _ in points), strict=True)
        ys, yerr = zip(*(_mean_std(cy) for _, _, cy in points), strict=True)
        color = _line(ax, i, str(s), xs, ys)
        if any(e > 0 for e in xerr + yerr):
            ax.errorbar(
                xs, ys, xerr=xerr, yerr=yerr, fmt="none", ecolor=color, capsize=2, elinewidth=1
            )
        if annotate is not None:
            for (_, cx, cy), px, py in zip(points, xs, ys, strict=True):
                text = _fmt(cy[annotate] if annotate in cy else cx[annotate])
                ax.annotate(
                    text,
                    (px, py),
                    textcoords="offset points",
                    xytext=(4, 4),
                    fontsize=7,
                    color=color,
                )
    _style(ax, title=title, x_label=x_label, y_label=y_label, logx=logx)
    fig.tight_layout()
    return fig


plot_tradeoff = _plotter(
    _tradeoff_figure,
    """y means (`summary_y`) against x means (`summary_x`), points matched by (`series`, `key`)
    and joined per series in `key` order (e.g. x = images/s, y = accuracy, key = eval size);
    error bars of one std where n > 1; each point labelled with its cell's `annotate` value
    (e.g. annotate="size"). Returns `path`.""",
)
