"""DETR's set prediction (Carion et al. 2020, sec. 3.1): boxes, Hungarian matching, the losses.

Boxes are (cx, cy, w, h) in [0, 1] as the model predicts them, or (x0, y0, x1, y1). The
matching cost of prediction i and object j is DETR's (eq. 1 and its appendix A.1)

    C_ij = -w_class p_i(c_j) + w_l1 ||b_i - b_j||_1 - w_giou GIoU(b_i, b_j),

minimised over one-to-one assignments by `scipy.optimize.linear_sum_assignment`; the loss
(eq. 2) is the cross-entropy of every prediction's class (its object's, or "no object" for the
unmatched, weighted `no_object`) plus w_l1 L1 + w_giou (1 - GIoU) of the matched boxes, each
box term divided by the number of objects in the batch, summed over the decoder's layers
(the auxiliary losses, DETR sec. 3.2).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment

__all__ = [
    "cxcywh_to_xyxy",
    "xyxy_to_cxcywh",
    "box_iou",
    "generalized_box_iou",
    "LossWeights",
    "match",
    "set_loss",
]


def cxcywh_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    """[..., 4] (cx, cy, w, h) -> (x0, y0, x1, y1)."""
    cx, cy, w, h = boxes.unbind(-1)
    return torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1)


def xyxy_to_cxcywh(boxes: torch.Tensor) -> torch.Tensor:
    """[..., 4] (x0, y0, x1, y1) -> (cx, cy, w, h)."""
    x0, y0, x1, y1 = boxes.unbind(-1)
    return torch.stack([(x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0], -1)


def _area(boxes: torch.Tensor) -> torch.Tensor:
    return (boxes[..., 2] - boxes[..., 0]).clamp_min(0) * (boxes[..., 3] - boxes[..., 1]).clamp_min(
        0
    )


def box_iou(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """a: [N, 4], b: [M, 4] (x0, y0, x1, y1) -> (IoU [N, M], union [N, M])."""
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp_min(0).prod(-1)
    union = _area(a)[:, None] + _area(b)[None, :] - inter
    return inter / union, union


def generalized_box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a: [N, 4], b: [M, 4] (x0, y0, x1, y1) -> GIoU [N, M] = IoU - (|C| - |A u B|) / |C|,
    C the smallest box holding both (Rezatofighi et al. 2019, Algorithm 1)."""
    iou, union = box_iou(a, b)
    lt = torch.minimum(a[:, None, :2], b[None, :, :2])
    rb = torch.maximum(a[:, None, 2:], b[None, :, 2:])
    hull = (rb - lt).clamp_min(0).prod(-1)
    return iou - (hull - union) / hull


@dataclass(frozen=True)
class LossWeights:
    """DETR's weights: of the class term (cost and loss), the L1 and the GIoU terms, and of the
    "no object" class in the cross-entropy (its `eos_coef`)."""

    cls: float = 1.0
    l1: float = 5.0
    giou: float = 2.0
    no_object: float = 0.1


