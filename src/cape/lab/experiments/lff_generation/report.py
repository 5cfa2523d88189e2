"""The LFF image-generation study's report: bits per dim vs training step with a 95% confidence
band over seeds (Figure 3a/3b), the final bpd table (mean ± std, parameters per row),
`results.json`.

`render(out, results)` writes report.md and the PNGs, a pure function of the results (the
`Experiment` base writes `results.json` first, and `cape plot` renders again from it).

Confidence intervals are t-based: mean ± t_{0.975, n-1} · std / sqrt(n) over the n seeds (std
with ddof=1). `t_quantile_975` is scipy.stats.t.ppf(0.975, df) to 3 decimals, as statistics
tables print it (e.g. 4.303 for df = 2, i.e. 3 seeds), so that the reports in results/ and a
reader with such a table get the same figures.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from scipy import stats

from cape.lab.experiments.reporting import add_curves, plot_ok, train_cost_table
from cape.lab.experiments.verdict import Study, add_verdict, removed_cells, verdict
from cape.lab.report import Report, mean_std, pivot, summarize

__all__ = ["t_quantile_975", "confidence_cells", "render"]


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` >= 1 degrees of freedom, to 3 decimals."""
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ValueError(f"df must be an int >= 1, got {df!r}")
    return round(float(stats.t.ppf(0.975, df)), 3)


def confidence_cells(
    records: list[dict[str, Any]], by: list[str], value: str
) -> list[dict[str, Any]]:
    """`cape.lab.report.summarize` cells plus "ci" (the half-width t_{0.975,n-1} std / sqrt(n); 0
    for n = 1), "lo" and "hi" (mean ∓ ci)."""
    cells = summarize(records, by, value)
    for c in cells:
        n = int(c["n"])
        half = t_quantile_975(n - 1) * c["std"] / math.sqrt(n) if n > 1 else 0.0
        c.update(ci=half, lo=c["mean"] - half, hi=c["mean"] + half)
    return cells


