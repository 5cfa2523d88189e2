"""The LFF image-generation study (Li et al. 2021, sec. 4.1, Figure 3) as `cape experiment
lff-generation`: autoregressive models of RGB character images, one position encoding per row,
held-out bits per dim vs training step.

`run_experiment(cfg, mapping, out)`: for every row and seed, train (`train_run`, resumable; the
Trainer's eval_fn logs held-out bpd every `train.eval_every` steps), measure the final bpd
(`eval_records`), cache both in the run folder's `eval.json`, then write `results.json`,
`report.md` and the plots (`lff_generation_report`). Layout of `out`: `config.yaml`,
`<row>/seed<k>/` (engine run folder: metrics.jsonl, checkpoints, eval.json), `results.json`,
`report.md`, `*.png`. The model is in `lff_generation_model`.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from cape.lab.experiments.lff_generation.config import DataConfig, GenerationConfig, RowConfig
from cape.lab.experiments.lff_generation.model import PixelTransformer, bits_per_dim, flatten_images
from cape.lab.experiments.lff_generation.report import redraw, write_report
from cape.lab.experiments.runs import begin, finish
from cape.lab.experiments.template import cached_runs, run_dir
from cape.lab.experiments.vision.config import DataConfig as ImageDataConfig
from cape.lab.experiments.vision.data import VisionData
from cape.lab.train import Trainer, seed_everything
from cape.lab.train import distributed as D
from cape.lab.train.checkpoint import latest_checkpoint, load_checkpoint
from cape.lab.train.lock import holds_out
from cape.lab.train.logging import read_metrics

__all__ = [
    "GenerationData",
    "SequenceDataset",
    "make_model",
    "make_data",
    "generation_loss",
    "evaluate_bpd",
    "read_curve",
    "train_run",
    "load_run",
    "eval_records",
    "format_records",
    "run_dir",
    "run_experiment",
    "redraw",
]

EXPERIMENT = "lff-generation"


class SequenceDataset(Dataset):
    """Items: one image's intensities, uint8 [L]; the default collate makes [B, L]."""

    def __init__(self, seqs: torch.Tensor) -> None:
        self.seqs = seqs

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.seqs[i]


class GenerationData:
    """The train and val ("held-out") images of `cfg` as flattened uint8 sequences [N, S*S*3].

    Rendered once by `cape.lab.data.make_split` (cached on disk in `cfg.root`, rank 0 first under
    torchrun, through the vision experiment's `VisionData`), flattened with `flatten_images`.
    """

    def __init__(self, cfg: DataConfig) -> None:
        self.cfg = cfg
        self._images = VisionData(
            ImageDataConfig(
                root=cfg.root,
                train=cfg.train,
                val=cfg.val,
                test=0,
                seed=cfg.seed,
                workers=cfg.workers,
                transform="rgb",
            )
        )
        self._memo: dict[str, torch.Tensor] = {}

    def sequences(self, split: str) -> torch.Tensor:
        """uint8 [N, S*S*3] of split "train" or "val"."""
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        if split not in self._memo:
            images, _ = self._images.arrays(split, self.cfg.size)
            self._memo[split] = flatten_images(torch.from_numpy(images))
        return self._memo[split]

    def dataset(self, split: str) -> SequenceDataset:
        return SequenceDataset(self.sequences(split))


def make_data(cfg: GenerationConfig) -> GenerationData:
    """The images the config names (rendered and cached on first use)."""
    return GenerationData(cfg.data)


def make_model(cfg: GenerationConfig, row: RowConfig) -> PixelTransformer:
    m, s = cfg.model, cfg.data.size
    return PixelTransformer(
        s,
        s,
        row.position,
        dim=m.dim,
        channel_dim=m.channel_dim,
        depth=m.depth,
        heads=m.heads,
        ffn_dim=m.ffn_dim,
        dropout=m.dropout,
        position_options=row.options,
    )


def generation_loss(
    model: torch.nn.Module, seqs: torch.Tensor
) -> tuple[torch.Tensor, dict[str, Any]]:
    """loss_fn of the Trainer: seqs uint8 [B, L] -> (mean NLL in nats, {"bpd"})."""
    bits = bits_per_dim(model(seqs), seqs)
    return bits * math.log(2.0), {"bpd": bits.detach()}


@torch.no_grad()
def evaluate_bpd(
    model: torch.nn.Module, seqs: torch.Tensor, batch_size: int, device: torch.device | None = None
) -> float:
    """Held-out bits per dim: the NLL (bits) summed over every intensity of `seqs` [N, L],
    divided by N * L. The model is used as it is (call `.eval()` first)."""
    device = device or next(model.parameters()).device
    total, count = 0.0, 0
    for i in range(0, len(seqs), batch_size):
        batch = seqs[i : i + batch_size].to(device)
        total += float(bits_per_dim(model(batch), batch)) * batch.numel()
        count += batch.numel()
    return total / count if count else math.nan


