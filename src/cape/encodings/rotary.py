"""Rotary embeddings over continuous, optionally CAPE-augmented positions (CAPE sec. 6, [38]).

Rotating queries and keys makes attention logits depend on relative positions only; CAPE's
augmentation then perturbs those relative positions during training (local shift, global
scaling). A global shift moves q and k together and leaves the logits unchanged, so for rotary
it only matters through float32 precision.
"""

from __future__ import annotations

import torch

from .._checks import (
    _may_inspect_values,
    check_choice,
    check_even,
    check_float,
    check_generator,
    check_int,
    check_phases,
    check_tensor,
)
from ..augment import Augmentation, mean_normalize
from ..functional.frequencies import grid_frequencies_2d
from ..functional.rope_scaling import (
    extension_factor,
    position_midpoint,
    position_span,
    scaled_frequencies,
    xpos_scale,
    yarn_temperature,
)
from ..functional.rotary import rotary_angles
from ..functional.sinusoidal import cape2d_frequencies, sinusoid_frequencies
from ..positions import as_positions, token_positions
from .base import float32_region
from .extension import init_extension
from .grids import GridLayout, fit_grid_pair, max_scaling_of, sampling_of
from .in_attention import QKTransform
from .rotation import rotate

__all__ = ["Rotary"]


