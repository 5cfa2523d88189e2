"""The length experiment's model: `LookupModel` (`make_model` builds a row's) and its loss."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cape.lab.data.text.lookup import IGNORE
from cape.lab.experiments.length.config import LengthConfig, RowConfig, position_options
from cape.models.plan import position_plan
from cape.models.transformer import TransformerEncoder
from cape.positions import token_positions

__all__ = ["LookupModel", "make_model", "token_loss"]


class LookupModel(nn.Module):
    """Token embeddings (+ an absolute encoding) -> bidirectional Transformer encoder (+ an
    in-attention encoding per layer) -> linear head to the V symbols at every position.

    position, options: a 1-D `cape.build` name and its options (`cape.models.plan`). The
    positions are the token indices [B, T, 1], augmented in training once per sample (CAPE;
    mean-normalised in eval too when the augmentation asks) and given to every layer alike.
    forward(batch {"tokens": [B, T] int64, "mask": [B, T] bool}) -> logits [B, T, V].
    """

    def __init__(
        self,
        vocab: int,
        position: str,
        options: dict[str, Any],
        *,
        dim: int,
        heads: int,
        layers: int,
        ffn_dim: int,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        # the plan first: its modules are initialised before the embedding, as the seeds expect
        plan = position_plan(position, dim=dim, heads=heads, options=options)
        self.embed = nn.Embedding(vocab, dim)
        self.encoder = TransformerEncoder(
            layers, dim, heads, ffn_dim, position=plan, dropout=dropout
        )
        self.head = nn.Linear(dim, vocab)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        tokens, mask = batch["tokens"], batch["mask"]
        pos = token_positions(*tokens.shape, mask=mask)  # [B, T, 1], 0 at padding
        return self.head(self.encoder(self.embed(tokens), mask=mask, positions=pos))


def make_model(cfg: LengthConfig, row: RowConfig, *, evaluation: bool = False) -> LookupModel:
    """The row's model; with `evaluation`, its encoding takes the row's `eval_options` too."""
    return LookupModel(
        cfg.data.vocab,
        row.position,
        position_options(row, cfg, evaluation=evaluation),
        **dataclasses.asdict(cfg.model),  # dim, heads, layers, ffn_dim, dropout
    )


def token_loss(
    model: nn.Module, batch: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, dict[str, Any]]:
    """(cross-entropy over the scored positions, {"acc": % of them right}) for the engine."""
    logits, targets = model(batch), batch["targets"]
    loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE)
    scored = targets != IGNORE
    acc = (logits.argmax(-1) == targets)[scored].float().mean() * 100
    return loss, {"acc": acc.detach()}