def _trainer(
    cfg: GenerationConfig,
    row: RowConfig,
    seed: int,
    folder: Path,
    data: GenerationData,
    model: PixelTransformer,
) -> Trainer:
    val = data.sequences("val")

    def eval_fn(m: torch.nn.Module) -> dict[str, float]:
        shard = val[D.get_rank() :: D.get_world_size()]  # the Trainer averages over ranks
        return {"bpd": evaluate_bpd(m, shard, cfg.eval.batch_size)}

    record = {
        "experiment": EXPERIMENT,
        "row": row.name,
        "seed": seed,
        "config": dataclasses.asdict(cfg),
    }
    return Trainer(
        model,
        generation_loss,
        data.dataset("train"),
        eval_fn,
        dataclasses.replace(cfg.train, seed=seed),
        folder,
        experiment=record,
    )


def train_run(
    cfg: GenerationConfig, row: RowConfig, seed: int, out: str | Path, data: GenerationData
) -> tuple[PixelTransformer, dict[str, float]]:
    """Train one (row, seed) into `run_dir`, resuming from its checkpoints; returns the final
    model and the Trainer's summary."""
    seed_everything(seed)
    model = make_model(cfg, row)
    trainer = _trainer(cfg, row, seed, run_dir(out, row, seed), data, model)
    summary = trainer.fit(resume=True)
    return trainer.model, summary  # type: ignore[return-value]


def load_run(
    cfg: GenerationConfig,
    row: RowConfig,
    seed: int,
    out: str | Path,
    data: GenerationData | None = None,
) -> PixelTransformer:
    """The final weights of a trained run (`data` is not needed; kept for the interface)."""
    folder = run_dir(out, row, seed)
    path = latest_checkpoint(folder / "checkpoints")
    if path is None:
        raise FileNotFoundError(
            f"no checkpoint in {folder}; train it first (cape train {EXPERIMENT})"
        )
    model = make_model(cfg, row)
    load_checkpoint(path, model)
    return model


def eval_records(
    cfg: GenerationConfig,
    row: RowConfig,
    seed: int,
    model: PixelTransformer,
    data: GenerationData,
    device: torch.device,
) -> list[dict[str, Any]]:
    """The final held-out bits per dim of a trained model: one record {"row", "seed", "set",
    "images", "bpd", "params", "position_params"}."""
    model.to(device).eval()
    val = data.sequences("val")
    bpd = evaluate_bpd(model, val, cfg.eval.batch_size, device)
    return [
        {
            "row": row.name,
            "seed": seed,
            "set": "val",
            "images": len(val),
            "bpd": bpd,
            "params": sum(p.numel() for p in model.parameters()),
            "position_params": model.position_parameters(),
        }
    ]


def format_records(records: list[dict[str, Any]]) -> str:
    """The evaluation records as a markdown table (what `cape eval lff-generation` prints)."""
    lines = [
        "| row | seed | set | images | bits/dim | params | position params |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in records:
        lines.append(
            f"| {r['row']} | {r['seed']} | {r['set']} | {r['images']} | {r['bpd']:.4f} "
            f"| {r['params']:,} | {r['position_params']:,} |"
        )
    return "\n".join(lines)


def read_curve(folder: str | Path) -> list[dict[str, Any]]:
    """The held-out bpd the Trainer logged in a run folder: [{"step", "bpd"}] by step (the last
    row of a step wins; a resumed run has already dropped the rows it repeats)."""
    points: dict[int, float] = {}
    for row in read_metrics(Path(folder) / "metrics.jsonl"):
        if row.get("split") == "eval" and "bpd" in row:
            points[int(row["step"])] = float(row["bpd"])
    return [{"step": s, "bpd": points[s]} for s in sorted(points)]


@holds_out
def run_experiment(
    cfg: GenerationConfig, mapping: dict[str, Any], out: str | Path, *, train: bool = True
) -> dict[str, Any]:
    """Train and evaluate every (row, seed), then write the report; returns the results. With
    `train=False`, report only the runs that have finished (`cape experiment --finished`)."""
    out, dist = begin(cfg, mapping, out)
    data = make_data(cfg)
    records: list[dict[str, Any]] = []
    curves: list[dict[str, Any]] = []
    summaries: dict[str, dict[str, float]] = {}

    def compute(row: RowConfig, seed: int, folder: Path) -> dict[str, Any]:
        model, summary = train_run(cfg, row, seed, out, data)
        return {
            "records": eval_records(cfg, row, seed, model, data, dist.device),
            "curve": read_curve(folder),
            "summary": summary,
        }

    for row, seed, done in cached_runs(cfg.rows, cfg.seeds, out, compute, cfg, train=train):
        records += done["records"]
        curves += [{"row": row.name, "seed": seed, **p} for p in done["curve"]]
        summaries[f"{row.name}/seed{seed}"] = done["summary"]
    results = {
        "experiment": EXPERIMENT,
        "name": cfg.name,
        "config": mapping,
        "records": records,
        "curves": curves,
        "train": summaries,
    }
    finish(dist, lambda: write_report(out, results))
    return results
