"""The language-model report's verdict, written from the numbers: which rows keep their
perplexity at long lengths, whether CAPE's augmentation helps each base, what the fine-tune
buys the RoPE extensions, and the best row at the longest length.

Every comparison is of perplexity means over seeds; two cells whose means differ by less than
the larger of their seed spreads (`cape.lab.experiments.pairs.level`), or by less than LEVEL of
the second (one seed has no spread), are called level."""

from __future__ import annotations

import math
from typing import Any

from cape.lab.experiments.pairs import AUGMENTATION_KEYS, twins
from cape.lab.experiments.pairs import augmentation_method as method
from cape.lab.experiments.pairs import level as within_spread
from cape.lab.experiments.verdict import Study, positions_line, removed_cells
from cape.lab.report import MISSING, mean_std, summarize

__all__ = [
    "KEEP",
    "LEVEL",
    "level",
    "ppl_cells",
    "kept",
    "augmentation",
    "finetunes",
    "best_longest",
    "verdict",
]

KEEP = 0.10  # a row keeps its perplexity at a length within this share above its 1x one
LEVEL = 0.01  # two perplexities within this share of each other are level whatever the seeds
Cells = dict[tuple[str, int], dict[str, Any]]


def ppl_cells(results: dict[str, Any], key: str = "ppl") -> Cells:
    """(row, factor) -> `summarize` cell of `key` over seeds."""
    cells = summarize(results["records"], ["row", "factor"], key)
    return {(c["row"], c["factor"]): c for c in cells if c["n"]}


def _factors(results: dict[str, Any]) -> list[int]:
    return list(results["config"]["eval"]["factors"])


