"""The vision experiment: ViTs with each encoding trained at one resolution, tested at others.

`run_experiment(cfg, out)`: for every row and seed, train (`train_run`, resumable), evaluate
(`evaluate_run`, cached in the run folder's `eval.json`), then write `results.json`,
`report.md` and the plots (`vision_report`). Layout of `out`:
`config.yaml`, `<row>/seed<k>/` (engine run folder: metrics, checkpoints, eval.json),
`results.json`, `maps.npz`, `report.md`, `*.png`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from cape.lab.experiments.runs import begin, finish
from cape.lab.experiments.template import cached_runs, run_dir
from cape.lab.experiments.vision.config import RowConfig, VisionConfig
from cape.lab.experiments.vision.data import VisionData
from cape.lab.experiments.vision.evaluate import accuracy, eval_records, predict, throughput
from cape.lab.experiments.vision.report import (
    position_maps,
    redraw,
    row_maps,
    saved_maps,
    write_report,
)
from cape.lab.train import Trainer, seed_everything
from cape.lab.train import distributed as D
from cape.lab.train.checkpoint import latest_checkpoint, load_checkpoint
from cape.lab.train.lock import holds_out
from cape.models.vit import ViT

__all__ = [
    "make_model",
    "make_data",
    "classify_loss",
    "train_run",
    "load_run",
    "run_experiment",
    "run_dir",
    "redraw",
    "format_records",
]


def make_data(cfg: VisionConfig) -> VisionData:
    """The images the config names (rendered and cached on first use)."""
    return VisionData(cfg.data)


def format_records(records: list[dict[str, Any]]) -> str:
    """The evaluation records as a markdown table (what `cape eval vision` prints)."""
    lines = ["| set | size | method | acc % | images/s |", "|---|---|---|---|---|"]
    for r in records:
        ips = "" if r["images_per_s"] is None else f"{r['images_per_s']:.0f}"
        lines.append(
            f"| {r['set']} | {r['size'] or r['bin']} | {r['method']} | {r['acc']:.2f} | {ips} |"
        )
    return "\n".join(lines)


def make_model(cfg: VisionConfig, row: RowConfig, num_classes: int) -> ViT:
    m = row.model_config(cfg.model)
    return ViT(
        num_classes,
        image_size=row.train_size,
        patch=m.patch,
        dim=m.dim,
        depth=m.depth,
        heads=m.heads,
        mlp_ratio=m.mlp_ratio,
        dropout=m.dropout,
        position=row.position,
        position_options=dict(row.options),
    )


def classify_loss(sizes: list[int], packed: bool = False):
    """loss_fn(model, (images [B, 3, S, S], labels [B])) -> (cross-entropy, {"acc"}).

    With `sizes` (UniViT) each batch is resized to one size drawn from them, or with `packed`
    each image to its own size and the batch packed with padding masks. Draws use the global
    torch RNG (checkpointed by the engine, different on every rank)."""

    def resize(images: torch.Tensor, s: int) -> torch.Tensor:
        if s == images.shape[-1]:
            return images
        return F.interpolate(images, size=(s, s), mode="bilinear", antialias=True)

    def loss_fn(model: torch.nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        images, labels = batch
        if packed:
            picks = torch.randint(len(sizes), (len(images),)).tolist()
            logits = model(
                [resize(im[None], sizes[k])[0] for im, k in zip(images, picks, strict=True)]
            )
        else:
            if sizes:
                images = resize(images, sizes[int(torch.randint(len(sizes), ()))])
            logits = model(images)
        loss = F.cross_entropy(logits.float(), labels)
        acc = (logits.argmax(-1) == labels).float().mean() * 100
        return loss, {"acc": acc.detach()}

    return loss_fn


def _trainer(
    cfg: VisionConfig,
    row: RowConfig,
    seed: int,
    folder: Path,
    data: VisionData,
    model: ViT,
    *,
    finetune: bool = False,
) -> Trainer:
    """The engine for a row's training (at `train_size`, UniViT sizes drawn per batch) or for
    its fine-tune (at `finetune_size`, lr / 10, `finetune_steps`)."""
    size = row.finetune_size if finetune else row.train_size
    tcfg = dataclasses.replace(cfg.train, seed=seed)
    if finetune:
        steps = row.finetune_steps
        tcfg = dataclasses.replace(
            tcfg,
            steps=steps,
            lr=tcfg.lr * 0.1,
            warmup_steps=min(tcfg.warmup_steps, steps // 10),
            eval_every=min(tcfg.eval_every, steps),
            checkpoint_every=min(tcfg.checkpoint_every, steps),
        )
    val_x, val_y = data.tensors("val", size)

    def eval_fn(m: torch.nn.Module) -> dict[str, float]:
        shard = slice(D.get_rank(), None, D.get_world_size())
        probs, _ = predict(m, val_x[shard], cfg.eval.batch_size)  # type: ignore[arg-type]
        return {"acc": accuracy(probs, val_y[shard])}

    sizes = [] if finetune else list(row.univit_sizes)
    train_set = data.dataset("train", size if finetune else row.data_size)
    record = {
        "experiment": "vision",
        "row": row.name,
        "seed": seed,
        "finetune": finetune,
        "config": dataclasses.asdict(cfg),
    }
    loss_fn = classify_loss(sizes, packed=row.packed and not finetune)
    return Trainer(
        model, loss_fn, train_set, eval_fn, tcfg, folder, train_set.collate, experiment=record
    )


def train_run(
    cfg: VisionConfig, row: RowConfig, seed: int, out: str | Path, data: VisionData
) -> tuple[ViT, dict[str, float]]:
    """Train one (row, seed), resuming from its checkpoints; with a fine-tune, also the "+ft"
    model (in `ft/`). Returns the final model (fine-tuned if asked) and the training summary."""
    folder = run_dir(out, row, seed)
    seed_everything(seed)
    model = make_model(cfg, row, data.num_classes)
    trainer = _trainer(cfg, row, seed, folder, data, model)
    summary = trainer.fit(resume=True)
    if row.finetune_size:
        ft = _trainer(cfg, row, seed, folder / "ft", data, trainer.model, finetune=True)
        summary = {**summary, **{f"ft_{k}": v for k, v in ft.fit(resume=True).items()}}
        return ft.model, summary  # type: ignore[return-value]
    return trainer.model, summary  # type: ignore[return-value]


def load_run(
    cfg: VisionConfig, row: RowConfig, seed: int, out: str | Path, data: VisionData | int
) -> ViT:
    """The final weights of a trained run (fine-tuned when the row fine-tunes); data: the
    `VisionData` or its number of classes."""
    folder = run_dir(out, row, seed) / ("ft" if row.finetune_size else "")
    path = latest_checkpoint(folder / "checkpoints")
    if path is None:
        raise FileNotFoundError(f"no checkpoint in {folder}; train it first (cape train vision)")
    num_classes = data if isinstance(data, int) else data.num_classes
    model = make_model(cfg, row, num_classes)
    load_checkpoint(path, model)
    return model


@holds_out
def run_experiment(
    cfg: VisionConfig, mapping: dict[str, Any], out: str | Path, *, train: bool = True
) -> dict[str, Any]:
    """Train and evaluate every (row, seed), then write the report; returns the results. With
    `train=False`, report only the runs that have finished (`cape experiment --finished`)."""
    out, dist = begin(cfg, mapping, out)
    data = VisionData(cfg.data)
    records: list[dict[str, Any]] = []
    summaries: dict[str, dict[str, float]] = {}
    maps: dict[str, Any] = {}
    archived: dict[str, Any] | None = None  # maps.npz as found, for runs without weights

    def compute(row: RowConfig, seed: int, folder: Path) -> dict[str, Any]:
        model, summary = train_run(cfg, row, seed, out, data)
        model.to(dist.device).eval()
        return {
            "records": eval_records(cfg, row, seed, model, data, dist.device),
            "summary": summary,
        }

    for row, seed, done in cached_runs(cfg.rows, cfg.seeds, out, compute, cfg, train=train):
        records += done["records"]
        summaries[f"{row.name}/seed{seed}"] = done["summary"]
        if cfg.eval.figures and seed == cfg.seeds[0] and dist.rank == 0:
            try:
                model = load_run(cfg, row, seed, out, data.num_classes)
            except FileNotFoundError:  # a run restored from its eval.json alone (no weights)
                if archived is None:  # read once, before write_report replaces it
                    archived = saved_maps(out)
                kept = row_maps(archived, row.name)
                maps.update(kept)
                print(
                    f"no weights for {row.name} seed {seed}: "
                    + ("its maps come from maps.npz" if kept else "its maps are left out"),
                    flush=True,
                )
                continue
            maps.update(position_maps(model, row, cfg.eval.sizes))
    results = {
        "experiment": "vision",
        "name": cfg.name,
        "config": mapping,
        "records": records,
        "train": summaries,
        # a folder's real counts (its fractions decide them), or the rendered ones
        "data": {
            "counts": {s: data.count(s) for s in ("train", "val", "test")},
            "classes": data.num_classes,
        },
    }

    def write() -> None:
        # Figure 4's speeds: every row timed here, in one process (freshly built models)
        models = {r.name: make_model(cfg, r, data.num_classes) for r in cfg.rows}
        sizes = sorted(set(cfg.eval.sizes) | {r.train_size for r in cfg.rows})
        results["throughput"] = throughput(models, sizes, cfg.eval.batch_size, device=dist.device)
        write_report(out, results, maps)

    finish(dist, write)
    return results
