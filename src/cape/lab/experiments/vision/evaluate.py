"""Evaluation of a trained ViT: accuracy per test resolution, position rescaling (CAPE Table 6),
test-time augmentation over resolutions (Table 1), resize strategies per native size (Table 5).

Every result is one record: {"row", "seed", "set", "size", "method", "acc", "bin"};
`cape.lab.report.summarize` turns records into mean +- std over seeds. Under torchrun each rank
evaluates a shard and the counts are summed. Speed is measured apart (`throughput`): every row
timed in one process."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from cape.lab.experiments.base import rank_slice
from cape.lab.experiments.run_folders import summed_accuracy
from cape.lab.experiments.vision.config import RowConfig, VisionConfig
from cape.lab.experiments.vision.data import VisionData, resize_images, to_tensors
from cape.lab.experiments.vision.verdict import NO_POSITIONS
from cape.lab.progress import progress
from cape.lab.timing import time_models
from cape.models.vit import ViT

__all__ = [
    "predict",
    "throughput",
    "accuracy",
    "eval_records",
    "removed_records",
    "format_records",
    "extent_for",
    "round_to_patch",
    "native_targets",
    "tta_sizes",
    "NO_POSITIONS",
]


def extent_for(method: str, size: int, train_size: int) -> float:
    """CAPE Table 6: positions rescaled to [-gamma, gamma] at evaluation, gamma = 1, r/r_train
    or sqrt(r/r_train)."""
    ratio = size / train_size
    return {"1": 1.0, "ratio": ratio, "sqrt": math.sqrt(ratio)}[method]


def round_to_patch(size: float, patch: int) -> int:
    """The nearest multiple of `patch`, at least one patch."""
    return max(patch, int(round(size / patch)) * patch)


def tta_sizes(size: int, patch: int) -> list[int]:
    """The resolutions averaged by test-time augmentation: r - patch, r, r + patch (>= patch)."""
    return [s for s in (size - patch, size, size + patch) if s >= patch]


def native_targets(native: list[int], low: int, high: int, strategy: str, patch: int) -> list[int]:
    """Evaluation size of each image of native size in [low, high) for a resize strategy:
    "min"/"max" (the bin's smallest/largest size), "original" (its own size), "fixed S"."""
    if strategy.startswith("fixed "):
        return [int(strategy.split()[1])] * len(native)
    if strategy == "min":
        return [round_to_patch(low, patch)] * len(native)
    if strategy == "max":
        return [round_to_patch(high - 1, patch)] * len(native)
    if strategy == "original":
        return [round_to_patch(s, patch) for s in native]
    raise ValueError(f"strategy must be 'fixed S', 'min', 'max' or 'original', got {strategy!r}")


@torch.no_grad()
def predict(
    model: ViT,
    images: torch.Tensor,
    batch_size: int,
    *,
    extent: float | None = None,
    device: torch.device | None = None,
) -> torch.Tensor:
    """images [N, 3, H, W] -> class probabilities float32 [N, C] on the CPU (speed is
    `throughput`'s, every row timed in one process)."""
    device = device or next(model.parameters()).device
    model.eval()
    out = []
    for i in range(0, len(images), batch_size):
        logits = model(images[i : i + batch_size].to(device), extent=extent)
        out.append(logits.float().softmax(-1).cpu())
    return torch.cat(out)


def throughput(
    models: dict[str, ViT],
    sizes: list[int],
    batch_size: int,
    *,
    runs: int = 3,
    device: torch.device | None = None,
) -> list[dict[str, Any]]:
    """Images/s of each model at each size on batches [batch_size, 3, size, size]: records
    {"row", "size", "batch_size", "images_per_s"}. Speed does not depend on the weights, so
    every row is timed in one process, round-robin (`time_models`): timings of runs trained
    in different sessions of a noisy machine are not comparable, these are."""
    device = device or torch.device("cpu")
    for m in models.values():
        m.to(device).eval()

    def batches() -> Iterator[tuple[int, torch.Tensor]]:
        for size in sizes:
            x = torch.rand(batch_size, 3, size, size, generator=torch.Generator().manual_seed(0))
            yield size, x.to(device)

    timed = time_models(models, batches(), runs=runs, warmup=1, device=device)
    return [
        {"row": name, "size": size, "batch_size": batch_size,
         "images_per_s": batch_size / (t.median_ms / 1e3)}
        for size, name, t in timed
    ]  # fmt: skip


def accuracy(probs: torch.Tensor, labels: torch.Tensor) -> float:
    """Top-1 accuracy in % of probs [N, C] against labels [N], summed over ranks."""
    return summed_accuracy(float((probs.argmax(-1) == labels).sum()), len(labels))


def eval_records(
    cfg: VisionConfig,
    row: RowConfig,
    seed: int,
    model: ViT,
    data: VisionData,
    device: torch.device,
) -> list[dict[str, Any]]:
    """Every measurement the config asks for, for one trained model."""
    ev, bs = cfg.eval, cfg.eval.batch_size
    base = {"row": row.name, "seed": seed, "bin": None}
    out: list[dict[str, Any]] = []

    def record(split: str, size: int, method: str, acc: float) -> None:
        out.append({**base, "set": split, "size": size, "method": method, "acc": acc})

    sizes = sorted(set(ev.sizes) | {row.train_size})
    sets = ["test"] + (["test_fonts"] if cfg.data.test_fonts else [])
    sets = [s for s in sets if data.counts[s] > 0]
    cont = model.takes_extent
    probs_at: dict[int, torch.Tensor] = {}
    for split in sets:
        for size in progress(sizes, desc=f"eval {row.name} {split}"):
            x, y = data.tensors(split, size)
            sh = rank_slice()
            probs = predict(model, x[sh], bs, device=device)
            acc = accuracy(probs, y[sh])
            record(split, size, "plain", acc)
            if split == "test":
                probs_at[size] = probs
            if not cont:
                continue
            for e in ev.extents:
                gamma = extent_for(e, size, row.train_size)
                if gamma != 1.0:
                    acc = accuracy(predict(model, x[sh], bs, extent=gamma, device=device), y[sh])
                record(split, size, f"extent {e}", acc)
    if ev.tta and "test" in sets:
        for size in ev.sizes:
            record("test", size, "tta", _tta_accuracy(cfg, model, data, device, size, probs_at))
    if cfg.data.native and data.cfg.source == "chars":
        out += _native_records(cfg, model, data, device, base)
    return out


def removed_records(
    cfg: VisionConfig, row: RowConfig, seed: int, model: ViT, data: VisionData, device: torch.device
) -> list[dict[str, Any]]:
    """Test accuracy at every evaluation size of `model` as given (the caller,
    `Experiment.measure_removed`, has taken its positions out): method `NO_POSITIONS`, so a row
    that keeps its accuracy does not use its positions."""
    if data.counts["test"] == 0:
        return []
    out = []
    for size in sorted(set(cfg.eval.sizes) | {row.train_size}):
        x, y = data.tensors("test", size)
        sh = rank_slice()
        acc = accuracy(predict(model, x[sh], cfg.eval.batch_size, device=device), y[sh])
        out.append(
            {"row": row.name, "seed": seed, "bin": None, "set": "test", "size": size,
             "method": NO_POSITIONS, "acc": acc}
        )  # fmt: skip
    return out


def _tta_accuracy(
    cfg: VisionConfig,
    model: ViT,
    data: VisionData,
    device: torch.device,
    size: int,
    probs_at: dict[int, torch.Tensor],
) -> float:
    """Test accuracy at `size` of the class probabilities summed over `tta_sizes`; `probs_at`
    (size -> this rank's test probabilities) is read, and filled where a size is missing."""
    total = None
    for s in tta_sizes(size, cfg.model.patch):
        if s not in probs_at:
            x, y = data.tensors("test", s)
            probs_at[s] = predict(model, x[rank_slice()], cfg.eval.batch_size, device=device)
        total = probs_at[s] if total is None else total + probs_at[s]
    y = data.tensors("test", size)[1]
    return accuracy(total, y[rank_slice()])


def _native_records(
    cfg: VisionConfig, model: ViT, data: VisionData, device: torch.device, base: dict[str, Any]
) -> list[dict[str, Any]]:
    """Accuracy per native-size bin for each resize strategy (CAPE Table 5)."""
    images, labels = data.native()
    sh = rank_slice()
    images, labels = images[sh], labels[sh]
    native = [int(im.shape[0]) for im in images]
    edges = cfg.eval.native_bins
    strategies = [f"fixed {s}" for s in cfg.eval.sizes] + ["min", "max", "original"]
    out = []
    for low, high in zip(edges[:-1], edges[1:], strict=True):
        idx = [i for i, s in enumerate(native) if low <= s < high]
        for strategy in strategies:
            targets = native_targets([native[i] for i in idx], low, high, strategy, cfg.model.patch)
            correct = 0.0
            for t in sorted(set(targets)):
                group = [i for i, tt in zip(idx, targets, strict=True) if tt == t]
                x, y = to_tensors(
                    resize_images([images[i] for i in group], t),
                    np.asarray(labels)[group],
                    cfg.data.transform,
                )
                probs = predict(model, x, cfg.eval.batch_size, device=device)
                correct += float((probs.argmax(-1) == y).sum())
            acc = summed_accuracy(correct, len(idx))
            out.append(
                {
                    **base,
                    "set": "native",
                    "size": None,
                    "method": strategy,
                    "acc": acc,
                    "bin": f"{low}-{high - 1}",
                }
            )
    return out


def format_records(records: list[dict[str, Any]]) -> str:
    """The evaluation records as a markdown table (what `cape eval vision` prints)."""
    lines = ["| set | size | method | acc % |", "|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['set']} | {r['size'] or r['bin']} | {r['method']} | {r['acc']:.2f} |")
    return "\n".join(lines)
