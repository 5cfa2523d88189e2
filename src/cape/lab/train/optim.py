"""Optimiser and learning-rate schedule built from a `TrainConfig`."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from cape.lab.train.config import TrainConfig

__all__ = ["build_optimizer", "build_scheduler", "lr_factor"]


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW or Adagrad. Weight decay applies to matrices only (ndim >= 2), not to biases,
    norm gains or 1-D position tables' scales, which decay would pull toward zero for no gain."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    groups = [g for g in groups if g["params"]]
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr)
    return torch.optim.Adagrad(groups, lr=cfg.lr)


def lr_factor(cfg: TrainConfig) -> Callable[[int], float]:
    """Multiplier of `cfg.lr` after `s` optimiser steps (LambdaLR's `last_epoch`).

    Warm-up (W = warmup_steps > 0): (s + 1) / W for s < W. Afterwards:
      cosine:       0.5 (1 + cos(pi t)), t = (s - W) / max(1, steps - W) clamped to [0, 1]
      inverse_sqrt: sqrt(max(W, 1) / (s + 1))  (1 at the end of warm-up)
      constant:     1
    """
    warmup, total, kind = cfg.warmup_steps, cfg.steps, cfg.schedule

    def factor(s: int) -> float:
        if s < warmup:
            return (s + 1) / warmup
        if kind == "cosine":
            t = min(max((s - warmup) / max(1, total - warmup), 0.0), 1.0)
            return 0.5 * (1.0 + math.cos(math.pi * t))
        if kind == "inverse_sqrt":
            return math.sqrt(max(warmup, 1) / (s + 1))
        return 1.0

    return factor


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: TrainConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg))
