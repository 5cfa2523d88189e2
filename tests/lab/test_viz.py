"""`cape.lab.viz`: every plot writes a valid PNG, plots the summary's data, and rejects bad
input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("matplotlib")

from PIL import Image  # noqa: E402

from cape.lab.report import summarize  # noqa: E402
from cape.lab.viz import plot_curves, plot_maps, plot_tradeoff  # noqa: E402
from cape.lab.viz.maps import _maps_figure  # noqa: E402
from cape.lab.viz.plots import _curves_figure, _tradeoff_figure  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def _close_figures():
    import matplotlib.pyplot as plt

    yield
    plt.close("all")


def _summary(metric: str = "acc", seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    recs = [
        {"row": row, "size": size, "seed": s, metric: float(rng.normal(50 + size, 3))}
        for row, seeds in (("cape2d", 3), ("sinpos2d", 2), ("nopos", 1))
        for size in (48, 16, 32, 24)
        for s in range(seeds)
    ]
    return summarize(recs, ["row", "size"], metric)


def _check_png(path: Path, min_size: tuple[int, int] = (300, 200)) -> None:
    assert path.read_bytes()[:8] == PNG
    with Image.open(path) as im:
        im.verify()
    with Image.open(path) as im:
        w, h = im.size
        assert im.format == "PNG"
    assert min_size[0] <= w <= 4000 and min_size[1] <= h <= 4000
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp files


def test_plot_curves_png(tmp_path: Path) -> None:
    path = plot_curves(
        _summary(),
        tmp_path / "a" / "curves.png",
        x="size",
        series="row",
        y_label="top-1 (%)",
        x_label="px",
        title="t",
        vline=32,
        logx=True,
    )
    assert path == tmp_path / "a" / "curves.png"
    _check_png(path)
    with Image.open(path) as im:
        assert im.size == (640, 440)  # 6.4 x 4.4 in at 100 dpi


def test_curves_figure_plots_the_means() -> None:
    summary = _summary()
    fig = _curves_figure(
        summary,
        x="size",
        series="row",
        y_label="y",
        x_label="x",
        series_order=["nopos", "cape2d"],
        vline=24,
        percent=True,
    )
    ax = fig.axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines() if not ln.get_label().startswith("_")}
    assert list(lines) == ["nopos", "cape2d", "sinpos2d", "train size"]
    for row in ("cape2d", "sinpos2d", "nopos"):
        cells = sorted((c for c in summary if c["row"] == row), key=lambda c: c["size"])
        np.testing.assert_allclose(lines[row].get_xdata(), [c["size"] for c in cells])
        np.testing.assert_allclose(lines[row].get_ydata(), [c["mean"] for c in cells])
    np.testing.assert_allclose(lines["train size"].get_xdata(), [24, 24])
    # error bars only for series with n > 1: one LineCollection each for cape2d and sinpos2d
    assert len(ax.collections) == 2
    seg = ax.collections[0].get_segments()  # cape2d, sorted by size: [16, 24, 32, 48]
    cells = sorted((c for c in summary if c["row"] == "cape2d"), key=lambda c: c["size"])
    np.testing.assert_allclose([s[1, 1] - s[0, 1] for s in seg], [2 * c["std"] for c in cells])


def test_many_series_stay_distinguishable_with_the_legend_beside_the_axes() -> None:
    # 25 rows (the vision cpu-full preset): no two lines share colour, marker and line style
    summary = [
        {"row": f"row {i}", "size": s, "mean": float(i + s), "std": 0.0, "n": 1}
        for i in range(25)
        for s in (24, 32)
    ]
    fig = _curves_figure(summary, x="size", series="row", y_label="y", x_label="x")
    ax = fig.axes[0]
    styles = [(ln.get_color(), ln.get_marker(), ln.get_linestyle()) for ln in ax.get_lines()]
    assert len(styles) == 25 and len(set(styles)) == 25
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == [f"row {i}" for i in range(25)]
    fig.canvas.draw()  # placed right of the axes, not over the data
    assert legend.get_window_extent().x0 > ax.get_window_extent().x1
    few = _curves_figure(summary[:6], x="size", series="row", y_label="y", x_label="x")
    legend = few.axes[0].get_legend()
    few.canvas.draw()
    assert legend.get_window_extent().x1 <= few.axes[0].get_window_extent().x1


def test_plot_curves_errors(tmp_path: Path) -> None:
    kw = dict(x="size", series="row", y_label="y", x_label="x")
    with pytest.raises(ValueError, match="summary must hold at least one cell"):
        plot_curves([], tmp_path / "p.png", **kw)
    with pytest.raises(ValueError, match=r"summary\[0\] has no key 'encoding'"):
        plot_curves(_summary(), tmp_path / "p.png", **{**kw, "series": "encoding"})
    with pytest.raises(ValueError, match="must be a number"):
        plot_curves(_summary(), tmp_path / "p.png", **{**kw, "x": "row", "series": "size"})
    cells = summarize(
        [{"row": "a", "size": 1, "seed": s, "value": 1.0} for s in (0, 1)], ["row", "size", "seed"]
    )
    with pytest.raises(ValueError, match="two cells for row='a', size=1"):
        plot_curves(cells, tmp_path / "p.png", **kw)
    assert not list(tmp_path.iterdir())


def test_plot_tradeoff_png_and_data(tmp_path: Path) -> None:
    acc = _summary("acc")
    speed = [c for c in _summary("images_per_s", seed=1) if c["size"] != 48]  # 48 unmatched
    speed += summarize(
        [{"row": "other", "size": 16, "images_per_s": 10.0}], ["row", "size"], "images_per_s"
    )
    path = plot_tradeoff(
        speed,
        acc,
        tmp_path / "t.png",
        key="size",
        series="row",
        x_label="images/s",
        y_label="acc",
        annotate="size",
    )
    _check_png(path)
    fig = _tradeoff_figure(
        speed, acc, key="size", series="row", x_label="x", y_label="y", annotate="size"
    )
    ax = fig.axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines() if not ln.get_label().startswith("_")}
    assert list(lines) == ["cape2d", "sinpos2d", "nopos"]  # "other" has no accuracy
    for row, ln in lines.items():
        xs = {c["size"]: c["mean"] for c in speed if c["row"] == row}
        ys = {c["size"]: c["mean"] for c in acc if c["row"] == row}
        np.testing.assert_allclose(ln.get_xdata(), [xs[s] for s in (16, 24, 32)])
        np.testing.assert_allclose(ln.get_ydata(), [ys[s] for s in (16, 24, 32)])
    assert sorted(t.get_text() for t in ax.texts) == sorted(["16", "24", "32"] * 3)
    assert ax.get_xscale() == "log"


def test_plot_tradeoff_errors(tmp_path: Path) -> None:
    acc = _summary()
    kw = dict(key="size", series="row", x_label="x", y_label="y")
    with pytest.raises(ValueError, match="summary_x must hold at least one cell"):
        plot_tradeoff([], acc, tmp_path / "t.png", **kw)
    with pytest.raises(ValueError, match=r"summary_x\[0\] has no key 'encoding'"):
        plot_tradeoff(acc, acc, tmp_path / "t.png", **{**kw, "series": "encoding"})
    other = [dict(c, row=c["row"] + "_x") for c in acc]
    with pytest.raises(ValueError, match="share no"):
        plot_tradeoff(other, acc, tmp_path / "t.png", **kw)
    with pytest.raises(ValueError, match="annotate 'seed'"):
        plot_tradeoff(acc, acc, tmp_path / "t.png", annotate="seed", **kw)
    neg = [dict(c, mean=-1.0) for c in acc]
    with pytest.raises(ValueError, match="logx=True needs positive x means"):
        plot_tradeoff(neg, acc, tmp_path / "t.png", **kw)
    assert not list(tmp_path.iterdir())


def test_plot_maps_png_and_limits(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    maps = {
        "cape2d": {f"{s} px ch 1": rng.normal(size=(s // 4, s // 4)) for s in (16, 32, 64)},
        "sinpos2d": {"16 px ch 1": torch.randn(4, 4), "32 px ch 1": torch.randn(8, 8)},
    }
    path = plot_maps(maps, tmp_path / "m.png", title="components")
    _check_png(path, (500, 400))
    fig = _maps_figure(maps, title="components")
    assert len(fig.axes) == 6
    a = fig.axes[0]
    m = np.abs(maps["cape2d"]["16 px ch 1"]).max()
    np.testing.assert_allclose(a.images[0].get_clim(), (-m, m))
    np.testing.assert_allclose(a.images[0].get_array(), maps["cape2d"]["16 px ch 1"])
    assert a.get_title() == "16 px ch 1" and a.get_ylabel() == "cape2d"
    assert fig.axes[1].images[0].get_array().shape == (8, 8)
    assert fig.axes[3].get_ylabel() == "sinpos2d"
    assert not fig.axes[5].axison  # the missing third map of row 2 is blank
    fig = _maps_figure({"": {"a": np.zeros((3, 5))}}, vmin=-1, vmax=1, col_titles=False)
    assert fig.axes[0].images[0].get_clim() == (-1, 1)
    assert fig.axes[0].get_title() == "" and fig.axes[0].get_ylabel() == ""
    fig = _maps_figure({"r": {"a": np.arange(6.0).reshape(2, 3)}}, symmetric=False)
    assert fig.axes[0].images[0].get_clim() == (0, 5)


def test_plot_maps_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="maps must be a non-empty mapping"):
        plot_maps({}, tmp_path / "m.png")
    with pytest.raises(ValueError, match=r"maps\['r'\] must be a non-empty mapping"):
        plot_maps({"r": {}}, tmp_path / "m.png")
    with pytest.raises(ValueError, match=r"maps\['r'\]\['c'\] must be a non-empty 2D array"):
        plot_maps({"r": {"c": np.zeros((2, 2, 2))}}, tmp_path / "m.png")
    with pytest.raises(ValueError, match="vmin and vmax must be given together"):
        plot_maps({"r": {"c": np.zeros((2, 2))}}, tmp_path / "m.png", vmin=0)
    with pytest.raises(ValueError, match="vmin must be a number below vmax"):
        plot_maps({"r": {"c": np.zeros((2, 2))}}, tmp_path / "m.png", vmin=1, vmax=0)
    assert not list(tmp_path.iterdir())


def test_importing_viz_does_not_need_matplotlib() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['matplotlib'] = None; import cape.lab.viz, cape.lab.report; "
        "print('ok')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_log_y_and_dense_curves_without_markers() -> None:
    # the language-model report's plots: perplexity on a log y axis, loss at ~40 positions
    sparse = [{"row": "a", "len": n, "mean": 3.0 * n, "std": 0.0, "n": 1} for n in (1, 2, 4, 8)]
    dense = [{"row": "b", "len": n, "mean": 50.0 / n, "std": 0.0, "n": 1} for n in range(1, 41)]
    fig = _curves_figure(sparse + dense, x="len", series="row", y_label="y", x_label="x", logy=True)
    ax = fig.axes[0]
    assert ax.get_yscale() == "log" and ax.get_xscale() == "linear"
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert lines["a"].get_marker() == "o" and lines["b"].get_marker() == "None"
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert labels and not any("10^" in t or "$" in t for t in labels)  # plain numbers: 1, 10
    plain = _curves_figure(sparse, x="len", series="row", y_label="y", x_label="x")
    assert plain.axes[0].get_yscale() == "linear"
