"""The detection experiment's measurements: COCO's AP of the test scenes at every image size
(`eval_records`), the training loss and the validation metric, and the boxes a model finds on a
few test images (`examples`, drawn by the report)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn

from cape.lab.data.scenes import SHAPES, Scenes
from cape.lab.experiments.detection.coco import METRICS, coco_metrics
from cape.lab.experiments.detection.config import DetectionConfig
from cape.lab.experiments.detection.data import DetectionData, SceneSet, as_images, targets_of
from cape.lab.experiments.detection.matching import cxcywh_to_xyxy, set_loss

__all__ = [
    "NO_POSITIONS",
    "detection_loss",
    "predict",
    "size_metrics",
    "val_metrics",
    "eval_records",
    "format_records",
    "examples",
]

NO_POSITIONS = "positions removed"  # the method name of the records measured without them
Predictions = list[tuple[np.ndarray, np.ndarray, np.ndarray]]


def detection_loss(train_set: SceneSet, sizes: list[int]):
    """loss_fn(model, batch) -> (DETR's loss over every decoder layer, its last layer's terms)
    for the engine: the batch's images at one of `sizes`, drawn per batch from the global torch
    RNG (checkpointed by the engine, so a resumed run draws the same)."""

    def loss_fn(model: nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        size = sizes[int(torch.randint(len(sizes), ()))]
        images = train_set.images(batch["index"], size).to(batch["index"].device)
        return set_loss(model(images), batch["targets"])

    return loss_fn


@torch.no_grad()
def predict(
    model: nn.Module, scenes: Scenes, size: int, batch_size: int, device: Any, rows: range
) -> Predictions:
    """The last decoder layer's predictions for scenes `rows` resized to `size` px: per image
    (boxes [Q, 4] (x0, y0, x1, y1) in [0, 1], scores [Q], labels [Q]); a prediction's label is
    its likeliest class but "no object", its score that class's probability (DETR's)."""
    model.eval()
    out: Predictions = []
    idx = list(rows)
    for start in range(0, len(idx), batch_size):
        chunk = idx[start : start + batch_size]
        logits, boxes = model(as_images(scenes.images[chunk], size).to(device))[-1]
        scores, labels = logits.float().softmax(-1)[..., :-1].max(-1)
        xyxy = cxcywh_to_xyxy(boxes.float()).clamp(0, 1)
        for i in range(len(chunk)):
            out.append((xyxy[i].cpu().numpy(), scores[i].cpu().numpy(), labels[i].cpu().numpy()))
    return out


def size_metrics(
    cfg: DetectionConfig, model: nn.Module, scenes: Scenes, size: int, device: Any
) -> dict[str, float]:
    """COCO's metrics (%) of `model` on every scene of `scenes` at `size` px, in the stored
    images' pixels. COCO's AP is no mean over images, so every rank scores the whole (small)
    set, and all get the same numbers."""
    rows = range(len(scenes))
    return coco_metrics(
        [scenes.objects(i) for i in rows],
        predict(model, scenes, size, cfg.eval.batch_size, device, rows),
        side=float(max(cfg.data.sizes)),
        classes=len(SHAPES),
        small_side=cfg.eval.small_side,
        large_side=cfg.eval.large_side,
    )


def eval_records(
    cfg: DetectionConfig, row: Any, seed: int, model: nn.Module, data: DetectionData, device: Any
) -> list[dict[str, Any]]:
    """COCO's metrics on the test scenes at every size of `data.sizes`: records {"row", "seed",
    "size", "seen" (a training size), "method": "plain", ap, ap50, ap75, ap_small, ap_medium,
    ap_large}."""
    seen = set(cfg.data.train_sizes)
    out = []
    for size in cfg.data.sizes:
        metrics = size_metrics(cfg, model, data.test, size, device)
        out.append(
            {"row": row.name, "seed": seed, "size": size, "seen": size in seen, "method": "plain",
             **metrics}
        )  # fmt: skip
    return out


def format_records(records: list[dict[str, Any]]) -> str:
    """The evaluation records as a markdown table (what `cape eval detection` prints)."""
    head = "| size | seen | method | " + " | ".join(METRICS) + " |"
    lines = [head, "|" + "---|" * (3 + len(METRICS))]
    for r in records:
        cells = " | ".join(
            "–" if r[k] is None or math.isnan(r[k]) else f"{r[k]:.1f}" for k in METRICS
        )
        lines.append(f"| {r['size']} | {'yes' if r['seen'] else 'no'} | {r['method']} | {cells} |")
    return "\n".join(lines)


def examples(
    cfg: DetectionConfig, model: nn.Module, data: DetectionData, device: Any
) -> dict[str, Any]:
    """The boxes `model` finds with a score of at least `eval.score` on the first `eval.examples`
    test scenes, at the largest training size and at the largest size: {"<size>": [per image
    {"boxes": [[x0, y0, x1, y1], ...] in [0, 1], "scores", "labels"}]}."""
    n = min(cfg.eval.examples, len(data.test))
    if not n:
        return {}
    out: dict[str, Any] = {}
    for size in sorted({max(cfg.data.train_sizes), max(cfg.data.sizes)}):
        found = []
        for boxes, scores, labels in predict(model, data.test, size, n, device, range(n)):
            keep = scores >= cfg.eval.score
            found.append(
                {
                    "boxes": np.round(boxes[keep], 4).tolist(),
                    "scores": np.round(scores[keep], 3).tolist(),
                    "labels": labels[keep].tolist(),
                }
            )
        out[str(size)] = found
    return out


def val_metrics(cfg: DetectionConfig, model: nn.Module, data: DetectionData) -> dict[str, float]:
    """The validation scenes at the largest training size: DETR's loss and COCO's AP (%)."""
    device = next(model.parameters()).device
    size, scenes = max(cfg.data.train_sizes), data.val
    rows = range(len(scenes))
    targets = [(lab.to(device), box.to(device)) for lab, box in targets_of(scenes, list(rows))]
    total = 0.0
    for start in range(0, len(rows), cfg.eval.batch_size):
        chunk = slice(start, start + cfg.eval.batch_size)
        images = as_images(scenes.images[chunk], size).to(device)
        loss, _ = set_loss(model(images), targets[chunk])
        total += float(loss) * len(images)
    ap = size_metrics(cfg, model, scenes, size, device)["ap"]
    return {"loss": total / max(len(rows), 1), "ap": ap}
