"""Rotary embeddings over continuous, optionally CAPE-augmented positions (CAPE sec. 6, [38]).

Rotating queries and keys makes attention logits depend on relative positions only; CAPE's
augmentation then perturbs those relative positions during training (local shift, global
scaling). A global shift moves q and k together and leaves the logits unchanged, so for rotary
it only matters through float32 precision.
"""

from __future__ import annotations

import torch
from torch import nn

from .._checks import (
    check_choice,
    check_even,
    check_float,
    check_generator,
    check_int,
    check_tensor,
)
from ..augment import Augmentation, augment_pair, mean_normalize
from ..functional.frequencies import grid_frequencies_2d
from ..functional.rotary import apply_rotary, rotary_angles
from ..functional.sinusoidal import cape2d_frequencies, sinusoid_frequencies
from ..positions import as_positions, token_positions
from .base import float32_region
from .grids import fit_grid_pair, layout_grid, max_scaling_of, sampling_of

__all__ = ["Rotary"]


class Rotary(nn.Module):
    """Rotates queries and keys by angles of (augmented) positions; no parameters.

    head_dim: hd, channels per head (even). pos_dim: 1 (tokens, seconds) or 2 (x, y: CAPE's
    rotated 2D frequencies). base, freq_scale: 1D frequencies freq_scale * base^(-2c/hd)
    (freq_scale = 30 for seconds); in 2D freq_scale multiplies CAPE's 2D frequencies.
    augmentation: CAPE's `Augmentation`, applied in train mode (normalisation also in eval).
    fit_grid (pos_dim 2): (H, W) of the training grid: 2D frequencies fitted to it (as
    `CAPE2d(fit_grid=...)`, through the augmentation's max_global_scaling) instead of the paper's.

    It acts inside attention (`kind = "attention"`): one module per layer, `dim` of `cape.build`
    is the head size. `grid_positions(H, W)` are the continuous (x, y) a 2-D rotary reads.
    """

    kind = "attention"
    units = "continuous"

    def __init__(
        self,
        head_dim: int,
        *,
        pos_dim: int = 1,
        base: float = 10000.0,
        freq_scale: float = 1.0,
        augmentation: Augmentation | None = None,
        fit_grid: tuple[int, int] | None = None,
    ) -> None:
        super().__init__()
        self.head_dim = check_even("head_dim", head_dim)
        check_int("pos_dim", pos_dim)
        check_choice("pos_dim", pos_dim, (1, 2))
        self.pos_dim = pos_dim
        self.base = check_float("base", base, minimum=1.0, strict=True)
        self.freq_scale = check_float("freq_scale", freq_scale, strict=True)
        if augmentation is not None and not isinstance(augmentation, Augmentation):
            raise TypeError(
                f"augmentation must be a cape.Augmentation or None, got {augmentation!r}"
            )
        self.augmentation = augmentation
        if pos_dim == 1:  # made once here: base and freq_scale must give float32 frequencies
            sinusoid_frequencies(head_dim, base=base, freq_scale=freq_scale)
        else:
            cape2d_frequencies(head_dim, freq_scale=freq_scale)
        self.fit_grid = fit_grid_pair(fit_grid)
        self._fitted: torch.Tensor | None = None
        if fit_grid is not None:
            if pos_dim != 2:
                raise ValueError(f"fit_grid applies to pos_dim=2 (a grid), got pos_dim={pos_dim}")
            if freq_scale != 1.0:
                raise ValueError("give freq_scale or fit_grid, not both (fit_grid sets the range)")
            spacing, span = sampling_of(self, fit_grid)
            self._fitted = grid_frequencies_2d(
                head_dim, spacing, span, max_scaling=max_scaling_of(augmentation)
            )
            self.register_buffer("fitted_freqs", self._fitted.clone(), persistent=False)

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        super()._apply(fn, recurse)
        if self._fitted is not None:  # float32 through .to(bf16): phases must not shift
            self.fitted_freqs = self._fitted.to(self.fitted_freqs.device)
        return self

    @property
    def frequencies(self) -> torch.Tensor:
        """The angular frequencies [M, head_dim/2] (radians per unit), float32 on the CPU."""
        if self._fitted is not None:
            return self._fitted
        if self.pos_dim == 1:
            return sinusoid_frequencies(self.head_dim, base=self.base, freq_scale=self.freq_scale)[
                None
            ]
        return cape2d_frequencies(self.head_dim, freq_scale=self.freq_scale)

    def grid_positions(
        self,
        height: int,
        width: int,
        *,
        extent: float | None = None,
        batch: int = 1,
        device: torch.device | str | None = None,
    ) -> torch.Tensor:
        """(x, y) of an H x W patch grid in [-extent, extent] (extent 1) -> [B, H*W, 2]."""
        return layout_grid(self, height, width, extent=extent, batch=batch, device=device)

    def _angles(self, pos: torch.Tensor) -> torch.Tensor:
        return rotary_angles(
            pos,
            self.head_dim,
            base=self.base,
            freq_scale=self.freq_scale,
            mode="1d" if self.pos_dim == 1 else "2d",
            freqs=None if self._fitted is None else self.fitted_freqs,
        )

    def angles(
        self,
        positions: torch.Tensor,
        mask: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """positions: [B, T] or [B, T, M], mask: [B, T] bool -> angles [B, T, hd/2] float32.

        Augments the positions in train mode (one draw: use the result for both q and k).
        """
        with float32_region(positions.device):
            pos = as_positions(positions, mask=mask, dims=self.pos_dim)
            if self.augmentation is not None:
                pos = self.augmentation(pos, mask, training=self.training, generator=generator)
            return self._angles(pos)

    def pair_angles(
        self,
        positions: torch.Tensor,
        k_positions: torch.Tensor,
        mask: torch.Tensor | None = None,
        k_mask: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Query and key angles for cross-attention: [B, Tq, hd/2], [B, Tk, hd/2].

        Augmentation is synchronised (`augment_pair` with alpha = 1): one global shift and
        scale per sample for both sides, independent local shifts. `normalize` subtracts the
        keys' mean from both sides (a common offset, so relative positions are kept).
        """
        with float32_region(positions.device):
            q = as_positions(positions, mask=mask, dims=self.pos_dim)
            k = as_positions(
                k_positions, mask=k_mask, dims=self.pos_dim, name="k_positions", mask_name="k_mask"
            )
            aug = self.augmentation
            if aug is not None:
                if aug.normalize and k.shape[1]:  # no keys: no mean to take
                    offset = k - mean_normalize(k, k_mask)  # [B, 1, M] mean broadcast
                    q, k = q - offset[:, :1], k - offset[:, :1]
                q, k = augment_pair(
                    q,
                    k,
                    mask,
                    k_mask,
                    max_global_shift=aug.max_global_shift,
                    max_local_shift=aug.max_local_shift,
                    max_global_scaling=aug.max_global_scaling,
                    training=self.training,
                    generator=generator,
                )
            return self._angles(q), self._angles(k)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        *,
        positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        k_mask: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [B, H, Tq, hd], k: [B, H, Tk, hd] -> (q_rot, k_rot), same shapes and dtypes.

        positions: [B, Tq] or [B, Tq, M]; None = token indices (1D only, padding from `mask`).
        k_positions: [B, Tk(, M)]; None = self-attention: the same (augmented) angles rotate
        q and k, so Tq must equal Tk. mask / k_mask: [B, Tq] / [B, Tk] bool, True at real tokens.
        """
        check_generator("generator", generator)
        for name, t in (("q", q), ("k", k)):
            check_tensor(name, t, ndims=(4,), floating=True)
            if t.dim() != 4 or t.shape[-1] != self.head_dim:
                raise ValueError(
                    f"{name} must have shape [B, H, T, {self.head_dim}], got {tuple(t.shape)}"
                )
        for name, p in (("positions", positions), ("k_positions", k_positions)):
            if p is not None:  # values and M are checked with the angles
                check_tensor(name, p, ndims=(2, 3))
        batch, tq, tk = q.shape[0], q.shape[2], k.shape[2]
        if positions is None:
            if self.pos_dim != 1:
                raise ValueError("positions are required for pos_dim=2 (x, y per token)")
            if k_positions is not None:
                raise ValueError("give positions too when giving k_positions")
            positions = token_positions(batch, tq, mask=mask, device=q.device)
        if k_positions is None:
            if tq != tk:
                raise ValueError(
                    f"k_positions is required when Tq ({tq}) != Tk ({tk}); "
                    "without it q and k share the same positions"
                )
            ang = self.angles(positions, mask, generator)
            return apply_rotary(q, ang), apply_rotary(k, ang)
        q_ang, k_ang = self.pair_angles(positions, k_positions, mask, k_mask, generator)
        return apply_rotary(q, q_ang), apply_rotary(k, k_ang)

    def extra_repr(self) -> str:
        aug = "" if self.augmentation is None else f", augmentation={self.augmentation}"
        fit = "" if self.fit_grid is None else f", fit_grid={self.fit_grid}"
        return (
            f"head_dim={self.head_dim}, pos_dim={self.pos_dim}, base={self.base}, "
            f"freq_scale={self.freq_scale}{fit}{aug}"
        )
