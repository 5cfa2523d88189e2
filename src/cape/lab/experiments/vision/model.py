"""The vision experiment's model: a row's ViT (`make_model`) and the classification loss."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F

from cape.lab.experiments.vision.config import RowConfig, VisionConfig
from cape.models.vit import ViT

__all__ = ["make_model", "classify_loss"]


def make_model(cfg: VisionConfig, row: RowConfig, num_classes: int) -> ViT:
    m = row.model_config(cfg.model)
    return ViT(
        num_classes,
        image_size=row.train_size,
        position=row.position,
        position_options=dict(row.options),
        **dataclasses.asdict(m),  # patch, dim, depth, heads, mlp_ratio, dropout
    )


def classify_loss(sizes: list[int], packed: bool = False):
    """loss_fn(model, (images [B, 3, S, S], labels [B])) -> (cross-entropy, {"acc"}).

    With `sizes` (UniViT) each batch is resized to one size drawn from them, or with `packed`
    each image to its own size and the batch packed with padding masks. Draws use the global
    torch RNG (checkpointed by the engine, different on every rank)."""

    def resize(images: torch.Tensor, s: int) -> torch.Tensor:
        if s == images.shape[-1]:
            return images
        return F.interpolate(images, size=(s, s), mode="bilinear", antialias=True)

    def loss_fn(model: torch.nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        images, labels = batch
        if packed:
            picks = torch.randint(len(sizes), (len(images),)).tolist()
            logits = model(
                [resize(im[None], sizes[k])[0] for im, k in zip(images, picks, strict=True)]
            )
        else:
            if sizes:
                images = resize(images, sizes[int(torch.randint(len(sizes), ()))])
            logits = model(images)
        loss = F.cross_entropy(logits.float(), labels)
        acc = (logits.argmax(-1) == labels).float().mean() * 100
        return loss, {"acc": acc.detach()}

    return loss_fn
