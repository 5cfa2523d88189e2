"""Learnable Fourier features (Li et al. 2021): pure float32 functions.

`fourier_features` is Eq. 2 / Algorithm 1 line 1, `learnable_fourier_features` the whole of
Algorithm 1 (Fourier features -> GeLU MLP per group, groups concatenated) and `lff_kernel` the
exact kernel that the features' dot product estimates at initialisation.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .._checks import (
    LIMIT,
    _may_inspect_values,
    check_bool,
    check_float,
    check_limit,
    check_phases,
    check_real,
    check_tensor,
    max_abs,
)
from .sinusoidal import cos_sin

__all__ = ["fourier_features", "lff_kernel", "learnable_fourier_features"]


def fourier_features(positions: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """r_x = (1/sqrt(F)) [cos(x W_r^T) || sin(x W_r^T)] (Eq. 2, Algorithm 1 line 1).

    positions: [..., M] real, weight W_r: [F/2, M] -> [..., F] float32.
    r_x . r_y = (1/F) sum_k cos(w_k . (x - y)) depends on x - y only (Eq. 3), and r_x . r_x = 1/2.
    """
    check_tensor("weight", weight, ndims=(2,), floating=True)
    axes = weight.shape[1]
    _check_real("positions", positions)
    if positions.dim() < 1 or positions.shape[-1] != axes:
        raise ValueError(
            f"positions must end with M = {axes} coordinates (weight is {tuple(weight.shape)}), "
            f"got {tuple(positions.shape)}"
        )
    pos = positions.to(torch.float32)
    w = weight.to(torch.float32)
    if _may_inspect_values(w):
        check_phases("positions", positions, max_abs(w), " (the largest |W_r| per axis)")
    if _may_inspect_values(positions) and float(max_abs(positions).max()) > LIMIT:
        # with W_r = 0 the phases pass, but float32 positions would be inf (inf x 0 = NaN)
        raise ValueError(f"positions must lie within +-{LIMIT:.0e} (float32 maths)")
    # One multiply-add per axis rather than a matmul: M is tiny, and an accelerator's matmul
    # may round the phases to TF32 (10 mantissa bits), far too coarse for large positions.
    phase = pos[..., 0:1] * w[:, 0]
    for m in range(1, axes):
        phase = phase + pos[..., m : m + 1] * w[:, m]
    return cos_sin(phase) * (1.0 / math.sqrt(2 * w.shape[0]))


def lff_kernel(distance_sq: torch.Tensor | float, gamma: float) -> torch.Tensor:
    """E[r_x . r_y] at initialisation = 1/2 exp(-||x - y||^2 / (2 gamma^2)), as float32.

    distance_sq: ||x - y||^2 (a float or a tensor of any shape). gamma > 0.

    Derivation. With F features, r_x . r_y = (1/F) sum_{k=1}^{F/2} [cos a_k cos b_k +
    sin a_k sin b_k] = (1/F) sum_{k=1}^{F/2} cos(w_k . d), where a_k = w_k . x, b_k = w_k . y and
    d = x - y. Each row w_k ~ N(0, gamma^-2 I) (variance gamma^-2, std 1/gamma), so w_k . d ~
    N(0, s^2) with s^2 = ||d||^2 / gamma^2, and E[cos Z] = Re E[exp(iZ)] = exp(-s^2 / 2) for
    Z ~ N(0, s^2) (the normal characteristic function). Hence
        E[r_x . r_y] = (1/F) (F/2) exp(-||d||^2 / (2 gamma^2)) = 1/2 exp(-||d||^2 / (2 gamma^2)).
    The paper's Eq. 5, exp(-||d||^2 / gamma^2), drops both the 1/2 (from the 1/sqrt(F) scale
    over F/2 frequencies) and the 2 in the exponent. The Monte Carlo variance of the estimate is
    Var[cos(w . d)] / (2F) with Var[cos(w . d)] = (1 + exp(-2 ||d||^2 / gamma^2)) / 2
    - exp(-||d||^2 / gamma^2).
    """
    gamma = check_float("gamma", gamma, strict=True)
    if not 1e-19 <= gamma <= 1e19:  # 2 gamma^2 must be a normal float32
        raise ValueError(f"gamma must lie in [1e-19, 1e19], got {gamma}")
    if isinstance(distance_sq, torch.Tensor):
        _check_real("distance_sq", distance_sq)
    elif isinstance(distance_sq, bool) or not isinstance(distance_sq, (int, float)):
        raise TypeError(
            f"distance_sq must be a float or a tensor, got {type(distance_sq).__name__}"
        )
    d2 = torch.as_tensor(distance_sq, dtype=torch.float32)
    if _may_inspect_values(d2) and bool((d2 < 0).any()):
        raise ValueError("distance_sq must be >= 0 (a squared distance)")
    return 0.5 * torch.exp(-d2 / (2.0 * gamma**2))


def _check_real(name: str, t: object) -> None:
    check_real(name, t, ndims=range(9))


def _check_mlp(
    in_dim: int,
    w1: torch.Tensor | None,
    b1: torch.Tensor | None,
    w2: torch.Tensor | None,
    b2: torch.Tensor | None,
) -> None:
    for name, t in (("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2)):
        if t is None:
            raise ValueError(f"{name} is required when mlp=True")
        check_tensor(name, t, ndims=(1, 2), floating=True)
    assert w1 is not None and b1 is not None and w2 is not None and b2 is not None
    if w1.dim() != 2 or w1.shape[0] != in_dim:
        raise ValueError(f"w1 must have shape [F_in={in_dim}, H], got {tuple(w1.shape)}")
    hidden = w1.shape[1]
    if tuple(b1.shape) != (hidden,):
        raise ValueError(f"b1 must have shape [H={hidden}], got {tuple(b1.shape)}")
    if w2.dim() != 2 or w2.shape[0] != hidden:
        raise ValueError(f"w2 must have shape [H={hidden}, D/G], got {tuple(w2.shape)}")
    if tuple(b2.shape) != (w2.shape[1],):
        raise ValueError(f"b2 must have shape [D/G={w2.shape[1]}], got {tuple(b2.shape)}")


def learnable_fourier_features(
    positions: torch.Tensor,
    weight: torch.Tensor | None,
    w1: torch.Tensor | None = None,
    b1: torch.Tensor | None = None,
    w2: torch.Tensor | None = None,
    b2: torch.Tensor | None = None,
    *,
    mlp: bool = True,
) -> torch.Tensor:
    """Algorithm 1. positions: [..., G, M] -> PE: [..., D] float32.

    weight W_r: [F/2, M], or None for "MLP only" (the MLP reads the raw positions, F_in = M).
    w1: [F_in, H], b1: [H], w2: [H, D/G], b2: [D/G]: Y = GeLU(r W1 + B1) W2 + B2 (exact erf
    GeLU), the same weights for every group. mlp=False is "Fourier only": each group yields its
    F features (w1..b2 must then be None) and D = G F. The G group outputs are concatenated in
    group order (line 3: reshape [..., G, D/G] -> [..., D]). Parameters of any dtype are used in
    float32.
    """
    _check_real("positions", positions)
    check_bool("mlp", mlp)
    if positions.dim() < 2:
        raise ValueError(f"positions must have shape [..., G, M], got {tuple(positions.shape)}")
    if weight is None and not mlp:
        raise ValueError("weight=None (MLP only) needs mlp=True: one of the two stages must run")
    feats = positions.to(torch.float32) if weight is None else fourier_features(positions, weight)
    if weight is None:
        _check_mlp(feats.shape[-1], w1, b1, w2, b2)
        _check_mlp_reach(feats, w1, b1, w2, b2)  # type: ignore[arg-type]
    if not mlp:
        if any(t is not None for t in (w1, b1, w2, b2)):
            raise ValueError("w1, b1, w2, b2 must be None when mlp=False (Fourier only)")
        return feats.flatten(-2)
    _check_mlp(feats.shape[-1], w1, b1, w2, b2)
    assert w1 is not None and b1 is not None and w2 is not None and b2 is not None
    f32 = torch.float32
    hidden = F.gelu(torch.matmul(feats, w1.to(f32)) + b1.to(f32))
    out = torch.matmul(hidden, w2.to(f32)) + b2.to(f32)
    return out.flatten(-2)


def _check_mlp_reach(
    pos: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor
) -> None:
    """MLP only: raw positions through the MLP must stay finite in float32 (a bound from
    max |p|, |W1|, |B1|, |W2|, |B2|; CPU only)."""
    if not (_may_inspect_values(pos) and _may_inspect_values(w1) and pos.numel()):
        return
    f64 = torch.float64
    hidden = max_abs(pos.flatten(0, -2)) @ w1.detach().abs().to(f64) + b1.detach().abs().to(f64)
    reach = float((hidden @ w2.detach().abs().to(f64) + b2.detach().abs().to(f64)).max())
    check_limit("positions", reach, " once through the MLP (|p| |W1| ... bound)")
