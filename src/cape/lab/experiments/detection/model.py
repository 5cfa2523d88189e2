"""A small DETR (Carion et al. 2020) whose 2-D positions are any `cape.build` encoding.

Stem: a 4 x 4 convolution of stride 4 and a 3 x 3 one of stride 2 (GroupNorm, ReLU): a feature
map of stride 8 for DETR's ResNet of stride 32. Encoder: DETR's layers (pre-norm by default,
its `pre_norm` option), the positions added to the queries and keys of every self-attention,
not to the values (DETR's `with_pos_embed`); `input_positions` also adds them once to the
encoder's input (DETR's "at input" placement, its Table 3). Measured on the quick preset (1200
steps, one seed, AP at 64 px): Sine-2D 14.5 in attention only, 25.4 with the input too; MLP
26.8 and 23.0. Decoder: learned object queries (`query_pos`, added to the queries and keys of the
self-attention and to the queries of the cross-attention) over a target that starts at 0; the
memory's keys take the positions too. Heads after every decoder layer (with the decoder's final
norm: DETR's auxiliary outputs): classes (C + "no object") and boxes (cx, cy, w, h) in [0, 1].

A row's encoding goes where its kind says (`cape.models.plan`): an absolute one (sine-2d,
embed-2d, lff, cape2d) is computed once per forward and added as above; rotary2d rotates the
queries and keys of every encoder self-attention instead (it acts inside attention, relative to
the keys: nothing is added, and the decoder's cross-attention has no positions to relate its
queries to). CAPE's augmentation is drawn once per forward per image (the positions are given
per image in training), by the absolute encoding itself or, for rotary, by the plan for every
layer. `cape.models.without_positions` takes either out (the model then adds nothing).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cape.lab.experiments.detection.config import (
    DetectionConfig,
    RowConfig,
    position_options,
    position_unit,
)
from cape.models.attention import MultiheadAttention
from cape.models.plan import PositionPlan, position_plan

__all__ = ["DetrAttention", "Detr", "make_model", "grid_positions"]


def grid_positions(
    height: int, width: int, *, normalize: bool, index: bool, device: torch.device | None = None
) -> torch.Tensor:
    """The (x, y) of an H x W feature map's cells, row-major -> [1, H*W, 2]: integer (column,
    row) indices with `index` (int64: a learned table's rows), else float32 cells counted from
    the top-left corner, or their centres divided by the grid ((j + 0.5) / W, (i + 0.5) / H) in
    (0, 1) with `normalize`."""
    i, j = torch.meshgrid(
        torch.arange(height, device=device), torch.arange(width, device=device), indexing="ij"
    )
    cells = torch.stack([j, i], -1).reshape(1, height * width, 2)
    if index:
        return cells
    cells = cells.to(torch.float32)
    if normalize:
        return (cells + 0.5) / torch.tensor([width, height], device=device, dtype=torch.float32)
    return cells


class DetrAttention(MultiheadAttention):
    """Attention whose queries, keys and values come from three inputs (DETR adds positions to
    the queries and keys only); the q/k slot (`rotary`) rotates queries and keys by their
    positions when it holds an encoding."""

    def attend(
        self,
        q_in: torch.Tensor,
        k_in: torch.Tensor,
        v_in: torch.Tensor,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q_in: [B, Tq, D], k_in, v_in: [B, Tk, D] -> [B, Tq, D]. positions: [B or 1, T, 2]
        for the q/k slot (self-attention: Tq = Tk), already augmented."""
        b, tq, _ = q_in.shape
        tk = k_in.shape[1]
        h, d = self.heads, self.head_dim
        q = self.q_proj(q_in).view(b, tq, h, d).transpose(1, 2)
        k = self.k_proj(k_in).view(b, tk, h, d).transpose(1, 2)
        v = self.v_proj(v_in).view(b, tk, h, d).transpose(1, 2)
        if self.rotary is not None and positions is not None:
            q, k = self.rotary(q, k, positions=positions.expand(b, -1, -1))
        p = self.dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        return self.out_proj(out.transpose(1, 2).reshape(b, tq, self.dim))


class _FFN(nn.Module):
    def __init__(self, dim: int, ffn_dim: int, dropout: float) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim, ffn_dim), nn.ReLU(), nn.Dropout(dropout), nn.Linear(ffn_dim, dim)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _plus(x: torch.Tensor, pos: torch.Tensor | None) -> torch.Tensor:
    return x if pos is None else x + pos


