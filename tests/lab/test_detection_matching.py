"""DETR's set prediction in the detection experiment, against independent computations: GIoU
and IoU in closed form on hand-made boxes, the Hungarian matching against a brute force over
every assignment, and the loss against a scalar re-computation of DETR's eq. 2."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from cape.lab.experiments.detection.matching import (
    LossWeights,
    box_iou,
    cxcywh_to_xyxy,
    generalized_box_iou,
    match,
    set_loss,
    xyxy_to_cxcywh,
)

# (a, b, IoU, GIoU): IoU = |A n B| / |A u B|, GIoU = IoU - (|C| - |A u B|) / |C|
HAND = [
    ((0, 0, 1, 1), (0, 0, 1, 1), 1.0, 1.0),  # the same box
    ((0, 0, 1, 1), (2, 0, 3, 1), 0.0, 0.0 - (3 - 2) / 3),  # apart: hull 3 x 1, union 2
    ((0, 0, 2, 2), (1, 1, 3, 3), 1 / 7, 1 / 7 - (9 - 7) / 9),  # corner overlap of 1
    ((0, 0, 4, 4), (1, 1, 2, 2), 1 / 16, 1 / 16),  # nested: the hull is the union
    ((0, 0, 1, 1), (1, 0, 2, 1), 0.0, 0.0),  # touching: the hull is the union
    ((0, 0, 2, 1), (1, 0, 3, 1), 1 / 3, 1 / 3),  # side by side, half overlapping
    ((0, 0, 1, 1), (3, 3, 4, 4), 0.0, 0.0 - (16 - 2) / 16),  # far apart diagonally
]


@pytest.mark.parametrize(("a", "b", "iou", "giou"), HAND)
def test_iou_and_giou_closed_forms(a, b, iou, giou):
    ta = torch.tensor([a], dtype=torch.float64)
    tb = torch.tensor([b], dtype=torch.float64)
    got_iou, _ = box_iou(ta, tb)
    assert got_iou.item() == pytest.approx(iou, abs=1e-12)
    assert generalized_box_iou(ta, tb).item() == pytest.approx(giou, abs=1e-12)
    assert generalized_box_iou(tb, ta).item() == pytest.approx(giou, abs=1e-12)  # symmetric


def test_giou_is_a_matrix_of_every_pair_and_bounded():
    g = torch.Generator().manual_seed(0)
    a = cxcywh_to_xyxy(torch.rand(5, 4, generator=g, dtype=torch.float64) * 0.5 + 0.1)
    b = cxcywh_to_xyxy(torch.rand(3, 4, generator=g, dtype=torch.float64) * 0.5 + 0.1)
    full = generalized_box_iou(a, b)
    assert full.shape == (5, 3)
    for i in range(5):
        for j in range(3):
            assert full[i, j] == generalized_box_iou(a[i : i + 1], b[j : j + 1])[0, 0]
    assert (full <= 1).all() and (full > -1).all()


def test_box_formats_round_trip():
    boxes = torch.tensor([[0.5, 0.5, 0.2, 0.4], [0.1, 0.9, 0.2, 0.1]])
    xyxy = cxcywh_to_xyxy(boxes)
    assert torch.allclose(xyxy[0], torch.tensor([0.4, 0.3, 0.6, 0.7]))
    assert torch.allclose(xyxy_to_cxcywh(xyxy), boxes)


def _scalar_giou(pred, target) -> float:
    """GIoU of two (cx, cy, w, h) boxes, with plain floats."""
    a, b = _xyxy(pred), _xyxy(target)
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    hull = (max(a[2], b[2]) - min(a[0], b[0])) * (max(a[3], b[3]) - min(a[1], b[1]))
    return inter / union - (hull - union) / hull


def _scalar_cost(prob, pred, label, target, w: LossWeights) -> float:
    """DETR's matching cost of one prediction and one object, computed with plain floats."""
    l1 = sum(abs(p - t) for p, t in zip(pred, target, strict=True))
    return -w.cls * prob[label] + w.l1 * l1 - w.giou * _scalar_giou(pred, target)


def _xyxy(box):
    cx, cy, w, h = box
    return (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)


def _softmax(row):
    e = [math.exp(v - max(row)) for v in row]
    return [v / sum(e) for v in e]


def _brute_force(logits, boxes, labels, targets, w):
    """The least total cost over every injective map object -> prediction."""
    q, n = len(logits), len(labels)
    probs = [_softmax(row) for row in logits]
    cost = [[_scalar_cost(probs[i], boxes[i], labels[j], targets[j], w) for j in range(n)]
            for i in range(q)]  # fmt: skip
    best = min(
        sum(cost[perm[j]][j] for j in range(n)) for perm in itertools.permutations(range(q), n)
    )
    return best, cost


def _random_case(seed: int, q: int, n: int, classes: int = 3):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(1, q, classes + 1, generator=g, dtype=torch.float64) * 2
    boxes = torch.rand(1, q, 4, generator=g, dtype=torch.float64) * 0.4 + 0.1
    labels = torch.randint(classes, (n,), generator=g)
    targets = torch.rand(n, 4, generator=g, dtype=torch.float64) * 0.4 + 0.1
    return logits, boxes, labels, targets