@torch.no_grad()
def match(
    logits: torch.Tensor,
    boxes: torch.Tensor,
    targets: Sequence[tuple[torch.Tensor, torch.Tensor]],
    weights: LossWeights = LossWeights(),
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The assignment of predictions to objects minimising DETR's cost, per image.

    logits: [B, Q, C + 1], boxes: [B, Q, 4] (cx, cy, w, h); targets: per image (labels [n],
    boxes [n, 4] (cx, cy, w, h)), n <= Q -> per image (prediction indices, object indices),
    each [n] and sorted by prediction. The costs of every prediction against every object of
    the batch are computed at once (as DETR does), each image's block then solved alone."""
    b, q, _ = logits.shape
    counts = [len(t[0]) for t in targets]
    if not sum(counts):
        return [(np.zeros(0, np.int64), np.zeros(0, np.int64)) for _ in targets]
    labels = torch.cat([t[0] for t in targets])
    tboxes = torch.cat([t[1] for t in targets]).float()
    prob = logits.float().flatten(0, 1).softmax(-1)  # [B*Q, C + 1]
    pred = boxes.float().flatten(0, 1)
    cost = (
        -weights.cls * prob[:, labels]
        + weights.l1 * torch.cdist(pred, tboxes, p=1)
        - weights.giou * generalized_box_iou(cxcywh_to_xyxy(pred), cxcywh_to_xyxy(tboxes))
    )
    blocks = cost.view(b, q, -1).cpu().split(counts, -1)
    out = []
    for i, block in enumerate(blocks):
        rows, cols = linear_sum_assignment(block[i].numpy())
        out.append((rows.astype(np.int64), cols.astype(np.int64)))
    return out


def _layer_loss(
    logits: torch.Tensor,
    boxes: torch.Tensor,
    targets: Sequence[tuple[torch.Tensor, torch.Tensor]],
    weights: LossWeights,
    num_boxes: float,
) -> dict[str, torch.Tensor]:
    """The three terms of one decoder layer's predictions (unweighted), after its own matching."""
    pairs = match(logits, boxes, targets, weights)
    b, q, c1 = logits.shape
    device = logits.device
    img = torch.cat([torch.full((len(r),), i, dtype=torch.long) for i, (r, _) in enumerate(pairs)])
    src = torch.from_numpy(np.concatenate([r for r, _ in pairs]))
    labels = torch.cat([t[0][c] for t, (_, c) in zip(targets, pairs, strict=True)])
    tgt = torch.cat([t[1][c] for t, (_, c) in zip(targets, pairs, strict=True)]).float()
    img, src = img.to(device), src.to(device)
    classes = torch.full((b, q), c1 - 1, dtype=torch.long, device=device)
    classes[img, src] = labels.to(device)
    class_weight = torch.ones(c1, device=device)
    class_weight[-1] = weights.no_object
    ce = F.cross_entropy(logits.float().transpose(1, 2), classes, class_weight)
    pred = boxes[img, src].float()
    tgt = tgt.to(device)
    l1 = F.l1_loss(pred, tgt, reduction="sum") / num_boxes
    giou = _paired_giou(cxcywh_to_xyxy(pred), cxcywh_to_xyxy(tgt))
    return {"ce": ce, "l1": l1, "giou": (1 - giou).sum() / num_boxes}


def _paired_giou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """GIoU of a[k] and b[k]: [K, 4], [K, 4] -> [K] (the diagonal of `generalized_box_iou`)."""
    inter = torch.minimum(a[:, 2:], b[:, 2:]) - torch.maximum(a[:, :2], b[:, :2])
    inter = inter.clamp_min(0).prod(-1)
    union = _area(a) + _area(b) - inter
    hull = (torch.maximum(a[:, 2:], b[:, 2:]) - torch.minimum(a[:, :2], b[:, :2])).prod(-1)
    return inter / union - (hull - union) / hull


def set_loss(
    layers: Sequence[tuple[torch.Tensor, torch.Tensor]],
    targets: Sequence[tuple[torch.Tensor, torch.Tensor]],
    weights: LossWeights = LossWeights(),
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DETR's loss summed over the decoder's layers.

    layers: per decoder layer (logits [B, Q, C + 1], boxes [B, Q, 4] cx, cy, w, h), the last
    layer last; targets: per image (labels [n], boxes [n, 4] cx, cy, w, h) ->
    (loss, the last layer's terms {"ce", "l1", "giou"}, detached)."""
    num_boxes = max(float(sum(len(t[0]) for t in targets)), 1.0)
    total = torch.zeros((), device=layers[-1][0].device)
    terms: dict[str, torch.Tensor] = {}
    for logits, boxes in layers:
        terms = _layer_loss(logits, boxes, targets, weights, num_boxes)
        total = total + weights.cls * terms["ce"] + weights.l1 * terms["l1"]
        total = total + weights.giou * terms["giou"]
    return total, {k: v.detach() for k, v in terms.items()}