class _Residual(nn.Module):
    """x + dropout(f(x)) with a LayerNorm after (DETR's default) or before f (its `pre_norm`)."""

    def __init__(self, dim: int, dropout: float, pre_norm: bool) -> None:
        super().__init__()
        self.norm, self.drop, self.pre_norm = nn.LayerNorm(dim), nn.Dropout(dropout), pre_norm

    def forward(self, x: torch.Tensor, f: Any) -> torch.Tensor:
        if self.pre_norm:
            return x + self.drop(f(self.norm(x)))
        return self.norm(x + self.drop(f(x)))


class EncoderLayer(nn.Module):
    """DETR's encoder layer: self-attention with q = k = x + pos, v = x; FFN."""

    def __init__(
        self, dim: int, heads: int, ffn_dim: int, dropout: float, rotary: Any, pre_norm: bool
    ) -> None:
        super().__init__()
        self.attn = DetrAttention(dim, heads, dropout=dropout, rotary=rotary)
        self.ffn = _FFN(dim, ffn_dim, dropout)
        self.res = nn.ModuleList(_Residual(dim, dropout, pre_norm) for _ in range(2))

    def forward(
        self, x: torch.Tensor, pos: torch.Tensor | None, rot: torch.Tensor | None
    ) -> torch.Tensor:
        def attend(y: torch.Tensor) -> torch.Tensor:
            qk = _plus(y, pos)
            return self.attn.attend(qk, qk, y, rot)

        return self.res[1](self.res[0](x, attend), self.ffn)


class DecoderLayer(nn.Module):
    """DETR's decoder layer: self-attention of the targets (q = k = t + query_pos),
    cross-attention (q = t + query_pos, k = memory + pos, v = memory), FFN."""

    def __init__(self, dim: int, heads: int, ffn_dim: int, dropout: float, pre_norm: bool) -> None:
        super().__init__()
        self.self_attn = DetrAttention(dim, heads, dropout=dropout)
        self.cross_attn = DetrAttention(dim, heads, dropout=dropout)
        self.ffn = _FFN(dim, ffn_dim, dropout)
        self.res = nn.ModuleList(_Residual(dim, dropout, pre_norm) for _ in range(3))

    def forward(
        self,
        t: torch.Tensor,
        query_pos: torch.Tensor,
        memory: torch.Tensor,
        pos: torch.Tensor | None,
    ) -> torch.Tensor:
        keys = _plus(memory, pos)

        def self_attend(y: torch.Tensor) -> torch.Tensor:
            qk = y + query_pos
            return self.self_attn.attend(qk, qk, y)

        def cross_attend(y: torch.Tensor) -> torch.Tensor:
            return self.cross_attn.attend(y + query_pos, keys, memory)

        t = self.res[1](self.res[0](t, self_attend), cross_attend)
        return self.res[2](t, self.ffn)


