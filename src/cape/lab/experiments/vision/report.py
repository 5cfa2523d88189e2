"""The vision experiment's report: tables (mean +- std over seeds), plots, position maps.

`render(out, results, maps)` is a pure function of what the runs produced; without `maps`
(`cape plot`) it draws the figures from the folder's `maps.npz` (`save_maps`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cape.lab.experiments.pairs import decided
from cape.lab.experiments.reporting import add_curves, add_tradeoff, plot_ok, train_cost_table
from cape.lab.experiments.verdict import add_verdict, verdict
from cape.lab.experiments.vision.config import RowConfig
from cape.lab.experiments.vision.verdict import NO_POSITIONS, accuracy_cells, study
from cape.lab.io import atomic_write
from cape.lab.report import Report, claims_table, mean_std, pivot, summarize, summary_table
from cape.models.vit import ViT

__all__ = ["position_maps", "saved_maps", "row_maps", "save_maps", "render", "paper_claims"]

FIGURE13 = ("abspos2d", "sinpos2d", "cape2d")


@torch.no_grad()
def patch_embedding(model: ViT, size: int) -> torch.Tensor | None:
    """The additive patch positions of `model` (eval mode) for size x size images:
    [H', W', D] float32, or None for encodings that add nothing (nopos, rotary2d)."""
    model.eval()
    g = size // model.patch
    pe = model.patch_positions((g, g))
    return None if pe is None else pe.detach().reshape(g, g, -1).float().cpu()


def similarity_map(pe: torch.Tensor) -> torch.Tensor:
    """pe [H, W, D] -> [H, W]: dot product of every position with the centre one, divided by the
    centre's squared norm (1 at the centre; LFF Figure 2)."""
    h, w, _ = pe.shape
    centre = pe[h // 2, w // 2]
    return pe @ centre / centre.dot(centre).clamp_min(1e-12)


def position_maps(model: ViT, row: RowConfig, sizes: list[int]) -> dict[str, np.ndarray]:
    """2D maps of one trained model, keyed "sim|<row>" (similarity at the training size) and,
    for abspos/sinpos/CAPE, "embed|<row>|<size> px ch <c>" (Figure 13's components)."""
    out: dict[str, np.ndarray] = {}
    pe = patch_embedding(model, row.train_size)
    if pe is None:
        return out
    out[f"sim|{row.name}"] = similarity_map(pe).numpy()
    if row.position in FIGURE13 and not row.univit_sizes:
        channels = (1, model.dim // 2 + 1)
        for size in sorted({min(sizes), row.train_size, max(sizes)}):
            emb = patch_embedding(model, size)
            for c in channels:
                out[f"embed|{row.name}|{size} px ch {c}"] = emb[..., c].numpy()
    return out


def _records(results: dict[str, Any], **match: Any) -> list[dict[str, Any]]:
    return [r for r in results["records"] if all(r.get(k) == v for k, v in match.items())]


def save_maps(out: Path, maps: dict[str, np.ndarray]) -> None:
    """maps.npz in `out`, when there are maps (what `render` draws the figures from later)."""
    if maps:
        atomic_write(out / "maps.npz", lambda tmp: np.savez(open(tmp, "wb"), **maps))


def saved_maps(out: str | Path) -> dict[str, np.ndarray]:
    """The maps in `out/maps.npz` (none if absent). A run restored from its archive has no
    weights, so its maps can only come from here (`row_maps` picks one row's)."""
    path = Path(out) / "maps.npz"
    if not path.is_file():
        return {}
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def row_maps(maps: dict[str, np.ndarray], row: str) -> dict[str, np.ndarray]:
    """The maps of one row (keys "<kind>|<row>|..." as `position_maps` names them)."""
    return {k: v for k, v in maps.items() if k.split("|")[1] == row}


def render(out: Path, results: dict[str, Any], maps: dict[str, np.ndarray] | None = None) -> Path:
    """report.md and the PNGs in `out` from `results` and the position `maps` (None: those of
    `out`'s maps.npz, as `cape plot` redraws); returns report.md's path."""
    if maps is None:
        maps = saved_maps(out)
    cfg = results["config"]
    rows, seeds = [r["name"] for r in cfg["rows"]], cfg["seeds"]
    sizes_of_rows = [r["train_size"] for r in cfg["rows"]]
    train_sizes = sorted(set(sizes_of_rows))
    main_size = max(train_sizes, key=sizes_of_rows.count)  # the size most rows train at
    rep = Report(f"Vision experiment `{results['name']}`")
    m, t = cfg["model"], cfg["train"]
    n_train = results["data"]["counts"]["train"]
    rep.paragraph(
        f"ViT d={m['dim']}, depth {m['depth']}, {m['heads']} heads, patch {m['patch']}; "
        f"{t['steps']} steps of batch {t['batch_size']} ({t['optimizer']}, lr {t['lr']}, "
        f"{t['schedule']}); {n_train} training images ({cfg['data']['source']}); "
        f"trained at {', '.join(map(str, train_sizes))} px unless the row says otherwise; "
        f"seeds {seeds} (mean ± std over {len(seeds)} seed(s)). Produced by `cape experiment "
        f"vision`; `cape plot` redraws this page from results.json."
    )
    opts = dict(rows="row", cols="size", row_order=rows, col_format="{} px")
    claims = paper_claims(results)
    add_verdict(rep, verdict(study(results, main_size, claims)))
    rendered = cfg["data"]["source"] in ("chars", "relations")
    for split, title in (
        ("test", "test images (train fonts)" if rendered else "the folder's test images"),
        ("test_fonts", "test images of held-out fonts"),
    ):
        recs = _records(results, set=split, method="plain")
        if recs:
            rep.table(
                summary_table(recs, value="acc", **opts),
                caption=f"Top-1 accuracy (%) on {title}, by test resolution.",
            )
    plain = list(accuracy_cells(results["records"], "plain").values())
    if plain and plot_ok():
        add_curves(
            rep,
            out,
            "accuracy_vs_resolution.png",
            "Accuracy vs test resolution (Figure 2 analog).",
            plain,
            x="size",
            series_order=rows,
            y_label="top-1 accuracy (%)",
            x_label="test resolution (px)",
            title="Accuracy vs test resolution",
            vline=main_size,
        )
    removed = list(accuracy_cells(results["records"], NO_POSITIONS).values())
    if removed:
        rep.table(
            pivot(removed, **opts),
            caption="Top-1 accuracy (%) with the positions taken out at test time (no absolute "
            "encoding added, no rotation in attention): a row that keeps its accuracy does not "
            "use its positions.",
        )
    _extra_tables(rep, results, rows)
    if claims:
        ours = (
            ", then ours (a row with scaled frequencies against the same row at the paper's)"
            if _frequency_pairs({r["name"]: r for r in cfg["rows"]})
            else ""
        )
        rep.table(
            claims_table(claims),
            caption=f"The paper's findings (sec. 5.1){ours}, checked "
            "on the means over seeds (mean ± std); rows of the names the presets use.",
        )
    together = results["throughput"]
    speed = summarize(together, ["row", "size"], "images_per_s")
    if speed:
        batch = together[0]["batch_size"]
        how = f"every row timed round-robin in one process after training, batch {batch}"
        rep.table(
            pivot(speed, **opts, fmt="{mean:.0f}", fmt_single="{mean:.0f}", best=None),
            caption=f"Evaluation throughput (images/s; {how}) by resolution (Figure 4).",
        )
        if plot_ok():
            add_tradeoff(
                rep,
                out,
                "throughput.png",
                "Accuracy vs throughput (Figure 4 analog).",
                speed,
                plain,
                key="size",
                x_label="images/s",
                y_label="top-1 accuracy (%)",
                title="Accuracy vs throughput per test resolution",
                annotate="size",
            )
    train_cost_table(rep, results)
    _figures(rep, out, maps)
    return rep.write(out / "report.md")


def _extra_tables(rep: Report, results: dict[str, Any], rows: list[str]) -> None:
    def by_method(recs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        return [dict(r, label=f"{r['row']} ({r['method']})") for r in recs]

    px = dict(rows="label", value="acc", col_format="{} px", best=None)
    test = _records(results, set="test")
    extents = by_method(r for r in test if r["method"].startswith("extent"))
    if extents:
        rep.table(
            summary_table(extents, cols="size", **px),
            caption="Positions rescaled to [-γ, γ] at evaluation (Table 6): γ = 1, "
            "r/r_train ('ratio'), sqrt(r/r_train) ('sqrt').",
        )
    tta = by_method(r for r in test if r["method"] in ("plain", "tta"))
    if any(r["method"] == "tta" for r in tta):
        sizes = sorted({r["size"] for r in tta if r["method"] == "tta"})
        tta = [r for r in tta if r["size"] in sizes]
        order = [f"{n} ({m})" for n in rows for m in ("plain", "tta")]
        rep.table(
            summary_table(tta, cols="size", row_order=order, **px),
            caption="Test-time augmentation: class probabilities averaged over r - patch, "
            "r, r + patch (Table 1).",
        )
    native = by_method(_records(results, set="native"))
    if native:
        rep.table(
            summary_table(native, cols="bin", **px),
            caption="Accuracy (%) per native-size bin and resize strategy (Table 5).",
        )


def paper_claims(results: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """CAPE sec. 5.1's findings, each (claim, measured, holds) from the test-set accuracies of
    the rows named "CAPE", "sinpos", "abspos" and "UniViT ..." (those present): CAPE at least as
    good as sinpos and abspos at the training size and better than sinpos at the smallest and
    largest test sizes; abspos losing more than CAPE from the training size to the largest;
    each UniViT within 1 point of the best single-resolution row at every size; TTA above the
    plain accuracy for sinpos and CAPE at every size."""
    cfg_rows = {r["name"]: r for r in results["config"]["rows"]}
    acc = accuracy_cells(results["records"], "plain")
    tta = accuracy_cells(results["records"], "tta")
    sizes = sorted(results["config"]["eval"]["sizes"])
    if "CAPE" not in cfg_rows or not sizes:
        return []
    train = cfg_rows["CAPE"]["train_size"]
    out: list[tuple[str, str, bool | None]] = []

    def versus(a: str, b: str, size: int, strict: bool) -> None:
        if (a, size) in acc and (b, size) in acc:
            ca, cb = acc[(a, size)], acc[(b, size)]
            better = ca["mean"] > cb["mean"] if strict else ca["mean"] >= cb["mean"]
            holds = decided(ca, cb, better)
            out.append(
                (
                    f"{a} {'>' if strict else '≥'} {b} at {size} px",
                    f"{mean_std(ca)} vs {mean_std(cb)}",
                    holds,
                )
            )

    versus("CAPE", "sinpos", train, False)
    versus("CAPE", "abspos", train, False)
    versus("CAPE", "sinpos", sizes[0], True)
    versus("CAPE", "sinpos", sizes[-1], True)
    big = sizes[-1]
    if all((r, s) in acc for r in ("abspos", "CAPE") for s in (train, big)):
        drop = {r: acc[(r, train)]["mean"] - acc[(r, big)]["mean"] for r in ("abspos", "CAPE")}
        out.append(
            (
                f"abspos loses more than CAPE from {train} to {big} px",
                f"abspos -{drop['abspos']:.1f}, CAPE -{drop['CAPE']:.1f} points",
                drop["abspos"] > drop["CAPE"],
            )
        )
    single = [n for n, r in cfg_rows.items() if not r.get("univit_sizes")]
    for uni in (n for n, r in cfg_rows.items() if r.get("univit_sizes")):
        gaps = []
        for size in sizes:
            best = max((acc[(n, size)]["mean"] for n in single if (n, size) in acc), default=None)
            if best is not None and (uni, size) in acc:
                gaps.append((size, acc[(uni, size)]["mean"] - best))
        if gaps:
            out.append(
                (
                    f"{uni} within 1 point of the best single-resolution row at each size",
                    ", ".join(f"{s} px {g:+.1f}" for s, g in gaps),
                    min(g for _, g in gaps) >= -1,
                )
            )
    for row in ("sinpos", "CAPE"):
        gains = [
            (s, tta[(row, s)]["mean"] - acc[(row, s)]["mean"])
            for s in sizes
            if (row, s) in tta and (row, s) in acc
        ]
        if gains:
            out.append(
                (
                    f"TTA helps {row} at every size",
                    ", ".join(f"{s} px {g:+.1f}" for s, g in gains),
                    min(g for _, g in gains) > 0,
                )
            )
    # ours, not the paper's: frequencies under the grid's Nyquist limit help at the training size
    for name, base in _frequency_pairs(cfg_rows):
        versus(name, base, train, True)
    return out


def _frequency_pairs(cfg_rows: dict[str, dict[str, Any]]) -> list[tuple[str, str]]:
    """(row, base): rows whose options set freq_scale != 1, each with the row that is the same
    in every other field (the same encoding at the paper's frequencies)."""

    def key(row: dict[str, Any]) -> str:
        options = {k: v for k, v in row["options"].items() if k != "freq_scale"}
        return repr(sorted({**row, "name": "", "options": sorted(options.items())}.items()))

    def scale(row: dict[str, Any]) -> float:
        return row["options"].get("freq_scale", 1.0)

    # reversed: where several unscaled rows match, the first one is the base
    plain = {key(r): n for n, r in reversed(cfg_rows.items()) if scale(r) == 1.0}
    return [(n, plain[key(r)]) for n, r in cfg_rows.items() if scale(r) != 1.0 and key(r) in plain]


def _figures(rep: Report, out: Path, maps: dict[str, np.ndarray]) -> None:
    if not maps or not plot_ok():
        return
    from cape.lab.viz import plot_maps

    sim = {k.split("|")[1]: v for k, v in maps.items() if k.startswith("sim|")}
    if sim:
        plot_maps(
            {"": sim},
            out / "similarity.png",
            title="Position similarity to the centre patch (training size)",
        )
        rep.image(
            "similarity.png",
            "Dot product of each patch position with the centre one (LFF Figure 2 analog).",
        )
    emb: dict[str, dict[str, np.ndarray]] = {}
    for k, v in maps.items():
        if k.startswith("embed|"):
            _, row, col = k.split("|")
            emb.setdefault(row, {})[col] = v
    if emb:
        plot_maps(
            emb, out / "embeddings.png", title="Position embedding components at three resolutions"
        )
        rep.image(
            "embeddings.png", "Embedding components at three test resolutions (Figure 13 analog)."
        )
