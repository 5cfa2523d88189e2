"""Learnable Fourier features + MLP (Li et al. 2021) as an absolute encoding module.

A thin wrapper over `cape.functional.fourier`: it holds W_r and the MLP, accepts grouped
positions `[B, T, G*M]` or `[B, T, G, M]`, and inherits CAPE's augmentation, padding, float32
maths and the cast to the content dtype from `PositionalEncoding`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .._checks import check_float, check_int
from ..augment import Augmentation
from ..functional.fourier import learnable_fourier_features
from .base import PositionalEncoding

__all__ = ["LearnableFourierFeatures"]


class LearnableFourierFeatures(PositionalEncoding):
    """Algorithm 1: PE = GeLU(r_x W1 + B1) W2 + B2 per group of M coordinates, groups concatenated.

    dim: D, divisible by `groups`. pos_dim: M, coordinates per group. groups: G (the paper's
    4-D boxes: G=1 M=4 is "1/4", G=2 M=2 "2/2", G=4 M=1 "4/1"). fourier_dim: F (even), hidden_dim:
    H. gamma: W_r ~ N(0, gamma^-2), i.e. std 1/gamma. learnable=False keeps W_r fixed (a
    buffer, saved in the state_dict: "Fixed-Fourier + MLP"). fourier=False is "MLP only" (the
    MLP reads raw positions); mlp=False is "Learnable-Fourier" alone and needs F = D / G.
    augmentation: CAPE's augmentation of the flattened positions [B, T, G*M].

    `self.pos_dim` is G*M, the width of the flattened positions; `self.group_dim` is M.
    forward(x: [B, T, D] | None, *, positions: [B, T, G*M] or [B, T, G, M], lengths, mask,
    generator) -> [B, T, D] in x's dtype (float32 without x). Positions are required.
    """

    def __init__(
        self,
        dim: int,
        pos_dim: int = 2,
        *,
        groups: int = 1,
        fourier_dim: int = 384,
        hidden_dim: int = 32,
        gamma: float = 1.0,
        learnable: bool = True,
        mlp: bool = True,
        fourier: bool = True,
        augmentation: Augmentation | None = None,
    ) -> None:
        check_int("dim", dim)
        check_int("pos_dim", pos_dim)
        check_int("groups", groups)
        if dim % groups:
            raise ValueError(f"dim must be divisible by groups, got dim={dim}, groups={groups}")
        for name, flag in (("learnable", learnable), ("mlp", mlp), ("fourier", fourier)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {flag!r}")
        if not (mlp or fourier):
            raise ValueError("mlp and fourier cannot both be False: nothing would encode positions")
        if fourier:
            check_int("fourier_dim", fourier_dim)
            if fourier_dim % 2:
                raise ValueError(
                    f"fourier_dim must be even ([cos || sin] pairs), got {fourier_dim}"
                )
        if not mlp and fourier_dim != dim // groups:
            raise ValueError(
                f"fourier_dim must equal dim / groups = {dim // groups} when mlp=False "
                f"(the features are the output), got {fourier_dim}"
            )
        if mlp:
            check_int("hidden_dim", hidden_dim)
        super().__init__(dim, groups * pos_dim, augmentation)
        self.group_dim = pos_dim
        self.groups = groups
        self.fourier_dim = fourier_dim if fourier else 0
        self.hidden_dim = hidden_dim if mlp else 0
        self.gamma = check_float("gamma", gamma, strict=True)
        self.learnable = learnable
        self.mlp = mlp
        self.fourier = fourier

        self.w_r: torch.Tensor | None
        if fourier:
            w_r = torch.empty(fourier_dim // 2, pos_dim)
            if learnable:
                self.w_r = nn.Parameter(w_r)
            else:  # persistent: a fixed random draw must survive a checkpoint round trip
                self.register_buffer("w_r", w_r)
        else:
            self.w_r = None
        if mlp:
            in_dim = fourier_dim if fourier else pos_dim
            self.w1 = nn.Parameter(torch.empty(in_dim, hidden_dim))
            self.b1 = nn.Parameter(torch.empty(hidden_dim))
            self.w2 = nn.Parameter(torch.empty(hidden_dim, dim // groups))
            self.b2 = nn.Parameter(torch.empty(dim // groups))
        else:
            self.w1 = self.b1 = self.w2 = self.b2 = None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """W_r ~ N(0, gamma^-2) (std 1/gamma, Eq. 4); MLP layers as nn.Linear:
        U(+-1/sqrt(fan_in))."""
        if self.w_r is not None:
            self.w_r.normal_(0.0, 1.0 / self.gamma, generator=generator)
        if self.mlp:
            for w, b in ((self.w1, self.b1), (self.w2, self.b2)):
                bound = 1.0 / math.sqrt(w.shape[0])
                w.uniform_(-bound, bound, generator=generator)
                b.uniform_(-bound, bound, generator=generator)

    def read_positions(self, positions: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """positions: [B, T, G*M] or [B, T, G, M] -> [B, T, G*M] (`forward` checks them next)."""
        if isinstance(positions, torch.Tensor) and positions.dim() == 4:
            if tuple(positions.shape[2:]) != (self.groups, self.group_dim):
                raise ValueError(
                    f"positions must have shape [B, T, G={self.groups}, M={self.group_dim}] "
                    f"or [B, T, {self.pos_dim}], got {tuple(positions.shape)}"
                )
            positions = positions.flatten(2)
        return positions

    def embed(self, positions: torch.Tensor) -> torch.Tensor:
        """positions: [B, T, G*M] float32 -> [B, T, D] float32 (parameters used in float32)."""
        grouped = positions.unflatten(-1, (self.groups, self.group_dim))
        return learnable_fourier_features(
            grouped, self.w_r, self.w1, self.b1, self.w2, self.b2, mlp=self.mlp
        )

    def extra_repr(self) -> str:
        kind = ("learnable" if self.learnable else "fixed") + "-fourier" if self.fourier else ""
        kind = "+".join(k for k in (kind, "mlp" if self.mlp else "") if k)
        return (
            super().extra_repr() + f", groups={self.groups}, group_dim={self.group_dim}, {kind}, "
            f"fourier_dim={self.fourier_dim}, hidden_dim={self.hidden_dim}, gamma={self.gamma}"
        )
