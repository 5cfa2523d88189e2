"""Rotary embeddings over continuous, optionally CAPE-augmented positions (CAPE sec. 6, [38]).

Rotating queries and keys makes attention logits depend on relative positions only; CAPE's
augmentation then perturbs those relative positions during training (local shift, global
scaling). A global shift moves q and k together and leaves the logits unchanged, so for rotary
it only matters through float32 precision.

Prepare once, apply per layer (`cape.encodings.in_attention`): `prepare(context)` turns one
call's positions into a `Rotation` (angles and magnitudes), `Rotation.apply(q, k)` rotates. The
frequencies are float32 buffers made once, in the constructor, with a fixed length extension
folded in; one that depends on the call (no fixed factor, transformers' dynamic types) scales
them in `prepare`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from .._checks import (
    check_choice,
    check_even,
    check_float,
    check_generator,
    check_int,
    check_phases,
    check_tensor,
    max_abs,
)
from ..augment import Augmentation, check_augmentation, mean_normalize
from ..functional.frequencies import grid_frequencies_2d
from ..functional.rope_scaling import longest_position, pair_span
from ..functional.sinusoidal import cape2d_frequencies, sinusoid_frequencies
from ..positions import as_positions, column_positions, token_positions
from .base import float32_region
from .extension import check_extension, check_half_range, xpos_scales
from .grids import GridLayout, fit_grid_pair, max_scaling_of, sampling_of
from .in_attention import PositionContext, QKTransform
from .rotation import rotate

__all__ = ["Rotary", "Rotation"]


@dataclasses.dataclass(frozen=True)
class Rotation:
    """One call's rotation, prepared once and applied in every layer.

    q_angles / k_angles: [B or 1, Tq / Tk, hd/2] float32 (per head: [B or 1, H, T, hd/2]).
    q_scale / k_scale: [B or 1, 1, T or 1, hd] float32 magnitudes (xPos, an attention factor),
    None = 1."""

    q_angles: torch.Tensor
    k_angles: torch.Tensor
    q_scale: torch.Tensor | None = None
    k_scale: torch.Tensor | None = None

    def apply(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [B, H, Tq, hd], k [B, H, Tk, hd] -> rotated (and scaled), in their dtypes."""
        return rotate(q, self.q_angles, self.q_scale), rotate(k, self.k_angles, self.k_scale)


