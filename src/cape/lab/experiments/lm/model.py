"""The language-model experiment's model: a row's `cape.models.CausalLM` (`make_model`) and the
engine's loss (`lm_loss`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cape.lab.experiments.lm.config import LMConfig, RowConfig, position_options
from cape.models import CausalLM

__all__ = ["make_model", "lm_loss"]


def make_model(
    cfg: LMConfig, row: RowConfig, vocab_size: int, *, evaluation: bool = False
) -> CausalLM:
    """The row's model (untrained); with `evaluation`, its encoding takes the row's
    `eval_options` too."""
    return CausalLM(
        vocab_size,
        position=row.position,
        position_options=position_options(row, cfg, evaluation=evaluation),
        **dataclasses.asdict(cfg.model),  # dim, heads, layers, ffn_dim, dropout
    )


def lm_loss(model: nn.Module, batch: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
    """(mean next-token cross-entropy, {}) of windows batch [B, T + 1] for the engine (the
    model may be DDP-wrapped: its forward, not `CausalLM.loss`)."""
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten()), {}