def _stem(dim: int) -> nn.Sequential:
    """A 4 x 4 convolution of stride 4 (patches), then a 3 x 3 one of stride 2:
    [B, 3, S, S] -> [B, dim, S/8, S/8]; each cell sees 12 x 12 px."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 4, 4), nn.GroupNorm(8, 32), nn.ReLU(),
        nn.Conv2d(32, dim, 3, 2, 1), nn.GroupNorm(8, dim),
    )  # fmt: skip


class Detr(nn.Module):
    """DETR with a position plan (module docstring).

    plan: the `cape.models.plan` of the row's encoding. pre_norm: LayerNorm before each
    sub-layer (and after the encoder), DETR's `pre_norm` option; else after (its default).
    input_positions: an absolute encoding is also added once to the encoder's input (DETR's
    "at input" placement, its Table 3), so that the values carry the positions too. unit: the
    factor of the positions for the encoding (`config.position_unit`). normalize: positions in
    (0, 1) per image. classes: C.
    forward(images [B, 3, S, S], S a multiple of 8) -> per decoder layer (logits
    [B, Q, C + 1], boxes [B, Q, 4] (cx, cy, w, h) in [0, 1]), the last layer last."""

    def __init__(
        self,
        plan: PositionPlan,
        *,
        classes: int,
        dim: int,
        heads: int,
        enc_layers: int,
        dec_layers: int,
        ffn_dim: int,
        queries: int,
        dropout: float = 0.0,
        pre_norm: bool = False,
        input_positions: bool = False,
        unit: float = 1.0,
        normalize: bool = False,
    ) -> None:
        super().__init__()
        self.plan, self.unit, self.normalize = plan, unit, normalize
        self.input_positions = input_positions
        self.position = plan.absolute
        self.index = plan.units == "index"
        self.stem = _stem(dim)
        self.encoder = nn.ModuleList(
            EncoderLayer(dim, heads, ffn_dim, dropout, plan.layer(), pre_norm)
            for _ in range(enc_layers)
        )
        self.enc_norm = nn.LayerNorm(dim) if pre_norm else nn.Identity()
        self.decoder = nn.ModuleList(
            DecoderLayer(dim, heads, ffn_dim, dropout, pre_norm) for _ in range(dec_layers)
        )
        self.dec_norm = nn.LayerNorm(dim)
        self.query_pos = nn.Parameter(torch.randn(queries, dim))
        self.class_head = nn.Linear(dim, classes + 1)
        self.box_head = nn.Sequential(
            nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, 4)
        )

    def positions(self, height: int, width: int, batch: int, device: torch.device) -> torch.Tensor:
        """What the row's encoding reads for an H x W map: [B, H*W, 2] (one per image, so that
        an augmentation draws per image)."""
        pos = grid_positions(height, width, normalize=self.normalize, index=self.index,
                             device=device)  # fmt: skip
        if not self.index and self.unit != 1.0:
            pos = pos * self.unit
        return pos.expand(batch, -1, -1)

    def encode(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """images [B, 3, S, S] -> (memory [B, T, D], the added positions [B, T, D] or None)."""
        feats = self.stem(images)
        b, _, h, w = feats.shape
        x = feats.flatten(2).transpose(1, 2)  # [B, H*W, D]
        pos = rot = None
        if self.position is not None or self.plan.in_attention:
            where = self.positions(h, w, b, x.device)
            if self.position is not None:
                pos = self.position(positions=where).to(x.dtype)
            else:
                rot = self.plan.layer_positions(
                    where.float(), None, (b, h * w), x.device, self.training, None
                )
        if pos is not None and self.input_positions:
            x = x + pos
        for layer in self.encoder:
            x = layer(x, pos, rot)
        return self.enc_norm(x), pos

    def forward(self, images: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        memory, pos = self.encode(images)
        b = memory.shape[0]
        query_pos = self.query_pos[None].expand(b, -1, -1)
        t = torch.zeros_like(query_pos)
        out = []
        for layer in self.decoder:
            t = layer(t, query_pos, memory, pos)
            y = self.dec_norm(t)
            out.append((self.class_head(y), self.box_head(y).sigmoid()))
        return out


def make_model(cfg: DetectionConfig, row: RowConfig, classes: int) -> Detr:
    """The row's untrained DETR."""
    m = cfg.model
    name = None if row.position == "nopos" else row.position
    options = None if name is None else position_options(row, m, cfg.data)
    plan = position_plan(name, dim=m.dim, heads=m.heads, options=options)
    return Detr(
        plan,
        classes=classes,
        dim=m.dim,
        heads=m.heads,
        enc_layers=m.enc_layers,
        dec_layers=m.dec_layers,
        ffn_dim=m.ffn_dim,
        queries=m.queries,
        dropout=m.dropout,
        pre_norm=m.pre_norm,
        input_positions=m.input_positions,
        unit=position_unit(row, cfg.data),
        normalize=cfg.data.normalize,
    )
