"""RoPE-ViT's 2-D rotary embeddings (Heo et al., ECCV 2024) over continuous image coordinates.

Axial and mixed frequencies (`cape.functional.rope2d`) in a `Rotary` that reads cape's (x, y)
patch coordinates, so CAPE's augmentation and any grid size apply as to `rotary2d` (whose
frequencies are CAPE's rotated 2-D ones). RoPE-ViT counts positions in patches: `fit_grid`
(the training grid) makes one patch of it the unit of the paper's frequencies. `pos_dim` > 2
takes the same rotations to M-D positions (ours: a box's 4 edges; `cape.functional.rope2d`).
"""

from __future__ import annotations

import torch
from torch import nn

from .._checks import check_choice, check_float, check_int
from ..augment import Augmentation
from ..functional.rope2d import axial_frequencies, mixed_angles, mixed_frequencies
from .grids import fit_grid_pair, sampling_of
from .rotary import Rotary

__all__ = ["RoPE2d"]

THETA = {"axial": 100.0, "mixed": 10.0}  # RoPE-ViT's theta per variant


class RoPE2d(Rotary):
    """2-D rotary with RoPE-ViT's frequencies: `RoPE2d(32, variant="mixed", heads=4)`.

    head_dim: hd (divisible by 4). variant: "axial" (half the rotation planes turn with x,
    half with y; fixed) or "mixed" (every plane turns with both axes along a direction drawn
    per head; the frequencies [H, 2, hd/2] are parameters, learned). heads: H (mixed only).
    theta: the frequencies' base (None: RoPE-ViT's, 100 axial, 10 mixed). fit_grid: (H, W)
    of the training grid: its patch spacing on cape's [-1, 1] coordinates is the unit of the
    per-patch frequencies (without it, frequencies are per unit of the positions given).
    augmentation: CAPE's `Augmentation` of the (x, y) positions, in train mode. pos_dim: M,
    the coordinates per position (2: x, y; more: e.g. a box's 4 edges, axial then needs hd
    divisible by 2M; no fit_grid).

    forward(q, k, positions=[B, T, M]) as `Rotary`; `angles()` is [B, H, T, hd/2] when mixed.
    `frequencies` is [M, n]: every frequency per axis (mixed: n = H hd/2, heads in turn).
    """

    per_head = False  # cape.build's dim is the head size; mixed also takes heads=

    def __init__(
        self,
        head_dim: int,
        *,
        variant: str = "axial",
        heads: int | None = None,
        theta: float | None = None,
        fit_grid: tuple[int, int] | None = None,
        augmentation: Augmentation | None = None,
        pos_dim: int = 2,
    ) -> None:
        super().__init__(head_dim, pos_dim=2, augmentation=augmentation)
        check_int("pos_dim", pos_dim, minimum=2)
        if fit_grid is not None and pos_dim != 2:
            raise ValueError(f"fit_grid applies to pos_dim=2 (a grid), got pos_dim={pos_dim}")
        # Rotary's own frequencies are 1-D or 2-D; ours come from `cape.functional.rope2d` for
        # any M, and every position check reads pos_dim
        self.pos_dim = pos_dim
        check_choice("variant", variant, tuple(THETA))
        if variant == "axial" and pos_dim > 2 and head_dim % (2 * pos_dim):
            raise ValueError(
                f"head_dim must be divisible by 2 x pos_dim = {2 * pos_dim} for variant='axial' "
                f"(hd/2 planes shared by the axes), got {head_dim}"
            )
        self.variant = variant
        self.theta = (
            THETA[variant]
            if theta is None
            else check_float("theta", theta, minimum=1.0, strict=True)
        )
        if variant == "mixed":
            if heads is None:
                raise ValueError("heads is required for variant='mixed' (frequencies per head)")
            self.heads: int | None = check_int("heads", heads)
        elif heads is not None:
            raise ValueError(f"heads applies to variant='mixed', got variant={variant!r}")
        else:
            self.heads = None
        self.fit_grid = fit_grid_pair(fit_grid, every_axis=True)
        spacing = (1.0,) * pos_dim if fit_grid is None else sampling_of(self, fit_grid)[0]
        if variant == "axial":
            with torch.device("cpu"):  # the float32 master, also under a meta device
                freqs = axial_frequencies(head_dim, theta=self.theta, spacing=spacing)
            self.register_float32("freqs", freqs)  # [M, hd/2]
        else:
            self.head_freqs = nn.Parameter(
                mixed_frequencies(head_dim, self.heads, theta=self.theta, spacing=spacing)
            )

    @property
    def frequencies(self) -> torch.Tensor:
        """[M, n] radians per unit of each axis, float32 on the CPU (mixed: [M, H hd/2])."""
        if self.variant == "axial":
            return super().frequencies
        w = self.head_freqs.detach().to(device="cpu", dtype=torch.float32)
        return w.permute(1, 0, 2).reshape(self.pos_dim, -1)

    def _angles(self, pos: torch.Tensor) -> torch.Tensor:
        if self.variant == "mixed":
            return mixed_angles(pos, self.head_freqs)  # [B, H, T, hd/2]
        return super()._angles(pos)  # over the axial [M, hd/2] frequencies

    def forward(self, q: torch.Tensor, k: torch.Tensor, **kwargs: object) -> tuple:
        """q: [B, H, Tq, hd], k: [B, H, Tk, hd] -> rotated (q, k): `Rotary.forward`."""
        if self.heads is not None:  # mixed: one set of frequencies per head
            for name, t in (("q", q), ("k", k)):
                if isinstance(t, torch.Tensor) and t.dim() == 4 and t.shape[1] != self.heads:
                    raise ValueError(
                        f"{name} must have {self.heads} heads (RoPE-Mixed's frequencies are per "
                        f"head), got shape {tuple(t.shape)}"
                    )
        return super().forward(q, k, **kwargs)  # type: ignore[arg-type]

    def extra_repr(self) -> str:
        heads = "" if self.heads is None else f", heads={self.heads}"
        heads += "" if self.pos_dim == 2 else f", pos_dim={self.pos_dim}"
        fit = "" if self.fit_grid is None else f", fit_grid={self.fit_grid}"
        aug = "" if self.augmentation is None else f", augmentation={self.augmentation}"
        return (
            f"head_dim={self.head_dim}, variant={self.variant!r}{heads}, theta={self.theta}"
            f"{fit}{aug}"
        )
