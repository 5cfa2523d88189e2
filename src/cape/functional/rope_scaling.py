"""Rotary beyond the training length: position interpolation, NTK-aware, YaRN, and xPos.

Each method turns the 1-D rotary frequencies omega_c = freq_scale * base^(-2c/hd) (channel c
pairs with c + hd/2, `apply_rotary`'s half layout) into smaller ones, given the extension
factor s >= 1 (s = 1 leaves them as they are):

- "pi", position interpolation (Chen et al. 2023, arXiv 2306.15595): omega_c / s, i.e. the
  positions divided by s.
- "ntk", NTK-aware (bloc97 2023; YaRN paper sec. 3.1, Code Llama): base' = base s^(hd/(hd-2)),
  so omega'_c = omega_c s^(-2c/(hd-2)): c = 0 is kept, the lowest frequency is divided by s.
- "yarn", NTK-by-parts (Peng et al. 2023, arXiv 2309.00071, sec. 3.2-3.4): with the wavelength
  lambda_c = 2 pi / omega_c and r_c = L_train / lambda_c, the ramp gamma(r) = 0 below alpha, 1
  above beta, linear between; omega'_c = (1 - gamma) omega_c / s + gamma omega_c. Plus the
  attention temperature sqrt(1/t) = 0.1 ln s + 1 (`yarn_temperature`).

xPos (Sun et al. 2022, arXiv 2212.10554) multiplies q by zeta_c^(n/scale_base) and k by
zeta_c^(-m/scale_base), zeta_c = (2c/hd + 0.4) / 1.4, so that logits decay as zeta^((n-m)/B).
Tensors here are float32 (factors, frequencies, scales); scalar closed forms are float64.
"""

from __future__ import annotations

import math

import torch

from .._checks import (
    LIMIT,
    _may_inspect_values,
    check_choice,
    check_even,
    check_float,
    check_mask,
    check_real,
    check_tensor,
    max_abs,
)

__all__ = [
    "ntk_base",
    "position_range",
    "position_span",
    "position_midpoint",
    "extension_factor",
    "scaled_frequencies",
    "yarn_temperature",
    "xpos_zeta",
    "xpos_scale",
    "joint_mask",
    "pair_span",
    "longest_position",
]

METHODS = ("pi", "ntk", "yarn")
XPOS_GAMMA = 0.4  # the paper's gamma (sec. 3.2), as in torchscale and rotary-embedding-torch
# zeta^x must stay a normal float32 both ways (q gets zeta^x, k zeta^-x): |x ln zeta| <= 80
XPOS_MAX_EXPONENT = 80.0


def ntk_base(base: float, factor: float, head_dim: int) -> float:
    """NTK-aware base' = base * factor^(hd / (hd - 2)) (needs head_dim >= 4)."""
    check_even("head_dim", head_dim)
    if head_dim < 4:
        raise ValueError(f"head_dim must be >= 4 for NTK scaling (hd - 2 > 0), got {head_dim}")
    check_float("base", base, minimum=1.0, strict=True)
    check_float("factor", factor, minimum=1.0)
    return base * factor ** (head_dim / (head_dim - 2))


def _check_positions(positions: object, mask: object = None) -> None:
    """1-D positions [B, T, 1] within float32's range at valid tokens; mask None or [B, T]."""
    check_real("positions", positions, ndims=(3,))
    assert isinstance(positions, torch.Tensor)
    if positions.shape[-1] != 1:
        raise ValueError(f"positions must be 1-D, [B, T, 1], got {tuple(positions.shape)}")
    if mask is not None:
        mask = check_mask("mask", mask, positions.shape[:2])
    if _may_inspect_values(positions) and positions.numel():
        reach = float(max_abs(positions, mask).max())
        if reach > LIMIT:
            raise ValueError(
                f"positions must be at most {LIMIT:.0e} in magnitude (float32 maths), got {reach:g}"
            )


def _check_factor(factor: object) -> None:
    """A tensor factor: real, [] or [B], every entry finite and >= 1 (checked on the CPU)."""
    check_real("factor", factor, ndims=(0, 1))
    assert isinstance(factor, torch.Tensor)
    if _may_inspect_values(factor):
        f = factor.to(torch.float64)
        if not bool((torch.isfinite(f) & (f >= 1)).all()):
            raise ValueError(f"factor must be finite and >= 1 everywhere, got {factor.tolist()}")