class Rotary(GridLayout, QKTransform):
    """Rotates queries and keys by angles of (augmented) positions; no parameters.

    head_dim: hd, channels per head (even). pos_dim: 1 (tokens, seconds) or 2 (x, y: CAPE's
    rotated 2D frequencies). base, freq_scale: 1D frequencies freq_scale * base^(-2c/hd)
    (freq_scale = 30 for seconds); in 2D freq_scale multiplies CAPE's 2D frequencies.
    augmentation: CAPE's `Augmentation`, applied in train mode (normalisation also in eval).
    fit_grid (pos_dim 2): (H, W) of the training grid: 2D frequencies fitted to it (as
    `CAPE2d(fit_grid=...)`, through the augmentation's max_global_scaling) instead of the paper's.

    Longer than training (pos_dim 1; `cape.functional.rope_scaling` has the formulas):
    scaling: None, "pi" (position interpolation), "ntk" (NTK-aware base) or "yarn" (NTK-by-parts
    and q, k each multiplied by 0.1 ln s + 1, the attention temperature). The factor s: `factor`
    (fixed, >= 1), else per call and per sample s = max(1, L / train_length) with L the length
    the valid positions cover, n steps of their mean spacing, the larger of q's and k's
    (augmented in training): L = T for token indices 0..T-1, T x hop for frames in seconds,
    whatever the padding. train_length is in the positions' units (tokens,
    seconds); YaRN needs it for its ramp (yarn_alpha < yarn_beta, in turns over train_length).
    xpos: xPos (causal / relative use: logits scale by zeta^((n - m) / xpos_scale_base), which
    decays for n > m and blows up for n < m): q * zeta^((n - n0)/B), k * zeta^(-(m - n0)/B),
    n0 = floor((min + max + 1)/2) of the valid positions, or `xpos_center` if given (a common
    offset, it cancels in logits). With "pi", xPos reads the interpolated positions (as
    rotary-embedding-torch does). A key/value cache needs `factor` and `xpos_center` (`cacheable`).

    It acts inside attention (the q/k protocol, `cape.encodings.in_attention`:
    `MultiheadAttention(rotary=...)`): one module per layer, `dim` of `cape.build` is the head
    size. `grid_positions(H, W)` are the continuous (x, y) a 2-D rotary reads.
    """

    def __init__(
        self,
        head_dim: int,
        *,
        pos_dim: int = 1,
        base: float = 10000.0,
        freq_scale: float = 1.0,
        augmentation: Augmentation | None = None,
        fit_grid: tuple[int, int] | None = None,
        scaling: str | None = None,
        train_length: float | None = None,
        factor: float | None = None,
        yarn_alpha: float = 1.0,
        yarn_beta: float = 32.0,
        xpos: bool = False,
        xpos_scale_base: float = 512.0,
        xpos_center: float | None = None,
    ) -> None:
        super().__init__(augmentation)
        self.head_dim = check_even("head_dim", head_dim)
        check_int("pos_dim", pos_dim)
        check_choice("pos_dim", pos_dim, (1, 2))
        self.pos_dim = pos_dim
        self.base = check_float("base", base, minimum=1.0, strict=True)
        self.freq_scale = check_float("freq_scale", freq_scale, strict=True)
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
        init_extension(
            self, scaling, train_length, factor, yarn_alpha, yarn_beta,
            xpos, xpos_scale_base, xpos_center,
        )  # fmt: skip

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
        With `scaling`, the extended angles (YaRN's and xPos's magnitudes are left to forward).
        """
        return self._self_rotation(positions, mask, generator)[0]

    def _self_rotation(self, positions, mask, generator, validate=True):
        with float32_region(positions.device):
            pos = as_positions(positions, mask=mask, dims=self.pos_dim, validate=validate)
            if self.augmentation is not None:
                pos = self.augmentation(pos, mask, training=self.training, generator=generator)
            return self._extended(pos, pos, mask, mask, validate)

    def _extended(self, q, k, q_mask, k_mask, validate=True):
        """Positions [B, T, 1] of q and k -> (q angles, k angles, q's and k's magnitudes
        [B, 1, T, hd] or [B, 1, 1, 1], None = 1): length extension and xPos (class docstring)."""
        if self.scaling is None and not self.xpos:
            return self._angles(q), self._angles(k), None, None
        b, tq, tk = q.shape[0], q.shape[1], k.shape[1]
        both = torch.cat([q, k], dim=1)
        both_mask = None
        if q_mask is not None or k_mask is not None:
            ones = torch.ones(b, tq + tk, dtype=torch.bool, device=q.device)
            both_mask = torch.cat(
                [
                    ones[:, :tq] if q_mask is None else q_mask,
                    ones[:, tq:] if k_mask is None else k_mask,
                ],
                dim=1,
            )
        s = None
        if self.scaling is None:
            q_ang, k_ang = self._angles(q), self._angles(k)
        else:
            if self.factor is not None:
                s = torch.full((b,), self.factor, device=q.device)
            else:
                assert self.train_length is not None
                s = extension_factor(_span(q, k, q_mask, k_mask), self.train_length)
            if validate:  # every method lowers frequencies: the plain ones bound the phases
                check_phases("positions", q, self.freq_scale)
                if k is not q:
                    check_phases("k_positions", k, self.freq_scale)
            omega = sinusoid_frequencies(
                self.head_dim, base=self.base, freq_scale=self.freq_scale, device=q.device
            )
            w = scaled_frequencies(
                omega,
                s,
                self.scaling,
                train_length=self.train_length,
                alpha=self.yarn_alpha,
                beta=self.yarn_beta,
            )[:, None]  # [B, 1, hd/2]
            q_ang, k_ang = q * w, k * w
        q_mag = k_mag = None
        if self.scaling == "yarn":
            q_mag = k_mag = yarn_temperature(s)[:, None, None, None]
        if self.xpos:
            if self.scaling == "pi":  # xPos on the interpolated positions
                q, k, both = (p / s[:, None, None] for p in (q, k, both))
            n0 = (
                position_midpoint(both, both_mask) if self.xpos_center is None else self.xpos_center
            )
            qs = xpos_scale(q, self.head_dim, scale_base=self.xpos_scale_base, center=n0)
            ks = 1 / xpos_scale(k, self.head_dim, scale_base=self.xpos_scale_base, center=n0)
            q_mag = qs[:, None] if q_mag is None else q_mag * qs[:, None]
            k_mag = ks[:, None] if k_mag is None else k_mag * ks[:, None]
        return q_ang, k_ang, q_mag, k_mag

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
        return self._pair_rotation(positions, k_positions, mask, k_mask, generator)[:2]

    def _pair_rotation(self, positions, k_positions, mask, k_mask, generator, validate=True):
        with float32_region(positions.device):
            q = as_positions(positions, mask=mask, dims=self.pos_dim, validate=validate)
            k = as_positions(
                k_positions, mask=k_mask, dims=self.pos_dim, name="k_positions",
                mask_name="k_mask", validate=validate,
            )  # fmt: skip
            aug = self.augmentation
            if aug is not None:
                if aug.normalize and k.shape[1]:  # no keys: no mean to take
                    offset = k - mean_normalize(k, k_mask)  # [B, 1, M] mean broadcast
                    q, k = q - offset[:, :1], k - offset[:, :1]
                q, k = aug.pair(q, k, mask, k_mask, training=self.training, generator=generator)
            return self._extended(q, k, mask, k_mask, validate)

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
        validate: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [B, H, Tq, hd], k: [B, H, Tk, hd] -> (q_rot, k_rot), same shapes and dtypes.

        positions: [B, Tq] or [B, Tq, M]; None = token indices (1D only, padding from `mask`).
        k_positions: [B, Tk(, M)]; None = self-attention: the same (augmented) angles rotate
        q and k, so Tq must equal Tk. mask / k_mask: [B, Tq] / [B, Tk] bool, True at real tokens.
        validate: False when the caller checked these inputs (`MultiheadAttention`).
        """
        if validate:
            self._check_call(q, k, positions, k_positions, generator)
        batch, tq, tk = q.shape[0], q.shape[2], k.shape[2]
        if positions is None:
            if self.pos_dim != 1:
                raise ValueError("positions are required for pos_dim=2 (x, y per token)")
            if k_positions is not None:
                raise ValueError("give positions too when giving k_positions")
            # one row shared by the batch unless padding or a random draw (`drawing`) makes them
            # differ: the angles (and their checks) are then [1, T, hd/2], broadcast over B
            shared = mask is None and not self.drawing
            positions = token_positions(1 if shared else batch, tq, mask=mask, device=q.device)
        if k_positions is None:
            if tq != tk:
                raise ValueError(
                    f"k_positions is required when Tq ({tq}) != Tk ({tk}); "
                    "without it q and k share the same positions"
                )
            rotation = self._self_rotation(positions, mask, generator, validate)
        else:
            rotation = self._pair_rotation(
                positions, k_positions, mask, k_mask, generator, validate
            )
        q_ang, k_ang, q_mag, k_mag = rotation
        if self.xpos:  # YaRN's temperature alone (0.1 ln s + 1) stays near 1: nothing to read
            check_half_range(q.dtype, q_mag, k_mag)
        return rotate(q, q_ang, q_mag), rotate(k, k_ang, k_mag)

    def check_dtype(self, dtype: torch.dtype, positions: torch.Tensor, mask=None) -> None:
        """Refuse, naming `positions`, self-attention positions [B, T(, 1)] whose xPos factors
        would overflow `dtype` (float16) once q and k are scaled (`check_half_range`); the
        check of an attention's boundary, before its layers skip their own."""
        if not (self.xpos and dtype == torch.float16) or not _may_inspect_values(positions):
            return
        with float32_region(positions.device):
            pos = as_positions(positions, mask=mask, dims=1, validate=False)
            *_, q_mag, k_mag = self._extended(pos, pos, mask, mask, validate=False)
        check_half_range(dtype, q_mag, k_mag)

    def _check_call(self, q, k, positions, k_positions, generator) -> None:
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

    cacheable_rule = (
        "a rotary whose key rotation reads the key's own position only: no active augmentation, "
        "no xPos without xpos_center (else centred on each call's positions), no scaling "
        "without a fixed factor (else each call's span)"
    )

    @property
    def cacheable(self) -> bool:
        """Whether keys rotated in one call stay valid in later ones (a decoder's key/value
        cache): `cacheable_rule`."""
        per_call_xpos = self.xpos and self.xpos_center is None
        fixed_scaling = self.scaling is None or self.factor is not None
        return super().cacheable and not per_call_xpos and fixed_scaling

    def extra_repr(self) -> str:
        aug = "" if self.augmentation is None else f", augmentation={self.augmentation}"
        if self.scaling is not None:
            aug += f", scaling={self.scaling!r}, train_length={self.train_length}"
            aug += f", factor={self.factor}" if self.factor is not None else ""
            if self.scaling == "yarn":
                aug += f", yarn_alpha={self.yarn_alpha}, yarn_beta={self.yarn_beta}"
        if self.xpos:
            aug += f", xpos=True, xpos_scale_base={self.xpos_scale_base}"
            aug += "" if self.xpos_center is None else f", xpos_center={self.xpos_center}"
        fit = "" if self.fit_grid is None else f", fit_grid={self.fit_grid}"
        return (
            f"head_dim={self.head_dim}, pos_dim={self.pos_dim}, base={self.base}, "
            f"freq_scale={self.freq_scale}{fit}{aug}"
        )


