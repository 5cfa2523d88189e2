"""The translation experiment's model: a row's encoder-decoder (`make_model`), the training
loss, and a trained model with the row's evaluation options (`with_eval_options`)."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from cape.lab.experiments.recipes import length_recipe
from cape.lab.experiments.train_as import evaluation_model
from cape.lab.experiments.translation.config import RowConfig, TranslationConfig
from cape.models.seq2seq import Seq2Seq

__all__ = ["make_model", "loss_fn", "with_eval_options"]


def make_model(
    cfg: TranslationConfig, row: RowConfig, alpha: float, vocab_size: int, pad_id: int = 0
) -> Seq2Seq:
    """The row's model; `alpha: auto` becomes the training set's ratio (used by augmented
    encodings: Seq2Seq scales the source positions by it). FIRE's threshold and xPos's scale
    base follow their recipe from L = data.max_tokens, the longest training side
    (`length_recipe`)."""
    sizes = dataclasses.asdict(cfg.model)  # the layers, widths and dropout
    del sizes["label_smoothing"]  # the loss's
    options = dict(row.options)
    given = options.pop("alpha", "auto")
    options = length_recipe(row.position, options, train_length=cfg.data.max_tokens)
    return Seq2Seq(
        vocab_size,
        position=row.position,
        position_options=options,
        alpha=float(alpha if given == "auto" else given),
        pad_id=pad_id,
        **sizes,
    )


def loss_fn(label_smoothing: float, pad_id: int):
    """loss_fn(model, batch) -> (label-smoothed cross-entropy per target token, {"nll"}): the
    engine's loss; positions are drawn (CAPE) from the global torch RNG."""

    def fn(model: torch.nn.Module, batch: dict[str, torch.Tensor]):
        logits = model(batch["src"], batch["src_mask"], batch["tgt_in"], batch["tgt_mask"])
        flat, target = logits.flatten(0, 1), batch["tgt_out"].flatten()
        loss = F.cross_entropy(flat, target, ignore_index=pad_id, label_smoothing=label_smoothing)
        with torch.no_grad():
            nll = F.cross_entropy(flat, target, ignore_index=pad_id)
        return loss, {"nll": nll}

    return fn


def with_eval_options(row: RowConfig, model: Seq2Seq) -> Seq2Seq:
    """`model` with the row's `eval_options` over its encoding's options (the same weights)."""
    spec = model.spec

    def make() -> Seq2Seq:
        options = {**spec["position_options"], **row.eval_options}
        return Seq2Seq(**{**spec, "position_options": options})

    return evaluation_model(row, model, make)  # type: ignore[return-value]
