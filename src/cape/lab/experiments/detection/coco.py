"""COCO's detection metrics through pycocotools (the reference implementation of the COCO
evaluation, which DETR reports): AP (IoU 0.50:0.95), AP50, AP75 and AP over small, medium and
large objects, with area ranges scaled to these images (`EvalConfig.small_side`, `large_side`).

Ground truth and predictions are given in [0, 1] of the image side (x0, y0, x1, y1) and scored
in the pixels of the stored images (`side` px), as DETR maps its boxes back to each image's
original size before COCO scores them: a size a model sees changes its input, not the frame
the boxes are scored in.
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Sequence

import numpy as np

__all__ = ["METRICS", "LABELS", "coco_metrics"]

METRICS = ("ap", "ap50", "ap75", "ap_small", "ap_medium", "ap_large")
"""The first six numbers of COCO's summary, in its order, as percentages."""
LABELS = dict(
    zip(METRICS, ("AP", "AP50", "AP75", "AP small", "AP medium", "AP large"), strict=True)
)
"""How the reports name them."""


def _ground_truth(
    objects: Sequence[tuple[np.ndarray, np.ndarray]], side: float, classes: int
) -> dict[str, list]:
    images, annotations = [], []
    for i, (boxes, labels) in enumerate(objects):
        images.append({"id": i, "width": side, "height": side})
        for box, label in zip(np.asarray(boxes, np.float64) * side, labels, strict=True):
            w, h = box[2] - box[0], box[3] - box[1]
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": i,
                    "category_id": int(label) + 1,
                    "bbox": [box[0], box[1], w, h],
                    "area": w * h,
                    "iscrowd": 0,
                }
            )
    categories = [{"id": c + 1, "name": str(c)} for c in range(classes)]
    return {"images": images, "annotations": annotations, "categories": categories}


def coco_metrics(
    objects: Sequence[tuple[np.ndarray, np.ndarray]],
    predictions: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
    *,
    side: float,
    classes: int,
    small_side: float = 32 / 640,
    large_side: float = 96 / 640,
) -> dict[str, float]:
    """COCO's AP of `predictions` against `objects`, in % (NaN where no object of an area range).

    objects: per image (boxes [n, 4] (x0, y0, x1, y1) in [0, 1], labels [n] in [0, classes)).
    predictions: per image (boxes [q, 4] as the objects', scores [q], labels [q]). side: the
    images' side in px, the frame of the scores; small_side, large_side: COCO's small objects
    have an area below (small_side x side)^2, large ones above (large_side x side)^2 (the
    defaults: COCO's 32^2 and 96^2 px for a 640 px image)."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    if len(objects) != len(predictions):
        raise ValueError(
            f"predictions must hold one entry per image ({len(objects)}), got {len(predictions)}"
        )
    rows = []
    for i, (boxes, scores, labels) in enumerate(predictions):
        b = np.asarray(boxes, np.float64).reshape(-1, 4) * side
        for box, score, label in zip(b, scores, labels, strict=True):
            rows.append([i, box[0], box[1], box[2] - box[0], box[3] - box[1], score, label + 1])
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress
        gt = COCO()
        gt.dataset = _ground_truth(objects, side, classes)
        gt.createIndex()
        if not rows:
            return dict.fromkeys(METRICS, 0.0 if gt.dataset["annotations"] else math.nan)
        dt = gt.loadRes(np.asarray(rows, dtype=np.float64))
        ev = COCOeval(gt, dt, "bbox")
        small, large = (small_side * side) ** 2, (large_side * side) ** 2
        ev.params.areaRng = [[0.0, 1e10], [0.0, small], [small, large], [large, 1e10]]
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return {
        k: (math.nan if v < 0 else 100.0 * float(v))
        for k, v in zip(METRICS, ev.stats[: len(METRICS)], strict=True)
    }
