"""COCO's metrics of the detection experiment (pycocotools) on hand-made predictions whose AP is
known from COCO's definition: AP averaged over IoU thresholds 0.50:0.05:0.95, each the mean of
the interpolated precision at 101 recall points; area ranges from `small_side`, `large_side`."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cape.lab.experiments.detection.coco import METRICS, coco_metrics


def _objects():
    """Three images: a small, a medium and a large object (sides 0.1, 0.2, 0.4 of 100 px)."""
    return [
        (np.array([[0.10, 0.10, 0.20, 0.20]]), np.array([0])),
        (np.array([[0.50, 0.50, 0.70, 0.70]]), np.array([1])),
        (np.array([[0.20, 0.30, 0.60, 0.70]]), np.array([2])),
    ]


def _exact(objects, score: float = 0.9):
    return [(boxes, np.full(len(boxes), score), labels) for boxes, labels in objects]


def _metrics(objects, predictions):
    return coco_metrics(objects, predictions, side=100.0, classes=4, small_side=0.15,
                        large_side=0.3)  # fmt: skip


def test_perfect_predictions_score_100_everywhere():
    got = _metrics(_objects(), _exact(_objects()))
    assert set(got) == set(METRICS)
    for key in METRICS:
        assert got[key] == pytest.approx(100.0)


def _shifted(box: np.ndarray, iou: float) -> np.ndarray:
    """`box` moved right so that its IoU with itself is `iou`: for a shift d of a w-wide box,
    IoU = (w - d) / (w + d), so d = w (1 - iou) / (1 + iou)."""
    w = box[2] - box[0]
    d = w * (1 - iou) / (1 + iou)
    return box + np.array([d, 0.0, d, 0.0])


@pytest.mark.parametrize(
    ("iou", "ap", "ap50", "ap75"),
    [
        (0.62, 30.0, 100.0, 0.0),  # passes the thresholds 0.50, 0.55, 0.60: 3 of 10
        (0.77, 60.0, 100.0, 100.0),  # 0.50 ... 0.75: 6 of 10
        (0.45, 0.0, 0.0, 0.0),  # below every threshold
        (0.93, 90.0, 100.0, 100.0),  # all but 0.95
    ],
)
def test_shifted_boxes_score_the_iou_thresholds_they_pass(iou, ap, ap50, ap75):
    objects = _objects()
    predictions = [
        (np.stack([_shifted(b, iou) for b in boxes]), np.full(len(boxes), 0.9), labels)
        for boxes, labels in objects
    ]
    got = _metrics(objects, predictions)
    assert got["ap"] == pytest.approx(ap, abs=1e-6)
    assert got["ap50"] == pytest.approx(ap50, abs=1e-6)
    assert got["ap75"] == pytest.approx(ap75, abs=1e-6)


def test_a_wrong_class_finds_nothing():
    objects = _objects()
    predictions = [(boxes, np.full(len(boxes), 0.9), (labels + 1) % 4) for boxes, labels in objects]
    assert _metrics(objects, predictions)["ap"] == 0.0


def test_half_found_first_is_51_of_101_recall_points():
    """Two objects; the right box ranked first, a miss second: precision 1 up to recall 0.5,
    none after, so the interpolated precision is 1 at 51 of COCO's 101 recall points."""
    objects = [
        (np.array([[0.1, 0.1, 0.3, 0.3]]), np.array([0])),
        (np.array([[0.5, 0.5, 0.7, 0.7]]), np.array([0])),
    ]
    predictions = [
        (np.array([[0.1, 0.1, 0.3, 0.3]]), np.array([0.9]), np.array([0])),
        (np.array([[0.0, 0.0, 0.1, 0.1]]), np.array([0.2]), np.array([0])),
    ]
    got = coco_metrics(objects, predictions, side=100.0, classes=1)
    assert got["ap"] == pytest.approx(100 * 51 / 101)
    assert got["ap50"] == pytest.approx(100 * 51 / 101)


def test_a_false_positive_ranked_first_lowers_the_precision():
    """One object found second, after a confident miss: precision 1/2 at recall 1, and the
    interpolated precision is 1/2 at every recall point."""
    objects = [(np.array([[0.1, 0.1, 0.3, 0.3]]), np.array([0]))]
    predictions = [
        (np.array([[0.6, 0.6, 0.8, 0.8], [0.1, 0.1, 0.3, 0.3]]), np.array([0.9, 0.5]),
         np.array([0, 0])),
    ]  # fmt: skip
    got = coco_metrics(objects, predictions, side=100.0, classes=1)
    assert got["ap"] == pytest.approx(50.0)


def test_area_ranges_follow_the_sides_given():
    """Only the small and large objects found: AP small and AP large are 100, AP medium 0;
    with no medium object at all, AP medium is NaN (COCO's -1)."""
    objects = _objects()
    predictions = _exact(objects)
    predictions[1] = (np.array([[0.0, 0.0, 0.05, 0.05]]), np.array([0.9]), np.array([1]))
    got = _metrics(objects, predictions)
    assert got["ap_small"] == pytest.approx(100.0) and got["ap_large"] == pytest.approx(100.0)
    assert got["ap_medium"] == 0.0
    without = _metrics([objects[0], objects[2]], [predictions[0], predictions[2]])
    assert math.isnan(without["ap_medium"]) and without["ap"] == pytest.approx(100.0)


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="predictions"):
        coco_metrics(_objects(), [], side=100.0, classes=4)
