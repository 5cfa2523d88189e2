"""The vision report's verdict: a paragraph written from the numbers, and the table behind it.

It says whether the task needs positions (no positions against chance and against learned
absolute positions at the training size), which rows use their positions (the accuracy lost
when they are taken out at test time), and which rows generalise to each unseen size (the best
row and the rows within one standard deviation of it, what each keeps of its training-size
accuracy). Every comparison uses the seeds' spread: two rows whose means differ by less than the
larger of their standard deviations are called level, whatever their order. Nothing here knows
which row is expected to win.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cape.lab.experiments.pairs import level, pair_sentences, twins, verdict_pairs
from cape.lab.report import mean_std, summarize

__all__ = ["verdict", "removed_table_cells", "NO_POSITIONS", "USES_POSITIONS_POINTS"]

NO_POSITIONS = "positions removed"  # the evaluation's method name (`evaluate.NO_POSITIONS`)
USES_POSITIONS_POINTS = 5.0
"""A row 'uses its positions' when taking them out costs more than this many points and more
than twice the seeds' spread (std of the difference over seeds); it 'does not' when the cost is
at most this many points; otherwise the seeds disagree (some use them, some do not)."""

Cell = Mapping[str, Any]


def _cells(records: Sequence[Mapping[str, Any]], method: str) -> dict[tuple[str, int], Cell]:
    recs = [r for r in records if r.get("set") == "test" and r.get("method") == method]
    return {(c["row"], c["size"]): c for c in summarize(recs, ["row", "size"], "acc")}


def _drops(records: Sequence[Mapping[str, Any]], size: int) -> dict[str, Cell]:
    """Per row: points lost when positions are taken out at `size`, paired by seed."""
    plain = {
        (r["row"], r["seed"]): r["acc"]
        for r in records
        if r.get("set") == "test" and r.get("method") == "plain" and r["size"] == size
    }
    diffs = [
        {"row": r["row"], "drop": plain[(r["row"], r["seed"])] - r["acc"]}
        for r in records
        if r.get("set") == "test"
        and r.get("method") == NO_POSITIONS
        and r["size"] == size
        and (r["row"], r["seed"]) in plain
    ]
    return {c["row"]: c for c in summarize(diffs, ["row"], "drop")}


def removed_table_cells(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`summarize` cells {row, size, mean, std, ...} of the accuracy with positions removed."""
    recs = [r for r in records if r.get("set") == "test" and r.get("method") == NO_POSITIONS]
    return summarize(recs, ["row", "size"], "acc")


def _rows_of(config: Mapping[str, Any], position: str) -> list[str]:
    return [r["name"] for r in config["rows"] if r.get("position") == position]


def verdict(
    records: Sequence[Mapping[str, Any]],
    config: Mapping[str, Any],
    rows: Sequence[str],
    train_size: int,
    num_classes: int | None,
) -> str | None:
    """The paragraph (markdown), or None unless every row with positions was also measured
    without them (a study of older runs, or one whose later rerun alone measured it)."""
    removed = _cells(records, NO_POSITIONS)
    plain = _cells(records, "plain")
    with_positions = {r for (r, _) in plain} - set(_rows_of(config, "nopos"))
    if not removed or not with_positions <= {r for (r, _) in removed}:
        return None
    out: list[str] = []
    at = lambda row, size: plain.get((row, size))  # noqa: E731
    nopos = [r for r in _rows_of(config, "nopos") if at(r, train_size)]
    abspos = [r for r in _rows_of(config, "abspos2d") if at(r, train_size)]
    if nopos and num_classes:
        chance = 100.0 / num_classes
        n = at(nopos[0], train_size)
        needs = n["mean"] - chance <= max(5.0, 2 * n["std"])
        sentence = (
            f"**Does the task need positions?** Without positions (`{nopos[0]}`) the model "
            f"reaches {mean_std(n)}% at the training size ({train_size} px), against "
            f"{chance:.0f}% by chance: "
            + (
                "it cannot solve the task without them"
                if needs
                else f"{n['mean'] - chance:.1f} points above chance, so the task does not need "
                "positions at this budget"
            )
        )
        if abspos:
            a = at(abspos[0], train_size)
            sentence += f"; learned absolute positions (`{abspos[0]}`) reach {mean_std(a)}%"
        out.append(sentence + ".")
    drops = _drops(records, train_size)
    if drops:
        kinds = {r: _use(drops[r]) for r in rows if r in drops}
        parts = [f"`{r}` {mean_std(drops[r])}" for r in kinds]
        said = {
            "used": "Used by: {}.",
            "unused": f"Not used (at most {USES_POSITIONS_POINTS:g} points): {{}}.",
            "mixed": "The seeds disagree (a cost under twice its spread): {}.",
        }
        groups = [
            text.format(_names([r for r, k in kinds.items() if k == kind]))
            for kind, text in said.items()
            if kind in kinds.values()
        ]
        out.append(
            f"**Which rows use their positions?** Taking them out at test time costs "
            f"(points at {train_size} px) " + ", ".join(parts) + ". " + " ".join(groups)
        )
    sizes = sorted({s for (_, s) in plain if s != train_size})
    for size in sizes:
        cells = [(r, at(r, size)) for r in rows if at(r, size) and r not in nopos]
        if not cells:
            continue
        best_row, best = max(cells, key=lambda rc: rc[1]["mean"])
        tied = [r for r, c in cells if r != best_row and level(c, best)]
        kept = [
            f"`{r}` {c['mean'] / at(r, train_size)['mean']:.0%}"
            for r, c in cells
            if at(r, train_size) and at(r, train_size)["mean"] > 0
        ]
        kind = "smaller" if size < train_size else "larger"
        sentence = (
            f"**At {size} px ({kind} than training)** the best row is `{best_row}` with "
            f"{mean_std(best)}%"
            + (
                f"; level with it within the seeds' spread: {_names(tied)}"
                if tied
                else "; no other row is within the seeds' spread of it"
            )
        )
        if nopos and at(nopos[0], size):
            sentence += f"; no positions: {mean_std(at(nopos[0], size))}%"
        out.append(
            sentence + ". Share of the training-size accuracy kept: " + ", ".join(kept) + "."
        )
    every = sorted({s for (_, s) in plain})
    cell = lambda row, size: plain.get((row, size))  # noqa: E731
    px = lambda size: f"{size} px"  # noqa: E731
    out += pair_sentences(
        "Frequencies fitted to the grid",
        twins(config["rows"], ("fit_grid",)),
        cell,
        every,
        px,
        twin_note=" (the paper's frequencies)",
    )
    out += verdict_pairs(config["rows"], cell, every, px)  # augmented, drawn per layer
    return "\n\n".join(out)


def _use(drop: Cell) -> str:
    if drop["mean"] <= USES_POSITIONS_POINTS:
        return "unused"
    return "used" if drop["mean"] > 2 * drop["std"] else "mixed"


def _names(rows: Sequence[str]) -> str:
    return ", ".join(f"`{r}`" for r in rows)