def level(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two perplexity cells are level: within the seeds' spread or within LEVEL."""
    return within_spread(a, b) or abs(a["mean"] - b["mean"]) <= LEVEL * abs(b["mean"])


def _pct(a: dict[str, Any], b: dict[str, Any]) -> str:
    text = f"{100 * (a['mean'] / b['mean'] - 1):+.1f}%"
    return text + (" (level)" if level(a, b) else "")


def kept(results: dict[str, Any]) -> tuple[str, list[str]]:
    """A table of each row's perplexity at every longer length as a ratio to its own at 1x (per
    seed, then mean ± std), and one sentence per length of 8x and 16x (else the longest) naming
    the rows within KEEP of their 1x perplexity."""
    ratios = []
    ppl = {(r["row"], r["seed"], r["factor"]): r["ppl"] for r in results["records"]}
    for (row, seed, factor), value in ppl.items():
        base = ppl.get((row, seed, 1))
        if factor > 1 and base:
            ratios.append({"row": row, "factor": factor, "ratio": value / base})
    cells = {(c["row"], c["factor"]): c for c in summarize(ratios, ["row", "factor"], "ratio")}
    longer = [f for f in _factors(results) if f > 1]
    head = ["row", *[f"{f}x / 1x" for f in longer]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    keeps: dict[int, list[str]] = {f: [] for f in longer}
    for row in [r["name"] for r in results["config"]["rows"]]:
        line = [row]
        for f in longer:
            cell = cells.get((row, f))
            if cell is None or not cell["n"]:
                line.append(MISSING)
                continue
            ok = cell["mean"] <= 1 + KEEP
            keeps[f] += [row] if ok else []
            line.append(f"{mean_std(cell, 2)}{' (keeps)' if ok else ''}")
        lines.append("| " + " | ".join(line) + " |")
    asked = [f for f in longer if f in (8, 16)] or longer[-1:]
    said = [f"at {f}x: {', '.join(keeps[f]) or 'none'}" for f in asked]
    return "\n".join(lines), said


def _plain(row: dict[str, Any]) -> bool:
    return not row.get("train_as") and not row.get("finetune_from") and not row["eval_options"]


def augmentation(results: dict[str, Any], cells: Cells) -> list[str]:
    """One sentence per (augmented row, the same row without its augmentation: CAPE's or one of
    `pairs.METHODS`), and CAPE (cape1d) against sinpos: the perplexity change at 1x, at 8x and
    16x and at the longest length, and whether it helps there."""
    rows = results["config"]["rows"]
    pairs = twins(rows, AUGMENTATION_KEYS)
    sinpos = next((r["name"] for r in rows if r["position"] == "sinpos" and _plain(r)), None)
    pairs += [(r["name"], sinpos) for r in rows if r["position"] == "cape1d" and sinpos]
    factors = _factors(results)
    # 1x, 8x, 16x and the longest length (the one the sentence judges)
    shown = sorted({1, factors[-1], *(f for f in factors if f in (8, 16))})
    out = []
    by_name = {r["name"]: r for r in rows}
    for aug, base in pairs:
        diffs = [
            f"{_pct(cells[aug, f], cells[base, f])} at {f}x"
            for f in shown
            if (aug, f) in cells and (base, f) in cells
        ]
        if not diffs:
            continue
        longest = factors[-1]
        a, b = cells.get((aug, longest)), cells.get((base, longest))
        if a is None or b is None or level(a, b):
            word = "level"
        else:
            word = "helps" if a["mean"] < b["mean"] else "hurts"
        out.append(
            f"**{method(by_name[aug])} on {base}: {word} at {longest}x.** `{aug}` against "
            f"`{base}`, perplexity {', '.join(diffs)}."
        )
    return out


def finetunes(results: dict[str, Any], cells: Cells) -> list[str]:
    """One sentence per fine-tuned row against the same extension chosen at inference on the
    weights it started from (no fine-tune). Only at the fine-tune's length do both scale by the
    same factor: that is the fine-tune's own effect; elsewhere the fine-tuned row keeps its
    factor and the other scales by length / L, so the difference is said apart."""
    cfg = results["config"]
    rows, ft = cfg["rows"], cfg.get("finetune", {})
    out = []
    for row in rows:
        source = row.get("finetune_from")
        if not source:
            continue
        window = row.get("finetune_factor") or ft.get("factor")  # times L, the windows
        at = row["options"].get("factor", window)  # the fixed factor RoPE scales by
        scaling = row["options"].get("scaling")
        twin = next(
            (
                r["name"]
                for r in rows
                if r.get("train_as") == source and r["eval_options"].get("scaling") == scaling
            ),
            source,
        )
        diffs = {
            f: _pct(cells[row["name"], f], cells[twin, f])
            for f in _factors(results)
            if (row["name"], f) in cells and (twin, f) in cells
        }
        if not diffs:
            continue
        head = f"**What the fine-tune buys `{row['name']}`** ({ft.get('steps')} steps at "
        head += f"{window}x L{_with(row)} from `{source}`'s weights), perplexity against `{twin}` "
        head += "(no fine-tune): "
        extended = twin != source  # the twin scales too (by length / L), else plain weights
        same = ""
        if at in diffs:
            where = f"where both scale by {at:g}" if extended else "the length it was fine-tuned at"
            same = f"{diffs.pop(at)} at {at:g}x, {where}"
        rest = ", ".join(f"{d} at {f}x" for f, d in diffs.items())
        if rest and extended:
            rest = f"at the other lengths (factor {at:g} against length / L) {rest}"
        out.append(f"{head}{same}{'; ' if same and rest else ''}{rest}.")
    return out


def _with(row: dict[str, Any]) -> str:
    """The words ', with <method>' for a fine-tune that also augments its positions (PoSE)."""
    options = row.get("options") or {}
    return f", with {method(row)}" if options.get("augmentation") else ""


def best_longest(results: dict[str, Any], cells: Cells) -> str:
    """The rows with the lowest perplexity at the longest length."""
    longest = _factors(results)[-1]
    ranked = sorted(
        (r["name"] for r in results["config"]["rows"] if (r["name"], longest) in cells),
        key=lambda n: cells[n, longest]["mean"],
    )
    if not ranked:
        return f"Best at {longest}x: no row was evaluated there."
    top = ranked[0]
    text = f"**Best at {longest}x: {top}**, perplexity {mean_std(cells[top, longest], 2)}"
    if len(ranked) > 1:
        second = cells[ranked[1], longest]
        text += f"; next {ranked[1]}, {mean_std(second, 2)}"
        text += " (level)" if level(cells[top, longest], second) else ""
    return text + "."


def positions(results: dict[str, Any], cells: Cells) -> str:
    """Does the task need positions (`cape.lab.experiments.verdict.positions_line`): the best
    row against nopos at 1x L, and the rows measured with their positions taken out."""
    study = Study(
        rows=results["config"]["rows"], cells=cells, columns=_factors(results), train=1,
        unseen=[], label=lambda f: f"{f}x L", metric="perplexity", unit="", higher=False,
        digits=2, removed=removed_cells(results),
    )  # fmt: skip
    return positions_line(study)


def verdict(results: dict[str, Any]) -> tuple[list[str], str]:
    """The verdict's lines (the report writes each as a bullet) and its table of perplexity
    ratios, from the numbers."""
    cells = ppl_cells(results)
    table, said = kept(results)
    keep = (
        f"**Rows whose perplexity stays within {KEEP:.0%} of their 1x perplexity** (per seed, "
        "then mean over seeds): " + "; ".join(said) + "."
    )
    out = [positions(results, cells), keep, *augmentation(results, cells)]
    out += finetunes(results, cells)
    out.append(best_longest(results, cells))
    if any(math.isnan(c["mean"]) for c in cells.values()):
        out.append("Some runs gave no finite perplexity (a diverged run); see the table.")
    return out, table
