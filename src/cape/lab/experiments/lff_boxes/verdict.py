"""The LFF boxes report's verdict (`cape.lab.experiments.verdict`): answer accuracy on screens
with seen coordinates (the training column) and unseen ones, each row with CAPE's augmentation
of the corners against the same row without it, and a line of its own: the rows that lose
accuracy from seen to unseen coordinates beyond the seeds' spread."""

from __future__ import annotations

from typing import Any

from cape.lab.experiments.pairs import level
from cape.lab.experiments.verdict import Study, removed_cells
from cape.lab.experiments.verdict import verdict as shared_verdict
from cape.lab.report import summarize

__all__ = ["verdict"]

SETS = {"test_seen": "seen", "test_unseen": "unseen"}


def _twins(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(row with `augment`, the same row without it): position and options equal."""

    def key(row: dict[str, Any]) -> tuple[str, str]:
        return row["position"], repr(sorted((row.get("options") or {}).items()))

    plain = {key(r): r["name"] for r in rows if not r.get("augment")}
    return [(r["name"], plain[key(r)]) for r in rows if r.get("augment") and key(r) in plain]


def verdict(results: dict[str, Any]) -> list[str]:
    """The verdict's lines (markdown) from the records' overall accuracy per set."""
    rows = results["config"]["rows"]
    recs = [r for r in results["records"] if r["question"] == "all"]
    cells = {(c["row"], c["set"]): c for c in summarize(recs, ["row", "set"], "acc")}
    names = [r["name"] for r in rows]
    there = [n for n in names if (n, "test_unseen") in cells and (n, "test_seen") in cells]
    if not there:
        return []
    drops = {
        n: cells[(n, "test_unseen")]["mean"] - cells[(n, "test_seen")]["mean"]
        for n in there
        if not level(cells[(n, "test_unseen")], cells[(n, "test_seen")])
        and cells[(n, "test_unseen")]["mean"] < cells[(n, "test_seen")]["mean"]
    }
    lose = (
        "**Lose accuracy on unseen coordinates** (beyond the seeds' spread): "
        + (", ".join(f"`{n}` {d:+.1f} points" for n, d in drops.items()) if drops else "none")
        + "."
    )
    study = Study(
        rows=rows, cells=cells, columns=list(SETS), train="test_seen", unseen=["test_unseen"],
        label=lambda s: f"{SETS[s]} coordinates", metric="answer accuracy",
        pairs=[("CAPE's augmentation", _twins(rows), " (not augmented)")],
        pair_unit="accuracy points (positive: better)", extra=[lose],
        removed=removed_cells(results),
    )  # fmt: skip
    return shared_verdict(study)
