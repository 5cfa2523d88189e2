"""Every report's verdict, written from its own numbers by one piece of code.

An experiment describes its study (`Study`: the rows, the summary cells of its main metric per
(row, column), the training column and the columns never seen in training, the measurements
with positions removed, the paper's claims) and `verdict` writes the bullet lines every report
opens with (`add_verdict`):

1. whether the task needs positions: the best row against the row without positions at the
   training column, and, where positions were taken out at test time, which rows lose by it;
2. which row is best at each column never seen in training, and the rows level with it;
3. what each paired row changes (`cape.lab.experiments.pairs`): CAPE's augmentation against
   the same row without it, frequencies fitted to the grid against the paper's, an extension
   at inference against the same weights, an augmentation drawn in every layer against one
   shared draw;
4. how many of the paper's claims hold.

Two cells are level when their means differ by at most the larger of their standard deviations
over seeds; with one seed the spread is unknown, and the verdict says so and compares plainly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cape.lab.experiments.pairs import level, pair_sentences, twins, verdict_pairs
from cape.lab.report import Report, mean_std, summarize

__all__ = ["Study", "verdict", "add_verdict", "positions_line", "removed_cells"]

Cell = Mapping[str, Any]
Pairs = tuple[str, Sequence[tuple[str, str]], str]  # (title, [(row, twin)], twin note)


@dataclass(frozen=True)
class Study:
    """What a verdict reads. `cells`: (row, column) -> summary cell (mean, std, n) of the main
    `metric`; `train`: the column measured at the training size (None: none); `unseen`: the
    columns never seen in training; `removed`: row -> cell of the metric with the positions
    taken out at test time, at `train`; `positions`: a line that replaces the generic one (an
    experiment with a better test of it); `pairs`: pairs of its own beyond the shared ones;
    `extra`: lines of its own, said last."""

    rows: Sequence[Mapping[str, Any]]
    cells: Mapping[tuple[str, Any], Cell]
    columns: Sequence[Any]
    train: Any
    unseen: Sequence[Any]
    label: Callable[[Any], str] = str
    metric: str = "accuracy"
    unit: str = "%"
    higher: bool = True
    digits: int = 1
    removed: Mapping[str, Cell] = field(default_factory=dict)
    positions: str | None = None
    claims: Sequence[tuple[str, str, bool | None]] = ()
    pairs: Sequence[Pairs] = ()
    pair_unit: str = "points"
    extra: Sequence[str] = ()

    @property
    def one_seed(self) -> bool:
        return max((c.get("n", 1) for c in self.cells.values()), default=1) <= 1

    def text(self, cell: Cell) -> str:
        return f"{mean_std(cell, self.digits)}{self.unit}"  # the mean alone with one seed

    def better(self, a: Cell, b: Cell) -> bool:
        """`a` better than `b` beyond the seeds' spread (plainly, with one seed)."""
        if not self.one_seed and level(a, b):
            return False
        return a["mean"] > b["mean"] if self.higher else a["mean"] < b["mean"]

    def ranked(self, column: Any) -> list[str]:
        """The rows measured at `column`, best first."""
        names = [r["name"] for r in self.rows if (r["name"], column) in self.cells]
        sign = -1 if self.higher else 1
        return sorted(names, key=lambda n: sign * self.cells[(n, column)]["mean"])


def removed_cells(results: Mapping[str, Any]) -> dict[str, Cell]:
    """row -> `summarize` cell over seeds of the main metric with the positions taken out at
    test time (results' "removed", `Experiment.measure_removed`); empty when not measured."""
    cells = summarize(results.get("removed", []), ["row"], "value")
    return {c["row"]: c for c in cells if c["n"]}


def _names(rows: Sequence[str]) -> str:
    return ", ".join(f"`{r}`" for r in rows)


def _spread(study: Study) -> str:
    return " (one seed: spread unknown, compared plainly)" if study.one_seed else ""


def _removed(study: Study) -> tuple[list[str], str]:
    """(rows that lose by taking their positions out, the clause that says so). A row that
    evaluates another row's weights (`train_as`) is left out: without positions its model is
    its source's, so it would only repeat the source's numbers."""
    reused = {r["name"] for r in study.rows if r.get("train_as")}
    removed = {n: c for n, c in study.removed.items() if n not in reused}
    parts, used = [], []
    for name, off in removed.items():
        on = study.cells.get((name, study.train))
        if on is None:
            continue
        d = study.digits
        parts.append(f"`{name}` {on['mean']:.{d}f} → {off['mean']:.{d}f}{study.unit}")
        if study.better(on, off):
            used.append(name)
    if not parts:
        return [], ""
    unused = [n for n in removed if n not in used and (n, study.train) in study.cells]
    return used, (
        f"; positions taken out at test time ({study.label(study.train)}): "
        + ", ".join(parts)
        + (f"; worse without them: {_names(used)}" if used else "; no row is worse without them")
        + (f"; not worse: {_names(unused)}" if used and unused else "")
    )


