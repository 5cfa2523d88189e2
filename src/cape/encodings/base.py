"""What every absolute encoding module shares: positions in, augmentation, float32 maths, cast out.

An absolute encoding maps positions `[B, T, M]` to an embedding `[B, T, D]` that the caller adds
to (or concatenates with) its content. Subclasses implement `embed(positions) -> float32` and
`default_positions(...)`; this base handles given positions, padding, augmentation in training
mode, disabling autocast and the final cast to the content dtype.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from ..augment import Augmentation
from ..positions import as_positions, resolve_mask

__all__ = ["PositionalEncoding", "float32_region"]


def float32_region(device: torch.device) -> contextlib.AbstractContextManager:
    """Disable autocast so phases are computed in float32 whatever the caller's autocast."""
    return torch.autocast(device_type=device.type, enabled=False)


class PositionalEncoding(nn.Module):
    """Base of the absolute encodings.

    dim: D, the embedding size. pos_dim: M, coordinates per position.
    augmentation: CAPE's `Augmentation` (None = no augmentation, positions used as given).
    """

    def __init__(self, dim: int, pos_dim: int, augmentation: Augmentation | None = None) -> None:
        super().__init__()
        self.dim = dim
        self.pos_dim = pos_dim
        if augmentation is not None and not isinstance(augmentation, Augmentation):
            raise TypeError(f"augmentation must be a cape.Augmentation or None, got {augmentation!r}")
        self.augmentation = augmentation

    # -- to implement ----------------------------------------------------------------------
    def embed(self, positions: torch.Tensor) -> torch.Tensor:
        """positions: [B, T, M] float32 -> [B, T, D] float32 (or a compute dtype of params)."""
        raise NotImplementedError

    # -- shared ----------------------------------------------------------------------------
    def prepare(
        self,
        positions: torch.Tensor,
        mask: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        augmentation: Augmentation | None = None,
        validate: bool = True,
    ) -> torch.Tensor:
        """Validate, then augment (train mode) -> [B, T, M] float32, 0 at padding.

        augmentation: overrides `self.augmentation` for this call (e.g. a grid-dependent emax).
        validate: False for positions built by `cape.positions` (known finite, right shape).
        """
        pos = as_positions(positions, mask=mask, dims=self.pos_dim) if validate else positions
        aug = augmentation if augmentation is not None else self.augmentation
        if aug is None:
            return pos
        return aug(pos, mask, training=self.training, generator=generator)

    def encode(
        self,
        positions: torch.Tensor,
        mask: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        dtype: torch.dtype | None = None,
        augmentation: Augmentation | None = None,
        validate: bool = True,
    ) -> torch.Tensor:
        """positions: [B, T] or [B, T, M] -> embedding [B, T, D] in `dtype` (0 at padding)."""
        with float32_region(positions.device):
            pos = self.prepare(positions, mask, generator, augmentation, validate)
            out = self.embed(pos)
        if mask is not None:
            out = out * mask[..., None].to(out.dtype)
        return out if dtype is None else out.to(dtype)

    def forward(
        self,
        x: torch.Tensor | None = None,
        *,
        positions: torch.Tensor | None = None,
        lengths: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """x: [B, T, D] content (for B, T, device and dtype) and/or positions [B, T(, M)].

        Returns the embedding [B, T, D] in x's dtype (float32 without x); the caller adds it.
        """
        if x is None and positions is None:
            raise ValueError("give x ([B, T, D]) or positions ([B, T, M])")
        self.check_content(x, ndims=(3,))
        ref = x if x is not None else positions
        assert ref is not None
        batch, length = ref.shape[0], ref.shape[1]
        mask = resolve_mask(batch, length, lengths, mask)
        validate = positions is not None
        if positions is None:
            positions = self.default_positions(batch, length, device=ref.device, mask=mask)
        elif x is not None and tuple(positions.shape[:2]) != (batch, length):
            raise ValueError(
                f"positions must start with [B, T] = [{batch}, {length}], got {tuple(positions.shape)}"
            )
        dtype = None if x is None else x.dtype
        return self.encode(positions, mask, generator, dtype=dtype, validate=validate)

    def check_content(self, x: torch.Tensor | None, ndims: tuple[int, ...] = (3,)) -> None:
        """x (the content) must be a tensor of rank in `ndims` ending with D = self.dim."""
        if x is None:
            return
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() not in ndims or x.shape[-1] != self.dim:
            want = " or ".join("[B, T, D]" if n == 3 else "[B, H, W, D]" for n in ndims)
            raise ValueError(f"x must have shape {want} with D = {self.dim}, got {tuple(x.shape)}")

    def add_to(self, x: torch.Tensor, **kwargs: object) -> torch.Tensor:
        """x + self(x, **kwargs) (the default combination) without a second output buffer.

        x: [B, T, D] (or the module's grid shape). When the embedding is a fresh tensor outside
        autograd, the content is added into it in place (autograd still tracks x); cached
        tables and learned embeddings take the ordinary out-of-place add.
        """
        emb = self(x, **kwargs)
        if torch.compiler.is_compiling():  # the compiled graph fuses the add by itself
            return x + emb
        cache = getattr(self, "_cache", None)
        fresh = (
            emb._base is None and not emb.requires_grad and emb.is_contiguous()
            and emb.shape == x.shape and emb.dtype == x.dtype
            and not (cache is not None and cache.holds(emb))
        )
        return emb.add_(x) if fresh else x + emb

    def default_positions(
        self, batch: int, length: int, *, device: torch.device, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Positions used when none are given: [B, T, M]. Default: token indices (M = 1)."""
        raise ValueError(f"{type(self).__name__} needs explicit positions")

    def extra_repr(self) -> str:
        aug = "" if self.augmentation is None else f", augmentation={self.augmentation}"
        return f"dim={self.dim}, pos_dim={self.pos_dim}{aug}"
