"""A Vision Transformer with any `cape` image encoding (CAPE sec. 5.1, appendix B).

Patch embedding (a strided Conv2d) -> patch positions added (absolute encodings) -> a class
token with its own learned position prepended -> pre-norm Transformer encoder -> final
LayerNorm -> linear head on the class token. Every encoding gets the same learned class-token
position, as in the paper (the grid encodings only know the patches).

Any 2-D encoding of `cape.build` by name, asked for the positions of the patch grid
(`grid_positions`) rather than branched on by name:

- "nopos": nothing added to the patches.
- "abspos2d": a learned (image_size/patch)^2 table, resampled bicubically for other grids.
- "sinpos2d", "cape2d": CAPE's 2D sinusoid over x, y in [-1, 1] (cape2d augments in training;
  `position_options={"preset": "image"}` for the paper's values).
- "lff": learnable Fourier features of the same grid positions (pos_dim=2).
- "sine-2d", "embed-2d": LFF paper baselines over integer (column, row) indices of the patch
  grid; embed-2d's tables cover the training grid, larger grids clamp to its last bins.
- "rotary2d" (or "rotary"): no additive position; every layer rotates queries and keys by the
  2D grid positions (`Rotary(head_dim, pos_dim=2)`); the class token sits at (0, 0). CAPE's
  augmentation of those positions is drawn once per forward for every layer (the position
  plan, `cape.models.plan`); `position_options={"draw": "per_layer"}` draws it in each layer.

Options that depend on the training grid are filled in when the encoding takes them and the
caller did not: `grid` (abspos2d's table), `sizes` (embed-2d's bins, (W, H)), `pos_dim` (2);
`fit_grid=True` fits the frequencies (cape2d, sinpos2d, sine-2d, rotary2d) to the training grid.

`extent` (CAPE Table 6) rescales the grid positions to [-extent, extent]; it applies to the
encodings over continuous image coordinates (sinpos2d, cape2d, lff, rotary2d): the others
refuse it (`ViT.takes_extent`).

`forward_packed` takes a list of images of different native sizes: each gets the positions of
its own grid, the tokens are padded to the longest with a mask (`cape.models.vit_packed`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .._checks import check_content, check_float, check_int
from ..build import encoding_class, encoding_options
from .plan import PositionPlan, add_position, position_plan
from .transformer import TransformerEncoder
from .vit_packed import check_packed, pack_patches, packed_positions

__all__ = ["ViT"]

_PATCHES = (
    "the ViT needs an encoding of 2-D (x, y) patch positions (e.g. cape2d, sinpos2d, abspos2d, "
    "lff, rotary2d)"
)


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
    position: a 2-D `cape.build` name. position_options: keywords for `cape.build` (for
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
        check_float("mlp_ratio", mlp_ratio, strict=True)
        if int(mlp_ratio * dim) < 1:
            raise ValueError(f"mlp_ratio * dim must be >= 1 (the MLP's width), got {mlp_ratio}")
        if position_options is not None and not isinstance(position_options, dict):
            raise TypeError(
                f"position_options must be a dict or None, got {type(position_options).__name__}"
            )
        if dim % heads:
            raise ValueError(f"dim ({dim}) must be divisible by heads ({heads})")
        if any(s % self.patch for s in self.image_size):
            raise ValueError(
                f"image_size {self.image_size} must be a multiple of patch={self.patch}"
            )
        encoding_class(
            position, key="position"
        )  # a `cape.build` name, or a ValueError listing them
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
        if options.get("cls_token"):
            raise ValueError(f"{name}: the ViT has its own class-token position; drop cls_token")
        if options.get("fit_grid") is True:  # frequencies fitted to this ViT's training grid
            options["fit_grid"] = self.grid
        training_grid = {  # what an encoding takes of this ViT (heads: RoPE-Mixed's per head)
            "grid": self.grid,
            "sizes": (self.grid[1], self.grid[0]),
            "pos_dim": 2,
            "heads": heads,
        }
        for key, value in training_grid.items():
            if key in encoding_options(name):
                options.setdefault(key, value)
        self.plan = position_plan(
            name, dim=dim, heads=heads, options=options, pos_dim=2, what=_PATCHES
        )
        self.position: nn.Module | None = self.plan.absolute

        self.dropout = nn.Dropout(dropout)
        self.encoder = TransformerEncoder(
            depth,
            dim,
            heads,
            int(mlp_ratio * dim),
            position=self.plan.without_absolute(),
            dropout=dropout,
            norm_first=True,
            final_norm=True,
        )
        self.head = nn.Linear(dim, num_classes)

    # -- pieces --------------------------------------------------------------------------
    def patch_grid(self, images: torch.Tensor) -> tuple[int, int]:
        """Check images [B, C, H, W] -> the patch grid (H/patch, W/patch)."""
        if not isinstance(images, torch.Tensor) or images.dim() != 4:
            shape = (
                tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
            )
            raise ValueError(f"images must be a tensor [B, C, H, W], got {shape}")
        if images.shape[1] != self.channels:
            raise ValueError(
                f"images must have {self.channels} channels, got {tuple(images.shape)}"
            )
        check_content("images", images, images.shape[-1], self.patch_embed.weight.dtype, (4,))
        height, width = images.shape[-2:]
        if height % self.patch or width % self.patch or not height * width:
            raise ValueError(
                f"images size {height}x{width} must be a positive multiple of patch={self.patch}"
            )
        return height // self.patch, width // self.patch

    @property
    def layer_position(self) -> PositionPlan | None:
        """What grid positions the in-attention encoding reads (rotary2d: the plan's
        `grid_positions`), or None."""
        return self.plan if self.plan.in_attention else None

    @property
    def takes_extent(self) -> bool:
        """Whether its positions are continuous image coordinates that `extent` rescales."""
        pos = self.position if self.position is not None else self.layer_position
        if pos is None:
            return False
        try:
            pos.grid_positions(1, 1, extent=1.0)
        except ValueError:
            return False
        return True

    def patch_positions(
        self,
        grid: tuple[int, int],
        *,
        extent: float | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor | None:
        """The additive positions of an H' x W' patch grid: [1, H'W', D] float32, row-major
        (augmented in training mode), or None for encodings that add nothing (nopos, rotary2d)."""
        self._check_extent(extent)
        if self.position is None:
            return None
        return self.position(grid=grid, extent=extent, generator=generator)

    def _check_extent(self, extent: float | None) -> None:
        if extent is not None and self.position is None and self.layer_position is None:
            raise ValueError(f"extent rescales positions; {self.position_name!r} has none")

    def _rotary_positions(self, positions: torch.Tensor | None, batch: int) -> torch.Tensor | None:
        """Patch positions [1 or B, T, 2] -> with the class token at (0, 0) first, [B, 1 + T, 2]."""
        if positions is None:
            return None
        cls = positions.new_zeros(positions.shape[0], 1, 2)
        return torch.cat([cls, positions], dim=1).expand(batch, -1, -1)

    def embed(
        self,
        images: torch.Tensor,
        *,
        extent: float | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """images [B, C, H, W] -> (tokens [B, 1 + H'W', D], rotary positions [B, 1 + H'W', 2] or
        None).

        Tokens: the class token (+ its learned position) first, then the patches (+ their
        positions, `position(x, grid=(H', W'))`) in row-major order.
        """
        height, width = self.patch_grid(images)
        self._check_extent(extent)
        batch = images.shape[0]
        x = self.patch_embed(images).permute(0, 2, 3, 1).flatten(1, 2)  # [B, H'W', D]
        if self.position is not None:
            size = (height, width)
            x = add_position(self.position, x, grid=size, extent=extent, generator=generator)
        rotary = self.layer_position
        grid = (
            None
            if rotary is None
            else rotary.grid_positions(height, width, extent=extent, device=x.device)
        )
        return self._with_cls(x), self._rotary_positions(grid, batch)

    def _with_cls(self, x: torch.Tensor) -> torch.Tensor:
        cls = (self.cls_token + self.cls_position).to(x.dtype)
        return self.dropout(torch.cat([cls[None, None].expand(x.shape[0], 1, -1), x], dim=1))

    def forward(
        self,
        images: torch.Tensor | list[torch.Tensor],
        *,
        extent: float | None = None,
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
        self,
        images: list[torch.Tensor],
        *,
        extent: float | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """A packed batch: images [C, H_i, W_i] of different sizes (multiples of patch) ->
        (tokens [B, 1 + T_max, D], mask [B, 1 + T_max] bool (True = real token; the class
        token first), rotary positions [B, 1 + T_max, 2] or None), T_max = max_i H_i'W_i'.

        Each image's patches get the positions of its own grid; padded tokens are 0 (see
        `cape.models.vit_packed` for the encodings and CAPE2d's per-image local shift).
        """
        grids = check_packed(images, self.channels, self.patch)
        self._check_extent(extent)
        x, real = pack_patches(images, grids, self.patch_embed)
        batch, t_max = x.shape[:2]
        # no padding (one size): no mask, so the encodings compute exactly what `forward` does
        patch_mask = real if len(set(grids)) > 1 else None
        if self.position is not None:
            p = packed_positions(self.position, grids, t_max, extent=extent, device=x.device)
            x = add_position(
                self.position, x, positions=p, mask=patch_mask, grid=grids, extent=extent,
                generator=generator,
            )  # fmt: skip
        mask = torch.cat([real.new_ones(batch, 1), real], dim=1)
        rotary = self.layer_position
        grid = (
            None
            if rotary is None
            else packed_positions(rotary, grids, t_max, extent=extent, device=x.device)
        )
        return self._with_cls(x), mask, self._rotary_positions(grid, batch)

    def forward_packed(
        self,
        images: list[torch.Tensor],
        *,
        extent: float | None = None,
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
