"""What every experiment's report shares: whether plots can be drawn, the figures drawn and
added to a report, the seeds of each row, the training cost table."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cape.lab.stats import welch_t_test

__all__ = [
    "plot_ok",
    "add_curves",
    "add_tradeoff",
    "seeds_by_row",
    "welch_p",
    "train_cost_table",
]


def plot_ok() -> bool:
    """Whether matplotlib (the `plot` extra) is there: reports skip their PNGs without it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def add_curves(
    rep: Any, out: Path, name: str, caption: str, cells: Sequence[Mapping[str, Any]], **options: Any
) -> None:
    """Draw `cells` (summary cells, one curve per row) as `out / name` with
    `cape.lab.viz.plot_curves` (`options`: its x, labels, title, ...) and add the figure to
    `rep` under `caption`."""
    from cape.lab.viz import plot_curves

    plot_curves(cells, out / name, series="row", **options)
    rep.image(name, caption)


def add_tradeoff(
    rep: Any,
    out: Path,
    name: str,
    caption: str,
    x_cells: Sequence[Mapping[str, Any]],
    y_cells: Sequence[Mapping[str, Any]],
    **options: Any,
) -> None:
    """Draw `y_cells` against `x_cells` (summary cells, one series per row) as `out / name`
    with `cape.lab.viz.plot_tradeoff` (`options`: its key, labels, title, ...) and add the
    figure to `rep` under `caption`."""
    from cape.lab.viz import plot_tradeoff

    plot_tradeoff(x_cells, y_cells, out / name, series="row", **options)
    rep.image(name, caption)


def seeds_by_row(results: Mapping[str, Any]) -> dict[str, list[int]]:
    """The seeds each row of `results` holds, from its runs (`results["train"]` keys
    "row/seedN"), in the order they ran: a report drawn with `--finished` may hold fewer seeds
    for some rows than the config lists."""
    seeds: dict[str, list[int]] = {}
    for key in results.get("train", {}):
        row, _, seed = key.rpartition("/seed")
        seeds.setdefault(row, []).append(int(seed))
    return seeds


def welch_p(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> float:
    """Welch's two-sided p (`cape.lab.stats.welch_t_test`) over the seeds' values of two
    `summarize` cells, their NaN left out; NaN with fewer than 2 seeds in either, or no cell."""
    if a is None or b is None:
        return math.nan
    finite = [[v for v in c["values"] if v is not None and not math.isnan(v)] for c in (a, b)]
    return welch_t_test(*finite)[2]


def train_cost_table(
    rep: Any, results: Mapping[str, Any], metric: str = "eval_acc", label: str = "final val acc"
) -> None:
    """The training cost of every run (`results["train"]`: name -> the Trainer's summary) as a
    table of `rep` (`cape.lab.report.Report`): compute and data-loading seconds, the loader's share,
    the engine's overhead and the final validation `metric`, with its best value (that of the
    checkpoint kept, `best_<metric>` in the summary) where the run recorded one."""
    lines = [
        f"| run | train s | data s | loader share | engine overhead | {label} |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in results["train"].items():
        total = sum(s.get(f"time_{k}", 0.0) for k in ("data", "compute", "log", "checkpoint"))
        digits = 3 if metric == "eval_bpd" else 1
        value, best = s.get(metric, float("nan")), s.get(f"best_{metric}")
        value_s = "–" if math.isnan(value) else f"{value:.{digits}f}"
        if best is not None and f"{best:.{digits}f}" != value_s:
            value_s += f" (best {best:.{digits}f})"
        if not total:  # re-evaluated from a checkpoint that predates the time record
            lines.append(f"| {name} | – | – | – | – | {value_s} |")
            continue
        lines.append(
            f"| {name} | {s.get('time_compute', 0):.0f} | {s.get('time_data', 0):.1f} | "
            f"{s.get('time_data', 0.0) / total:.1%} | "
            f"{s.get('engine_overhead', float('nan')):.1%} | {value_s} |"
        )
    rep.table(
        "\n".join(lines),
        caption="Training cost per run (every session of a resumed run); "
        "–: not recorded (a run evaluated again from a checkpoint older than that record).",
    )
