"""The length experiment's report: accuracy per test length, a verdict written from the numbers,
and a plot of accuracy against length.

`render(out, results)` writes `report.md` and `accuracy_vs_length.png`, a pure function of the
results (the `Experiment` base writes `results.json` first, and `cape plot` renders again from it).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from cape.lab.experiments.recipes import recipe_notes
from cape.lab.experiments.reporting import (
    add_curves,
    plot_ok,
    seeds_by_row,
    train_cost_table,
    welch_p,
)
from cape.lab.experiments.verdict import Study, add_verdict, removed_cells
from cape.lab.experiments.verdict import verdict as shared_verdict
from cape.lab.report import MISSING, Report, cell_text, mean_std, summarize

__all__ = ["render", "length_table", "verdict"]

MARGIN = 10.0  # points above which a row beats the content-only one (or the position-blind bound)
KEEP = 0.9  # a row keeps its accuracy at a length if it reaches this share of its 1x accuracy
ALPHA = 0.05  # Welch's test level, where both groups have >= 2 seeds


def _factor(results: dict[str, Any], length: int) -> str:
    return f"{length / results['config']['data']['max_len']:g}x"


def _cells(results: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    """(row, length) -> `summarize` cell of the accuracy over seeds."""
    return {
        (c["row"], c["length"]): c for c in summarize(results["records"], ["row", "length"], "acc")
    }


def _mean(cell: dict[str, Any] | None) -> float:
    return math.nan if cell is None or not cell["n"] else float(cell["mean"])


def length_table(results: dict[str, Any]) -> str:
    """Markdown: per row, its encoding, seeds and mean ± std accuracy (%) at every test length
    (best per length in bold), then chance (1/V) and the position-blind bound."""
    cfg = results["config"]
    lengths, cells, seeds = cfg["eval"]["lengths"], _cells(results), seeds_by_row(results)
    best = {
        n: max((_mean(cells.get((r["name"], n))) for r in cfg["rows"]), default=math.nan)
        for n in lengths
    }
    head = ["row", "encoding", "seeds", *[f"{n} ({_factor(results, n)})" for n in lengths]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in cfg["rows"]:
        name = row["name"]
        encoding = row["position"] + (f", weights of {row['train_as']}" if row["train_as"] else "")
        line = [name, encoding, str(len(seeds.get(name, [])))]
        for n in lengths:
            cell = cells.get((name, n))
            text = cell_text(cell)
            line.append(f"**{text}**" if _mean(cell) == best[n] else text)
        lines.append("| " + " | ".join(line) + " |")
    base = results["baselines"]
    blind = [f"{base['position_blind'].get(str(n), math.nan):.1f}" for n in lengths]
    chance = [f"{base['chance']:.1f}"] * len(lengths)
    for name, values in (("chance (1/V)", chance), ("position-blind bound", blind)):
        lines.append("| " + " | ".join([name, MISSING, MISSING, *values]) + " |")
    return "\n".join(lines)


def _positions_needed(results: dict[str, Any], cells: dict, ref: int) -> str:
    cfg = results["config"]
    nopos = next((r["name"] for r in cfg["rows"] if r["position"] == "nopos"), None)
    ranked = sorted(
        (r["name"] for r in cfg["rows"] if r["name"] != nopos and (r["name"], ref) in cells),
        key=lambda n: -_mean(cells[n, ref]),
    )
    if nopos is None or (nopos, ref) not in cells or not ranked:
        return "Positions needed: cannot say (no content-only row, or no other row, was run)."
    top, blind = ranked[0], results["baselines"]["position_blind"].get(str(ref), math.nan)
    gap = _mean(cells[top, ref]) - _mean(cells[nopos, ref])
    p = welch_p(cells[top, ref], cells[nopos, ref])
    needed = gap > MARGIN and (math.isnan(p) or p < ALPHA)
    p_text = "no p: fewer than 2 seeds" if math.isnan(p) else f"Welch p = {p:.3g}"
    return (
        f"**Positions needed: {'yes' if needed else 'no'}.** At {ref} tokens "
        f"({_factor(results, ref)}), content only ({nopos}) reaches "
        f"{cell_text(cells[nopos, ref])}% (chance {results['baselines']['chance']:.1f}%, the best "
        f"position-blind guess {blind:.1f}%), the best row ({top}) {cell_text(cells[top, ref])}%: "
        f"{gap:+.1f} points ({p_text}). Yes means more than {MARGIN:g} points, and "
        f"p < {ALPHA} where both rows have >= 2 seeds."
    )


def _kept(results: dict[str, Any], ref: int) -> tuple[str, list[str]]:
    """A table of each learned row's accuracy at every longer length as a share of its own at
    `ref` (per seed, then mean ± std), and one line per length naming the rows that keep
    >= KEEP of it."""
    cfg, recs = results["config"], results["records"]
    lengths = [n for n in cfg["eval"]["lengths"] if n > ref]
    blind = results["baselines"]["position_blind"].get(str(ref), math.nan)
    acc = {(r["row"], r["seed"], r["length"]): r["acc"] for r in recs}
    cells = _cells(results)
    learned = [
        r["name"] for r in cfg["rows"] if _mean(cells.get((r["name"], ref))) > blind + MARGIN
    ]
    head = ["row", f"{ref} ({_factor(results, ref)}) %", *[_factor(results, n) for n in lengths]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    keeps: dict[int, list[str]] = {n: [] for n in lengths}
    for name in learned:
        line = [name, cell_text(cells[name, ref])]
        for n in lengths:
            shares = [
                {"row": name, "share": acc[name, s, n] / acc[name, s, ref]}
                for (row, s, m) in acc
                if row == name and m == n and acc.get((name, s, ref))
            ]
            if not shares:
                line.append(MISSING)
                continue
            cell = summarize(shares, ["row"], "share")[0]
            kept = cell["mean"] >= KEEP
            keeps[n] += [name] if kept else []
            line.append(f"{mean_std(cell, 2)} ({'keeps' if kept else 'drops'})")
        lines.append("| " + " | ".join(line) + " |")
    said = [
        f"at {n} tokens ({_factor(results, n)}): {', '.join(keeps[n]) or 'none'}" for n in lengths
    ]
    return "\n".join(lines), said


def verdict(results: dict[str, Any]) -> tuple[list[str], str]:
    """The verdict's lines (`cape.lab.experiments.verdict`, with this experiment's test of
    positions against the position-blind bound and the rows that keep their accuracy) and the
    table of kept accuracy, written from the numbers."""
    cells = _cells(results)
    rows, lengths = results["config"]["rows"], results["config"]["eval"]["lengths"]
    ref = lengths[0]
    table, said = _kept(results, ref)
    keep = (
        f"**Rows that keep >= {KEEP:.0%} of their {ref}-token accuracy** (of the rows more than "
        f"{MARGIN:g} points above the position-blind bound at {ref} tokens; share of the 1x "
        "accuracy per seed, mean ± std over seeds): " + "; ".join(said) + "."
    )
    study = Study(
        rows=rows, cells=cells, columns=lengths, train=ref, unseen=lengths[1:],
        label=lambda n: f"{n} tokens", positions=_positions_needed(results, cells, ref),
        extra=[keep],
        removed=removed_cells(results),
    )  # fmt: skip
    return shared_verdict(study), table


def render(out: Path, results: dict[str, Any]) -> Path:
    cfg = results["config"]
    d, m, t, e = cfg["data"], cfg["model"], cfg["train"], cfg["eval"]
    rep = Report(f"Length experiment `{results['name']}`")
    rep.paragraph(
        f"Each sequence holds tokens drawn uniformly from {d['vocab']} symbols; the target at "
        f"position t is the token at t - {d['offset']} (the first {d['offset']} positions and "
        f"padding are not scored), so the answer is a relative position. Trained on lengths "
        f"{d['min_len']}-{d['max_len']} ({d['train']} sequences, validation {d['val']}), tested "
        f"on {e['test']} sequences at each of {e['lengths']} tokens. Bidirectional Transformer "
        f"encoder d={m['dim']}, layers {m['layers']}, heads {m['heads']}, FFN {m['ffn_dim']}, "
        f"a linear head per position; {t['steps']} steps of batch {t['batch_size']} "
        f"({t['optimizer']}, lr {t['lr']}, {t['schedule']}); seeds {cfg['seeds']} (mean ± std "
        f"over seeds; accuracy over the scored tokens, %). The final weights are evaluated. "
        f"Produced by `cape experiment length`; `cape plot` redraws this page from results.json."
    )
    lines, table = verdict(results)
    add_verdict(rep, lines)
    notes = []
    for r in cfg["rows"]:
        parts = [f"options {r['options']}"] if r["options"] else []
        parts += [f"at evaluation {r['eval_options']}"] if r["eval_options"] else []
        parts += [f"the weights of {r['train_as']}"] if r["train_as"] else []
        notes += [f"{r['name']}: {', '.join(parts)}"] if parts else []
    positions, defaults = {r["position"] for r in cfg["rows"]}, []
    if "abspos" in positions:
        defaults.append(
            f"abspos: a table of {d['max_len']} rows at the content scale (init std 1); longer "
            "inputs wrap (E(t mod N), its default)."
        )
    if "cape1d" in positions:
        defaults.append("cape1d: CAPE's `text` preset.")
    defaults += recipe_notes(cfg["rows"], d["max_len"])
    rep.paragraph(
        "Encodings are `cape.build` names; absolute ones are added to the token embeddings, the "
        "others act in every layer's attention; CAPE's augmentation is drawn once per sequence "
        "and shared by the layers. "
        + " ".join([*defaults, *(["Row options: " + "; ".join(notes) + "."] if notes else [])])
    )
    recipes = [f"- `{r['name']}`: {r['notes']}" for r in cfg["rows"] if r.get("notes")]
    if recipes:  # the rows' papers' recipes, one bullet each
        rep.paragraph("Row recipes:\n\n" + "\n".join(recipes))
    rep.table(
        length_table(results),
        caption="Accuracy (%) per test length (tokens; x: times the longest training length), "
        "mean ± std over seeds, best per length in bold. Chance: 1/V; position-blind bound: the "
        "best guess from a token and the multiset of its sequence (what a model without "
        "positions can reach).",
    )
    if len(table.splitlines()) > 2:
        rep.table(
            table,
            caption="Accuracy at each longer length as a share of the row's own "
            f"at {e['lengths'][0]} tokens (keeps: >= {KEEP:.0%}).",
        )
    _plot(rep, out, results)
    trained = {k: v for k, v in results["train"].items() if "train_as" not in v}
    if trained:
        train_cost_table(rep, {"train": trained})
    return rep.write(out / "report.md")


def _plot(rep: Report, out: Path, results: dict[str, Any]) -> None:
    cells = summarize(results["records"], ["row", "length"], "acc")
    if not (cells and plot_ok()):
        return
    cfg = results["config"]
    chance = [
        {
            "row": "chance (1/V)",
            "length": n,
            "mean": results["baselines"]["chance"],
            "std": 0.0,
            "n": 1,
        }
        for n in cfg["eval"]["lengths"]
    ]
    add_curves(
        rep,
        out,
        "accuracy_vs_length.png",
        "Accuracy against the test length (log scale), one line per row (error bars: std over "
        "seeds); the dashed line is the longest training sequence.",
        cells + chance,
        x="length",
        y_label="accuracy (%)",
        x_label="test length (tokens, log scale)",
        title="Accuracy vs test length",
        series_order=[r["name"] for r in cfg["rows"]],
        vline=float(cfg["data"]["max_len"]),
        vline_label="longest training sequence",
        logx=True,
    )
