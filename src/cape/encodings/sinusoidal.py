"""Sinusoidal encodings over continuous positions: CAPE1d (sinpos), CAPE2d, SineND.

Thin modules over `cape.functional.sinusoidal`; they build default positions, apply CAPE's
augmentation in training mode and cache the deterministic eval-mode tables.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from functools import partial

import torch

from .._checks import check_bool, check_choice, check_float, check_int
from ..augment import Augmentation, augment_positions
from ..functional.frequencies import grid_frequencies_2d
from ..functional.sinusoidal import (
    _shifted_sine_add,
    cape2d_frequencies,
    doubled_frequencies,
    shifted_sine,
    sinusoid_frequencies,
)
from ..positions import grid_positions
from .base import PositionalEncoding
from .cache import TableCache
from .grids import fit_grid_pair, max_scaling_of, resolve_grid, sampling_of
from .presets import PRESETS, _active, _is_auto, legacy_augmentation, preset_options

__all__ = ["CAPE1d", "CAPE2d", "PRESETS"]


def _check_even_dim(dim: int, what: str) -> None:
    """dim: an int >= 1, even ([cos || sin] pairs), or a ValueError that names `what`."""
    check_int("dim", dim)
    if dim % 2:
        raise ValueError(f"dim must be even for {what}, got {dim}")


class _Sinusoidal(PositionalEncoding):
    """Holds a sinusoid's frequencies as float32 buffers that follow the module's device only
    (`register_float32`: `model.to(torch.bfloat16)` must not round them); non-persistent, a
    function of the configuration, not in the state_dict."""

    def _set_frequencies(self, freqs: torch.Tensor) -> None:
        self._freqs = freqs.detach().to("cpu", torch.float32)
        with torch.device("cpu"):  # the masters, also under `with torch.device("meta")`
            freqs2, offset = doubled_frequencies(self._freqs)
        self.register_float32("freqs2", freqs2)
        self.register_float32("offset", offset)

    @property
    def frequencies(self) -> torch.Tensor:
        """The angular frequencies [M, K] (radians per position unit), float32 on the CPU."""
        return self._freqs

    def embed(self, positions: torch.Tensor) -> torch.Tensor:
        return shifted_sine(positions, self.freqs2, self.offset)

    def embed_kernel(self) -> tuple[Callable[..., torch.Tensor], tuple[torch.Tensor, ...]]:
        return _shifted_sine_add, (self.freqs2, self.offset)


class CAPE1d(_Sinusoidal):
    """CAPE over token indices or time in seconds; with no augmentation it is sinpos.

    dim: D (even). augmentation: CAPE's `cape.Augmentation` (None, or one that does nothing:
    sinpos). freq_scale: 30 for seconds (sec. 3). base: 10000. The four fields as keywords
    (`max_global_shift=`...) are deprecated: `augmentation=cape.Augmentation(...)`.

    forward(x: [B, T, D] | None, *, positions: [B, T(, 1)], lengths: [B], mask: [B, T],
    hop: float | [B] | [B, T] seconds per frame, generator) -> [B, T, D] in x's dtype.
    Without positions: token indices 0..T-1, or frame-centre timestamps when `hop` is given.
    """

    def __init__(
        self,
        dim: int,
        *,
        augmentation: Augmentation | None = None,
        freq_scale: float = 1.0,
        base: float = 10000.0,
        cache_size: int = 8,
        max_global_shift: float | Sequence[float] | None = None,
        max_local_shift: float | Sequence[float] | None = None,
        max_global_scaling: float | None = None,
        normalize: bool | None = None,
    ) -> None:
        _check_even_dim(dim, "a sinusoid")
        legacy = dict(
            max_global_shift=max_global_shift,
            max_local_shift=max_local_shift,
            max_global_scaling=max_global_scaling,
            normalize=normalize,
        )
        super().__init__(dim, 1, _active(legacy_augmentation("CAPE1d", augmentation, legacy)))
        self.freq_scale = check_float("freq_scale", freq_scale, strict=True)
        self.base = check_float("base", base, minimum=1.0, strict=True)
        self._cache = TableCache(check_int("cache_size", cache_size, minimum=0))
        omega = sinusoid_frequencies(dim, base=base, freq_scale=freq_scale, device="cpu")
        self._set_frequencies(omega[None])

    @classmethod
    def preset(cls, modality: str, dim: int, **overrides: object) -> CAPE1d:
        """The paper's values for "text" or "audio" (see `PRESETS`), with overrides: options,
        augmentation fields (`max_global_shift=10.0` replaces the preset's one) or
        `augmentation=` (replaces them all)."""
        check_choice("modality", modality, ("text", "audio"))
        return cls(dim, **preset_options(modality, overrides))  # type: ignore[arg-type]

    def _deterministic(self) -> bool:
        return self.augmentation is None or not self.augmentation.draws(self.training)

    def sequence_table(
        self, x: torch.Tensor, hop: float | torch.Tensor | None
    ) -> torch.Tensor | None:
        """A deterministic table (eval mode, no padding, a float hop or none) is cached per
        length: -> [B, T, D] in x's dtype (a broadcast view), None otherwise."""
        if not self._deterministic() or not isinstance(hop, (type(None), int, float)):
            return None  # drawn positions, or a hop that is not hashable (a cache key)
        batch, length = x.shape[0], x.shape[1]
        key = (length, hop, x.device, x.dtype)
        table = self._cache.get(
            key,
            lambda: self.encode(
                self.sequence_positions(1, length, hop=hop, device=x.device),
                dtype=x.dtype,
                source="positions" if hop is None else "hop",
            ),
        )
        return table.expand(batch, length, self.dim)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", freq_scale={self.freq_scale}, base={self.base}"


class CAPE2d(_Sinusoidal):
    """CAPE's 2D sinusoid over image coordinates in [-1, 1]; no augmentation = 2D sinpos.

    dim: D (even). rho: "exact" or "linspace" (appendix A). freq_scale: multiplies every
    frequency (1 in the paper; 0.4 keeps them under an 8 x 8 grid's Nyquist limit, see
    `cape2d_frequencies`). extent: grid span [-gamma, gamma] (Table 6).
    augmentation: CAPE's `cape.Augmentation` (its max_local_shift a float or one per axis (x,
    y)). auto_local_shift: emax = extent/N per axis (x, y) of the grid being encoded (the
    paper's emax = 1/N; each image's own grid in a packed batch); the augmentation's
    max_local_shift must then be 0. `PRESETS["image"]` and `cape.build("cape2d", ...)` write it
    max_local_shift="auto". The four fields as keywords (`max_local_shift="auto"`...) are
    deprecated: `augmentation=cape.Augmentation(...)` and `auto_local_shift=True`.

    fit_grid: (H, W) of the training grid: frequencies fitted to it instead of the paper's
    (`cape.functional.frequencies`: radii from half a period across the grid to its Nyquist limit
    divided by max_global_scaling, the paper's directions), so that none aliases on the grid
    the model trains on, augmented or not. `cape.count_aliased(enc, (H, W))` counts them.

    forward(x: [B, H, W, D] -> [B, H, W, D]; or x: [B, T, D] with grid=(H, W), T = H*W, or with
    positions: [B, T, 2] (x, y)) -> the embedding in x's dtype.
    """

    def __init__(
        self,
        dim: int,
        *,
        augmentation: Augmentation | None = None,
        auto_local_shift: bool = False,
        rho: str = "exact",
        freq_scale: float = 1.0,
        extent: float = 1.0,
        fit_grid: tuple[int, int] | None = None,
        cache_size: int = 8,
        max_global_shift: float | Sequence[float] | None = None,
        max_local_shift: float | str | Sequence[float] | None = None,
        max_global_scaling: float | None = None,
        normalize: bool | None = None,
    ) -> None:
        _check_even_dim(dim, "CAPE2d")
        auto = check_bool("auto_local_shift", auto_local_shift)
        if isinstance(max_local_shift, str) and not _is_auto(max_local_shift):
            raise ValueError(
                "max_local_shift must be a number, per-axis numbers or 'auto', "
                f"got {max_local_shift!r}"
            )
        legacy = dict(
            max_global_shift=max_global_shift,
            max_local_shift=max_local_shift,
            max_global_scaling=max_global_scaling,
            normalize=normalize,
        )
        auto = auto or _is_auto(max_local_shift)
        extra = ", auto_local_shift=True" if _is_auto(max_local_shift) else ""
        aug = legacy_augmentation("CAPE2d", augmentation, legacy, extra)
        if auto:
            aug = Augmentation() if aug is None else aug
            if not isinstance(aug, Augmentation):
                raise ValueError(
                    "auto_local_shift=True draws CAPE's local shift (emax = extent/N): "
                    f"augmentation must be a cape.Augmentation, got {type(aug).__name__}"
                )
            if aug.max_local_shift != 0.0:
                raise ValueError(
                    "auto_local_shift=True sets max_local_shift = extent/N per axis: the "
                    f"augmentation's max_local_shift must be 0, got {aug.max_local_shift}"
                )
        else:
            aug = _active(aug)
        self.auto_local = auto  # the grid sets emax; aug keeps max_local_shift = 0 meanwhile
        super().__init__(dim, 2, aug)
        self.rho = check_choice("rho", rho, ("exact", "linspace"))
        self.freq_scale = check_float("freq_scale", freq_scale, strict=True)
        self.extent = check_float("extent", extent, strict=True)
        self._cache = TableCache(check_int("cache_size", cache_size, minimum=0))
        self.fit_grid = fit_grid_pair(fit_grid)
        if fit_grid is None:
            freqs = cape2d_frequencies(dim, rho=rho, freq_scale=freq_scale, device="cpu")
        else:
            if freq_scale != 1.0:
                raise ValueError("give freq_scale or fit_grid, not both (fit_grid sets the range)")
            spacing, span = sampling_of(self, fit_grid)
            freqs = grid_frequencies_2d(
                dim, spacing, span, max_scaling=max_scaling_of(self.augmentation), rho=rho
            )
        self._set_frequencies(freqs)

    @classmethod
    def preset(cls, dim: int, **overrides: object) -> CAPE2d:
        """The paper's ViT values (Dmax 0.5, emax 1/N, lambda 1.4), with overrides (as
        `CAPE1d.preset`; max_local_shift=0.0 switches the 1/N local shift off)."""
        return cls(dim, **preset_options("image", overrides, auto_local=True))  # type: ignore[arg-type]

    def grid_augmentation(
        self, grids: list[tuple[int, int]], extent: float | None, device: torch.device
    ) -> Augmentation | Callable[..., torch.Tensor] | None:
        """emax = extent/N per axis (x, y) of each sample's own grid with auto_local_shift
        (one grid: float amounts; several: `augment_positions` with a per-sample [B, 2] emax,
        which an `Augmentation` cannot hold)."""
        if not (self.auto_local and self.augmentation is not None):
            return None
        ext = self.extent if extent is None else check_float("extent", extent, strict=True)
        if len(set(grids)) == 1 and len(grids) == 1:
            height, width = grids[0]
            return replace(self.augmentation, max_local_shift=(ext / width, ext / height))
        emax = torch.tensor([(ext / w, ext / h) for h, w in grids], device=device)
        fields = dict(asdict(self.augmentation), max_local_shift=emax)
        return partial(augment_positions, **fields)

    def call_augmentation(self, augmentation: Augmentation | None) -> Augmentation | None:
        """auto_local_shift's emax = extent/N needs a grid: without one (no grid augmentation
        given) training refuses the positions."""
        if (
            augmentation is None
            and self.auto_local
            and self.training
            and self.augmentation is not None
        ):
            raise ValueError(
                "auto_local_shift (max_local_shift='auto') needs a grid: call with grid=(H, W), "
                "x [B, H, W, D], or positions with grid= each sample's (H, W)"
            )
        return super().call_augmentation(augmentation)

    def grid_table(
        self, x: torch.Tensor | None, grid: tuple[int, int] | None, extent: float | None
    ) -> torch.Tensor | None:
        """The grid's table, cached per grid, extent, device and dtype, unless training draws
        (a 0-size grid has nothing to augment, nor an emax = 1/N)."""
        height, width, _, shape = resolve_grid(x, grid, self.dim)
        ext = self.extent if extent is None else check_float("extent", extent, strict=True)
        if self.training and self._draws() and height * width:
            return None
        device = x.device if x is not None else torch.device("cpu")
        dtype = x.dtype if x is not None else torch.float32
        key = (height, width, ext, device, dtype)
        table = self._cache.get(
            key,
            lambda: self.encode(
                grid_positions(height, width, extent=ext, batch=1, device=device),
                dtype=dtype,
                source="extent",
            ),
        )
        return table.reshape((1,) + shape[1:]).expand(shape)

    def _draws(self) -> bool:
        """Whether training draws anything (the 1/N local shift included)."""
        aug = self.augmentation
        return aug is not None and (aug.random or self.auto_local)

    def extra_repr(self) -> str:
        local = ", auto_local_shift=True" if self.auto_local else ""
        scale = f", freq_scale={self.freq_scale}" if self.freq_scale != 1.0 else ""
        scale += f", fit_grid={self.fit_grid}" if self.fit_grid is not None else ""
        return super().extra_repr() + f"{local}, rho={self.rho!r}{scale}, extent={self.extent}"
