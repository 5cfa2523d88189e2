"""The model of the LFF image-generation study (Li et al. 2021, sec. 4.1): a decoder-only
Transformer over the raster-order RGB intensities of an image, one encoding per row.

An image `uint8 [H, W, 3]` is the sequence of its H*W*3 intensities in raster order with the
three channels interleaved per pixel (Reformer on ImageNet64). Token t predicts intensity t
(256-way softmax) from the intensities before it: the input of token t is the embedding of
intensity t-1 (a start token for t = 0) plus the position part of token t, which is, as in the
paper, the pixel's position encoding (width D - D_ch) concatenated with a learned embedding of
the channel (3 -> D_ch).

Pixel encodings by name (`POSITIONS`):
- "embed-1d": a learned table over the pixel index 0..H*W-1 (Embed-1D);
- "sine-1d": the 1D sinusoid of the pixel index (Sine-1D);
- "embed-2d": per-axis learned tables over (column, row), concatenated (Embed-2D);
- "sine-2d": per-axis sinusoids of (column, row), concatenated (Sine-2D);
- "lff": learnable Fourier features (+ MLP) of (column, row) in pixel units (Algorithm 1;
  `mlp=False` is "Learnable-Fourier" alone, `fourier=False` "MLP" alone);
- "cape2d": CAPE's 2D sinusoid of the pixel grid in [-1, 1], augmented in training.

The encoding is built through the one position plan (`cape.models.plan.position_plan`): any
`cape.build` name it adds at the input will do (the rows use `POSITIONS`); the names that act
inside attention (rotary, relpos, ALiBi, FIRE) are refused. Which positions it reads is asked of
the encoding (`pos_dim`, `grid_positions`), except for LFF (`PixelPositions.pixel_encoding`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cape._checks import check_int
from cape.models.plan import position_plan
from cape.models.transformer import TransformerEncoder
from cape.positions import grid_indices

__all__ = [
    "POSITIONS",
    "INTENSITIES",
    "START",
    "flatten_images",
    "unflatten_images",
    "shift_right",
    "bits_per_dim",
    "causal_transformer",
    "PixelPositions",
    "PixelTransformer",
    "generation_loss",
]

POSITIONS = ("nopos", "embed-1d", "sine-1d", "embed-2d", "sine-2d", "lff", "cape2d")
INTENSITIES = 256
START = INTENSITIES  # the start token's index in the input vocabulary (257 entries)
CHANNELS = 3


def flatten_images(images: torch.Tensor) -> torch.Tensor:
    """images [N, H, W, 3] -> sequences [N, H*W*3] (raster order, RGB interleaved per pixel)."""
    if images.dim() != 4 or images.shape[-1] != CHANNELS:
        raise ValueError(f"images must have shape [N, H, W, 3], got {tuple(images.shape)}")
    return images.reshape(images.shape[0], -1)


def unflatten_images(seqs: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """sequences [N, H*W*3] -> images [N, H, W, 3]: the inverse of `flatten_images`."""
    if seqs.dim() != 2 or seqs.shape[1] != height * width * CHANNELS:
        raise ValueError(
            f"seqs must have shape [N, {height * width * CHANNELS}] for a "
            f"{height}x{width} RGB image, got {tuple(seqs.shape)}"
        )
    return seqs.reshape(seqs.shape[0], height, width, CHANNELS)


def shift_right(seqs: torch.Tensor) -> torch.Tensor:
    """seqs [B, L] intensities -> inputs [B, L] int64: START, then seqs[:, :-1]."""
    start = torch.full_like(seqs[:, :1], START, dtype=torch.long)
    return torch.cat([start, seqs[:, :-1].long()], dim=1)


def bits_per_dim(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logits [B, L, 256], targets [B, L] -> mean negative log-likelihood in bits (float32 0-d):
    cross-entropy in nats over every prediction, divided by ln 2."""
    nats = F.cross_entropy(logits.float().flatten(0, 1), targets.long().flatten())
    return nats / math.log(2.0)


