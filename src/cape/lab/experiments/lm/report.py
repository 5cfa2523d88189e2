"""The language-model experiment's report: the verdict first (`verdict.py`, one bullet line
each), perplexity and bits per byte by evaluation length, the corpus, the plots (perplexity
against length, loss by position) and the training cost.

`render(out, results)` writes `report.md`, `perplexity_vs_length.png` and
`loss_by_position.png`, a pure function of the results (the `Experiment` base writes
`results.json` first, and `cape plot` renders again from it).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from cape.lab.config import from_mapping
from cape.lab.experiments.lm.config import LMConfig, RowConfig, position_options
from cape.lab.experiments.lm.verdict import KEEP, ppl_cells, verdict
from cape.lab.experiments.reporting import add_curves, plot_ok, seeds_by_row
from cape.lab.experiments.verdict import add_verdict
from cape.lab.report import MISSING, Report, cell_text, summarize

__all__ = ["render", "ppl_table", "corpus_table"]


def _encoding(row: RowConfig, cfg: LMConfig) -> str:
    """The row's encoding with every option it runs with (`position_options`: its own and those
    the study sets from L), and RoPE's factor, fixed or length / L at each evaluation length."""
    trained = position_options(row, cfg)
    evaluated = position_options(row, cfg, evaluation=True)
    parts = [f"{k}={v}" for k, v in trained.items()]
    parts += [f"{k}={v} at evaluation" for k, v in evaluated.items() if trained.get(k) != v]
    if evaluated.get("scaling") is not None and "factor" not in evaluated:
        parts.append("factor=length/L at each length")
    parts += [f"weights of {row.train_as}"] if row.train_as else []
    parts += [f"fine-tuned from {row.finetune_from}"] if row.finetune_from else []
    return row.position + (f" ({', '.join(parts)})" if parts else "")


