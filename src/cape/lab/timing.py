"""Timing helpers shared by the benchmarks and the experiments' throughput measurements:
warm-up, then interleaved repeated runs (`time_interleaved`), and models timed on each input
(`time_models`).

Candidates are timed round-robin (a, b, c, a, b, c, ...) so that load from elsewhere on a noisy
machine hits all of them alike; ratios of their medians are then comparable within one run.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Timing", "time_interleaved", "time_models"]


@dataclass(frozen=True)
class Timing:
    median_ms: float
    iqr_ms: float
    runs: int


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _summary(samples: list[float]) -> Timing:
    q = statistics.quantiles(samples, n=4) if len(samples) >= 2 else [samples[0]] * 3
    return Timing(statistics.median(samples), q[2] - q[0], len(samples))


def time_interleaved(
    fns: Sequence[Callable[[], object]],
    *,
    runs: int = 20,
    warmup: int = 3,
    device: torch.device | None = None,
) -> list[Timing]:
    """Median and inter-quartile range (ms) of each of `fns`, timed round-robin `runs` times."""
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    device = device or torch.device("cpu")
    for _ in range(warmup):
        for fn in fns:
            fn()
    _sync(device)
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(runs):
        for fn, acc in zip(fns, samples, strict=True):
            start = time.perf_counter()
            fn()
            _sync(device)
            acc.append((time.perf_counter() - start) * 1e3)
    return [_summary(s) for s in samples]


def _infer(model: Callable[[Any], object], arg: Any) -> object:
    with torch.inference_mode():
        return model(arg)


def time_models(
    models: Mapping[str, Callable[[Any], object]],
    inputs: Iterable[tuple[Any, Any]],
    *,
    runs: int = 20,
    warmup: int = 3,
    device: torch.device | None = None,
) -> list[tuple[Any, str, Timing]]:
    """Every model of `models` (name -> call) timed on each input of `inputs` ((key, argument)
    pairs, made one at a time), the models round-robin per input (`time_interleaved`) and in
    inference mode: (key, name, Timing) by input, then model, in their order."""
    out: list[tuple[Any, str, Timing]] = []
    for key, arg in inputs:
        fns = [functools.partial(_infer, model, arg) for model in models.values()]
        timings = time_interleaved(fns, runs=runs, warmup=warmup, device=device)
        out += [(key, name, t) for name, t in zip(models, timings, strict=True)]
    return out