# float16 holds up to 65504: a factor on q and k must leave room for their entries, taken to
# reach this magnitude (activations after a projection rarely do)
HALF_HEADROOM = 256.0


def check_half_range(dtype: torch.dtype, *magnitudes: torch.Tensor | None) -> None:
    """xPos's scales (times YaRN's temperature, with both) multiply q and k in float32 before
    the cast back to their dtype: in float16, the largest factor x `HALF_HEADROOM` must stay
    within 65504, or the cast gives inf. Refused by name (when values may be read)."""
    if dtype != torch.float16:
        return
    for mag in magnitudes:
        if mag is None or not mag.numel() or not _may_inspect_values(mag):
            continue
        top = float(mag.max())
        if top * HALF_HEADROOM > torch.finfo(torch.float16).max:
            raise ValueError(
                f"positions: xPos scales q and k by up to {top:.3g} over these positions; float16 "
                f"holds up to 65504, which leaves entries up to {65504 / top:.3g} (at least "
                f"{HALF_HEADROOM:g} needed): use bfloat16 or float32, a larger xpos_scale_base, "
                "or a shorter span"
            )


def _span(q: torch.Tensor, k: torch.Tensor, q_mask, k_mask) -> torch.Tensor:
    """The length q's and k's positions [B, T, 1] cover, per sample [B]: the larger of their
    spans (`position_span`: n steps of their spacing; one set in self-attention)."""
    if k is q:
        return position_span(q, q_mask)
    return torch.maximum(position_span(q, q_mask), position_span(k, k_mask))
