"""A Vision Transformer with any `cape` image encoding (CAPE sec. 5.1, appendix B).

Patch embedding (a strided Conv2d) -> patch positions added (absolute encodings) -> a class
token with its own learned position prepended -> pre-norm Transformer encoder -> final
LayerNorm -> linear head on the class token. Every encoding gets the same learned class-token
position, as in the paper (the grid encodings only know the patches).

Encodings by name (`VIT_POSITIONS`):

- "nopos": nothing added to the patches.
- "abspos2d": a learned (image_size/patch)^2 table, resampled bicubically for other grids.
- "sinpos2d", "cape2d": CAPE's 2D sinusoid over x, y in [-1, 1] (cape2d augments in training;
  `position_options={"preset": "image"}` for the paper's values).
- "lff": learnable Fourier features of the same grid positions (pos_dim=2).
- "sine-2d", "embed-2d": LFF paper baselines over integer (column, row) indices of the patch
  grid; embed-2d's tables cover the training grid, larger grids clamp to its last bins.
- "rotary2d": no additive position; every layer rotates queries and keys by the 2D grid
  positions (`Rotary(head_dim, pos_dim=2)`); the class token sits at (0, 0).

`extent` (CAPE Table 6) rescales the grid positions to [-extent, extent]; it applies to the
continuous encodings only (sinpos2d, cape2d, lff, rotary2d).

`forward_packed` takes a list of images of different native sizes: each gets the positions of
its own grid, the tokens are padded to the longest with a mask (`cape.models.vit_packed`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .._checks import check_float, check_int
from ..build import build
from ..positions import grid_indices, grid_positions
from .transformer import TransformerEncoder
from .vit_packed import embed_packed

__all__ = ["ViT", "VIT_POSITIONS"]

# ViT name -> `cape.build` name
VIT_POSITIONS: dict[str, str] = {
    "nopos": "nopos",
    "abspos2d": "abspos2d",
    "sinpos2d": "sinpos2d",
    "cape2d": "cape2d",
    "lff": "lff",
    "sine-2d": "sine-2d",
    "embed-2d": "embed-2d",
    "rotary2d": "rotary",
}
_CONTINUOUS = ("sinpos2d", "cape2d", "lff", "rotary2d")


def _pair(name: str, value: object) -> tuple[int, int]:
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return check_int(f"{name}[0]", value[0]), check_int(f"{name}[1]", value[1])
    n = check_int(name, value)
    return n, n


class ViT(nn.Module):
    """ViT classifier: `ViT(10, position="cape2d", position_options={"preset": "image"})`.

    num_classes: outputs of the head. image_size: the training size (int or (H, W)); sets the
    grids of the learned tables (abspos2d, embed-2d). patch: patch side (images of any H, W
    that are multiples of it are accepted). dim, depth, heads, mlp_ratio, dropout: the encoder.
    position: one of `VIT_POSITIONS`. position_options: keywords for `cape.build` (for
    rotary2d: for each layer's `Rotary`). channels: input channels.

    forward(images [B, C, H, W], *, extent=None, generator=None) -> logits [B, num_classes].
    forward_packed(images: list of [C, H_i, W_i], *, extent=None, generator=None) -> logits
    [B, num_classes]: images of different native sizes in one padded, masked batch.
    """

    def __init__(
        self,
        num_classes: int,
        *,
        image_size: int | tuple[int, int] = 32,
        patch: int = 4,
        dim: int = 192,
        depth: int = 6,
        heads: int = 3,
        mlp_ratio: float = 4,
        dropout: float = 0.0,
        position: str = "cape2d",
        position_options: dict[str, Any] | None = None,
        channels: int = 3,
    ) -> None:
        super().__init__()
        check_int("num_classes", num_classes)
        self.patch = check_int("patch", patch)
        self.image_size = _pair("image_size", image_size)
        self.channels = check_int("channels", channels)
        check_int("dim", dim)
        check_int("heads", heads)
        check_int("depth", depth)
        if dim % heads:
            raise ValueError(f"dim ({dim}) must be divisible by heads ({heads})")
        if any(s % self.patch for s in self.image_size):
            raise ValueError(
                f"image_size {self.image_size} must be a multiple of patch={self.patch}"
            )
        if not isinstance(position, str) or position.lower() not in VIT_POSITIONS:
            raise ValueError(f"position must be one of {sorted(VIT_POSITIONS)}, got {position!r}")
        self.position_name = position.lower()
        self.grid = (self.image_size[0] // self.patch, self.image_size[1] // self.patch)
        self.dim = dim
        options = dict(position_options or {})

        self.patch_embed = nn.Conv2d(channels, dim, self.patch, stride=self.patch)
        self.cls_token = nn.Parameter(torch.zeros(dim))
        self.cls_position = nn.Parameter(torch.empty(dim))
        nn.init.trunc_normal_(self.cls_position, std=0.02, a=-0.04, b=0.04)
        nn.init.trunc_normal_(self.cls_token, std=0.02, a=-0.04, b=0.04)

        name = self.position_name
        relative_factory = None
        self.position: nn.Module | None = None
        if name == "rotary2d":
            head_dim = dim // heads
            options.setdefault("pos_dim", 2)
            build("rotary", head_dim, **options)  # validate the options once, eagerly

            def relative_factory() -> nn.Module:
                return build("rotary", head_dim, **options)
        elif name == "abspos2d":
            if options.get("cls_token"):
                raise ValueError("abspos2d: the ViT has its own class-token position; drop cls_token")
            options.setdefault("grid", self.grid)
            self.position = build(name, dim, **options)
        elif name == "embed-2d":
            options.setdefault("sizes", (self.grid[1], self.grid[0]))  # (W0, H0): (x, y) order
            self.position = build(name, dim, **options)
        elif name == "lff":
            options.setdefault("pos_dim", 2)
            self.position = build(name, dim, **options)
        elif name != "nopos":
            self.position = build(VIT_POSITIONS[name], dim, **options)

        self.dropout = nn.Dropout(dropout)
        self.encoder = TransformerEncoder(
            depth, dim, heads, int(mlp_ratio * dim), relative_factory=relative_factory,
            dropout=dropout, norm_first=True, final_norm=True,
        )
        self.head = nn.Linear(dim, num_classes)

    # -- pieces --------------------------------------------------------------------------
    def patch_grid(self, images: torch.Tensor) -> tuple[int, int]:
        """Check images [B, C, H, W] -> the patch grid (H/patch, W/patch)."""
        if not isinstance(images, torch.Tensor) or images.dim() != 4:
            shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
            raise ValueError(f"images must be a tensor [B, C, H, W], got {shape}")
        if images.shape[1] != self.channels:
            raise ValueError(f"images must have {self.channels} channels, got {tuple(images.shape)}")
        height, width = images.shape[-2:]
        if height % self.patch or width % self.patch:
            raise ValueError(
                f"image size {height}x{width} is not a multiple of patch={self.patch}"
            )
        return height // self.patch, width // self.patch

    def _check_extent(self, extent: float | None) -> float | None:
        if extent is None:
            return None
        if self.position_name not in _CONTINUOUS:
            raise ValueError(
                f"extent applies to the continuous encodings {list(_CONTINUOUS)}, "
                f"not {self.position_name!r}"
            )
        return check_float("extent", extent, strict=True)

    def patch_positions(
        self, patches: torch.Tensor, *, extent: float | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor | None:
        """patches [B, H', W', D] -> their additive positions [B, H'W', D] (row-major), or None
        for "nopos" and "rotary2d" (nothing added). Augmented in training mode for cape2d/lff."""
        name, pos = self.position_name, self.position
        extent = self._check_extent(extent)
        if pos is None:
            return None
        batch, height, width = patches.shape[:3]
        if name in ("sinpos2d", "cape2d"):
            kw: dict[str, Any] = {"generator": generator}
            if extent is not None:
                kw["extent"] = extent
            return pos(patches, **kw).flatten(1, 2)
        if name == "abspos2d":
            return pos(patches).flatten(1, 2)
        flat = patches.flatten(1, 2)
        if name == "lff":
            ext = 1.0 if extent is None else extent
            p = grid_positions(height, width, extent=ext, batch=batch, device=flat.device)
        else:  # sine-2d, embed-2d: integer (column, row) indices
            p = grid_indices(height, width, batch=batch, device=flat.device)
            if name == "sine-2d":
                p = p.to(torch.float32)
        return pos(flat, positions=p, generator=generator)

    def embed(
        self, images: torch.Tensor, *, extent: float | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """images [B, C, H, W] -> (tokens [B, 1 + H'W', D], rotary positions [B, 1 + H'W', 2] or None).

        Tokens: the class token (+ its learned position) first, then the patches (+ their
        positions) in row-major order.
        """
        height, width = self.patch_grid(images)
        batch = images.shape[0]
        patches = self.patch_embed(images).permute(0, 2, 3, 1)  # [B, H', W', D]
        x = patches.flatten(1, 2)
        pe = self.patch_positions(patches, extent=extent, generator=generator)
        if pe is not None:
            x = x + pe
        cls = (self.cls_token + self.cls_position).to(x.dtype)
        x = torch.cat([cls[None, None].expand(batch, 1, -1), x], dim=1)
        rotary_positions = None
        if self.position_name == "rotary2d":
            ext = 1.0 if extent is None else extent
            grid = grid_positions(height, width, extent=ext, device=x.device)
            grid = torch.cat([grid.new_zeros(1, 2), grid])  # the class token at (0, 0)
            rotary_positions = grid[None].expand(batch, -1, -1)
        return self.dropout(x), rotary_positions

    def forward(
        self, images: torch.Tensor | list[torch.Tensor], *, extent: float | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """images [B, C, H, W] (H, W multiples of patch) -> logits [B, num_classes].

        A list of [C, H_i, W_i] images of different sizes goes to `forward_packed` (so that a
        DistributedDataParallel wrapper sees packed batches too)."""
        if isinstance(images, (list, tuple)):
            return self.forward_packed(list(images), extent=extent, generator=generator)
        x, positions = self.embed(images, extent=extent, generator=generator)
        x = self.encoder(x, positions=positions, generator=generator)
        return self.head(x[:, 0])

    def embed_packed(
        self, images: list[torch.Tensor], *, extent: float | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """A packed batch: images [C, H_i, W_i] of different sizes (multiples of patch) ->
        (tokens [B, 1 + T_max, D], mask [B, 1 + T_max] bool (True = real token; the class
        token first), rotary positions [B, 1 + T_max, 2] or None), T_max = max_i H_i'W_i'.

        Each image's patches get the positions of its own grid; padded tokens are 0 (see
        `cape.models.vit_packed` for the encodings and CAPE2d's per-image local shift).
        """
        return embed_packed(self, images, extent=extent, generator=generator)

    def forward_packed(
        self, images: list[torch.Tensor], *, extent: float | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """images: list of [C, H_i, W_i] (any sizes, multiples of patch) -> logits [B, num_classes].

        In eval mode each row equals `forward` of that image alone (up to float rounding); in
        training, a list of same-size images draws CAPE's augmentation as `forward` of the stack.
        """
        x, mask, positions = self.embed_packed(images, extent=extent, generator=generator)
        one_size = len({tuple(img.shape[-2:]) for img in images}) == 1
        x = self.encoder(
            x, mask=None if one_size else mask, positions=positions, generator=generator
        )
        return self.head(x[:, 0])

    def extra_repr(self) -> str:
        return (
            f"position={self.position_name!r}, image_size={self.image_size}, "
            f"patch={self.patch}, grid={self.grid}"
        )
