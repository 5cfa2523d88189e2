"""Packed batches for `ViT`: images of different native sizes in one batch, no resizing.

Continuous positions make this possible (CAPE: a "UniViT" over native sizes): every image's
patches get the positions of its own grid, tokens are padded to the longest image and a mask
[B, 1 + T_max] (True = real token, the class token first) keeps the padding out of attention.

- sinpos2d / cape2d / lff / rotary2d: `grid_positions` of the image's own grid in
  [-extent, extent] (so a 2x2 grid and a 3x4 grid both span the same square).
- abspos2d: the learned table resampled to the image's grid (as `AbsPos2d` does for a batch).
- sine-2d / embed-2d: the image's integer (column, row) indices.

The encodings are called once on the padded batch [B, T_max, 2] with the mask, so CAPE's
training draws (global shift [B, M], scale [B], local shift [T_max, B, M], see `cape.augment`)
come in the same order as for an ordinary batch: for a list of same-size images the draws, and
the output, equal `ViT.forward` of the stacked batch with the same generator. CAPE2d's
`max_local_shift="auto"` (emax = extent/N per axis) uses each image's own N: a per-sample
emax [B, 2], so every image is jittered by the same fraction of its own patch spacing as when
it is encoded alone. The patch embedding runs once per distinct size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ..augment import Augmentation, augment_positions
from ..positions import grid_indices, grid_positions

if TYPE_CHECKING:
    from .vit import ViT

__all__ = ["check_packed", "embed_packed"]

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
        height, width = img.shape[-2:]
        if height % patch or width % patch:
            raise ValueError(
                f"images[{i}] size {height}x{width} is not a multiple of patch={patch}"
            )
        grids.append((height // patch, width // patch))
    return grids


class _PerSampleLocalShift:
    """`Augmentation` with emax per sample [B, M] (each image's own grid); `Augmentation`
    itself holds float amounts only, `augment_positions` takes tensors."""

    def __init__(self, base: Augmentation, max_local_shift: torch.Tensor) -> None:
        self.base, self.max_local_shift = base, max_local_shift

    def __call__(
        self, positions: torch.Tensor, mask: torch.Tensor | None = None, *,
        training: bool = True, generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        return augment_positions(
            positions, mask, max_global_shift=self.base.max_global_shift,
            max_local_shift=self.max_local_shift,
            max_global_scaling=self.base.max_global_scaling, normalize=self.base.normalize,
            training=training, generator=generator,
        )


def _padded(tables: dict[Grid, torch.Tensor], grids: list[Grid], t_max: int) -> torch.Tensor:
    """One [T_g, ...] table per distinct grid -> [B, T_max, ...] in list order, 0 at padding."""
    sizes = list(tables)
    stacked = torch.stack([
        F.pad(t, (0, 0) * (t.dim() - 1) + (0, t_max - t.shape[0])) for t in tables.values()
    ])
    ids = torch.tensor([sizes.index(g) for g in grids], device=stacked.device)
    return stacked[ids]


def _grid_positions(grids: list[Grid], t_max: int, extent: float, device: torch.device) -> torch.Tensor:
    tables = {g: grid_positions(*g, extent=extent, device=device) for g in dict.fromkeys(grids)}
    return _padded(tables, grids, t_max)


def _patch_positions(
    vit: ViT, x: torch.Tensor, grids: list[Grid], mask: torch.Tensor | None,
    extent: float | None, generator: torch.Generator | None,
) -> torch.Tensor | None:
    """The additive positions [B, T_max, D] of the padded patches x (0 at padding), or None."""
    name, pos = vit.position_name, vit.position
    if pos is None or name == "abspos2d":  # abspos2d is added per size group
        return None
    batch, t_max = x.shape[:2]
    if name in ("sinpos2d", "cape2d"):
        ext = pos.extent if extent is None else extent
        p = _grid_positions(grids, t_max, ext, x.device)
        aug = None
        if pos.auto_local and pos.augmentation is not None:
            # emax = extent / N per axis (x, y) with each image's own N (its grid spacing)
            emax = torch.tensor([(ext / w, ext / h) for h, w in grids], device=x.device)
            aug = _PerSampleLocalShift(pos.augmentation, emax)
        return pos.encode(p, mask, generator, dtype=x.dtype, augmentation=aug, validate=False)
    if name == "lff":
        p = _grid_positions(grids, t_max, 1.0 if extent is None else extent, x.device)
    else:  # sine-2d, embed-2d: integer (column, row) indices
        tables = {g: grid_indices(*g, device=x.device) for g in dict.fromkeys(grids)}
        p = _padded(tables, grids, t_max)
        if name == "sine-2d":
            p = p.to(torch.float32)
    return pos(x, positions=p, mask=mask, generator=generator)


def embed_packed(
    vit: ViT, images: list[torch.Tensor], *, extent: float | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """See `ViT.embed_packed`: -> (tokens [B, 1 + T_max, D], mask [B, 1 + T_max] bool,
    rotary positions [B, 1 + T_max, 2] or None)."""
    grids = check_packed(images, vit.channels, vit.patch)
    extent = vit._check_extent(extent)
    batch, device = len(images), images[0].device
    lengths = [h * w for h, w in grids]
    t_max = max(lengths)
    groups: dict[Grid, list[int]] = {}
    for i, g in enumerate(grids):
        groups.setdefault(g, []).append(i)

    chunks, order = [], []
    for idx in groups.values():  # one convolution per distinct size
        patches = vit.patch_embed(torch.stack([images[i] for i in idx])).permute(0, 2, 3, 1)
        tokens = patches.flatten(1, 2)
        if vit.position_name == "abspos2d":
            tokens = tokens + vit.position(patches).flatten(1, 2)
        chunks.append(F.pad(tokens, (0, 0, 0, t_max - tokens.shape[1])))
        order.extend(idx)
    x = torch.cat(chunks)
    if order != list(range(batch)):
        inverse = torch.empty(batch, dtype=torch.long)
        inverse[order] = torch.arange(batch)
        x = x[inverse.to(device)]

    real = torch.tensor(lengths, device=device)[:, None] > torch.arange(t_max, device=device)
    # no padding (one size): no mask, so the encodings compute exactly what `forward` does
    patch_mask = real if len(groups) > 1 else None
    pe = _patch_positions(vit, x, grids, patch_mask, extent, generator)
    if pe is not None:
        x = x + pe
    cls = (vit.cls_token + vit.cls_position).to(x.dtype)
    x = torch.cat([cls[None, None].expand(batch, 1, -1), x], dim=1)
    mask = torch.cat([real.new_ones(batch, 1), real], dim=1)
    rotary_positions = None
    if vit.position_name == "rotary2d":
        p = _grid_positions(grids, t_max, 1.0 if extent is None else extent, device)
        rotary_positions = torch.cat([p.new_zeros(batch, 1, 2), p], dim=1)  # class at (0, 0)
    return vit.dropout(x), mask, rotary_positions
