"""The one report writer of every experiment: summaries over seeds, markdown tables, JSON,
report.md.

Data flow: an experiment produces flat records (one dict per run and measurement, e.g.
`{"row": "cape2d", "size": 32, "seed": 0, "acc": 71.3}`); `summarize` groups them into cells
(mean, sample std, n over seeds); `pivot` lays the cells out as a GitHub markdown table;
`Report` assembles report.md. Every file is written atomically (`cape.lab.io.write_text`,
`cape.lab.io.write_json`: NaN / inf as null), so a reader never sees half a report.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePath
from typing import Any

from cape.lab.io import write_json, write_text  # re-exported: the one JSON writer

__all__ = [
    "summarize",
    "pivot",
    "summary_table",
    "mean_std",
    "claims_table",
    "write_json",
    "write_text",
    "Report",
]

MISSING = "–"
_BEST = ("max", "min", None)


def _as_float(value: object, key: str) -> float:
    """A record's value as a float; None (NaN after a JSON round trip) reads as NaN."""
    if value is None:
        return math.nan
    if isinstance(value, numbers.Real):
        return float(value)
    if hasattr(value, "item") and getattr(value, "shape", None) in ((), [1], (1,)):
        return float(value.item())  # 0-d numpy arrays and torch tensors
    raise ValueError(
        f"value {key!r} must be a real number or None, got {type(value).__name__} {value!r}"
    )


def summarize(
    records: Sequence[Mapping[str, Any]], by: Sequence[str], value: str = "value"
) -> list[dict[str, Any]]:
    """Group `records` by their `by` keys (first-appearance order) and summarise `value`.

    Each output dict holds the `by` keys plus `mean`, `std` (sample std, ddof=1; 0.0 when
    n == 1), `n` (number of non-NaN values), `nan` (number of NaN or None values) and `values`
    (every value of the group, NaN included, in record order). A group whose values are all
    NaN has mean and std NaN and n == 0. No records give an empty list.
    """
    if isinstance(by, str):
        raise ValueError(
            f"by must be a sequence of key names such as [{by!r}], got the string {by!r}"
        )
    by = list(by)
    groups: dict[tuple[Any, ...], list[float]] = {}
    for i, rec in enumerate(records):
        for k in [*by, value]:
            if k not in rec:
                raise ValueError(f"record {i} has no key {k!r} (keys: {sorted(map(str, rec))})")
        key = tuple(rec[k] for k in by)
        try:
            hash(key)
        except TypeError:
            raise ValueError(
                f"the by keys {by} of record {i} must be hashable, got {key!r}"
            ) from None
        groups.setdefault(key, []).append(_as_float(rec[value], value))
    out = []
    for key, values in groups.items():
        finite = [v for v in values if not math.isnan(v)]
        n = len(finite)
        mean = math.fsum(finite) / n if n else math.nan
        if n > 1:
            std = math.sqrt(math.fsum((v - mean) ** 2 for v in finite) / (n - 1))
        else:
            std = 0.0 if n == 1 else math.nan
        cell = dict(zip(by, key, strict=True))
        cell.update(mean=mean, std=std, n=n, nan=len(values) - n, values=values)
        out.append(cell)
    return out