def _final_table(
    cells: list[dict[str, Any]],
    records: list[dict[str, Any]],
    rows: list[str],
    positions: dict[str, str],
) -> str:
    """| row | encoding | bpd mean ± std | 95% CI | seeds | params | position params |."""
    by_row = {c["row"]: c for c in cells}
    params = {r["row"]: (r["params"], r["position_params"]) for r in records}
    finite = [c["mean"] for c in cells if c["mean"] is not None and not math.isnan(c["mean"])]
    best = min(finite) if finite else None
    lines = [
        "| row | pixel encoding | bits/dim (mean ± std) | 95% CI | seeds | params | "
        "position params |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in rows:
        c = by_row.get(name)
        if c is None:
            continue
        text = mean_std(c, 4)
        if c["mean"] == best:
            text = f"**{text}**"
        ci = f"[{c['lo']:.4f}, {c['hi']:.4f}]" if c["n"] > 1 else "–"
        p, pp = params.get(name, (0, 0))
        lines.append(
            f"| {name} | {positions.get(name, '')} | {text} | {ci} | {c['n']} | {p:,} | {pp:,} |"
        )
    return "\n".join(lines)


def _findings(curve: list[dict[str, Any]], final: list[dict[str, Any]]) -> str:
    """Which row is lowest at the first evaluation (convergence) and at the end."""
    if not curve or not final:
        return ""
    first = min(c["step"] for c in curve)
    early = min((c for c in curve if c["step"] == first), key=lambda c: c["mean"])
    last = min(final, key=lambda c: c["mean"])
    return (
        f"Lowest held-out bpd at the first evaluation (step {first}): **{early['row']}** "
        f"({early['mean']:.4f}). Lowest at the end: **{last['row']}** ({last['mean']:.4f})."
    )


def render(out: Path, results: dict[str, Any]) -> Path:
    cfg = results["config"]
    rows = [r["name"] for r in cfg["rows"]]
    positions = {
        r["name"]: r["position"] + (f" {r['options']}" if r.get("options") else "")
        for r in cfg["rows"]
    }
    seeds, m, t, d = cfg["seeds"], cfg["model"], cfg["train"], cfg["data"]
    size = d["size"]
    rep = Report(f"LFF image generation `{results['name']}`")
    rep.paragraph(
        f"Autoregressive generation of {size}x{size} RGB character images, flattened in raster "
        f"order with the channels interleaved ({size * size * 3} intensities per image, 256-way "
        f"softmax; LFF paper sec. 4.1, Reformer's ImageNet64 setting at CPU scale). Causal "
        f"Transformer d={m['dim']} (pixel encoding {m['dim'] - m['channel_dim']} ‖ channel "
        f"embedding {m['channel_dim']}), {m['depth']} layers, {m['heads']} heads, FFN "
        f"{m['ffn_dim']}; {t['steps']} steps of batch {t['batch_size']} ({t['optimizer']}, lr "
        f"{t['lr']}, {t['schedule']}); {d['train']} training images; bits per dim on "
        f"{d['val']} held-out images every {t['eval_every']} steps; seeds {seeds}. Produced by "
        f"`cape experiment lff-generation`; `cape plot` redraws this page from results.json."
    )
    final = confidence_cells(results["records"], ["row"], "bpd")
    curve = confidence_cells(results["curves"], ["row", "step"], "bpd") if results["curves"] else []
    cells = {(c["row"], "final"): c for c in final}
    add_verdict(
        rep,
        verdict(
            Study(
                rows=cfg["rows"], cells=cells, columns=["final"], train="final",
                unseen=["final"], label=lambda _: "the end of training", higher=False,
                metric="held-out bits per dim", unit=" bpd", digits=4,
                removed=removed_cells(results),
            )
        ),
    )  # fmt: skip
    rep.table(
        _final_table(final, results["records"], rows, positions),
        caption="Final held-out bits per dim (lower is better; mean ± std over seeds, "
        "t-based 95% CI), parameters of the whole model and of its position part "
        "(pixel encoding + channel embedding).",
    )
    text = _findings(curve, final)
    if text:
        rep.paragraph(text)
    if curve:
        rep.table(
            pivot(
                curve,
                rows="row",
                cols="step",
                row_order=rows,
                best="min",
                fmt="{mean:.3f} ± {ci:.3f}",
                fmt_single="{mean:.3f}",
                col_format="step {}",
            ),
            caption="Held-out bits per dim during training (mean ± 95% CI half-width).",
        )
        _plots(rep, out, curve, cfg["rows"], len(seeds))
    if results.get("train"):
        train_cost_table(rep, results, metric="eval_bpd", label="final val bpd")
    return rep.write(out / "report.md")


def _component(row: dict[str, Any]) -> bool:
    """Learnable-Fourier alone or MLP alone (Figure 3b only)."""
    opts = row.get("options") or {}
    return row["position"] == "lff" and (opts.get("mlp") is False or opts.get("fourier") is False)


def _plots(
    rep: Report, out: Path, curve: list[dict[str, Any]], rows: list[dict[str, Any]], n_seeds: int
) -> None:
    if not plot_ok():
        return
    band = ("lo", "hi") if n_seeds > 1 else None
    what = "mean and 95% CI over seeds" if band else "one seed"
    ablation = [r["name"] for r in rows if r["position"] == "lff"]
    figures = [
        (
            "bpd_vs_steps.png",
            [r["name"] for r in rows if not _component(r)],
            "Figure 3a analog: the encodings compared",
        )
    ]
    if len(ablation) > 1:
        figures.append(
            (
                "bpd_vs_steps_lff.png",
                ablation,
                "Figure 3b analog: Learnable-Fourier + MLP and its components",
            )
        )
    for name, series, caption in figures:
        cells = [c for c in curve if c["row"] in series]
        if not cells:
            continue
        add_curves(
            rep,
            out,
            name,
            f"{caption} (bits per dim vs training step, {what}).",
            cells,
            x="step",
            series_order=series,
            y_label="held-out bits per dim",
            x_label="training step",
            title=caption.split(":")[0],
            band=band,
        )
