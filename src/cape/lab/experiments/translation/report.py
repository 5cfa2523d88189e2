"""The translation experiment's report: sacreBLEU overall, per length tercile and on the long
buckets (Table 2 / Figure 8 analog), and the NLL per output position on stacked sentences
(slides 30-31), each as mean ± std over seeds, with plots.

`render(out, results)` writes `report.md` and the PNGs, a pure function of the results (the
`Experiment` base writes `results.json` first, and `cape plot` renders again from it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cape.lab.experiments.recipes import recipe_notes
from cape.lab.experiments.reporting import add_curves, plot_ok, seeds_by_row, train_cost_table
from cape.lab.experiments.translation.verdict import labelled, verdict
from cape.lab.experiments.verdict import add_verdict
from cape.lab.report import Report, summarize, summary_table

__all__ = ["render", "bleu_table", "nll_table", "nll_curve_cells"]

_LABELS = {  # (split, bin) -> column, in the tables' order
    ("test", "all"): "test",
    ("test", "short"): "short",
    ("test", "medium"): "medium",
    ("test", "long"): "long",
    ("test_21-30", "all"): "21-30 words",
    ("test_31-40", "all"): "31-40 words",
    ("test_41+", "all"): "41+ words",
}
_SMOOTH = 8  # output positions per point of the NLL curves


def _rows(results: dict[str, Any]) -> list[str]:
    return [r["name"] for r in results["config"]["rows"]]


def bleu_table(results: dict[str, Any]) -> str:
    """Markdown: BLEU per row (lines) and test bucket (columns), mean ± std over seeds; the
    best of each column bold."""
    return summary_table(
        labelled(results, _LABELS),
        "row",
        "col",
        "bleu",
        row_order=_rows(results),
        col_order=list(_LABELS.values()),
        best="max",
    )


def nll_table(results: dict[str, Any]) -> str:
    """Markdown: mean NLL (nats/token) per output-position band on stacked pairs; lowest bold."""
    recs = [r for r in results["records"] if r["split"] == "stacked"]
    bands = sorted({r["bin"] for r in recs}, key=lambda b: int(b.split("-")[0]))
    return summary_table(
        recs,
        "row",
        "bin",
        "nll",
        row_order=_rows(results),
        col_order=bands,
        best="min",
        fmt="{mean:.2f} ± {std:.2f}",
        fmt_single="{mean:.2f}",
        col_format="positions {}",
    )


def nll_curve_cells(results: dict[str, Any]) -> list[dict[str, Any]]:
    """`summarize` cells of the per-position NLL (groups of `_SMOOTH` positions, only where at
    least 5 sequences reach): keys row, position (group centre), mean, std over seeds."""
    recs = []
    for key, curve in results["curves"].items():
        row = key.rsplit("/seed", 1)[0]
        total, count = np.asarray(curve["total"]), np.asarray(curve["count"])
        for a in range(0, len(total), _SMOOTH):
            n = count[a : a + _SMOOTH].sum()
            if count[a : a + _SMOOTH].min() >= 5:
                recs.append(
                    {
                        "row": row,
                        "position": a + _SMOOTH / 2,
                        "nll": float(total[a : a + _SMOOTH].sum() / n),
                    }
                )
    return summarize(recs, ["row", "position"], "nll") if recs else []


def render(out: Path, results: dict[str, Any]) -> Path:
    cfg = results["config"]
    m, t, e = cfg["model"], cfg["train"], cfg["eval"]
    d = results.get("data", {})
    sizes = ", ".join(f"{k} {v['pairs']}" for k, v in d.items() if isinstance(v, dict))
    lo, hi = results.get("terciles", [float("nan")] * 2)
    rep = Report(f"Translation experiment `{results['name']}`")
    rep.paragraph(
        "CAPE sec. 5.3 / appendix D at CPU scale: English -> Spanish on WordNet glosses and "
        "fortunes translated by Apertium (lower-cased), joint SentencePiece BPE "
        f"({d.get('vocab_size', '?')} pieces). Training pairs have <= 20 source words; the "
        f"long buckets (21-30, 31-40, 41+ words) are never seen in training. Pairs: {sizes}. "
        f"Model: {m['encoder_layers']}+{m['decoder_layers']} pre-norm layers, d={m['dim']}, "
        f"{m['heads']} heads, FFN {m['ffn_dim']}, dropout {m['dropout']}, label smoothing "
        f"{m['label_smoothing']}, tied embeddings. {t['steps']} steps of {t['batch_size']} "
        f"pairs (length-sorted batches), lr {t['lr']} ({t['schedule']}); the checkpoint with "
        f"the best validation BLEU ({_search(e['val_beam'])}) is tested with "
        f"{_search(e['beam'])}. CAPE: source "
        f"positions x alpha = {d.get('alpha', float('nan')):.4f} (target/source tokens of the "
        "training set), one global shift per pair for both sides, local shifts U(-0.5, 0.5), "
        "no scaling, no mean-normalisation, BOS before the source. "
        + "".join(n + " " for n in recipe_notes(cfg["rows"], cfg["data"]["max_tokens"]))
        + f"Seeds {cfg['seeds']} "
        f"(mean ± std over seeds{_partial(results, cfg['seeds'])}). Produced by "
        "`cape experiment translation`; `cape plot` redraws this page from results.json."
    )
    add_verdict(rep, verdict(results))
    rep.table(
        bleu_table(results),
        caption=f"sacreBLEU on test (all, and by reference length: "
        f"short <= {lo:g} words < medium <= {hi:g} words < long) and on the long-sentence "
        "buckets (source words).",
    )
    rep.table(
        nll_table(results),
        caption="Teacher-forced NLL (nats per token) on stacked test "
        f"pairs (2-4 joined), by output position; training targets have at most "
        f"{results.get('train_length', '?')} tokens.",
    )
    rep.table(_params(results), caption="Trainable parameters and the seeds reported, per row.")
    _plots(rep, out, results)
    _examples(rep, results)
    train_cost_table(rep, results, metric="eval_bleu", label="final val BLEU")
    return rep.write(out / "report.md")


def _partial(results: dict[str, Any], seeds: list[int]) -> str:
    short = [r for r, s in seeds_by_row(results).items() if len(s) < len(seeds)]
    if not short:
        return ""
    return (
        f"; not every seed has finished for {', '.join(short)}: those rows show the mean "
        "of the seeds they have, listed in the parameters table"
    )


def _search(beam: int) -> str:
    return f"beam {beam}" if beam else "greedy decoding"


def _params(results: dict[str, Any]) -> str:
    seeds = seeds_by_row(results)
    lines = ["| row | parameters | seeds |", "|---|---|---|"]
    for row in _rows(results):
        n = results.get("params", {}).get(row)
        ran = ", ".join(map(str, seeds.get(row, []))) or "–"
        lines.append(f"| {row} | {'–' if n is None else f'{n:,}'} | {ran} |")
    return "\n".join(lines)


def _examples(rep: Report, results: dict[str, Any]) -> None:
    for row, exs in results.get("examples", {}).items():
        text = "\n".join(f"SRC: {x['src']}\nREF: {x['ref']}\nHYP: {x['hyp']}\n" for x in exs)
        rep.paragraph(
            f"Example translations of `{row}` (first seed): three test sentences, "
            "then the first of each long bucket."
        )
        rep.code(text.rstrip())
        return


def _plots(rep: Report, out: Path, results: dict[str, Any]) -> None:
    if not plot_ok():
        return
    rows = _rows(results)
    buckets = set(_LABELS) - {("test", "all")}  # the terciles and the long buckets
    # whole words on the axis: its ticks sit at the buckets' means
    recs = [
        dict(r, words=round(r["src_words"]))
        for r in results["records"]
        if (r["split"], r["bin"]) in buckets
    ]
    add_curves(
        rep,
        out,
        "bleu_by_length.png",
        "BLEU per length bucket (test terciles, then the 21-30, "
        "31-40 and 41+ word buckets), against the bucket's mean source length; error "
        "bars: std over seeds.",
        summarize(recs, ["row", "words"], "bleu"),
        x="words",
        y_label="BLEU",
        x_label="mean source length of the bucket (English words)",
        title="BLEU vs sentence length",
        series_order=rows,
        vline=20.0,
        vline_label="longest training source (words)",
    )
    cells = nll_curve_cells(results)
    if cells:
        add_curves(
            rep,
            out,
            "nll_by_position.png",
            "Teacher-forced NLL per output position on stacked "
            f"test pairs (mean over groups of {_SMOOTH} positions reached by >= 5 "
            "sequences; error bars: std over seeds). Flat beyond the dashed line = the "
            "encoding generalises to unseen lengths.",
            cells,
            x="position",
            y_label="NLL (nats / token)",
            x_label="output position (tokens)",
            title="NLL per position on stacked sentences",
            series_order=rows,
            vline=float(results.get("train_length", 0)) or None,
            vline_label="longest training target",
        )
