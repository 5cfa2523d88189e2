"""`vision_eval.throughput`: every row's model timed in one process, round-robin."""

from __future__ import annotations

import pytest

import cape.lab.experiments.vision.evaluate as vision_eval
from cape.lab.bench.timing import Timing
from cape.models.vit import ViT


def _vit(depth: int) -> ViT:
    return ViT(5, image_size=8, patch=4, dim=16, depth=depth, heads=2, position="sinpos2d")


def test_images_per_second_from_the_median_batch_time(monkeypatch):
    calls = []

    def fake(fns, *, runs, warmup, device):
        calls.append(len(fns))
        outs = [fn() for fn in fns]  # each candidate is a forward pass on one batch
        assert all(o.shape == (6, 5) for o in outs)
        return [Timing(median_ms=20.0 * (i + 1), iqr_ms=0.0, runs=runs) for i in range(len(fns))]

    monkeypatch.setattr(vision_eval, "time_interleaved", fake)
    models = {"a": _vit(1), "b": _vit(2)}
    models["a"].train()
    recs = vision_eval.throughput(models, [8, 12], batch_size=6)
    assert calls == [2, 2]  # one round-robin per size, both rows in it
    assert not models["a"].training  # timed in eval mode (no dropout)
    by = {(r["row"], r["size"]): r["images_per_s"] for r in recs}
    # 6 images in 20 ms (a) and 40 ms (b), at each size
    assert by == pytest.approx(
        {("a", 8): 300.0, ("b", 8): 150.0, ("a", 12): 300.0, ("b", 12): 150.0}
    )
    assert {r["batch_size"] for r in recs} == {6}
