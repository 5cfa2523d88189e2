"""The speech experiment's report: WER per duration bin (Figures 5-6 analog), the augmentation
study (Figure 7), ablations, padded vs padding-free (Figures 15-16), WER vs hop and throughput
(000 Figure 17), each as a table of mean ± std over seeds, with plots.

`render(out, results)` writes `report.md` and the PNGs, a pure function of the results (the
`Experiment` base writes `results.json` first, and `cape plot` renders again from it).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from cape.lab.data.speech.synth import MAX_TRAIN_SECONDS
from cape.lab.experiments.pairs import decided
from cape.lab.experiments.recipes import recipe_notes
from cape.lab.experiments.reporting import add_curves, add_tradeoff, plot_ok, train_cost_table
from cape.lab.experiments.verdict import Study, add_verdict, verdict
from cape.lab.report import Report, claims_table, mean_std, summarize, summary_table

__all__ = ["render", "bin_table", "flatness", "paper_claims"]

NO_POSITIONS = "test, positions removed"  # the split name of `evaluate.removed_records`

SPLITS = {
    "test": "voices heard in training",
    "test_unseen_voices": "voices never heard in training",
}
# rows of the studies, when the config has them (names as in the presets)
MAIN = ["nopos", "abspos", "sinpos", "CAPE"]
AUGMENTATION = ["sinpos no SpecAugment", "sinpos", "CAPE no SpecAugment", "CAPE"]
ABLATIONS = [
    "CAPE",
    "CAPE λ=2",
    "CAPE Δ=15s",
    "CAPE Δ=30s",
    "CAPE no local shift",
    "CAPE no global shift",
    "CAPE no scaling",
    "relpos",
    "relpos 6s",
    "relpos first layer",
    "rotary+CAPE",
]
PADDING = ["sinpos", "sinpos padding-free", "CAPE λ=1", "CAPE λ=1 padding-free"]


def _at_hop(results: dict[str, Any], *splits: str) -> list[dict[str, Any]]:
    """The records of `splits` at the training hop."""
    hop = results["config"]["features"]["hop_ms"]
    return [r for r in results["records"] if r["hop_ms"] == hop and r["split"] in splits]


def _bins(records: list[dict[str, Any]]) -> list[str]:
    seen = [r["bin"] for r in records if r["bin"] != "all"]
    return sorted(set(seen)) + ["all"]


def bin_table(
    results: dict[str, Any],
    split: str,
    rows: list[str] | None = None,
    hop_ms: float | None = None,
    metric: str = "wer",
) -> str:
    """Markdown: WER (or `metric` "cer") in % per duration bin (columns) per row, mean ± std
    over seeds; the best (lowest) of each column bold; plus the flatness column (longest bin /
    shortest bin)."""
    hop = results["config"]["features"]["hop_ms"] if hop_ms is None else hop_ms
    recs = [
        r
        for r in results["records"]
        if r["split"] == split and r["hop_ms"] == hop and (rows is None or r["row"] in rows)
    ]
    order = rows or [r["name"] for r in results["config"]["rows"]]
    table = summary_table(
        recs,
        "row",
        "bin",
        metric,
        row_order=[r for r in order if any(x["row"] == r for x in recs)],
        col_order=_bins(recs),
        best="min",
    )
    ratio = flatness(recs, metric)
    lines = table.splitlines()
    out = [lines[0] + " longest / shortest |", lines[1] + "---|"]
    for line in lines[2:]:
        name = line.split("|")[1].strip().strip("*")
        value = ratio.get(name)
        out.append(line + (f" {value:.2f} |" if value is not None else " – |"))
    return "\n".join(out)


def flatness(records: list[dict[str, Any]], metric: str = "wer") -> dict[str, float]:
    """Per row: mean WER (`metric`) of the longest duration bin / that of the shortest (over
    seeds); 1 = no degradation with duration. The paper: CAPE <= 1.5, sinpos/abspos > 2."""
    bins = [b for b in _bins(records) if b != "all"]
    if len(bins) < 2:
        return {}
    cells = {(c["row"], c["bin"]): c["mean"] for c in summarize(records, ["row", "bin"], metric)}
    out = {}
    for row in dict.fromkeys(r["row"] for r in records):
        lo, hi = cells.get((row, bins[0])), cells.get((row, bins[-1]))
        if lo is not None and hi is not None and lo > 0 and not math.isnan(lo + hi):
            out[row] = hi / lo
    return out


def paper_claims(results: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """CAPE sec. 5.2's findings, each (claim, measured, holds) from WER on `test` at the
    training hop, for the rows present: CAPE's longest/shortest bin ratio <= 1.5 while sinpos's
    and abspos's exceed 2, and whether CAPE and sinpos use their positions at all (WER with the
    encoding removed); CAPE and SpecAugment together better than either alone (Figure 7);
    padding-free training at least as good as padded (Figures 15-16)."""
    test = _at_hop(results, "test")
    ratio = flatness(test)
    wer = {c["row"]: c for c in summarize([r for r in test if r["bin"] == "all"], ["row"], "wer")}
    out: list[tuple[str, str, bool | None]] = []
    if "CAPE" in ratio:
        out.append(
            (
                "CAPE: longest-bin WER <= 1.5 x shortest",
                f"{ratio['CAPE']:.2f}",
                ratio["CAPE"] <= 1.5,
            )
        )
    gone = [r for r in _at_hop(results, NO_POSITIONS) if r["bin"] == "all"]
    removed = {c["row"]: c["mean"] for c in summarize(gone, ["row"], "wer")}
    for row in ("CAPE", "sinpos"):  # flat with duration means little for a model that ignores them
        if row in removed and row in wer:
            out.append(
                (
                    f"{row} uses its positions: WER > 2 points higher without them",
                    f"{wer[row]['mean']:.1f} -> {removed[row]:.1f}",
                    removed[row] > wer[row]["mean"] + 2,
                )
            )
    for row in ("sinpos", "abspos"):
        if row in ratio:
            out.append(
                (f"{row}: longest-bin WER > 2 x shortest", f"{ratio[row]:.2f}", ratio[row] > 2)
            )

    def ms(row: str) -> str:
        return f"{row} {mean_std(wer[row])}"

    both, alone = "CAPE", ("CAPE no SpecAugment", "sinpos")  # sinpos rows have SpecAugment
    if all(r in wer for r in (both, *alone)):
        best = min((wer[r] for r in alone), key=lambda c: c["mean"])
        out.append(
            (
                "CAPE + SpecAugment better than either alone",
                ", ".join(ms(r) for r in (both, *alone)),
                decided(wer[both], best, wer[both]["mean"] < best["mean"]),
            )
        )
    for padded in ("sinpos", "CAPE λ=1"):
        free = f"{padded} padding-free"
        if padded in wer and free in wer:
            out.append(
                (
                    f"{free} at least as good as padded",
                    f"{ms(free)} vs {ms(padded)}",
                    decided(wer[free], wer[padded], wer[free]["mean"] <= wer[padded]["mean"]),
                )
            )
    return out


def _hop_table(results: dict[str, Any]) -> str | None:
    recs = [r for r in results["records"] if r["split"] == "test@hop" and r["bin"] == "all"]
    if not recs:
        return None
    cells = {
        m: {(c["row"], c["hop_ms"]): c for c in summarize(recs, ["row", "hop_ms"], m)}
        for m in ("wer", "cer", "audio_s_per_s")
    }
    lines = ["| row | inference hop ms | WER % | CER % | audio s / s |", "|---|---|---|---|---|"]
    for key, c in cells["wer"].items():
        lines.append(
            f"| {key[0]} | {key[1]:g} | {mean_std(c)} | {mean_std(cells['cer'][key])} | "
            f"{mean_std(cells['audio_s_per_s'][key], 0)} |"
        )
    return "\n".join(lines)


def _reliance_table(results: dict[str, Any]) -> str | None:
    recs = [r for r in _at_hop(results, "test", NO_POSITIONS) if r["bin"] == "all"]
    removed = {r["row"] for r in recs if r["split"] == NO_POSITIONS}
    if not removed:
        return None
    cells = {
        m: {(c["row"], c["split"]): c["mean"] for c in summarize(recs, ["row", "split"], m)}
        for m in ("wer", "cer")
    }
    lines = [
        "| row | WER % | WER %, positions removed | CER % | CER %, positions removed |",
        "|---|---|---|---|---|",
    ]
    for row in [r["name"] for r in results["config"]["rows"] if r["name"] in removed]:
        w, c = cells["wer"], cells["cer"]
        lines.append(
            f"| {row} | {w[(row, 'test')]:.1f} | {w[(row, NO_POSITIONS)]:.1f} | "
            f"{c[(row, 'test')]:.1f} | {c[(row, NO_POSITIONS)]:.1f} |"
        )
    return "\n".join(lines)


def study(results: dict[str, Any], claims: list[Any] | None = None) -> Study:
    """The speech study for the verdict (`cape.lab.experiments.verdict`): WER on test at the
    training hop per duration bin; the training bin is the first (utterances <= 6 s), the bins
    past it are never seen in training; positions removed in that bin."""
    test = _at_hop(results, "test")
    cells = {(c["row"], c["bin"]): c for c in summarize(test, ["row", "bin"], "wer")}
    bins = _bins(test)
    gone = [r for r in _at_hop(results, NO_POSITIONS) if r["bin"] == bins[0]]
    return Study(
        rows=results["config"]["rows"], cells=cells, columns=bins, train=bins[0],
        unseen=[b for b in bins[1:] if b != "all"],
        label=lambda b: b if b == "all" else f"{b} s", metric="WER", higher=False,
        removed={c["row"]: c for c in summarize(gone, ["row"], "wer")},
        claims=claims or [], pair_unit="WER points on test (negative: fewer errors)",
    )  # fmt: skip


def render(out: Path, results: dict[str, Any]) -> Path:
    cfg = results["config"]
    rows = [r["name"] for r in cfg["rows"]]
    m, t, f = cfg["model"], cfg["train"], cfg["features"]
    sizes = results.get("data", {})
    hours = ", ".join(f"{k} {v['utterances']} utt / {v['hours']:.2f} h" for k, v in sizes.items())
    said = {"digits": "digit strings", "wordnet": "WordNet text"}[
        cfg["data"].get("text", "wordnet")
    ]
    reg = f"dropout {m['dropout']:g}, layer drop {m.get('layer_drop', 0.0):g}"
    rep = Report(f"Speech experiment `{results['name']}`")
    rep.paragraph(
        "CAPE sec. 5.2 / appendix C at CPU scale: CTC letter recognition (28 letters + blank) "
        f"of {said} spoken by espeak-ng (60 training voices; 10-40 dB noise). Training "
        f"utterances are <= 6 s; test sets are binned by duration up to 45 s. Data: {hours}. "
        f"Model: conv kernel {m['kernel']} stride {m['stride']} + GLU, {m['depth']} pre-norm "
        f"Transformer layers d={m['dim']}, {m['heads']} heads, FFN {m['ffn_dim']}, {reg}; "
        f"{f['n_mels']} log-mel, {f['win_ms']:g} ms window, {f['hop_ms']:g} ms hop. "
        f"{t['steps']} steps of {t['batch_size']} utterances (duration-sorted batches, "
        f"perturbed by U(0.85, 1.15) each epoch), lr {t['lr']}, {t['schedule']}; the checkpoint "
        "with the best validation WER is tested, greedy CTC decoding, batch size 1. "
        + "".join(n + " " for n in recipe_notes(cfg["rows"], MAX_TRAIN_SECONDS))
        + f"Seeds {cfg['seeds']} (mean ± std over seeds). Produced by `cape experiment asr`; "
        "`cape plot` redraws this page from results.json."
    )
    claims = paper_claims(results)
    add_verdict(rep, verdict(study(results, claims)))
    for split, label in SPLITS.items():
        if not any(r["split"] == split for r in results["records"]):
            continue
        for metric in ("wer", "cer"):
            rep.table(
                bin_table(results, split, metric=metric),
                caption=f"{metric.upper()} (%) per test duration bin (seconds), {split} "
                f"({label}); longest / shortest: the longest bin's {metric.upper()} over "
                "the shortest's.",
            )
    rep.table(_params(results, rows), caption="Trainable parameters per row.")
    for names, caption in (
        (
            AUGMENTATION,
            "Augmentation study (Figure 7 analog): CAPE and SpecAugment, alone and "
            "together, WER (%) on test.",
        ),
        (
            ABLATIONS,
            "Ablations: CAPE's global shift, local shift and scaling; relpos context "
            "and depth; rotary over CAPE-augmented time. WER (%) on test.",
        ),
        (
            PADDING,
            "Padded vs padding-free training batches (Figures 15-16 analog), WER (%) on "
            "test; both evaluated at 10 ms, batch size 1.",
        ),
    ):
        present = [n for n in names if n in rows]
        if len(present) >= 2 and set(present) - set(MAIN):  # a study needs one of its own rows
            rep.table(bin_table(results, "test", present), caption=caption)
    if claims:
        rep.table(
            claims_table(claims),
            caption="The paper's findings (sec. 5.2, app. C) checked "
            "on test WER, means over seeds; rows of the names the presets use.",
        )
    reliance = _reliance_table(results)
    if reliance:
        rep.table(
            reliance,
            caption="Does the model use its positions? WER and CER (%) on test "
            "(all bins) as trained and with the absolute encoding taken out at test time. "
            "No change means the model ignores its positions, so no encoding can change "
            "how it generalises to long inputs.",
        )
    hop = _hop_table(results)
    if hop:
        rep.table(
            hop,
            caption="WER and throughput when the inference STFT hop differs from the "
            "10 ms of training (000 Figure 17 analog); audio s / s: seconds of audio "
            "transcribed per second (features + model + greedy decoding, batch size 1).",
        )
    _plots(rep, out, results, rows)
    _examples(rep, results)
    train_cost_table(rep, results, metric="eval_wer", label="final val WER %")
    return rep.write(out / "report.md")


def _params(results: dict[str, Any], rows: list[str]) -> str:
    lines = ["| row | parameters |", "|---|---|"]
    for row in rows:
        n = results.get("params", {}).get(row)
        lines.append(f"| {row} | {'–' if n is None else f'{n:,}'} |")
    return "\n".join(lines)


def _examples(rep: Report, results: dict[str, Any]) -> None:
    for r in results["records"]:
        if "examples" in r:
            text = "\n".join(
                f"{e['duration']:5.1f} s  REF: {e['ref']}\n         HYP: {e['hyp']}"
                for e in r["examples"][:4]
            )
            rep.paragraph(f"Example transcripts of `{r['row']}` (seed {r['seed']}, {r['split']}):")
            rep.code(text)
            return


def _plots(rep: Report, out: Path, results: dict[str, Any], rows: list[str]) -> None:
    if not plot_ok():
        return
    for split in SPLITS:
        recs = [dict(r, mid=_mid(r["bin"])) for r in _at_hop(results, split) if r["bin"] != "all"]
        for metric in ("wer", "cer") if recs else ():
            add_curves(
                rep,
                out,
                f"{metric}_by_duration_{split}.png",
                f"{metric.upper()} per duration bin on {split} (error bars: std over "
                "seeds); the dashed line is the longest training utterance.",
                summarize(recs, ["row", "mid"], metric),
                x="mid",
                y_label=f"{metric.upper()} (%)",
                x_label="test utterance duration (s, bin centre)",
                title=f"{metric.upper()} vs duration ({split})",
                series_order=rows,
                vline=6.0,
                vline_label="longest training utterance",
            )
    recs = [r for r in results["records"] if r["split"] == "test@hop" and r["bin"] == "all"]
    if recs:
        add_tradeoff(
            rep,
            out,
            "wer_vs_throughput.png",
            "WER against throughput as the inference hop goes "
            "from small (slow) to large (fast); each point is labelled with its hop in ms.",
            summarize(recs, ["row", "hop_ms"], "audio_s_per_s"),
            summarize(recs, ["row", "hop_ms"], "wer"),
            key="hop_ms",
            x_label="audio seconds per second",
            y_label="WER (%)",
            title="WER vs throughput over inference hops",
            annotate="hop_ms",
        )


def _mid(label: str) -> float:
    lo, hi = (float(v) for v in label.split("-"))
    return (lo + hi) / 2