def causal_transformer(
    layers: int, dim: int, heads: int, ffn_dim: int, *, dropout: float = 0.0
) -> TransformerEncoder:
    """A pre-norm stack of causal self-attention layers (a decoder without cross-attention)
    with a final LayerNorm: x [B, T, D] -> [B, T, D], output t depends on inputs 0..t only."""
    return TransformerEncoder(layers, dim, heads, ffn_dim, dropout=dropout, causal=True)


def _pixel_options(
    kind: str, pixel_dim: int, height: int, width: int, options: Mapping[str, Any]
) -> dict[str, Any]:
    """`cape.build` options of a pixel encoding: the row's, plus the grid-given defaults."""
    opts = dict(options)
    if kind == "embed-1d":
        opts.setdefault("num_positions", height * width)
    elif kind == "embed-2d":
        opts.setdefault("sizes", (width, height))  # (column, row) order, as grid_indices
    elif kind == "lff":
        opts.setdefault("pos_dim", 2)
        if opts.get("fourier", True) and "fourier_dim" not in opts:
            groups = opts.get("groups", 1)
            out = pixel_dim // groups if isinstance(groups, int) and groups > 0 else pixel_dim
            # the paper's |F| = D/2 (384 for D = 768); F = D/G when the features are the output
            opts["fourier_dim"] = out if opts.get("mlp", True) is False else 2 * max(1, out // 4)
    return opts


class PixelPositions(nn.Module):
    """The position part of every token: [pixel encoding (D - D_ch) || channel embedding (D_ch)].

    kind: one of `POSITIONS` (or any `cape.build` name added at the input: 1-D ones read the
    pixel index, 2-D ones the grid). dim: D. channel_dim: D_ch (1 <= D_ch < D). height, width:
    the image grid. options: keywords of the pixel encoding (`cape.build`), e.g. the LFF's
    `fourier_dim`, `hidden_dim`, `gamma`, `mlp`, `fourier`, or cape2d's `preset`.
    forward(batch) -> [B, H*W*3, D] float32 (augmented in training mode for cape2d).
    """

    def __init__(
        self,
        kind: str,
        dim: int,
        channel_dim: int,
        height: int,
        width: int,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(kind, str):
            raise TypeError(f"kind must be a cape.build name ({list(POSITIONS)}), got {kind!r}")
        check_int("dim", dim)
        check_int("channel_dim", channel_dim)
        if channel_dim >= dim:
            raise ValueError(f"channel_dim must be below dim ({dim}), got {channel_dim}")
        self.height, self.width = check_int("height", height), check_int("width", width)
        self.dim, self.channel_dim, self.pixel_dim = dim, channel_dim, dim - channel_dim
        opts = _pixel_options(kind.lower(), self.pixel_dim, height, width, options or {})
        # the one plan decides where the encoding goes; here it must be added at the input
        plan = position_plan(kind, dim=self.pixel_dim, heads=1, options=opts)
        if plan.absolute is None and plan.kind != "none":
            raise ValueError(
                f"kind {kind!r} "
                + ("acts inside attention" if plan.in_attention else "adds no positions")
                + "; the pixel positions are an encoding added at the input: one of "
                f"{list(POSITIONS)} (or another absolute cape.build name)"
            )
        self.kind, self.pixel = plan.name, plan.absolute  # None: nopos (channel only)
        if self.pixel is not None and self.pixel.pos_dim not in (1, 2) and self.kind != "lff":
            raise ValueError(
                f"kind {kind!r} reads {self.pixel.pos_dim}-D positions; a pixel has a 1-D index "
                "or 2-D (column, row) coordinates"
            )
        self.channel = nn.Embedding(CHANNELS, channel_dim)
        cols_rows = grid_indices(height, width)  # [H*W, 2] int64, row-major
        index = torch.arange(height * width, dtype=torch.float32)[:, None]
        self.register_buffer("cols_rows", cols_rows, persistent=False)
        self.register_buffer("index", index, persistent=False)

    @property
    def length(self) -> int:
        return self.height * self.width * CHANNELS

    def pixel_encoding(self, batch: int) -> torch.Tensor:
        """One encoding per pixel: [B, H*W, D - D_ch] float32 (row-major pixels).

        The encoding says what it reads: 1-D ones (embed-1d, sine-1d) the pixel index
        0..H*W-1; 2-D ones the grid call, i.e. their `grid_positions(H, W)`: integer (column,
        row) bins for embed-2d, (column, row) as floats for sine-2d, CAPE's [-1, 1] grid with
        its emax = 1/N per axis ("auto") for cape2d.
        """
        cells = self.height * self.width
        if self.pixel is None:  # nopos, or taken out (`cape.models.without_positions`)
            return self.index.new_zeros(batch, cells, self.pixel_dim)
        if self.kind == "lff":
            # Kept by name: LFF's units are "continuous", so its grid_positions(H, W) are image
            # coordinates in [-1, 1]; the paper's LFF (and the study's lff rows) reads (column,
            # row) in pixel units, with gamma set for them.
            pos = self.cols_rows.to(torch.float32)
            return self.pixel(positions=pos[None].expand(batch, -1, -1))
        like = self.index.new_zeros(batch, cells, self.pixel_dim)
        if self.pixel.pos_dim == 1:  # x alone: the token indices it counts, the pixel index
            return self.pixel(like)
        return self.pixel(like, grid=(self.height, self.width))

    def forward(self, batch: int) -> torch.Tensor:
        cells = self.height * self.width
        pixel = self.pixel_encoding(batch).float().repeat_interleave(CHANNELS, dim=1)
        channel = self.channel.weight.float().repeat(cells, 1)  # [L, D_ch]: R, G, B, R, ...
        return torch.cat([pixel, channel[None].expand(batch, -1, -1)], dim=-1)


class PixelTransformer(nn.Module):
    """Next-intensity model over flattened RGB images (LFF sec. 4.1, Reformer's setting).

    height, width: the image grid (sequences have L = H*W*3 tokens). position: one of
    `POSITIONS`; position_options: its options (`PixelPositions`). dim, channel_dim, depth,
    heads, ffn_dim, dropout: the Transformer's sizes.
    forward(seqs: [B, L] intensities 0..255, any integer dtype) -> logits [B, L, 256];
    logits[:, t] depend on seqs[:, :t] only.
    """

    def __init__(
        self,
        height: int,
        width: int,
        position: str,
        *,
        dim: int = 64,
        channel_dim: int = 16,
        depth: int = 2,
        heads: int = 4,
        ffn_dim: int = 256,
        dropout: float = 0.0,
        position_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.position = PixelPositions(position, dim, channel_dim, height, width, position_options)
        self.token = nn.Embedding(INTENSITIES + 1, dim)  # 256 intensities + START
        self.dropout = nn.Dropout(dropout)
        self.decoder = causal_transformer(depth, dim, heads, ffn_dim, dropout=dropout)
        self.head = nn.Linear(dim, INTENSITIES)

    @property
    def length(self) -> int:
        return self.position.length

    def forward(self, seqs: torch.Tensor) -> torch.Tensor:
        if (
            not isinstance(seqs, torch.Tensor)
            or seqs.dim() != 2
            or seqs.shape[1] != self.length
            or seqs.is_floating_point()
        ):
            got = tuple(seqs.shape) if isinstance(seqs, torch.Tensor) else type(seqs).__name__
            raise ValueError(
                f"seqs must be an integer tensor [B, {self.length}] (H*W*3 intensities), got {got}"
            )
        tokens = self.token(shift_right(seqs))
        x = tokens + self.position(seqs.shape[0]).to(tokens.dtype)
        return self.head(self.decoder(self.dropout(x)))

    def position_parameters(self) -> int:
        """Learned parameters of the position part (pixel encoding + channel embedding)."""
        return sum(p.numel() for p in self.position.parameters())


def generation_loss(
    model: torch.nn.Module, seqs: torch.Tensor
) -> tuple[torch.Tensor, dict[str, Any]]:
    """loss_fn of the Trainer: seqs uint8 [B, L] -> (mean NLL in nats, {"bpd"})."""
    bits = bits_per_dim(model(seqs), seqs)
    return bits * math.log(2.0), {"bpd": bits.detach()}