def ppl_table(results: dict[str, Any], key: str = "ppl", digits: int = 2) -> str:
    """Markdown: per row, its encoding, seeds and mean ± std of `key` at every evaluation
    length (lowest per length in bold)."""
    cfg = results["config"]
    context, factors = cfg["data"]["context"], cfg["eval"]["factors"]
    cells, seeds = ppl_cells(results, key), seeds_by_row(results)
    best = {
        f: min((c["mean"] for (_, g), c in cells.items() if g == f), default=math.nan)
        for f in factors
    }
    head = ["row", "encoding", "seeds", *[f"{f * context} ({f}x)" for f in factors]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    config = from_mapping(LMConfig, cfg)  # the options each row runs with, as its model has them
    for row in config.rows:
        name = row.name
        line = [name, _encoding(row, config), str(len(seeds.get(name, [])))]
        for f in factors:
            cell = cells.get((name, f))
            text = cell_text(cell, digits)
            line.append(f"**{text}**" if cell is not None and cell["mean"] == best[f] else text)
        lines.append("| " + " | ".join(line) + " |")
    return "\n".join(lines)


def corpus_table(results: dict[str, Any]) -> str:
    """Markdown: documents, bytes, tokens and bytes per token of each split."""
    lines = [
        "| split | documents | bytes | tokens | bytes/token |",
        "|---|---:|---:|---:|---:|",
    ]
    for split, s in results["corpus"]["splits"].items():
        bpt = MISSING if s["bytes_per_token"] is None else f"{s['bytes_per_token']:.3f}"
        lines.append(f"| {split} | {s['documents']} | {s['bytes']} | {s['tokens']} | {bpt} |")
    return "\n".join(lines)


def _setup(rep: Report, results: dict[str, Any]) -> None:
    cfg = results["config"]
    d, m, t, ft, e = cfg["data"], cfg["model"], cfg["train"], cfg["finetune"], cfg["eval"]
    c = results["corpus"]
    vocab = c["vocabulary"]
    rep.paragraph(
        f"A causal language model (`cape.models.CausalLM`: d={m['dim']}, {m['layers']} layers, "
        f"{m['heads']} heads, FFN {m['ffn_dim']}, dropout {m['dropout']}, tied embeddings) "
        f"learns next-token prediction on the `{c['corpus']}` corpus ({vocab['tokenizer']} "
        f"tokenizer, {vocab['size']} ids) in windows of L = {d['context']} tokens: "
        f"{t['steps']} steps of batch {t['batch_size']} ({t['optimizer']}, lr {t['lr']}, "
        f"{t['schedule']}); seeds {cfg['seeds']}. Fine-tuned rows start from their source's "
        f"final weights and train {ft['steps']} more steps of batch {ft['batch_size']} at "
        f"{ft['factor']}x L{_own_windows(cfg)} (lr {ft['lr']}). Evaluation (the ALiBi paper's "
        "protocol): the "
        f"first {c['scored_tokens']} predicted tokens of the {c['scored_split']} split cut into "
        f"non-overlapping windows of each length {[f * d['context'] for f in e['factors']]}; "
        "every token is predicted once, with the context of its own window only. Perplexity is "
        "exp of the mean loss per token; bits per byte convert it by the split's bytes per "
        "token. Produced by `cape experiment lm`; `cape plot` redraws this page from "
        "results.json."
    )


def _own_windows(cfg: dict[str, Any]) -> str:
    """ ", or at their own window (...)" when some fine-tuned row sets `finetune_factor`."""
    own = [f"{r['name']} {r['finetune_factor']}x" for r in cfg["rows"] if r.get("finetune_factor")]
    return f", or at their own window ({', '.join(own)})" if own else ""


def _plots(rep: Report, out: Path, results: dict[str, Any]) -> None:
    cfg = results["config"]
    if not (results["records"] and plot_ok()):
        return
    order, context = [r["name"] for r in cfg["rows"]], cfg["data"]["context"]
    common = dict(series_order=order, vline=context, vline_label="training context L", logx=True)
    cells = summarize(results["records"], ["row", "length"], "ppl")
    add_curves(
        rep, out, "perplexity_vs_length.png",
        "Perplexity against the evaluation length (log scales), one line per row (error bars: "
        "std over seeds); the dashed line is the training context L.",
        [c for c in cells if c["n"]], x="length", logy=True,
        title="Perplexity vs evaluation length", x_label="evaluation length (tokens, log scale)",
        y_label="perplexity (log scale)", **common,
    )  # fmt: skip
    by_pos = results.get("by_position") or []
    if not by_pos:
        return
    cells = summarize(by_pos, ["row", "position"], "loss")
    longest = cfg["eval"]["factors"][-1] * context
    add_curves(
        rep, out, "loss_by_position.png",
        f"Mean loss by position inside the windows of {longest} tokens (averaged over "
        f"log-spaced position buckets, at most {cfg['eval']['buckets']}, and over seeds); the "
        "dashed line is L.",
        [c for c in cells if c["n"]], x="position", y_label="loss (nats per token)",
        x_label="position in the window (token number, log scale)",
        title=f"Loss by position in windows of {longest} tokens", **common,
    )  # fmt: skip


def _cost(rep: Report, results: dict[str, Any]) -> None:
    lines = ["| run | steps | train s | final val loss |", "|---|---|---|---|"]
    for name, s in results["train"].items():
        if "train_as" in s:
            continue
        seconds = sum(s.get(f"time_{k}", 0.0) for k in ("data", "compute", "log", "checkpoint"))
        loss = s.get("eval_loss", math.nan)
        loss_s = MISSING if loss is None or math.isnan(loss) else f"{loss:.4f}"
        steps = s.get("step")
        steps_s = MISSING if steps is None else str(int(steps))
        lines.append(f"| {name} | {steps_s} | {seconds:.0f} | {loss_s} |")
    if len(lines) > 2:
        rep.heading("Training cost")
        rep.table("\n".join(lines), caption="Per run: steps, seconds, validation loss at L.")


def render(out: Path, results: dict[str, Any]) -> Path:
    rep = Report(f"Language-model experiment `{results['name']}`")
    _setup(rep, results)
    lines, table = verdict(results)
    add_verdict(rep, lines)  # first: what the numbers say, one bullet line each
    rep.table(
        table,
        caption=f"Perplexity at each longer length over the row's own at 1x (keeps: <= "
        f"{1 + KEEP:.2f}).",
    )
    rep.heading("Perplexity by evaluation length")
    rep.table(
        ppl_table(results),
        caption="Perplexity per evaluation length (tokens; x: times L), mean ± std over seeds, "
        "lowest per length in bold.",
    )
    rep.table(
        ppl_table(results, "bpb", 3),
        caption="The same in bits per byte (mean ± std over seeds).",
    )
    notes = [f"- `{r['name']}`: {r['notes']}" for r in results["config"]["rows"] if r.get("notes")]
    if notes:  # the rows' papers' recipes, one bullet each
        rep.heading("Row recipes").paragraph("\n".join(notes))
    rep.heading("Corpus")
    rep.table(corpus_table(results), caption=f"`{results['corpus']['corpus']}`, by split.")
    rep.heading("Plots")
    _plots(rep, out, results)
    _cost(rep, results)
    return rep.write(out / "report.md")
