"""The detection report's verdict (`cape.lab.experiments.verdict`) and the paper's claims.

The study's cells are COCO's AP on the test scenes per (row, image size); the training column is
the largest training size, the columns never seen in training are the held-out sizes (Table
2's protocol; none under Table 1's). Besides the shared lines, the verdict answers Table 2's
question in one line of its own: which rows keep their AP from the largest training size to the
unseen sizes (their mean), beyond the seeds' spread. The paper's claims (sec. 4.2) are checked
on the mean AP over the unseen sizes (over the training sizes under Table 1's protocol).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cape.lab.experiments.detection.coco import LABELS, METRICS
from cape.lab.experiments.detection.presets import PAPER_ROWS
from cape.lab.experiments.pairs import decided, level
from cape.lab.experiments.verdict import Study, removed_cells
from cape.lab.experiments.verdict import verdict as shared_verdict
from cape.lab.report import mean_std, summarize

__all__ = ["plain_records", "set_cells", "study", "paper_claims", "keep_line", "verdict"]

Cell = Mapping[str, Any]


def plain_records(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [r for r in results["records"] if r.get("method", "plain") == "plain"]


def set_cells(results: Mapping[str, Any], metric: str = "ap") -> dict[tuple[str, str], Cell]:
    """(row, "seen" | "unseen") -> the summary over seeds of each run's mean `metric` over the
    sizes of that set (a run's sizes weigh alike)."""
    per_run: dict[tuple[str, int, str], list[float]] = {}
    for r in plain_records(results):
        key = (r["row"], r["seed"], "seen" if r["seen"] else "unseen")
        per_run.setdefault(key, []).append(r[metric])
    recs = [
        {"row": row, "seed": seed, "set": s, "value": sum(v) / len(v)}
        for (row, seed, s), v in per_run.items()
    ]
    return {(c["row"], c["set"]): c for c in summarize(recs, ["row", "set"], "value")}


def study(results: Mapping[str, Any], claims: Sequence[Any] = ()) -> Study:
    """The study of AP per size: the largest training size against the unseen ones."""
    cfg = results["config"]
    sizes, held = cfg["data"]["sizes"], cfg["data"]["held_out"]
    train_sizes = sizes[: len(sizes) - held]
    recs = plain_records(results)
    cells = {(c["row"], c["size"]): c for c in summarize(recs, ["row", "size"], "ap")}
    return Study(
        rows=cfg["rows"], cells=cells, columns=list(sizes), train=max(train_sizes),
        unseen=list(sizes[len(train_sizes):]), label=lambda s: f"{s} px", metric="AP",
        unit="", removed=removed_cells(results), claims=claims, pair_unit="AP points",
    )  # fmt: skip


def keep_line(results: Mapping[str, Any]) -> str | None:
    """Table 2's question: each row's AP at the largest training size against its mean over the
    unseen sizes; the rows that lose it beyond the seeds' spread, and those that keep it (rows
    with positions only)."""
    cfg = results["config"]
    sizes, held = cfg["data"]["sizes"], cfg["data"]["held_out"]
    if not held:
        return None
    train = max(sizes[: len(sizes) - held])
    at_train = {
        c["row"]: c
        for c in summarize([r for r in plain_records(results) if r["size"] == train], ["row"], "ap")
    }
    unseen = set_cells(results)
    parts, lose, keep = [], [], []
    # a row without positions has nothing to carry to larger images
    for row in (r["name"] for r in cfg["rows"] if r.get("position") != "nopos"):
        a, b = at_train.get(row), unseen.get((row, "unseen"))
        if a is None or b is None:
            continue
        parts.append(f"`{row}` {b['mean'] - a['mean']:+.1f}")
        (keep if level(a, b) or b["mean"] >= a["mean"] else lose).append(f"`{row}`")
    if not parts:
        return None
    return (
        f"**AP from {train} px (trained) to the unseen sizes** "
        f"({', '.join(str(s) for s in sizes[-held:])} px, their mean): "
        + ", ".join(parts)
        + "; lose it beyond the seeds' spread: "
        + (", ".join(lose) if lose else "none")
        + "; keep it: "
        + (", ".join(keep) or "none")
        + "."
    )


def paper_claims(results: Mapping[str, Any]) -> list[tuple[str, str, bool | None]]:
    """LFF sec. 4.2's findings, each (claim, measured, holds; None within the seeds' spread):
    Learnable-Fourier+MLP has the best AP and Embed-2D the worst among the paper's rows (at the
    unseen sizes under Table 2's protocol, over all sizes under Table 1's), LFF best at every
    COCO metric, and Embed-2D's gap to the other paper rows wider at unseen sizes than at seen
    ones."""
    held = results["config"]["data"]["held_out"]
    column, where = ("unseen", "at the unseen sizes") if held else ("seen", "over all sizes")
    cells = set_cells(results)
    rows = [r for r in PAPER_ROWS if (r, column) in cells]
    out: list[tuple[str, str, bool | None]] = []
    lff, embed = "Learnable-Fourier+MLP", "Embed-2D"
    if lff in rows and len(rows) > 1:
        out.append(_extreme(cells, column, lff, rows, best=True, where=where))
        out.append(_every_metric(results, column, lff, rows, where))
    if embed in rows and len(rows) > 1:
        out.append(_extreme(cells, column, embed, rows, best=False, where=where))
    if held and embed in rows and len(rows) > 1:
        gaps = {}
        for s in ("seen", "unseen"):
            others = [cells[(r, s)]["mean"] for r in rows if r != embed and (r, s) in cells]
            gaps[s] = sum(others) / len(others) - cells[(embed, s)]["mean"]
        out.append(
            (
                "Embed-2D's gap to the other paper rows is wider at unseen sizes",
                f"{gaps['unseen']:+.1f} unseen vs {gaps['seen']:+.1f} seen AP points",
                gaps["unseen"] > gaps["seen"],
            )
        )
    return out


def _extreme(
    cells: Mapping[tuple[str, str], Cell], column: str, name: str, rows: list[str], *,
    best: bool, where: str,
) -> tuple[str, str, bool | None]:  # fmt: skip
    """`name` has the highest (best) or lowest AP of `rows` at `column`; undecided when the
    row nearest to it is within the seeds' spread."""
    mine = cells[(name, column)]
    others = [(r, cells[(r, column)]) for r in rows if r != name]
    nearest, cell = (max if best else min)(others, key=lambda rc: rc[1]["mean"])
    holds = mine["mean"] > cell["mean"] if best else mine["mean"] < cell["mean"]
    word = "best" if best else "lowest"
    measured = f"{mean_std(mine)} vs `{nearest}` {mean_std(cell)}"
    claim = f"{name} has the {word} AP of the paper's rows {where}"
    return claim, measured, decided(mine, cell, holds)


def _every_metric(
    results: Mapping[str, Any], column: str, name: str, rows: list[str], where: str
) -> tuple[str, str, bool | None]:
    """`name` at least level with the best of `rows` at every COCO metric (Table 1's claim)."""
    behind, undecided = [], []
    for metric in METRICS:
        cells = set_cells(results, metric)
        if (name, column) not in cells:
            continue
        mine = cells[(name, column)]
        best = max((cells[(r, column)] for r in rows if r != name and (r, column) in cells),
                   key=lambda c: c["mean"])  # fmt: skip
        if mine["mean"] < best["mean"]:
            (undecided if level(mine, best) else behind).append(metric)
    holds = False if behind else (None if undecided else True)
    measured = (
        "behind the best other row at " + ", ".join(LABELS[m] for m in behind + undecided)
        if behind or undecided
        else "first at all six"
    )
    return (f"{name} is first at every COCO metric {where}", measured, holds)


def verdict(results: Mapping[str, Any]) -> list[str]:
    """The verdict's lines (markdown) from the records' AP."""
    if not plain_records(results):
        return []
    keep = keep_line(results)
    s = study(results, paper_claims(results))
    lines = shared_verdict(s)
    return lines if keep is None else [*lines[:1], keep, *lines[1:]]