def _escape(text: object) -> str:
    """A markdown table cell: pipes escaped, newlines flattened."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _order(seen: list[Any], order: Sequence[Any] | None) -> list[Any]:
    """`order` first (values absent from the data become empty lines), then unseen extras."""
    if order is None:
        return seen
    order = list(order)
    return order + [v for v in seen if v not in order]


def _format(fmt: str, name: str, cell: Mapping[str, Any]) -> str:
    try:
        return fmt.format(**cell)
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(
            f"{name} {fmt!r} must use only the fields {sorted(cell)} with numeric formats: {e!r}"
        ) from None


def _format_value(col_format: str, value: Any) -> str:
    try:
        return col_format.format(value)
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(
            f"col_format {col_format!r} must take one positional field, e.g. '{{}} px': {e!r}"
        ) from None


def _grid(
    summary: Sequence[Mapping[str, Any]], rows: str, cols: str
) -> tuple[dict[tuple[Any, Any], Mapping[str, Any]], list[Any], list[Any]]:
    """`pivot`'s cells by (row value, column value), and the row and column values in order of
    first appearance; ValueError for a cell without a key `pivot` reads, or two for one place."""
    table: dict[tuple[Any, Any], Mapping[str, Any]] = {}
    seen_rows: list[Any] = []
    seen_cols: list[Any] = []
    for i, cell in enumerate(summary):
        for k in (rows, cols, "mean", "n"):
            if k not in cell:
                raise ValueError(
                    f"summary cell {i} has no key {k!r} (keys: {sorted(map(str, cell))})"
                )
        r, c = cell[rows], cell[cols]
        if (r, c) in table:
            raise ValueError(
                f"summary has two cells for {rows}={r!r}, {cols}={c!r}: summarize by exactly "
                f"[{rows!r}, {cols!r}] (or filter the records) before pivoting"
            )
        table[r, c] = cell
        if r not in seen_rows:
            seen_rows.append(r)
        if c not in seen_cols:
            seen_cols.append(c)
    return table, seen_rows, seen_cols


def _best_cells(
    table: Mapping[tuple[Any, Any], Mapping[str, Any]],
    row_values: Sequence[Any],
    col_values: Sequence[Any],
    best: str | None,
) -> set[tuple[Any, Any]]:
    """The places of the best (`best` "max" or "min") non-NaN mean of each column; ties all."""
    bold: set[tuple[Any, Any]] = set()
    if best is None:
        return bold
    pick = max if best == "max" else min
    for c in col_values:
        means = {r: float(table[r, c]["mean"]) for r in row_values if (r, c) in table}
        means = {r: m for r, m in means.items() if not math.isnan(m)}
        if means:
            target = pick(means.values())
            bold |= {(r, c) for r, m in means.items() if m == target}
    return bold


def _cell_text(cell: Mapping[str, Any] | None, fmt: str, fmt_single: str, show_nan: bool) -> str:
    """One `pivot` cell's text: MISSING, "NaN", or its format (with the NaN count)."""
    if cell is None:
        return MISSING
    if int(cell["n"]) == 0:
        return "NaN"
    name, f = ("fmt_single", fmt_single) if int(cell["n"]) == 1 else ("fmt", fmt)
    text = _escape(_format(f, name, cell))
    if show_nan and int(cell.get("nan", 0)):
        text += f" ({int(cell['nan'])} NaN)"
    return text


def pivot(
    summary: Sequence[Mapping[str, Any]],
    rows: str,
    cols: str,
    *,
    row_order: Sequence[Any] | None = None,
    col_order: Sequence[Any] | None = None,
    fmt: str = "{mean:.1f} ± {std:.1f}",
    fmt_single: str = "{mean:.1f}",
    best: str | None = "max",
    row_label: str | None = None,
    col_format: str = "{}",
    show_nan: bool = True,
) -> str:
    """A GitHub markdown table of `summarize` cells: one line per `rows` value, one column per
    `cols` value (orders default to first appearance; values missing from a given order are
    appended after it, values of the order absent from the data give empty lines/columns).

    A cell reads `fmt.format(**cell)`, or `fmt_single` when n == 1; a missing combination reads
    "–" and a cell whose values are all NaN reads "NaN". With best="max" / "min" the best mean of
    each column is bold (ties all bold); best=None bolds nothing. Header cells are
    `col_format.format(value)`; the first header is `row_label` (default: `rows`). With
    `show_nan`, a cell that left out NaN values says how many, e.g. "71.2 (1 NaN)".
    """
    if best not in _BEST:
        raise ValueError(f"best must be one of {list(_BEST)}, got {best!r}")
    if not summary:
        raise ValueError("summary must hold at least one cell (summarize() of no records is empty)")
    table, seen_rows, seen_cols = _grid(summary, rows, cols)
    row_values, col_values = _order(seen_rows, row_order), _order(seen_cols, col_order)

    bold = _best_cells(table, row_values, col_values, best)

    header = [_escape(rows if row_label is None else row_label)]
    header += [_escape(_format_value(col_format, c)) for c in col_values]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in row_values:
        cells = [_escape(r)]
        for c in col_values:
            text = _cell_text(table.get((r, c)), fmt, fmt_single, show_nan)
            cells.append(f"**{text}**" if (r, c) in bold else text)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_table(
    records: Sequence[Mapping[str, Any]], rows: str, cols: str, value: str, **options: Any
) -> str:
    """`pivot` of `summarize(records, [rows, cols], value)`: `value` over seeds, one line per
    `rows` value and one column per `cols` value; `options` are `pivot`'s."""
    return pivot(summarize(records, [rows, cols], value), rows=rows, cols=cols, **options)


