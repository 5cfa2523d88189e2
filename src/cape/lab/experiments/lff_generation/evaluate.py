"""The LFF image-generation study's evaluation: held-out bits per dim, and its curve over
training read from a run's metrics."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from cape.lab.experiments.lff_generation.config import GenerationConfig, RowConfig
from cape.lab.experiments.lff_generation.data import GenerationData
from cape.lab.experiments.lff_generation.model import PixelTransformer, bits_per_dim
from cape.lab.train.logging import read_metrics

__all__ = ["evaluate_bpd", "eval_records", "format_records", "read_curve"]


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
