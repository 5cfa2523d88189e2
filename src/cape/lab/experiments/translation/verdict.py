"""The translation report's verdict (`cape.lab.experiments.verdict`): BLEU on test and on the
long buckets never seen in training, and lines of its own: how much of their test BLEU the rows
keep on the longest bucket, which rows' teacher-forced NLL stays lowest far past the training
lengths."""

from __future__ import annotations

from typing import Any

from cape.lab.experiments.pairs import level
from cape.lab.experiments.verdict import Study, removed_cells
from cape.lab.experiments.verdict import verdict as shared_verdict
from cape.lab.report import summarize

__all__ = ["labelled", "study", "verdict"]

# the columns the verdict reads: (split, bin) -> label
BUCKETS = {
    ("test", "all"): "test",
    ("test_21-30", "all"): "21-30 words",
    ("test_31-40", "all"): "31-40 words",
    ("test_41+", "all"): "41+ words",
}
LONGEST = "41+ words"


def labelled(results: dict[str, Any], labels: dict[tuple[str, str], str]) -> list[dict[str, Any]]:
    """The records of the (split, bin) places in `labels`, each with its label as "col"."""
    return [
        dict(r, col=labels[(r["split"], r["bin"])])
        for r in results["records"]
        if (r["split"], r["bin"]) in labels
    ]


def _cells(results: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    cells = summarize(labelled(results, BUCKETS), ["row", "col"], "bleu")
    return {(c["row"], c["col"]): c for c in cells}


def _best(cells: dict[Any, dict[str, Any]], rows: list[str], key: Any, high: bool) -> list[str]:
    """[best row, rows level with it] at column `key` (highest or lowest mean)."""
    there = [r for r in rows if (r, key) in cells]
    if not there:
        return []
    best = (max if high else min)(there, key=lambda r: cells[(r, key)]["mean"])
    return [best] + [r for r in there if r != best and level(cells[(r, key)], cells[(best, key)])]


def study(results: dict[str, Any]) -> Study:
    """The translation study: BLEU per bucket, test as the training column."""
    columns = list(BUCKETS.values())
    return Study(
        rows=results["config"]["rows"], cells=_cells(results), columns=columns, train="test",
        unseen=columns[1:], metric="", unit=" BLEU",
        pair_unit="BLEU points (positive: better)", extra=_own(results),
        removed=removed_cells(results),
    )  # fmt: skip


def verdict(results: dict[str, Any]) -> list[str]:
    """The verdict's lines (markdown) from the results' records."""
    return shared_verdict(study(results))


def _own(results: dict[str, Any]) -> list[str]:
    """The share of the test BLEU kept at the longest bucket, the stacked sentences' NLL."""
    rows = [r["name"] for r in results["config"]["rows"]]
    cells = _cells(results)
    said = []
    # a share of a BLEU near 0 says nothing: only rows that translate (test BLEU at least
    # half the best row's) are ranked
    tested = {r: cells[(r, "test")]["mean"] for r in rows if (r, "test") in cells}
    floor = max(tested.values(), default=0.0) / 2
    kept = {
        r: 100 * cells[(r, LONGEST)]["mean"] / tested[r]
        for r in tested
        if (r, LONGEST) in cells and tested[r] > 0 and tested[r] >= floor
    }
    if kept:
        order = sorted(kept, key=kept.get, reverse=True)  # type: ignore[arg-type]
        left = [f"`{r}`" for r in tested if r not in kept]
        said.append(
            f"**Share of the test BLEU kept at {LONGEST}** (means over seeds; rows with a test "
            f"BLEU of at least half the best's, {floor:.1f}): "
            + ", ".join(f"`{r}` {kept[r]:.0f}%" for r in order)
            + (f"; below that floor: {', '.join(left)}." if left else ".")
        )
    stacked = [r for r in results["records"] if r["split"] == "stacked"]
    if stacked:
        band = max({r["bin"] for r in stacked}, key=lambda b: int(b.split("-")[0]))
        nll = {(c["row"], c["bin"]): c for c in summarize(stacked, ["row", "bin"], "nll")}
        low = _best(nll, rows, band, high=False)
        if low:
            said.append(
                f"**Stacked sentences, output positions {band}** (far past the training "
                f"targets' {results.get('train_length', '?')} tokens): `{low[0]}` has the "
                f"lowest NLL ({nll[(low[0], band)]['mean']:.2f} nats per token)"
                + (f", level with {', '.join(f'`{r}`' for r in low[1:])}." if low[1:] else ".")
            )
    return said
