"""The LFF boxes report's verdict, written from the numbers: which rows answer best on unseen
coordinates (within the seeds' spread), which lose accuracy from seen to unseen coordinates
beyond it, whether the task needs positions at all, and each row with CAPE's augmentation of
the corners against the same row without it."""

from __future__ import annotations

from typing import Any

from cape.lab.experiments.pairs import level, pair_sentences
from cape.lab.report import summarize

__all__ = ["verdict"]

SETS = {"test_seen": "seen", "test_unseen": "unseen"}


def _twins(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(row with `augment`, the same row without it): position and options equal."""
    plain = {
        (r["position"], repr(sorted((r.get("options") or {}).items()))): r["name"]
        for r in rows
        if not r.get("augment")
    }
    return [
        (r["name"], plain[key])
        for r in rows
        if r.get("augment")
        and (key := (r["position"], repr(sorted((r.get("options") or {}).items())))) in plain
    ]


def verdict(results: dict[str, Any]) -> list[str]:
    """The verdict's sentences (markdown) from the records' overall accuracy per set."""
    rows = results["config"]["rows"]
    names = [r["name"] for r in rows]
    recs = [r for r in results["records"] if r["question"] == "all"]
    cells = {(c["row"], c["set"]): c for c in summarize(recs, ["row", "set"], "acc")}
    there = [n for n in names if (n, "test_unseen") in cells and (n, "test_seen") in cells]
    if not there:
        return []
    unseen = {n: cells[(n, "test_unseen")] for n in there}
    best = max(there, key=lambda n: unseen[n]["mean"])
    tied = [n for n in there if n != best and level(unseen[n], unseen[best])]
    level_with = ", ".join(f"`{n}`" for n in tied)
    said = [
        f"**Unseen coordinates**: `{best}` answers best ({unseen[best]['mean']:.1f} ± "
        f"{unseen[best]['std']:.1f}%)"
        + (f"; level with it within the seeds' spread: {level_with}." if tied else ".")
    ]
    drops = {
        n: unseen[n]["mean"] - cells[(n, "test_seen")]["mean"]
        for n in there
        if not level(unseen[n], cells[(n, "test_seen")])
        and unseen[n]["mean"] < cells[(n, "test_seen")]["mean"]
    }
    said.append(
        "**Lose accuracy on unseen coordinates** (beyond the seeds' spread): "
        + (", ".join(f"`{n}` {d:+.1f} points" for n, d in drops.items()) if drops else "none")
        + "."
    )
    blind = [r["name"] for r in rows if r["position"] == "nopos" and r["name"] in unseen]
    if blind:
        gap = unseen[best]["mean"] - unseen[blind[0]]["mean"]
        said.append(
            f"**Positions needed**: `{best}` is {gap:+.1f} points above `{blind[0]}` "
            f"({unseen[blind[0]]['mean']:.1f}%) on unseen coordinates."
        )
    said += pair_sentences(
        "CAPE's augmentation", _twins(rows), lambda n, s: cells.get((n, s)), list(SETS),
        SETS.get, "accuracy points (positive: better)", twin_note=" (not augmented)",
    )  # fmt: skip
    return said
