"""The detection experiment's report: Tables 1-2 analogues (COCO's six numbers at the seen and
the unseen sizes), AP per image size and its plot, AP with the positions taken out, the paper's
claims, a few test scenes with the boxes each row found, and the training cost.

`render(out, results)` writes `report.md`, `ap_vs_size.png` and `examples.png`, a pure function
of the results (the `Experiment` base writes `results.json` first, and `cape plot` renders
again from it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cape.lab.experiments.detection.coco import LABELS, METRICS
from cape.lab.experiments.detection.verdict import paper_claims, plain_records, set_cells, verdict
from cape.lab.experiments.reporting import add_curves, plot_ok, train_cost_table
from cape.lab.experiments.verdict import add_verdict, removed_cells
from cape.lab.report import Report, cell_text, claims_table, summarize, summary_table

__all__ = ["render", "metrics_table"]


def metrics_table(results: Mapping[str, Any], which: str) -> str:
    """Markdown: per row, the encoding's parameters and COCO's six numbers (mean ± std over
    seeds of each run's mean over the `which` sizes: "seen" or "unseen"); the best in bold."""
    rows = [r["name"] for r in results["config"]["rows"]]
    per_metric = {m: set_cells(results, m) for m in METRICS}
    best = {}
    for m, cells in per_metric.items():
        means = [c["mean"] for (_, s), c in cells.items() if s == which and c["n"]]
        best[m] = max(means, default=math.nan)
    head = ["row", "encoding params", *(LABELS[m] for m in METRICS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        params = results.get("params", {}).get(row, {}).get("position")
        line = [row, "–" if params is None else f"{params:,}"]
        for m in METRICS:
            cell = per_metric[m].get((row, which))
            text = cell_text(cell)
            bold = cell is not None and cell["n"] and cell["mean"] == best[m]
            line.append(f"**{text}**" if bold else text)
        lines.append("| " + " | ".join(line) + " |")
    return "\n".join(lines)


def _description(results: Mapping[str, Any]) -> str:
    cfg = results["config"]
    d, m, t = cfg["data"], cfg["model"], cfg["train"]
    sizes, held = d["sizes"], d["held_out"]
    train_sizes = sizes[: len(sizes) - held]
    protocol = (
        f"Table 2's protocol: the training images are resized to {_px(train_sizes)}; "
        f"{_px(sizes[len(train_sizes) :])} are for evaluation only, and positions are counted "
        "in cells from the top-left corner (not normalised), so the larger images hold "
        "positions never seen in training"
        if held
        else f"Table 1's protocol: the training images are resized to every size, {_px(sizes)}, "
        "and positions are each image's cell centres divided by its grid, in (0, 1)"
    )
    return (
        f"LFF paper sec. 4.2 (Tables 1-2) on scenes made here: {d['min_objects']}-"
        f"{d['max_objects']} shapes (circle, square, triangle, cross) per image, sides "
        f"{d['min_side']}-{d['max_side']} of the image, at random places; {d['train']} training "
        f"and {d['test']} test scenes. {protocol}; Embed-2D reads integer cell indices either "
        f"way. A small DETR: a stem of stride 8, a Transformer of width {m['dim']} with "
        f"{m['enc_layers']} encoder and {m['dec_layers']} decoder layers ({m['heads']} heads, "
        f"FFN {m['ffn_dim']}, {'pre' if m['pre_norm'] else 'post'}-norm), {m['queries']} object "
        "queries, the positions added to the queries and keys of every encoder self-attention "
        + ("and to the encoder's input " if m["input_positions"] else "")
        + "and to the keys of the cross-attention (rotary rows rotate the encoder's queries and "
        "keys instead), Hungarian matching and "
        f"DETR's losses at every decoder layer; {t['steps']} steps of batch {t['batch_size']} "
        f"(lr {t['lr']}, {t['schedule']}), one training size drawn per batch. COCO's metrics "
        "(pycocotools) in the stored images' pixels, small objects below "
        f"({cfg['eval']['small_side']} x side)^2, large above ({cfg['eval']['large_side']} x "
        f"side)^2; seeds {cfg['seeds']} (mean ± std over seeds). Produced by "
        "`cape experiment detection`; `cape plot` redraws this page from results.json."
    )


def _px(sizes: list[int]) -> str:
    return ", ".join(str(s) for s in sizes) + " px"


def render(out: Path, results: dict[str, Any]) -> Path:
    cfg = results["config"]
    rows = [r["name"] for r in cfg["rows"]]
    held = cfg["data"]["held_out"]
    rep = Report(f"Detection experiment `{results['name']}`")
    rep.paragraph(_description(results))
    add_verdict(rep, verdict(results))
    if held:
        rep.table(
            metrics_table(results, "unseen"),
            caption="Table 2 analogue: COCO's metrics at the sizes never seen in training "
            "(each run's mean over them); encoding params: trainable parameters of the "
            "encoding.",
        )
    rep.table(
        metrics_table(results, "seen"),
        caption=("At the training sizes (each run's mean over them)" if held else
                 "Table 1 analogue: COCO's metrics over every size (each run's mean)")
        + "; encoding params: trainable parameters of the encoding.",
    )  # fmt: skip
    recs = plain_records(results)
    if recs:
        rep.table(
            summary_table(recs, "row", "size", "ap", row_order=rows, col_format="{} px"),
            caption="AP per test image size"
            + (f"; the last {held} sizes are never seen in training." if held else "."),
        )
    _removed(rep, results)
    claims = paper_claims(results)
    if claims:
        rep.table(
            claims_table(claims),
            caption="The paper's findings (sec. 4.2), checked on the means over seeds.",
        )
    _plots(rep, out, results)
    train_cost_table(rep, results, metric="eval_ap", label="final val AP")
    return rep.write(out / "report.md")


def _removed(rep: Report, results: Mapping[str, Any]) -> None:
    cells = removed_cells(results)
    if not cells:
        return
    sizes, held = results["config"]["data"]["sizes"], results["config"]["data"]["held_out"]
    train = max(sizes[: len(sizes) - held])
    on = {
        c["row"]: c
        for c in summarize([r for r in plain_records(results) if r["size"] == train], ["row"], "ap")
    }
    lines = ["| row | AP | AP, positions taken out |", "|---|---|---|"]
    for row in (r["name"] for r in results["config"]["rows"]):
        if row in cells:
            lines.append(f"| {row} | {cell_text(on.get(row))} | {cell_text(cells[row])} |")
    rep.table(
        "\n".join(lines),
        caption=f"AP at {train} px (the largest training size) with every position the "
        "model holds taken out at test time (`cape.models.without_positions`).",
    )


def _plots(rep: Report, out: Path, results: Mapping[str, Any]) -> None:
    if not plot_ok():
        return
    cfg = results["config"]
    rows = [r["name"] for r in cfg["rows"]]
    sizes, held = cfg["data"]["sizes"], cfg["data"]["held_out"]
    cells = summarize(plain_records(results), ["row", "size"], "ap")
    if cells:
        add_curves(
            rep, out, "ap_vs_size.png",
            "AP against the test image size (error bars: std over seeds)"
            + ("; the dashed line is the largest training size." if held else "."),
            cells, x="size", series_order=rows, y_label="AP (COCO, %)",
            x_label="image side (px)", title="AP vs image size",
            vline=max(sizes[: len(sizes) - held]) if held else None,
        )  # fmt: skip
    examples = results.get("examples")
    if examples:
        from cape.lab.experiments.detection.figures import plot_examples

        plot_examples(examples, cfg["data"], rows, out / "examples.png")
        rep.image(
            "examples.png",
            "The first test scenes with the boxes each row's first seed finds (score >= "
            f"{cfg['eval']['score']}), at the largest training size and at the largest size; "
            "dotted white: the objects; each box in its class's colour (a box unlike its "
            "object has the wrong class).",
        )