def mean_std(cell: Mapping[str, Any], digits: int = 1) -> str:
    """One `summarize` cell as "mean ± std" with `digits` decimals, or the mean alone when
    n == 1: one seed has no spread, and "± 0.0" would claim one."""
    mean = f"{cell['mean']:.{digits}f}"
    return mean + (f" ± {cell['std']:.{digits}f}" if int(cell["n"]) > 1 else "")


def cell_text(cell: Mapping[str, Any] | None, digits: int = 1) -> str:
    """`mean_std` of a `summarize` cell, or MISSING for none or one without a value."""
    return MISSING if cell is None or not cell["n"] else mean_std(cell, digits)


def claims_table(claims: Sequence[tuple[str, str, bool | None]]) -> str:
    """A markdown table of a paper's claims checked against measurements: one row per (claim,
    what was measured, True / False / None when the numbers cannot decide it: within the seeds'
    spread) -> "yes" / "**no**" / "undecided"."""
    lines = ["| claim | measured | holds |", "|---|---|---|"]
    for claim, measured, holds in claims:
        verdict = "undecided" if holds is None else ("yes" if holds else "**no**")
        lines.append(f"| {_escape(claim)} | {_escape(measured)} | {verdict} |")
    return "\n".join(lines)


def _fence(text: str) -> str:
    """A backtick fence longer than any backtick run inside `text`."""
    longest = max(map(len, re.findall("`+", text)), default=0)
    return "`" * max(3, longest + 1)


class Report:
    """A markdown report built block by block, e.g.

    >>> rep = Report("Vision experiment")
    >>> rep.paragraph("ViT d=192 ...")
    >>> rep.table(pivot(summary, rows="row", cols="size"), caption="Top-1 accuracy (%).")
    >>> rep.image("accuracy.png", "Accuracy vs resolution.")
    >>> path = rep.write("runs/vision/report.md")
    """

    def __init__(self, title: str) -> None:
        if not isinstance(title, str) or not title.strip():
            raise ValueError(f"title must be a non-empty str, got {title!r}")
        self.title = title
        self.blocks: list[str] = []

    def _add(self, block: str) -> Report:
        self.blocks.append(block.strip("\n"))
        return self

    def heading(self, text: str, level: int = 2) -> Report:
        """A section heading (level 2 to 6; the title is level 1)."""
        if isinstance(level, bool) or not isinstance(level, int) or not 2 <= level <= 6:
            raise ValueError(f"level must be an int in 2..6, got {level!r}")
        return self._add("#" * level + " " + " ".join(str(text).split()))

    def paragraph(self, text: str) -> Report:
        """A paragraph of markdown text."""
        return self._add(str(text))

    def table(self, markdown: str, caption: str | None = None) -> Report:
        """A markdown table (e.g. from `pivot`), with an optional caption above it."""
        if not isinstance(markdown, str) or not markdown.lstrip().startswith("|"):
            raise ValueError("markdown must be a markdown table (a str whose lines start with '|')")
        block = markdown.strip("\n")
        return self._add(f"*{caption}*\n\n{block}" if caption else block)

    def image(self, path: str | PurePath, caption: str) -> Report:
        """An image, `path` relative to the report's folder, with a caption under it."""
        p = PurePath(path)
        if p.is_absolute() or str(path) == "":
            raise ValueError(
                f"path must be a non-empty path relative to the report, got {str(path)!r}"
            )
        alt = " ".join(str(caption).split()).replace("]", ")").replace("[", "(")
        return self._add(f"![{alt}]({p.as_posix()})\n\n*{caption}*")

    def code(self, text: str, lang: str = "") -> Report:
        """A fenced code block (the fence outgrows any backticks inside `text`)."""
        fence = _fence(text)
        return self._add(f"{fence}{lang}\n{text.rstrip(chr(10))}\n{fence}")

    def markdown(self) -> str:
        """The whole report as markdown text (ends with one newline)."""
        return "\n\n".join([f"# {self.title}", *self.blocks]) + "\n"

    def write(self, path: str | Path) -> Path:
        """Write the report to `path` atomically; returns the path."""
        return write_text(path, self.markdown())
