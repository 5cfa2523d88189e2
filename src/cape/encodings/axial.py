"""Per-axis sinusoids concatenated: the Learnable Fourier Features paper's Sine-2D and Sine-4D."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .._checks import check_float, check_int
from ..augment import Augmentation
from ..functional.frequencies import grid_frequencies_1d
from ..functional.sinusoidal import (
    _axial_doubled_frequencies,
    _shifted_sine_add,
    axial_sinusoidal,
    sinusoid_frequencies,
)
from ..positions import grid_indices
from .base import PositionalEncoding
from .grids import fit_grid_pair, max_scaling_of, sampling_of
from .presets import _active, legacy_augmentation

__all__ = ["SineND"]


class SineND(PositionalEncoding):
    """Per-axis sinusoids concatenated: LFF's Sine-2D (M=2) and Sine-4D (boxes, M=4).

    dim: D, divisible by 2M. Positions [B, T, M] are required (e.g. row/column indices or box
    edges); each axis gets D/M channels of `sinusoidal_1d`. augmentation: CAPE's
    `cape.Augmentation` of the positions (None, or one that does nothing: none); the four fields
    as keywords (`max_global_shift=`...) are deprecated.
    fit_grid (pos_dim 2): (H, W) of the training grid: each axis's frequencies fitted to its
    sampling (`grid_frequencies_1d`: from half a period across the grid to just under its
    Nyquist limit, divided by max_global_scaling) instead of base^(-2k/d).
    """

    def __init__(
        self,
        dim: int,
        pos_dim: int = 2,
        *,
        base: float = 10000.0,
        freq_scale: float = 1.0,
        augmentation: Augmentation | None = None,
        fit_grid: tuple[int, int] | None = None,
        max_global_shift: float | Sequence[float] | None = None,
        max_local_shift: float | Sequence[float] | None = None,
        max_global_scaling: float | None = None,
        normalize: bool | None = None,
    ) -> None:
        check_int("dim", dim)
        check_int("pos_dim", pos_dim)
        if dim % (2 * pos_dim):
            raise ValueError(f"dim must be divisible by 2 * pos_dim = {2 * pos_dim}, got {dim}")
        legacy = dict(
            max_global_shift=max_global_shift,
            max_local_shift=max_local_shift,
            max_global_scaling=max_global_scaling,
            normalize=normalize,
        )
        aug = legacy_augmentation("SineND", augmentation, legacy)
        super().__init__(dim, pos_dim, _active(aug))
        self.base = check_float("base", base, minimum=1.0, strict=True)
        self.freq_scale = check_float("freq_scale", freq_scale, strict=True)
        self.fit_grid = fit_grid_pair(fit_grid, every_axis=True)
        per_axis = dim // (2 * pos_dim)
        if fit_grid is None:
            omega = sinusoid_frequencies(dim // pos_dim, base=base, freq_scale=freq_scale)
            freqs = omega.expand(pos_dim, per_axis)
        else:
            if pos_dim != 2:
                raise ValueError(
                    f"fit_grid applies to a 2-D grid (pos_dim=2), got pos_dim={pos_dim}"
                )
            if freq_scale != 1.0 or base != 10000.0:
                raise ValueError("give base/freq_scale or fit_grid, not both (fit_grid sets them)")
            spacing, span = sampling_of(self, fit_grid)
            scaling = max_scaling_of(self.augmentation)
            freqs = torch.stack(
                [
                    grid_frequencies_1d(per_axis, d, s, max_scaling=scaling)
                    for d, s in zip(spacing, span, strict=True)
                ]
            )
        self._master = freqs.detach().to("cpu", torch.float32).contiguous()
        self.register_float32("freqs", self._master)
        with torch.device("cpu"):  # the masters, also under `with torch.device("meta")`
            freqs2, offset = _axial_doubled_frequencies(self._master)  # for the fused kernel
        self.register_float32("freqs2", freqs2)
        self.register_float32("offset", offset)

    @property
    def frequencies(self) -> torch.Tensor:
        """The angular frequencies [M, M*K] (radians per unit): axis m's K on its own block."""
        m, k = self._master.shape
        out = torch.zeros(m, m * k)
        for axis in range(m):
            out[axis, axis * k : (axis + 1) * k] = self._master[axis]
        return out

    def embed(self, positions: torch.Tensor) -> torch.Tensor:
        return axial_sinusoidal(positions, self.dim, freqs=self.freqs)

    def embed_kernel(self) -> tuple[Callable[..., torch.Tensor], tuple[torch.Tensor, ...]]:
        return _shifted_sine_add, (self.freqs2, self.offset)

    def grid_positions(
        self,
        height: int,
        width: int,
        *,
        extent: float | None = None,
        batch: int = 1,
        device: torch.device | str | None = None,
    ) -> torch.Tensor:
        """The LFF paper's Sine-2D reads integer (column, row) indices of the grid (as float)."""
        if self.pos_dim != 2:
            return super().grid_positions(height, width, extent=extent, batch=batch, device=device)
        if extent is not None:
            raise ValueError(
                "extent applies to continuous coordinates; SineND reads (column, row) indices"
            )
        return grid_indices(height, width, batch=batch, device=device).to(torch.float32)
