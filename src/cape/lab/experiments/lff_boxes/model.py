"""The LFF boxes experiment's model: `BoxQA` (`make_model` builds a row's), CAPE's augmentation
of boxes, and the training loss."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cape.augment import Augmentation
from cape.lab.data.boxes import NONE, QUESTIONS, WIDGETS
from cape.lab.experiments.lff_boxes.config import (
    ROTARY,
    LffBoxesConfig,
    RowConfig,
    position_options,
)
from cape.models.plan import PositionPlan, position_plan
from cape.models.transformer import TransformerEncoder

__all__ = ["augment_boxes", "BoxQA", "make_model", "answer_loss"]


def augment_boxes(
    positions: torch.Tensor, mask: torch.Tensor | None, augmentation: Augmentation
) -> torch.Tensor:
    """CAPE's augmentation of boxes [B, N, 4] (top, left, bottom, right) -> [B, N, 4].

    The boxes are seen as 2N corner points (y, x): `augmentation` draws one global shift per
    axis and one scale per screen, shared by every corner, so that the relations between boxes
    (order, alignment, containment, nearest) survive; a local shift moves each corner."""
    b, n, _ = positions.shape
    corners = positions.reshape(b, 2 * n, 2)
    cmask = None if mask is None else mask.repeat_interleave(2, dim=1)
    return augmentation(corners, cmask, training=True).reshape(b, n, 4)


class BoxQA(nn.Module):
    """Question answering over a screen of boxes.

    plan: the position plan (`cape.models.plan`) of 4-D positions: an absolute encoding added
    to the box tokens, or one in-attention encoding per layer (RoPE-ViT's 4-D rotations) fed the
    edges times `unit` (cells), the question token taking the query box's; "nopos": content
    only. augmentation: applied to the box corners in training (`augment_boxes`), the model's
    own draw. forward(batch) with batch
    {"positions": [B, N, 4], "types": [B, N], "mask": [B, N] bool, "query": [B],
    "question": [B]} -> answer logits [B, len(WIDGETS) + 1].
    """

    def __init__(
        self,
        plan: PositionPlan,
        *,
        dim: int,
        depth: int,
        heads: int,
        ffn_dim: int,
        dropout: float = 0.0,
        augmentation: Augmentation | None = None,
        unit: float = 1.0,
    ) -> None:
        super().__init__()
        self.position, self.augmentation = plan.absolute, augmentation
        self.in_attention, self.unit = plan.in_attention, unit
        self.content = nn.Embedding(len(WIDGETS), dim)
        self.flag = nn.Embedding(2, dim)  # 1 at the query box
        self.question = nn.Embedding(len(QUESTIONS), dim)
        self.encoder = TransformerEncoder(
            depth, dim, heads, ffn_dim, dropout=dropout, position=plan.without_absolute()
        )
        self.head = nn.Linear(dim, NONE + 1)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        pos, mask, query = batch["positions"], batch["mask"], batch["query"]
        n = pos.shape[1]
        is_query = (torch.arange(n, device=pos.device)[None] == query[:, None]).long()
        x = self.content(batch["types"]) + self.flag(is_query)  # [B, N, D]
        if self.training and self.augmentation is not None:
            pos = augment_boxes(pos, mask, self.augmentation)
        if self.position is not None:
            x = x + self.position(x, positions=pos, mask=mask)
        tokens = torch.cat([self.question(batch["question"])[:, None], x], 1)  # [B, 1 + N, D]
        full = torch.cat([torch.ones_like(mask[:, :1]), mask], 1)
        if not self.in_attention:
            return self.head(self.encoder(tokens, mask=full)[:, 0])
        asked = pos.gather(1, query[:, None, None].expand(-1, 1, pos.shape[-1]))  # [B, 1, 4]
        where = torch.cat([asked, pos], 1) * self.unit  # [B, 1 + N, 4] in cells
        return self.head(self.encoder(tokens, mask=full, positions=where)[:, 0])


def make_model(cfg: LffBoxesConfig, row: RowConfig) -> BoxQA:
    m = cfg.model
    options = position_options(row, m, cfg.data.canvas)
    # a row's seed alone decides its weights: the module the plan makes of an in-attention
    # encoding (RoPE-Mixed's frequencies are random) draws on a copy of the RNG
    fork = torch.random.fork_rng(devices=[]) if row.position in ROTARY else nullcontext()
    with fork:
        plan = position_plan(row.position, dim=m.dim, heads=m.heads, options=options)
    return BoxQA(
        plan,
        dim=m.dim,
        depth=m.depth,
        heads=m.heads,
        ffn_dim=m.ffn_dim,
        dropout=m.dropout,
        augmentation=row.augmentation(),
        unit=float(cfg.data.canvas - 1),
    )


def answer_loss(
    model: nn.Module, batch: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, dict[str, Any]]:
    """(cross-entropy of the answer, {"acc": % correct}) for the engine."""
    logits = model(batch)
    loss = F.cross_entropy(logits.float(), batch["answer"])
    acc = (logits.argmax(-1) == batch["answer"]).float().mean() * 100
    return loss, {"acc": acc.detach()}