class Rotary(GridLayout, QKTransform):
    """Rotates queries and keys by angles of (augmented) positions; no parameters.

    head_dim: hd, channels per head (even). pos_dim: 1 (tokens, seconds) or 2 (x, y: CAPE's
    rotated 2D frequencies). base, freq_scale: 1D frequencies freq_scale * base^(-2c/hd)
    (freq_scale = 30 for seconds); in 2D freq_scale multiplies CAPE's 2D frequencies.
    augmentation: CAPE's `Augmentation`, applied in train mode (normalisation also in eval).
    fit_grid (pos_dim 2): (H, W) of the training grid: 2D frequencies fitted to it (as
    `CAPE2d(fit_grid=...)`, through the augmentation's max_global_scaling) instead of the paper's.

    Longer than training (pos_dim 1): scaling, a name of the rope-scaling registry
    (`cape.functional.rope_registry`: "pi", "ntk", "yarn" (the paper's), "yarn-hf",
    "dynamic", "longrope", "llama3", or one registered by the user), with `factor`,
    `train_length` (in the positions' units: tokens, seconds) and the scaling's own options in
    `scaling_options` (yarn_alpha / yarn_beta are the paper's YaRN ramp, in turns over
    train_length). "pi", "ntk" and "yarn" without a fixed `factor` take per call and per sample
    s = max(1, L / train_length), L the length the valid positions cover (n steps of their
    mean spacing, the larger of q's and k's, augmented in training): T for token indices
    0..T-1, T x hop for frames in seconds, whatever the padding. The attention factor of YaRN
    (0.1 ln s + 1) or LongRoPE multiplies q and k.
    xpos: xPos (causal / relative use: logits scale by zeta^((n - m) / xpos_scale_base), which
    decays for n > m and blows up for n < m): q * zeta^((n - n0)/B), k * zeta^(-(m - n0)/B),
    n0 = floor((min + max + 1)/2) of the valid positions, or `xpos_center` if given (a common
    offset, it cancels in logits). With "pi", xPos reads the interpolated positions (as
    rotary-embedding-torch does). A key/value cache needs a fixed scaling and `xpos_center`
    (`cacheable`).

    It acts inside attention (the q/k protocol, `cape.encodings.in_attention`:
    `MultiheadAttention(rotary=...)`); having no parameters, one module serves every layer of
    a stack. `dim` of `cape.build` is the head size. `grid_positions(H, W)` are the continuous
    (x, y) a 2-D rotary reads.
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
        scaling_options: Mapping[str, Any] | None = None,
        xpos: bool = False,
        xpos_scale_base: float = 512.0,
        xpos_center: float | None = None,
    ) -> None:
        super().__init__(augmentation)
        self.head_dim = check_even("head_dim", head_dim)
        check_int("pos_dim", pos_dim)
        check_choice("pos_dim", pos_dim, (1, 2))
        self.pos_dim = pos_dim
        check_augmentation(augmentation, pos_dim=pos_dim)
        self.base = check_float("base", base, minimum=1.0, strict=True)
        self.freq_scale = check_float("freq_scale", freq_scale, strict=True)
        self.fit_grid = fit_grid_pair(fit_grid)
        if fit_grid is not None:
            if pos_dim != 2:
                raise ValueError(f"fit_grid applies to pos_dim=2 (a grid), got pos_dim={pos_dim}")
            if freq_scale != 1.0:
                raise ValueError("give freq_scale or fit_grid, not both (fit_grid sets the range)")
        with torch.device("cpu"):  # the float32 masters, also under `with torch.device("meta")`
            freqs = self._base_frequencies(augmentation)
        self.register_float32("freqs", freqs)  # [M, hd/2], radians per unit
        ext = check_extension(
            head_dim=self.head_dim, pos_dim=pos_dim, base=self.base, scaling=scaling,
            train_length=train_length, factor=factor, scaling_options=scaling_options,
            yarn_alpha=yarn_alpha, yarn_beta=yarn_beta, xpos=xpos,
            xpos_scale_base=xpos_scale_base, xpos_center=xpos_center,
        )  # fmt: skip
        self.extension = ext
        self.scaling, self.xpos = ext.scaling, ext.xpos
        self.train_length, self.factor = ext.options.get("train_length"), ext.fixed
        self.yarn_alpha = ext.options.get("yarn_alpha", check_float("yarn_alpha", yarn_alpha))
        self.yarn_beta = ext.options.get("yarn_beta", yarn_beta)
        self.xpos_scale_base, self.xpos_center = ext.xpos_scale_base, ext.xpos_center
        self._fixed_scale: float | None = None
        if ext.rule is not None and ext.fixed is not None:  # one table for every call
            with torch.device("cpu"):
                s = torch.full((1, 1), ext.fixed)
                scaled = ext.rule.frequencies(freqs[0], s, ext.options)
                factor_of = ext.rule.attention_factor(s[:, 0], ext.options)
            self.register_float32("scaled_freqs", scaled)
            self._fixed_scale = None if factor_of is None else float(factor_of[0])

    def _base_frequencies(self, augmentation: Augmentation | None) -> torch.Tensor:
        """[M, hd/2] radians per unit: fitted to `fit_grid`, CAPE's 2-D ones, or 1-D."""
        if self.fit_grid is not None:
            spacing, span = sampling_of(self, self.fit_grid)
            return grid_frequencies_2d(
                self.head_dim, spacing, span, max_scaling=max_scaling_of(augmentation)
            )
        if self.pos_dim == 1:
            return sinusoid_frequencies(self.head_dim, base=self.base, freq_scale=self.freq_scale)[
                None
            ]
        return cape2d_frequencies(self.head_dim, freq_scale=self.freq_scale)

    @property
    def frequencies(self) -> torch.Tensor:
        """The angular frequencies [M, head_dim/2] (radians per unit) before any length
        extension, float32 on the CPU."""
        return self._float32_masters["freqs"]

    # -- prepare ---------------------------------------------------------------------------
    def _angles(self, pos: torch.Tensor) -> torch.Tensor:
        """Positions [B, T, M] float32 -> angles [B, T, hd/2]: sum_m p_m w_m."""
        w = self.freqs
        angles = pos[..., 0:1] * w[0]
        for m in range(1, w.shape[0]):
            angles = angles + pos[..., m : m + 1] * w[m]
        return angles

    def _positions(self, context: PositionContext) -> tuple:
        """The call's float32 positions (q, k, q_mask, k_mask), augmented when this module
        draws; token indices by default, one row shared by the batch unless padding or a
        random draw (`drawing`) makes the rows differ."""
        c = context
        aug = None if c.augmented else self.augmentation
        qp, mask = c.q_positions, c.mask
        if qp is None:
            draws = aug is not None and self.drawing
            shared = mask is None and not draws and c.self_attention
            qp = token_positions(1 if shared else c.batch, c.q_len, mask=mask, device=c.device)
        q = column_positions(qp, mask)
        if c.self_attention:
            if aug is not None:
                q = aug(q, mask, training=self.training, generator=c.generator)
            return q, q, mask, mask
        k_mask = c.k_mask
        kp = c.k_positions
        if kp is None:
            kp = token_positions(c.batch, c.k_len, mask=k_mask, device=c.device)
        k = column_positions(kp, k_mask)
        if aug is not None:
            if aug.normalize and k.shape[1]:  # the keys' mean, subtracted from both sides
                offset = k - mean_normalize(k, k_mask)
                q, k = q - offset[:, :1], k - offset[:, :1]
            q, k = aug.pair(q, k, mask, k_mask, training=self.training, generator=c.generator)
        return q, k, mask, k_mask

    def prepare(self, context: PositionContext) -> Rotation:
        """The `Rotation` of one call's positions: angles and magnitudes of q and k, with the
        length extension and xPos (class docstring); the phases checked once here."""
        with float32_region(context.device):
            q, k, q_mask, k_mask = self._positions(context)
            self._check_phases(q, k)
            rotation = self._rotation(q, k, q_mask, k_mask)
        if self.xpos:  # YaRN's temperature alone (0.1 ln s + 1) stays near 1: nothing to read
            check_half_range(context.dtype, rotation.q_scale, rotation.k_scale)
        return rotation

    def _check_phases(self, q: torch.Tensor, k: torch.Tensor) -> None:
        def bound() -> torch.Tensor:  # per axis, the largest |frequency|; read when checking
            return max_abs(self.frequencies.t())

        check_phases("positions", q, bound)
        if k is not q:
            check_phases("k_positions", k, bound)

    def _rotation(self, q, k, q_mask, k_mask) -> Rotation:
        """Positions [B, T, M] of q and k -> their `Rotation` (class docstring)."""
        ext, self_attention = self.extension, k is q
        s = None
        if ext.rule is None:
            q_ang = self._angles(q)
            k_ang = q_ang if self_attention else self._angles(k)
        elif ext.fixed is not None:
            w = self.scaled_freqs[0]
            q_ang, k_ang = q * w, (q * w if self_attention else k * w)
            s = torch.full((1,), ext.fixed, device=q.device)
        else:
            span = pair_span(q, k, q_mask, k_mask)
            s = ext.rule.call_value(span, longest_position(q, k, q_mask, k_mask), ext.options)
            w = ext.rule.frequencies(self.freqs[0], s[:, None], ext.options)[:, None]
            q_ang, k_ang = q * w, (q * w if self_attention else k * w)
        q_mag = k_mag = self._attention_factor(s)
        if self.xpos:
            # the module's centre: a decoding loop may set one for its cache (`centred_xpos`)
            center = self.xpos_center
            qs, ks = xpos_scales(self.extension, self.head_dim, q, k, q_mask, k_mask, s, center)
            q_mag = qs if q_mag is None else q_mag * qs
            k_mag = ks if k_mag is None else k_mag * ks
        return Rotation(q_ang, k_ang, q_mag, k_mag)

    def _attention_factor(self, s: torch.Tensor | None) -> torch.Tensor | None:
        ext = self.extension
        if s is None or ext.rule is None:
            return None
        if ext.fixed is not None:
            value = self._fixed_scale
            return None if value is None else torch.full((1, 1, 1, 1), value, device=s.device)
        factor = ext.rule.attention_factor(s, ext.options)
        return None if factor is None else factor[:, None, None, None]

    # -- public calls ----------------------------------------------------------------------
    def _context(self, positions, k_positions, mask, k_mask, generator, batch, tq, tk, device,
                 dtype=torch.float32) -> PositionContext:  # fmt: skip
        """A context of one direct call, its positions checked here."""
        check_generator("generator", generator)
        q = None if positions is None else as_positions(positions, mask=mask, dims=self.pos_dim)
        k = None
        if k_positions is not None:
            k = as_positions(
                k_positions, mask=k_mask, dims=self.pos_dim, name="k_positions",
                mask_name="k_mask",
            )  # fmt: skip
        return PositionContext(
            batch, tq, tk, torch.device(device), q, k, self_attention=k_positions is None,
            mask=mask, k_mask=k_mask, generator=generator, dtype=dtype,
        )  # fmt: skip

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
        check_tensor("positions", positions, ndims=(2, 3))
        b, t = positions.shape[:2]
        ctx = self._context(positions, None, mask, None, generator, b, t, t, positions.device)
        return self.prepare(ctx).q_angles

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
        check_tensor("positions", positions, ndims=(2, 3))
        check_tensor("k_positions", k_positions, ndims=(2, 3))
        b, tq, tk = positions.shape[0], positions.shape[1], k_positions.shape[1]
        ctx = self._context(positions, k_positions, mask, k_mask, generator, b, tq, tk,
                            positions.device)  # fmt: skip
        rotation = self.prepare(ctx)
        return rotation.q_angles, rotation.k_angles

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
        self._check_call(q, k, positions, k_positions)
        batch, tq, tk = q.shape[0], q.shape[2], k.shape[2]
        if positions is None:
            if self.pos_dim != 1:
                raise ValueError("positions are required for pos_dim=2 (x, y per token)")
            if k_positions is not None:
                raise ValueError("give positions too when giving k_positions")
            if mask is not None:
                check_tensor("mask", mask, ndims=(2,))
        if k_positions is None and tq != tk:
            raise ValueError(
                f"k_positions is required when Tq ({tq}) != Tk ({tk}); "
                "without it q and k share the same positions"
            )
        ctx = self._context(positions, k_positions, mask, k_mask, generator, batch, tq, tk,
                            q.device, q.dtype)  # fmt: skip
        return self.prepare(ctx).apply(q, k)

    def _check_call(self, q, k, positions, k_positions) -> None:
        for name, t in (("q", q), ("k", k)):
            check_tensor(name, t, ndims=(4,), floating=True)
            if t.dim() != 4 or t.shape[-1] != self.head_dim:
                raise ValueError(
                    f"{name} must have shape [B, H, T, {self.head_dim}], got {tuple(t.shape)}"
                )
        for name, p in (("positions", positions), ("k_positions", k_positions)):
            if p is not None:  # values and M are checked with the context
                check_tensor(name, p, ndims=(2, 3))

    cacheable_rule = (
        "a rotary whose key rotation reads the key's own position only: no active augmentation, "
        "no xPos without xpos_center (else centred on each call's positions), no scaling "
        "without a fixed factor (else each call's span or length)"
    )

    @property
    def cacheable(self) -> bool:
        """Whether keys rotated in one call stay valid in later ones (a decoder's key/value
        cache): `cacheable_rule`."""
        per_call_xpos = self.xpos and self.xpos_center is None
        return super().cacheable and not per_call_xpos and not self.extension.per_call

    def extra_repr(self) -> str:
        aug = "" if self.augmentation is None else f", augmentation={self.augmentation}"
        ext = self.extension
        if self.scaling is not None:
            shown = {k: v for k, v in ext.options.items() if k not in ("base", "head_dim")}
            aug += f", scaling={self.scaling!r}, " + ", ".join(f"{k}={v}" for k, v in shown.items())
        if self.xpos:
            aug += f", xpos=True, xpos_scale_base={self.xpos_scale_base}"
            aug += "" if self.xpos_center is None else f", xpos_center={self.xpos_center}"
        fit = "" if self.fit_grid is None else f", fit_grid={self.fit_grid}"
        return (
            f"head_dim={self.head_dim}, pos_dim={self.pos_dim}, base={self.base}, "
            f"freq_scale={self.freq_scale}{fit}{aug}"
        )
