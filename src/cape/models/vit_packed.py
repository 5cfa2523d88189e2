"""Packed batches for `ViT`: images of different native sizes in one batch, no resizing.

Continuous positions make this possible (CAPE: a "UniViT" over native sizes): every image's
patches get the positions of its own grid, tokens are padded to the longest image and a mask
[B, 1 + T_max] (True = real token, the class token first) keeps the padding out of attention.

- sinpos2d / cape2d / lff / rotary2d: `grid_positions` of the image's own grid in
  [-extent, extent] (so a 2x2 grid and a 3x4 grid both span the same square).
- abspos2d: the learned table sampled bicubically at the image's cell centres (as the resampled
  table of a batch of that size, up to float rounding).
- sine-2d / embed-2d: the image's integer (column, row) indices.

Each encoding says which (`grid_positions`); it is called once on the padded batch
[B, T_max, M] with the mask and each image's grid (`grid=[(H_i, W_i), ...]`), so CAPE's
training draws (global shift [B, M], scale [B], local shift [T_max, B, M], see `cape.augment`)
come in the same order as for an ordinary batch: for a list of same-size images the draws, and
the output, equal `ViT.forward` of the stacked batch with the same generator. CAPE2d's
`max_local_shift="auto"` (emax = extent/N per axis) uses each image's own N: a per-sample
emax [B, 2], so every image is jittered by the same fraction of its own patch spacing as when
it is encoded alone. The patch embedding runs once per distinct size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["check_packed", "pack_patches", "packed_positions"]

Grid = tuple[int, int]


def check_packed(images: object, channels: int, patch: int) -> list[Grid]:
    """A non-empty list of [C, H_i, W_i] tensors (one dtype and device) -> patch grids."""
    if not isinstance(images, (list, tuple)):
        raise TypeError(f"images must be a list of [C, H, W] tensors, got {type(images).__name__}")
    if not images:
        raise ValueError("images must be a non-empty list of [C, H, W] tensors")
    first = images[0]
    grids = []
    for i, img in enumerate(images):
        if not isinstance(img, torch.Tensor) or img.dim() != 3:
            got = tuple(img.shape) if isinstance(img, torch.Tensor) else type(img).__name__
            raise ValueError(f"images[{i}] must be a tensor [C, H, W], got {got}")
        if img.shape[0] != channels:
            raise ValueError(f"images[{i}] must have {channels} channels, got {tuple(img.shape)}")
        if img.dtype != first.dtype or img.device != first.device:
            raise ValueError(
                f"images[{i}] is {img.dtype} on {img.device}, images[0] is "
                f"{first.dtype} on {first.device}: all images must share dtype and device"
            )
        if not img.is_floating_point():
            raise TypeError(f"images[{i}] must be a floating-point tensor, got {img.dtype}")
        height, width = img.shape[-2:]
        if height % patch or width % patch or not height * width:
            raise ValueError(
                f"images[{i}] size {height}x{width} is not a positive multiple of patch={patch}"
            )
        grids.append((height // patch, width // patch))
    return grids


def _padded(tables: dict[Grid, torch.Tensor], grids: list[Grid], t_max: int) -> torch.Tensor:
    """One [T_g, ...] table per distinct grid -> [B, T_max, ...] in list order, 0 at padding."""
    sizes = list(tables)
    stacked = torch.stack(
        [F.pad(t, (0, 0) * (t.dim() - 1) + (0, t_max - t.shape[0])) for t in tables.values()]
    )
    ids = torch.tensor([sizes.index(g) for g in grids], device=stacked.device)
    return stacked[ids]


def packed_positions(
    encoding: nn.Module,
    grids: list[Grid],
    t_max: int,
    *,
    extent: float | None,
    device: torch.device,
) -> torch.Tensor:
    """Each image's `encoding.grid_positions(H_i, W_i)`, padded -> [B, T_max, M] (0 at padding)."""
    tables = {
        g: encoding.grid_positions(*g, extent=extent, device=device)[0]
        for g in dict.fromkeys(grids)
    }
    return _padded(tables, grids, t_max)


def pack_patches(
    images: list[torch.Tensor], grids: list[Grid], patch_embed: nn.Module
) -> tuple[torch.Tensor, torch.Tensor]:
    """images [C, H_i, W_i] -> (patch tokens [B, T_max, D] row-major, 0 at padding; real
    [B, T_max] bool, True at an image's own patches). One convolution per distinct size."""
    batch, device = len(images), images[0].device
    lengths = [h * w for h, w in grids]
    t_max = max(lengths)
    groups: dict[Grid, list[int]] = {}
    for i, g in enumerate(grids):
        groups.setdefault(g, []).append(i)
    chunks, order = [], []
    for idx in groups.values():
        patches = patch_embed(torch.stack([images[i] for i in idx])).permute(0, 2, 3, 1)
        tokens = patches.flatten(1, 2)
        chunks.append(F.pad(tokens, (0, 0, 0, t_max - tokens.shape[1])))
        order.extend(idx)
    x = torch.cat(chunks)
    if order != list(range(batch)):
        inverse = torch.empty(batch, dtype=torch.long)
        inverse[order] = torch.arange(batch)
        x = x[inverse.to(device)]
    real = torch.tensor(lengths, device=device)[:, None] > torch.arange(t_max, device=device)
    return x, real
