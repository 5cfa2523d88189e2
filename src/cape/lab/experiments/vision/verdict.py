"""The vision report's verdict (`cape.lab.experiments.verdict`): top-1 accuracy on the test
images per test size, the training size (the one most rows train at) as reference, the sizes
never seen in training, and the accuracy with the positions taken out at test time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cape.lab.experiments.verdict import Study
from cape.lab.report import summarize

__all__ = ["study", "accuracy_cells", "NO_POSITIONS"]

NO_POSITIONS = "positions removed"  # the evaluation's method name (`evaluate.NO_POSITIONS`)


def accuracy_cells(records: Sequence[Mapping[str, Any]], method: str) -> dict[tuple[str, int], Any]:
    """(row, size) -> `summarize` cell of the test accuracy measured by `method` ("plain", "tta",
    `NO_POSITIONS`: with the positions taken out)."""
    recs = [r for r in records if r.get("set") == "test" and r.get("method") == method]
    return {(c["row"], c["size"]): c for c in summarize(recs, ["row", "size"], "acc")}


def study(results: Mapping[str, Any], train_size: int, claims: Sequence[Any] = ()) -> Study:
    """The vision study at `train_size` with the paper's `claims` (`report.paper_claims`)."""
    plain = accuracy_cells(results["records"], "plain")
    removed = accuracy_cells(results["records"], NO_POSITIONS)
    rows = results["config"]["rows"]
    sizes = sorted({s for (_, s) in plain})
    return Study(
        rows=rows,
        cells=plain,
        columns=sizes,
        train=train_size,
        unseen=[s for s in sizes if s != train_size],
        label=lambda size: f"{size} px",
        metric="top-1 accuracy",
        removed={r["name"]: removed[(r["name"], train_size)] for r in rows
                 if (r["name"], train_size) in removed},
        claims=claims,
    )  # fmt: skip
