"""`vision_eval.throughput`: every row's model timed in one process, round-robin
(`cape.lab.timing.time_models`)."""

from __future__ import annotations

import pytest
import torch

import cape.lab.experiments.vision.evaluate as vision_eval
import cape.lab.timing
from cape.lab.timing import Timing
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

    monkeypatch.setattr(cape.lab.timing, "time_interleaved", fake)
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


def test_time_models_times_every_model_per_input_in_inference_mode():
    seen = []

    def model(tag):
        def call(arg):
            seen.append((tag, arg, torch.is_inference_mode_enabled()))

        return call

    made = []

    def inputs():
        for key in ("x", "y"):
            made.append(key)  # one at a time: made when its turn comes
            yield key, f"{key}-input"

    timed = cape.lab.timing.time_models(
        {"a": model("a"), "b": model("b")}, inputs(), runs=2, warmup=1
    )
    assert [(k, n, t.runs) for k, n, t in timed] == [
        ("x", "a", 2), ("x", "b", 2), ("y", "a", 2), ("y", "b", 2)
    ]  # fmt: skip
    # warm-up once then two runs, round-robin, each model on its input, in inference mode
    assert seen == [(m, f"{k}-input", True) for k in "xy" for _ in range(3) for m in "ab"]
    assert made == ["x", "y"]
