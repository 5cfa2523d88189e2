"""The language-model report's verdict, written from the numbers: which rows keep their
perplexity at long lengths, whether CAPE's augmentation (or a successor's) helps each base,
which way of moving positions in training keeps a base's perplexity and how CAPE's compares with
its successors, what the fine-tune buys the RoPE extensions, and the best row at the longest
length.

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
    "ratio_cells",
    "kept",
    "augmentation",
    "successors",
    "finetunes",
    "best_longest",
    "verdict",
]

KEEP = 0.10  # a row keeps its perplexity at a length within this share above its 1x one
LEVEL = 0.01  # two perplexities within this share of each other are level whatever the seeds
Cells = dict[tuple[str, int], dict[str, Any]]
CAPE = method({})  # the name `augmentation_method` gives a row augmented by CAPE's augmentation


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


def ratio_cells(results: dict[str, Any]) -> Cells:
    """(row, factor) -> each longer length's perplexity over the row's own at 1x, per seed then
    summarized over seeds."""
    ratios = []
    ppl = {(r["row"], r["seed"], r["factor"]): r["ppl"] for r in results["records"]}
    for (row, seed, factor), value in ppl.items():
        base = ppl.get((row, seed, 1))
        if factor > 1 and base:
            ratios.append({"row": row, "factor": factor, "ratio": value / base})
    cells = summarize(ratios, ["row", "factor"], "ratio")
    return {(c["row"], c["factor"]): c for c in cells if c["n"]}


def _keeps(ratio: dict[str, Any]) -> bool:
    """Whether a `ratio_cells` cell keeps the row's 1x perplexity: a mean within KEEP above it."""
    return ratio["mean"] <= 1 + KEEP


def kept(results: dict[str, Any]) -> tuple[str, list[str]]:
    """A table of each row's perplexity at every longer length as a ratio to its own at 1x (per
    seed, then mean ± std), and one sentence per length of 8x and 16x (else the longest) naming
    the rows within KEEP of their 1x perplexity."""
    cells = ratio_cells(results)
    longer = [f for f in _factors(results) if f > 1]
    head = ["row", *[f"{f}x / 1x" for f in longer]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    keeps: dict[int, list[str]] = {f: [] for f in longer}
    for row in [r["name"] for r in results["config"]["rows"]]:
        line = [row]
        for f in longer:
            cell = cells.get((row, f))
            if cell is None:
                line.append(MISSING)
                continue
            ok = _keeps(cell)
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


def _moved(rows: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Base row -> the rows that are it with its positions moved in training: its augmentation
    twins, and fine-tunes of its weights that augment (PoSE)."""
    moved: dict[str, list[str]] = {}
    for aug, base in twins(rows, AUGMENTATION_KEYS):
        moved.setdefault(base, []).append(aug)
    for row in rows:
        if row.get("finetune_from") and (row.get("options") or {}).get("augmentation"):
            moved.setdefault(row["finetune_from"], []).append(row["name"])
    return moved


def successors(results: dict[str, Any], cells: Cells) -> list[str]:
    """For each base row whose positions are moved in training by CAPE's augmentation and by one
    of its successors (`pairs.METHODS`): which of those rows keep their perplexity within KEEP
    of their 1x one to the longest length, at what cost at 1x against the base, beside the
    rows that keep it without moving positions; then each CAPE row against each successor
    there (better, worse or level: lower perplexity is better)."""
    rows = results["config"]["rows"]
    by_name = {r["name"]: r for r in rows}
    longest = _factors(results)[-1]
    ratios = ratio_cells(results)
    moved = _moved(rows)
    moved_any = {a for augs in moved.values() for a in augs}
    still = [
        r["name"]
        for r in rows
        if (r["name"], longest) in ratios
        and _keeps(ratios[r["name"], longest])
        and r["name"] not in moved_any
        and r["position"] != "nopos"
    ]
    out = []
    for base, augs in moved.items():
        augs = [a for a in augs if (a, longest) in ratios and (base, 1) in cells]
        capes = [a for a in augs if method(by_name[a]) == CAPE]
        if not capes or len(capes) == len(augs):
            continue
        keeps = [a for a in augs if _keeps(ratios[a, longest])]
        rest = [a for a in augs if a not in keeps]
        text = (
            f"**Moving `{base}`'s positions in training: within {KEEP:.0%} of the 1x perplexity "
            f"to {longest}x** (ratio; cost at 1x against `{base}`): "
            + (", ".join(_said(a, base, ratios, cells, longest) for a in keeps) or "none")
        )
        if rest:
            text += "; not " + ", ".join(_said(a, base, ratios, cells, longest) for a in rest)
        if still:
            kept_ppl = ", ".join(f"`{n}` {mean_std(cells[n, longest], 2)}" for n in still)
            text += f". Without moving positions, these keep it (perplexity at {longest}x): "
            text += kept_ppl
        out.append(text + ".")
        out.append(_cape_against(base, capes, [a for a in augs if a not in capes], cells, longest))
    return out


def _said(row: str, base: str, ratios: Cells, cells: Cells, at: int) -> str:
    ratio = ratios[row, at]["mean"]
    return f"`{row}` ({ratio:.2f}x; {_pct(cells[row, 1], cells[base, 1])} at 1x)"


def _cape_against(base: str, capes: list[str], others: list[str], cells: Cells, at: int) -> str:
    """Each CAPE row against each successor row at length `at`, by perplexity."""
    parts = []
    for c in capes:
        groups: dict[str, list[str]] = {"level with": [], "better than": [], "worse than": []}
        for o in others:
            a, b = cells[c, at], cells[o, at]
            word = "level with" if level(a, b) else "better than" if a["mean"] < b["mean"] else ""
            groups[word or "worse than"].append(f"`{o}` ({mean_std(b, 2)})")
        said = "; ".join(f"{w} {', '.join(g)}" for w, g in groups.items() if g)
        parts.append(f"`{c}` ({mean_std(cells[c, at], 2)}) is {said}")
    return f"**CAPE's augmentation against its successors on `{base}`, at {at}x:** " + (
        ". ".join(parts) + "."
    )


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
    out += successors(results, cells)
    out += finetunes(results, cells)
    out.append(best_longest(results, cells))
    if any(math.isnan(c["mean"]) for c in cells.values()):
        out.append("Some runs gave no finite perplexity (a diverged run); see the table.")
    return out, table
