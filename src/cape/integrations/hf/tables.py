"""cape's absolute encodings in place of transformers' learned position tables.

Three layouts, found by the attribute that holds them:

- BERT-style `embeddings.position_embeddings` (BERT, RoBERTa, DistilBERT...): nn.Embedding
  [P, D] indexed by `position_ids` [B or 1, T], read from a buffer of P ids;
- GPT-2's `wpe`: the same, indexed by `position_ids` counted from the cache length;
- OPT's `embed_positions`: called with the attention mask (positions = cumsum(mask) - 1, then an
  offset of 2 into its table).

`PositionEmbedding` / `OPTPositionEmbedding` take their place. Their `state_dict` holds the
table that a stock model would need to compute the same in eval mode (the encoding at the
integer positions of its rows), so a stock `from_pretrained` of a saved model gives the same
eval logits, never a random table; the encoding's own parameters (a learned cape table, LFF)
sit beside it. What a stock load cannot carry (the training-time augmentation, continuous
positions beyond the table) is named by a warning when the state is saved.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

__all__ = ["PositionEmbedding", "OPTPositionEmbedding", "TABLES", "check_encoding"]

# attribute -> layout: where transformers' models keep a learned position table
TABLES = {"position_embeddings": "bert", "wpe": "gpt2", "embed_positions": "opt"}
OPT_OFFSET = 2  # OPT's table rows 0 and 1 precede position 0


def check_encoding(encoding: object) -> nn.Module:
    """A 1-D cape absolute encoding whose augmentation does not mean-normalise (transformers
    gives a position table no attention_mask: the mean would count padding)."""
    if getattr(encoding, "kind", None) != "absolute" or getattr(encoding, "pos_dim", 0) != 1:
        raise ValueError(
            "encoding must be a 1-D cape absolute encoding (cape.build('sinpos' | 'cape1d' | "
            f"'abspos' | 'lff', dim)), got {type(encoding).__name__}"
        )
    aug = getattr(encoding, "augmentation", None)
    if aug is not None and aug.normalize:
        raise ValueError(
            "encoding: normalize=True would count padding (transformers gives the position "
            "table no attention_mask); use an augmentation with normalize=False"
        )
    assert isinstance(encoding, nn.Module)
    return encoding


class PositionEmbedding(nn.Module):
    """A BERT- or GPT-2-style position table's replacement: forward(position_ids [B or 1, T]) ->
    [B or 1, T, D] from a 1-D cape absolute encoding (`cape.build("sinpos" or "cape1d" ..., D)`),
    in the dtype the module was moved to (float32 by default).

    rows: the size of the table it replaces (its `state_dict` then holds that table: module
    docstring; None: no table in the state). Continuous encodings read any position, so inputs
    longer than the table work (BERT also needs its position_ids buffer longer:
    `install_positions(max_length=)`). In train mode the encoding's own augmentation draws per
    row of position_ids.
    """

    offset = 0  # the table row of position 0

    def __init__(self, encoding: nn.Module, rows: int | None = None) -> None:
        super().__init__()
        self.encoding = check_encoding(encoding)
        self.embedding_dim = int(encoding.dim)  # type: ignore[attr-defined]
        self.rows = None if rows is None else int(rows)
        self.register_buffer("_dtype", torch.empty(0), persistent=False)  # follows .to()
        self._register_state_dict_hook(_with_table)
        self._register_load_state_dict_pre_hook(_drop_table)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        """position_ids: [B or 1, T] integer or float -> [B or 1, T, D]."""
        if not isinstance(position_ids, torch.Tensor) or position_ids.dim() != 2:
            shape = getattr(position_ids, "shape", type(position_ids).__name__)
            raise ValueError(f"position_ids must be a tensor [B, T], got {shape}")
        pos = position_ids.to(torch.float32)[..., None]  # [B, T, 1]
        return self.encoding(positions=pos).to(self._dtype.dtype)

    def table(self) -> torch.Tensor:
        """The table a stock model needs for the same eval outputs: [rows, D], row r the
        encoding (eval mode) at position r - offset; rows before position 0 are zero."""
        assert self.rows is not None
        was = self.encoding.training
        self.encoding.eval()
        try:
            with torch.no_grad():
                ids = torch.arange(self.rows - self.offset, dtype=torch.float32)
                ids = ids.to(self._dtype.device)[None, :, None]
                rows = self.encoding(positions=ids)[0].to(self._dtype.dtype)
        finally:
            self.encoding.train(was)
        pad = rows.new_zeros(self.offset, rows.shape[-1])
        return torch.cat([pad, rows], dim=0)

    def lost_on_a_stock_load(self) -> list[str]:
        """What a stock load of the saved table cannot carry (module docstring)."""
        lost = []
        if getattr(self.encoding, "augmentation", None) is not None:
            lost.append(f"the encoding's training-time augmentation {self.encoding.augmentation}")
        if getattr(self.encoding, "build_spec", None) is None:
            lost.append("the encoding itself (not made by cape.build: cape cannot make it again)")
        return lost


class OPTPositionEmbedding(PositionEmbedding):
    """OPT's `embed_positions` replacement: forward(attention_mask [B, T'], cache_length=0,
    position_ids=None) -> [B, T, D], positions counted over the real tokens from 0 (OPT's
    cumsum(mask) - 1), the last T = T' - cache_length of them; 0 at padding."""

    offset = OPT_OFFSET

    def forward(  # type: ignore[override]
        self,
        attention_mask: torch.Tensor,
        cache_length: int = 0,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if position_ids is None:
            mask = attention_mask.to(torch.long)
            position_ids = (torch.cumsum(mask, dim=1) * mask - 1)[:, int(cache_length) :]
            real = attention_mask[:, int(cache_length) :] != 0
        else:
            real = position_ids >= 0
        out = super().forward(position_ids.clamp(min=0))
        return out * real[..., None].to(out.dtype)


def _with_table(module: PositionEmbedding, state: dict, prefix: str, local: Any) -> None:
    """state_dict hook: add the stock table (`PositionEmbedding.table`) as `weight`, and warn
    naming what a stock load of it would not carry."""
    if module.rows is None:
        return
    state[prefix + "weight"] = module.table()
    lost = module.lost_on_a_stock_load()
    if lost:
        warnings.warn(
            f"cape: a stock transformers from_pretrained of this state gets the eval-mode table "
            f"{prefix}weight only; it loses {'; '.join(lost)}. "
            "cape.integrations.hf.from_pretrained makes the cape encoding again",
            stacklevel=2,
        )


def _drop_table(state: dict, prefix: str, *args: Any) -> None:
    """load_state_dict pre-hook: the stock table is what the encoding computes: not loaded."""
    state.pop(prefix + "weight", None)
