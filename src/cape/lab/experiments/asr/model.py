"""The speech experiment's model: a row's CTC model (`make_model`) and the CTC loss."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from cape.lab.data.speech.specaugment import MaskSettings, SpecAugment
from cape.lab.data.speech.synth import MAX_TRAIN_SECONDS
from cape.lab.data.speech.tokens import VOCAB_SIZE
from cape.lab.experiments.asr.config import AsrConfig, FeatureConfig, RowConfig
from cape.lab.experiments.recipes import length_recipe
from cape.lab.experiments.train_as import trained_row
from cape.models.asr import CTCModel

__all__ = ["make_model", "ctc_loss_fn"]


def make_model(cfg: AsrConfig, row: RowConfig, *, evaluation: bool = False) -> CTCModel:
    """The row's model (that of the row named by its `train_as`); with `evaluation`, its
    encoding takes the row's `eval_options` too."""
    m, trained = cfg.model, trained_row(cfg.rows, row)
    options = {**trained.options, **row.eval_options} if evaluation else dict(trained.options)
    # FIRE's threshold and xPos's scale base by their recipe from the longest training
    # utterance (seconds, the positions' unit), not the authors' 512 tokens as frames
    options = length_recipe(row.position, options, train_length=MAX_TRAIN_SECONDS)
    return CTCModel(
        VOCAB_SIZE,
        n_mels=cfg.features.n_mels,
        position=row.position,
        position_options=options,
        relative_layers=row.relative_layers,
        **dataclasses.asdict(m),  # the encoder's sizes, strides and dropouts
    )


def ctc_loss_fn(features: FeatureConfig, row: RowConfig):
    """loss_fn(model, batch) -> (CTC loss, {}) for the engine. SpecAugment (when the row has
    it) draws from the global torch RNG; padding-free batches feed each kept frame's original
    time (`frame_times`), padded ones the 10 ms hop."""
    augment = SpecAugment(MaskSettings.of(features)) if row.specaugment else None
    free = row.batching == "padding-free"

    def loss_fn(model: torch.nn.Module, batch: dict[str, torch.Tensor]):
        feats, lengths = batch["features"], batch["lengths"]
        if augment is not None:
            feats = augment(feats, lengths)
        if free:
            log_probs, out_lengths = model(feats, lengths, frame_times=batch["frame_times"])
        else:
            log_probs, out_lengths = model(feats, lengths, hop=batch["hop"])
        loss = F.ctc_loss(
            log_probs.transpose(0, 1),
            batch["targets"],
            out_lengths,
            batch["target_lengths"],
            blank=0,
            reduction="mean",
            zero_infinity=True,
        )
        return loss, {}

    return loss_fn