def positions_line(study: Study) -> str:
    """Does the task need positions? The best row against the row without positions at the
    training column, beyond the seeds' spread; and the rows measured with positions removed."""
    if study.positions is not None:  # the experiment's own test, then the removed check
        clause = _removed(study)[1].removeprefix("; ")
        return study.positions + (f" {clause[0].upper()}{clause[1:]}." if clause else "")
    blind = [r["name"] for r in study.rows if r.get("position") == "nopos"]
    ranked = [n for n in study.ranked(study.train) if n not in blind]
    blind = [n for n in blind if (n, study.train) in study.cells]
    used, removed = _removed(study)
    at = study.label(study.train)
    if blind and ranked:
        best, off = study.cells[(ranked[0], study.train)], study.cells[(blind[0], study.train)]
        answer = "yes" if study.better(best, off) else "no"
        said = (
            f"{answer}: at {at} the best row `{ranked[0]}` has {study.text(best)}"
            + (f" {study.metric}" if study.metric else "")
            + f", `{blind[0]}` (no positions) {study.text(off)}"
        )
        if answer == "no" and not study.one_seed:
            said += ", within the seeds' spread"
    elif removed:
        said = "yes" if used else "no"
    else:
        return f"**Positions needed?** Not measured: no row without positions{_spread(study)}."
    return f"**Positions needed?** {said}{removed}{_spread(study)}."


def best_lines(study: Study) -> list[str]:
    """For each column never seen in training: the best row and the rows level with it."""
    out = []
    for column in study.unseen:
        ranked = study.ranked(column)
        if not ranked:
            continue
        best = study.cells[(ranked[0], column)]
        line = f"**Best at {study.label(column)}**: `{ranked[0]}` {study.text(best)}"
        if study.one_seed:
            nxt = ranked[1:2]
            line += "".join(
                f"; next `{n}` {study.text(study.cells[(n, column)])}" for n in nxt
            ) + _spread(study)
        else:
            tied = [n for n in ranked[1:] if level(study.cells[(n, column)], best)]
            line += (
                "; level with it within the seeds' spread: "
                + ", ".join(f"`{n}` {study.text(study.cells[(n, column)])}" for n in tied)
                if tied
                else "; no other row within the seeds' spread"
            )
        out.append(line + ".")
    return out


def pair_lines(study: Study) -> list[str]:
    """What each paired row changes, at every column."""
    cell = lambda row, column: study.cells.get((row, column))  # noqa: E731
    out = pair_sentences(
        "Frequencies fitted to the grid", twins(study.rows, ("fit_grid",)), cell, study.columns,
        study.label, study.pair_unit, twin_note=" (the paper's frequencies)",
    )  # fmt: skip
    for title, pairs, note in study.pairs:
        out += pair_sentences(
            title, pairs, cell, study.columns, study.label, study.pair_unit, twin_note=note
        )
    out += verdict_pairs(study.rows, cell, study.columns, study.label, study.pair_unit)
    if out and study.one_seed:
        out[-1] += " (One seed: a difference is not known to exceed the spread.)"
    return out


def claims_line(claims: Sequence[tuple[str, str, bool | None]]) -> list[str]:
    """How many of the paper's claims hold, naming those that do not and those the numbers
    cannot decide (None: the rows compared are within the seeds' spread), with their numbers."""
    if not claims:
        return []
    judged = [(c, m, h) for c, m, h in claims if h is not None]
    fail = [f"{c} ({m})" for c, m, h in judged if not h]
    open_ = [f"{c} ({m})" for c, m, h in claims if h is None]
    text = f"**The paper's claims**: {len(judged) - len(fail)} of {len(claims)} hold"
    if fail:
        text += f"; not: {'; '.join(fail)}"
    if open_:
        text += f"; undecided (within the seeds' spread): {'; '.join(open_)}"
    return [text + "."]


def verdict(study: Study) -> list[str]:
    """The verdict's bullet lines (markdown), each from the numbers of `study`."""
    return [
        positions_line(study),
        *best_lines(study),
        *pair_lines(study),
        *claims_line(study.claims),
        *study.extra,
    ]


def add_verdict(rep: Report, lines: Sequence[str]) -> None:
    """A "Verdict" section of `rep`, one bullet per line."""
    if lines:
        rep.heading("Verdict").paragraph("\n".join(f"- {line}" for line in lines))