def position_range(
    positions: torch.Tensor, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """positions: [B, T, 1], mask: [B, T] bool -> (min, max, any valid) over the valid
    positions, each [B] (min/max are +-inf where a sample has none). No host sync on an
    accelerator (the checks of values run on the CPU only)."""
    _check_positions(positions, mask)
    b, t = positions.shape[:2]
    if t == 0:
        inf = positions.new_full((b,), math.inf, dtype=torch.float32)
        return inf, -inf, torch.zeros(b, dtype=torch.bool, device=positions.device)
    p = positions[..., 0].to(torch.float32)
    valid = torch.ones_like(p, dtype=torch.bool) if mask is None else mask
    hi = torch.where(valid, p, -math.inf).amax(dim=1)
    lo = torch.where(valid, p, math.inf).amin(dim=1)
    return lo, hi, valid.any(dim=1)


def position_span(positions: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """positions: [B, T, 1], mask: [B, T] bool -> [B] float32: the length the n valid positions
    cover, n steps of their mean spacing, (max - min) n / (n - 1): T for token indices 0..T-1,
    T x hop for frames at `hop` seconds (in the positions' own unit, as `train_length`); 0 where
    a sample has fewer than two (no spacing to read: any extension factor is then 1)."""
    lo, hi, _ = position_range(positions, mask)
    valid = positions.new_ones(positions.shape[:2], dtype=torch.bool) if mask is None else mask
    n = valid.sum(dim=1).to(torch.float32)
    two = n >= 2
    steps = torch.where(two, n / (n - 1).clamp(min=1.0), 0.0)
    width = torch.where(two, hi / 2 - lo / 2, 0.0)  # halves: no overflow near float32's limit
    return (width * steps * 2).clamp(max=LIMIT)


def position_midpoint(positions: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """floor((min + max + 1) / 2) over the valid positions -> [B] float32 (T // 2 for token
    indices 0..T-1, rotary-embedding-torch's xPos offset), 0 where a sample has none."""
    lo, hi, any_valid = position_range(positions, mask)
    return torch.where(any_valid, torch.floor(lo / 2 + hi / 2 + 0.5), 0.0)


def extension_factor(length: torch.Tensor, train_length: float) -> torch.Tensor:
    """s = max(1, length / train_length) per sample -> float32 (length: [B], e.g. a span)."""
    check_real("length", length, ndims=(1,))
    check_float("train_length", train_length, strict=True)
    return (length.to(torch.float32) / train_length).clamp(min=1.0, max=LIMIT)


def scaled_frequencies(
    omega: torch.Tensor,
    factor: torch.Tensor | float,
    method: str,
    *,
    train_length: float | None = None,
    alpha: float = 1.0,
    beta: float = 32.0,
) -> torch.Tensor:
    """omega: [hd/2] 1-D rotary frequencies (radians per unit, decreasing from c = 0), factor:
    s >= 1, a float or [B] -> [hd/2] or [B, hd/2] float32 (module docstring: the formulas).

    train_length (yarn): L_train, in the positions' units; alpha < beta: the ramp's ends.
    """
    check_choice("method", method, METHODS)
    check_tensor("omega", omega, ndims=(1,), floating=True)
    w = omega.to(torch.float32)
    if isinstance(factor, torch.Tensor):
        _check_factor(factor)
        s = factor.to(device=w.device, dtype=torch.float32)[..., None]  # [B, 1]
    else:
        s = torch.tensor(check_float("factor", factor, minimum=1.0), device=w.device)
    if method == "pi":
        return w / s
    half = w.shape[0]
    if method == "ntk":
        if half < 2:
            raise ValueError("omega must hold >= 2 frequencies for NTK (head_dim >= 4), got 1")
        # base^(-2c/hd) with base' = base s^(hd/(hd-2)): omega_c s^(-2c/(hd-2))
        exponent = torch.arange(half, device=w.device, dtype=torch.float32) / (half - 1)
        return w * s ** (-exponent)
    if train_length is None:
        raise ValueError("train_length is required for method='yarn' (r = L_train / lambda)")
    check_float("train_length", train_length, strict=True)
    check_float("alpha", alpha)
    check_float("beta", beta)
    if not alpha < beta:
        raise ValueError(f"alpha must be < beta (the ramp's ends), got {alpha} and {beta}")
    # r_c = L_train / lambda_c = L_train omega_c / (2 pi): how many turns over training
    r = train_length * w / (2 * math.pi)
    ramp = ((r - alpha) / (beta - alpha)).clamp(0.0, 1.0)
    return (1 - ramp) * w / s + ramp * w


def yarn_temperature(factor: torch.Tensor | float) -> torch.Tensor | float:
    """sqrt(1/t) = 0.1 ln s + 1 (YaRN sec. 3.4): q and k are each multiplied by it, which
    divides the logits by t. A float for a float factor, else float32 like `factor`."""
    if isinstance(factor, torch.Tensor):
        _check_factor(factor)
        return 0.1 * torch.log(factor.to(torch.float32)) + 1.0
    return 0.1 * math.log(check_float("factor", factor, minimum=1.0)) + 1.0


def xpos_zeta(head_dim: int, *, gamma: float = XPOS_GAMMA) -> torch.Tensor:
    """zeta_c = (2c/hd + gamma) / (1 + gamma), c = 0..hd/2-1 -> [hd/2] float32 in (0, 1)."""
    check_even("head_dim", head_dim)
    check_float("gamma", gamma, strict=True)
    c = torch.arange(head_dim // 2, dtype=torch.float64)
    return ((2 * c / head_dim + gamma) / (1 + gamma)).to(torch.float32)


def xpos_scale(
    positions: torch.Tensor, head_dim: int, *, scale_base: float = 512.0, center=None
) -> torch.Tensor:
    """positions: [B, T, 1] -> the queries' xPos scale [B, T, hd] float32 (keys: 1 / it).

    zeta_c^((n - center) / scale_base) on channels c and c + hd/2 (half layout). center: [B]
    or a float, a common offset of q and k (it cancels in every logit q.k); the caller keeps
    zeta's powers in float32's range with it (`Rotary` takes the positions' midpoint).
    """
    _check_positions(positions)
    check_float("scale_base", scale_base, strict=True)
    log_zeta = torch.log(xpos_zeta(head_dim).to(positions.device))  # [hd/2], < 0
    n = positions.to(torch.float32)
    if center is not None:
        if isinstance(center, torch.Tensor):
            check_real("center", center, ndims=(0, 1))
            if center.dim() == 1 and center.shape[0] not in (1, n.shape[0]):
                raise ValueError(f"center must be [B] or [1], got {tuple(center.shape)}")
        else:
            check_float("center", center, minimum=-math.inf)
        c = torch.as_tensor(center, dtype=torch.float32, device=n.device)
        n = n - (c[:, None, None] if c.dim() else c)
    x = n / scale_base
    if _may_inspect_values(x) and x.numel():
        reach = float(x.abs().max()) * float(-log_zeta[0])
        if not reach <= XPOS_MAX_EXPONENT:
            raise ValueError(
                f"positions: xPos powers zeta^(|position - center| / xpos_scale_base) reach "
                f"exp({reach:.3g}), beyond float32 (exp({XPOS_MAX_EXPONENT:g})): positions must "
                f"span at most {2 * XPOS_MAX_EXPONENT / float(-log_zeta[0]):.3g} x xpos_scale_base"
            )
    scale = torch.exp(x * log_zeta)  # [B, T, hd/2]
    return torch.cat([scale, scale], dim=-1)


def joint_mask(q, k, q_mask, k_mask) -> torch.Tensor | None:
    """[B, Tq + Tk] bool of q's and k's valid positions (None: all valid)."""
    if q_mask is None and k_mask is None:
        return None
    b, tq, tk = max(q.shape[0], k.shape[0]), q.shape[1], k.shape[1]
    ones = torch.ones(b, tq + tk, dtype=torch.bool, device=q.device)
    return torch.cat(
        [ones[:, :tq] if q_mask is None else q_mask, ones[:, tq:] if k_mask is None else k_mask],
        dim=1,
    )


def pair_span(q: torch.Tensor, k: torch.Tensor, q_mask, k_mask) -> torch.Tensor:
    """The length q's and k's positions [B, T, 1] cover, per sample [B]: the larger of their
    spans (`position_span`: n steps of their spacing; one set in self-attention)."""
    if k is q:
        return position_span(q, q_mask)
    return torch.maximum(position_span(q, q_mask), position_span(k, k_mask))


def longest_position(q: torch.Tensor, k: torch.Tensor, q_mask, k_mask) -> torch.Tensor:
    """The call's largest valid position + 1, over the batch and both sides -> [] float32
    (transformers' dynamic rope types: max(position_ids) + 1)."""
    hi = position_range(q, q_mask)[1].amax() if q.shape[1] else q.new_tensor(-1.0)
    if k is not q and k.shape[1]:
        hi = torch.maximum(hi, position_range(k, k_mask)[1].amax())
    return hi + 1
