"""What every timm install checks before it changes a model (the model, its options), and the
patch grid a forward reads: a symbolic size under torch.export stays symbolic, so that an
exported model serves every image size."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..._checks import check_int
from ...build import encoding_options

__all__ = ["VIT", "check_model", "check_fit_grid", "with_grid", "patch_grid"]

VIT = "a timm VisionTransformer (timm.create_model('vit_...'))"


def check_model(model: object, needs: tuple[str, ...]) -> nn.Module:
    """model must be an nn.Module with the attributes `needs` (timm's ViT has them); anything
    else is refused by name (a state_dict, a model name, a config...)."""
    if not isinstance(model, nn.Module):
        hint = ""
        if isinstance(model, Mapping):
            hint = " (a state_dict? create the model, then load it into the model)"
        elif isinstance(model, str):
            hint = " (a name? create the model with timm.create_model first)"
        raise TypeError(f"model must be {VIT}, got {type(model).__name__}{hint}")
    missing = [name for name in needs if not hasattr(model, name)]
    if missing:
        raise TypeError(f"model must be {VIT}; {type(model).__name__} has no {missing}")
    return model


def check_fit_grid(model: nn.Module, fit_grid: object) -> tuple[int, int] | None:
    """fit_grid: True (the model's training grid, `patch_embed.grid_size`), a pair (H, W) of
    ints >= 1, or None / False -> (H, W) or None."""
    if fit_grid is None or fit_grid is False:
        return None
    if fit_grid is True:
        grid = getattr(model.patch_embed, "grid_size", None)
        if grid is None:  # timm's img_size=None: no training grid
            raise ValueError("fit_grid=True needs model.patch_embed.grid_size; give (H, W)")
        height, width = (int(n) for n in grid)
        return height, width
    if not isinstance(fit_grid, (tuple, list)) or len(fit_grid) != 2:
        raise TypeError(
            f"fit_grid must be True, False, None or a pair (H, W) of ints >= 1, got {fit_grid!r}"
        )
    return check_int("fit_grid[0]", fit_grid[0]), check_int("fit_grid[1]", fit_grid[1])


def with_grid(name: str, options: dict[str, Any], grid: tuple | None) -> dict[str, Any]:
    """options plus fit_grid=grid where the encoding `name` takes it and it was not given."""
    if grid is not None and "fit_grid" in encoding_options(name):
        return {"fit_grid": grid, **options}
    return dict(options)


def patch_grid(patch_embed: nn.Module, images: torch.Tensor, out: torch.Tensor) -> tuple:
    """The (H', W') patch grid of patch_embed's output: [B, H', W', D] (timm's
    `dynamic_img_size`) or [B, H'W', D] on the grid of the images' size. The sizes are read from
    the shapes as they are (never int()), so that a traced size stays symbolic."""
    if isinstance(out, torch.fx.Proxy):  # shapes are proxies: the grid cannot be computed
        raise TypeError(
            "torch.fx symbolic tracing (timm's create_feature_extractor) cannot trace cape's "
            "positions; use model.forward_intermediates, torch.export or torch.compile"
        )
    if out.dim() == 4:  # NHWC
        return out.shape[1], out.shape[2]
    if hasattr(patch_embed, "dynamic_feat_size") and images.dim() == 4:
        height, width = patch_embed.dynamic_feat_size(tuple(images.shape[-2:]))
    else:
        height, width = patch_embed.grid_size
    if out.dim() != 3 or out.shape[1] != height * width:
        raise ValueError(
            f"patch_embed's output must be [B, H', W', D] or [B, H'W', D] with (H', W') = "
            f"{(height, width)} for images {tuple(images.shape)}, got {tuple(out.shape)}"
        )
    return height, width
