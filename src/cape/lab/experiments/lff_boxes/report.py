"""The LFF boxes experiment's report: Tables 3-4 analogs with Welch t-tests, and a plot.

`render(out, results)` writes `report.md` and `seen_vs_unseen.png`, a pure function of the
results (the `Experiment` base writes `results.json` first, and `cape plot` renders again from it).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from cape.lab.data.boxes import QUESTIONS
from cape.lab.experiments.lff_boxes.verdict import SETS, verdict
from cape.lab.experiments.reporting import add_tradeoff, plot_ok, train_cost_table, welch_p
from cape.lab.experiments.verdict import add_verdict
from cape.lab.report import Report, cell_text, summarize, summary_table

_COLUMNS = ["all", *QUESTIONS]  # of the accuracy tables

__all__ = ["render", "main_table"]

_ROTARY = (
    "RoPE rows: RoPE-ViT's rotations (axial: theta 100, planes split among the 4 edges; mixed: "
    "theta 10, learned frequencies over all 4) of every layer's queries and keys by the edges "
    "in cells, the question token at the query box's edges; nothing is added to the tokens. "
)


def main_table(results: dict[str, Any]) -> str:
    """Markdown: per row, encoding parameters, mean ± std accuracy on seen / unseen screens,
    the drop, and Welch t-test p-values against the reference row (eval.reference)."""
    rows = [r["name"] for r in results["config"]["rows"]]
    ref = results["config"]["eval"]["reference"]
    recs = [r for r in results["records"] if r["question"] == "all"]
    cells = {(c["row"], c["set"]): c for c in summarize(recs, ["row", "set"], "acc")}
    best = {
        s: max((c["mean"] for (_, s2), c in cells.items() if s2 == s and c["n"]), default=math.nan)
        for s in SETS
    }
    has_ref = any(row == ref for row, _ in cells)
    head = ["row", "encoding params", "seen %", "unseen %", "unseen − seen"]
    if has_ref:
        head += [f"p seen vs {ref}", f"p unseen vs {ref}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        seen, unseen = cells.get((row, "test_seen")), cells.get((row, "test_unseen"))
        params = results.get("params", {}).get(row, {}).get("position")
        line = [row, "–" if params is None else f"{params:,}"]
        for s, c in (("test_seen", seen), ("test_unseen", unseen)):
            text = cell_text(c)
            line.append(
                f"**{text}**" if c is not None and c["n"] and c["mean"] == best[s] else text
            )
        gap = (
            unseen["mean"] - seen["mean"] if seen and unseen and seen["n"] and unseen["n"] else None
        )
        line.append("–" if gap is None else f"{gap:+.1f}")
        if has_ref:
            for s in SETS:
                p = welch_p(cells.get((row, s)), cells.get((ref, s)))
                line.append("ref" if row == ref else "–" if math.isnan(p) else f"{p:.3f}")
        lines.append("| " + " | ".join(line) + " |")
    return "\n".join(lines)


def render(out: Path, results: dict[str, Any]) -> Path:
    cfg = results["config"]
    rows = [r["name"] for r in cfg["rows"]]
    d, m, t = cfg["data"], cfg["model"], cfg["train"]
    rep = Report(f"LFF boxes experiment `{results['name']}`")
    rep.paragraph(
        f"LFF paper sec. 4.4 (Tables 3-4) on procedural screens: {d['min_boxes']}-{d['max_boxes']} "
        f"boxes on a {d['canvas']} x {d['canvas']} canvas, each with one of 8 widget types; "
        f"questions ({', '.join(QUESTIONS)}) ask for the widget type of the box in that "
        f"relation to the query box, or none. Train "
        f"and val screens and test_seen use even coordinates only; test_unseen is test_seen "
        f"moved by one cell (odd coordinates only, never seen in training; same questions and "
        f"answers). Transformer encoder d={m['dim']}, depth {m['depth']}, {m['heads']} heads, "
        f"FFN {m['ffn_dim']}; {t['steps']} steps of batch {t['batch_size']} ({t['optimizer']}, "
        f"lr {t['lr']}, {t['schedule']}) on {d['train']} screens; {d['test']} test screens per "
        f"set; seeds {cfg['seeds']} (mean ± std over seeds; p: Welch's t-test over seeds, "
        f"two-sided, needs >= 2 seeds). Positions: box edges / (canvas - 1) in [0, 1]; LFF "
        f"|F|={m['fourier_dim']}, |H|={m['hidden_dim']}, gamma = {m['gamma_cells']} cells, "
        f"Embed-4D init std {m.get('embed_init_std', 0.02)} unless a row says otherwise. "
        f"{_ROTARY if any(r['position'].startswith('rope-') for r in cfg['rows']) else ''}"
        f"Produced by `cape experiment lff-boxes`; `cape plot` "
        f"redraws this page from results.json."
    )
    add_verdict(rep, verdict(results))
    base = results.get("baselines", {})
    if base:
        parts = [
            f"{name.replace('_', '-')}: {v['test_seen']:.1f}% seen, {v['test_unseen']:.1f}% unseen"
            for name, v in base.items()
        ]
        rep.paragraph(
            "Baselines without training (answers need positions): "
            + "; ".join(parts)
            + ". Majority: the commonest train answer per question type; content-only: "
            "the Bayes-optimal guess from the widget types and the number of boxes."
        )
    augmented = [f"{r['name']}: {r['augment']}" for r in cfg["rows"] if r.get("augment")]
    if augmented:
        rep.paragraph(
            "CAPE augmentation of the box corners in training (one shift per axis "
            "and one scale per screen, shared by all corners): " + "; ".join(augmented)
        )
    rep.table(
        main_table(results),
        caption="Answer accuracy (%) on screens with seen and unseen "
        "coordinate values (Tables 3-4 analog); encoding params: trainable parameters of "
        "the position encoding.",
    )
    for split, label in SETS.items():
        recs = [r for r in results["records"] if r["set"] == split]
        if recs:
            rep.table(
                summary_table(recs, "row", "question", "acc", row_order=rows, col_order=_COLUMNS),
                caption=f"Accuracy (%) per question type, {label} coordinates.",
            )
    _plot(rep, out, results)
    train_cost_table(rep, results)
    return rep.write(out / "report.md")


def _plot(rep: Report, out: Path, results: dict[str, Any]) -> None:
    recs = [r for r in results["records"] if r["question"] == "all"]
    seen = summarize([r for r in recs if r["set"] == "test_seen"], ["row", "question"], "acc")
    unseen = summarize([r for r in recs if r["set"] == "test_unseen"], ["row", "question"], "acc")
    if not (seen and unseen and plot_ok()):
        return
    add_tradeoff(
        rep,
        out,
        "seen_vs_unseen.png",
        "Accuracy on unseen vs seen coordinates per encoding (one "
        "point per row, error bars: std over seeds); the distance below the diagonal is "
        "the loss on unseen positions.",
        seen,
        unseen,
        key="question",
        x_label="accuracy on seen coordinates (%)",
        y_label="accuracy on unseen coordinates (%)",
        title="Generalisation to unseen box coordinates",
        logx=False,
        annotate="row",
    )