@pytest.mark.parametrize(
    ("seed", "q", "n"), [(s, q, n) for s in range(4) for q, n in ((4, 2), (5, 3), (6, 4), (3, 3))]
)
def test_match_finds_the_least_cost_of_every_assignment(seed, q, n):
    w = LossWeights()
    logits, boxes, labels, targets = _random_case(seed, q, n)
    [(rows, cols)] = match(logits, boxes, [(labels, targets)], w)
    best, cost = _brute_force(logits[0].tolist(), boxes[0].tolist(), labels.tolist(),
                              targets.tolist(), w)  # fmt: skip
    assert len(rows) == len(cols) == n and len(set(rows.tolist())) == n
    assert sorted(cols.tolist()) == list(range(n))
    got = sum(cost[i][j] for i, j in zip(rows.tolist(), cols.tolist(), strict=True))
    assert got == pytest.approx(best, abs=1e-9)


def test_match_solves_each_image_alone():
    """Two images in one call: the same answer as each alone (the batch's cost matrix holds
    every object of the batch; an image must use only its own block)."""
    a = _random_case(1, 5, 2)
    b = _random_case(2, 5, 3)
    logits = torch.cat([a[0], b[0]])
    boxes = torch.cat([a[1], b[1]])
    both = match(logits, boxes, [(a[2], a[3]), (b[2], b[3])])
    for got, case in zip(both, (a, b), strict=True):
        [alone] = match(case[0], case[1], [(case[2], case[3])])
        assert got[0].tolist() == alone[0].tolist() and got[1].tolist() == alone[1].tolist()
    empty = match(logits[:1], boxes[:1], [(torch.zeros(0, dtype=torch.long), torch.zeros(0, 4))])
    assert [len(r) for r, _ in empty] == [0]


def _scalar_loss(logits, boxes, labels, targets, w: LossWeights) -> float:
    """DETR's eq. 2 for one image and one layer, with the brute-force assignment: weighted
    cross-entropy over every prediction (the "no object" class weighted w.no_object), then
    w_l1 L1 + w_giou (1 - GIoU) over the matched pairs, each divided by the object count."""
    q, n = len(logits), len(labels)
    probs = [_softmax(row) for row in logits]
    cost = [[_scalar_cost(probs[i], boxes[i], labels[j], targets[j], w) for j in range(n)]
            for i in range(q)]  # fmt: skip
    perm = min(itertools.permutations(range(q), n),
               key=lambda p: sum(cost[p[j]][j] for j in range(n)))  # fmt: skip
    none = len(logits[0]) - 1
    cls = [none] * q
    for j, i in enumerate(perm):
        cls[i] = labels[j]
    weight = [w.no_object if c == none else 1.0 for c in cls]
    ce = -sum(wt * math.log(probs[i][cls[i]]) for i, wt in enumerate(weight)) / sum(weight)
    l1 = giou = 0.0
    for j, i in enumerate(perm):
        l1 += sum(abs(p - t) for p, t in zip(boxes[i], targets[j], strict=True))
        giou += 1 - _scalar_giou(boxes[i], targets[j])
    return w.cls * ce + w.l1 * l1 / n + w.giou * giou / n


def test_set_loss_is_detrs_loss_summed_over_layers():
    w = LossWeights()
    first = _random_case(3, 5, 3)
    second = _random_case(4, 5, 3)
    target = (first[2], first[3])  # one image, one set of objects, two decoder layers
    layers = [(first[0], first[1]), (second[0], second[1])]
    loss, terms = set_loss(layers, [target], w)
    want = sum(
        _scalar_loss(lg[0].tolist(), bx[0].tolist(), first[2].tolist(), first[3].tolist(), w)
        for lg, bx in layers
    )
    assert loss.item() == pytest.approx(want, rel=1e-6)  # the loss is computed in float32
    assert set(terms) == {"ce", "l1", "giou"}
    alone, _ = set_loss(layers[1:], [target], w)
    last = _scalar_loss(second[0][0].tolist(), second[1][0].tolist(), first[2].tolist(),
                        first[3].tolist(), w)  # fmt: skip
    assert alone.item() == pytest.approx(last, rel=1e-6)


def test_set_loss_is_least_for_the_objects_themselves_and_has_gradients():
    labels = torch.tensor([0, 2])
    targets = torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.7, 0.6, 0.3, 0.1]])
    logits = torch.full((1, 4, 4), -10.0)
    logits[0, :, 3] = 10.0  # "no object" everywhere...
    logits[0, 1, 0], logits[0, 1, 3] = 10.0, -10.0  # ...but query 1 says class 0
    logits[0, 3, 2], logits[0, 3, 3] = 10.0, -10.0  # and query 3 class 2
    boxes = torch.rand(1, 4, 4) * 0.5 + 0.2
    boxes[0, 1], boxes[0, 3] = targets[0], targets[1]
    perfect, terms = set_loss([(logits, boxes)], [(labels, targets)])
    assert terms["l1"].item() == pytest.approx(0.0, abs=1e-6)
    assert terms["giou"].item() == pytest.approx(0.0, abs=1e-6)
    assert perfect.item() < 1e-3
    moved = boxes.clone().requires_grad_(True)
    with torch.no_grad():
        moved[0, 1] += 0.05
    worse, _ = set_loss([(logits, moved)], [(labels, targets)])
    assert worse.item() > perfect.item()
    worse.backward()
    assert torch.isfinite(moved.grad).all() and moved.grad[0, 1].abs().sum() > 0
    assert np.allclose(moved.grad[0, [0, 2]].numpy(), 0.0)  # unmatched boxes get no gradient
