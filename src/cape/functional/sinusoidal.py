"""Sinusoidal encodings: pure functions, float32 phases, `[cos || sin]` layout.

Layout: every sinusoid here returns the concatenation `[cos(phase) || sin(phase)]` along the last
axis, as CAPE's appendix A does for 2D. (Eq. 1 interleaves cos/sin; that is a fixed permutation
of the channels and changes neither dot products nor what a model can learn.)
"""

from __future__ import annotations

import math

import torch

from .._checks import (
    LIMIT,
    check_choice,
    check_even,
    check_float,
    check_limit,
    check_phases,
    check_real,
    check_tensor,
    max_abs,
)

__all__ = [
    "sinusoid_frequencies",
    "cape2d_frequencies",
    "cos_sin",
    "sinusoid",
    "doubled_frequencies",
    "shifted_sine",
    "sinusoidal_1d",
    "sinusoidal_2d",
    "axial_sinusoidal",
]


def sinusoid_frequencies(
    dim: int,
    *,
    base: float = 10000.0,
    freq_scale: float = 1.0,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """omega_k = freq_scale * base^(-2k/dim), k = 0..dim/2-1 -> [dim/2] float32.

    freq_scale = 30 gives CAPE's frequencies for time in seconds (sec. 3).
    """
    check_even("dim", dim)
    check_float("base", base, minimum=1.0, strict=True)
    check_limit("freq_scale", check_float("freq_scale", freq_scale, strict=True))
    k = torch.arange(dim // 2, device="cpu", dtype=torch.float64)
    return (freq_scale * base ** (-2.0 * k / dim)).to(device=device, dtype=torch.float32)


def cape2d_frequencies(
    dim: int,
    *,
    rho: str = "exact",
    freq_scale: float = 1.0,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """CAPE's 2D frequencies, pi included -> [2, dim/2] float32 (rows: x, y).

    w_x = s rho_k cos k, w_y = s rho_k sin k for k = 0..dim/2-1 (appendix A), with
    rho = "exact": 10^(j/half), j = 1..half (sec. 3, so rho runs 10^(1/half)..10), or
    rho = "linspace": 10^linspace(0, 1, half) (appendix A's simpler approximation).
    s = freq_scale (1 in the paper): s = 0.4 caps |w| at 4 pi, the Nyquist limit of an
    8 x 8 grid over [-1, 1] (spacing 0.25), where the paper's 14 x 14 grid allows 7 pi.
    """
    check_even("dim", dim)
    check_choice("rho", rho, ("exact", "linspace"))
    check_float("freq_scale", freq_scale, strict=True)
    if 10 * math.pi * freq_scale > LIMIT:  # rho <= 10: |w| <= 10 pi freq_scale
        raise ValueError(
            f"freq_scale must be at most {LIMIT / (10 * math.pi):.3g}, got {freq_scale}"
        )
    half = dim // 2
    # float64 on the CPU, then cast: the frequencies are exact whatever the target device
    cpu = dict(dtype=torch.float64, device="cpu")
    if rho == "exact":
        r = 10.0 ** (torch.arange(1, half + 1, **cpu) / half)
    else:
        r = 10.0 ** torch.linspace(0.0, 1.0, half, **cpu)
    k = torch.arange(half, **cpu)
    w = torch.stack([r * torch.cos(k), r * torch.sin(k)]) * (math.pi * freq_scale)
    return w.to(device=device, dtype=torch.float32)


def cos_sin(phase: torch.Tensor) -> torch.Tensor:
    """phase: [..., K] -> [..., 2K] = [cos(phase) || sin(phase)], in phase's dtype."""
    check_tensor("phase", phase, ndims=range(1, 9), floating=True)
    return torch.cat([torch.cos(phase), torch.sin(phase)], dim=-1)


def doubled_frequencies(freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """freqs: [M, K] -> (freqs2: [M, 2K], offset: [2K]) for `shifted_sine`.

    cos(a) = sin(a + pi/2): one sine over [phase + pi/2 || phase] yields [cos || sin].
    """
    check_tensor("freqs", freqs, ndims=(2,), floating=True)
    k = freqs.shape[-1]
    offset = torch.cat([torch.full((k,), math.pi / 2), torch.zeros(k)])
    offset = offset.to(device=freqs.device, dtype=torch.float32)
    return torch.cat([freqs, freqs], dim=-1).to(torch.float32), offset


def shifted_sine(
    positions: torch.Tensor, freqs2: torch.Tensor, offset: torch.Tensor
) -> torch.Tensor:
    """sin(p freqs2 + offset). positions: [..., M] -> [..., 2K] float32 (see doubled_frequencies).

    One fused multiply-add per axis and one in-place sine over a contiguous buffer: on a CPU
    the passes over memory, not the trigonometry, dominate the cost of an encoding.
    """
    _check_sine_args(positions, freqs2, offset)
    check_phases("positions", positions, lambda: max_abs(freqs2.t()))
    pos = positions.to(torch.float32)
    out = torch.addcmul(offset, pos[..., 0:1], freqs2[0])
    for m in range(1, freqs2.shape[0]):
        out = out.addcmul_(pos[..., m : m + 1], freqs2[m])
    return torch.sin(out) if out.requires_grad else out.sin_()


def _add_masked(
    x: torch.Tensor, embedding: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """x + embedding (float32 [..., D]) zeroed where mask [...] is False, in x's dtype: how an
    absolute encoding meets its content."""
    if mask is not None:
        embedding = embedding * mask[..., None].to(embedding.dtype)
    return x + embedding.to(x.dtype)


def _shifted_sine_add(
    x: torch.Tensor,
    positions: torch.Tensor,
    mask: torch.Tensor | None,
    freqs2: torch.Tensor,
    offset: torch.Tensor,
) -> torch.Tensor:
    """x + shifted_sine(positions, freqs2, offset) (0 at padding), in x's dtype: the kernel
    `cape.fusion` compiles. x: [..., 2K], positions: [..., M], mask: [...] bool or None."""
    return _add_masked(x, shifted_sine(positions, freqs2, offset), mask)


def _axial_doubled_frequencies(freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-axis frequencies [M, K] -> (freqs2 [M, 2MK], offset [2MK]): `shifted_sine` with them
    gives `axial_sinusoidal`'s layout [cos_0 || sin_0 || cos_1 || ...] (axis m's phases on its
    own block, exact zeros elsewhere), one sine per output channel: the fused kernel's form."""
    blocks = [doubled_frequencies(w[None]) for w in freqs.to(torch.float32)]
    return torch.block_diag(*[w2 for w2, _ in blocks]), torch.cat([off for _, off in blocks])


def _check_sine_args(positions: object, freqs2: object, offset: object) -> None:
    pos = check_real("positions", positions)
    w = check_tensor("freqs2", freqs2, ndims=(2,), floating=True)
    off = check_tensor("offset", offset, ndims=(1,), floating=True)
    if pos.shape[-1] != w.shape[0] or off.shape[0] != w.shape[1]:
        raise ValueError(
            f"positions [..., M], freqs2 [M, 2K] and offset [2K] must agree, got "
            f"{tuple(pos.shape)}, {tuple(w.shape)}, {tuple(off.shape)}"
        )


def sinusoid(positions: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """[cos(p W) || sin(p W)]. positions: [..., M], freqs W: [M, K] -> [..., 2K] float32.

    The phase p W = sum_m p_m W_mk is computed in float32.
    """
    check_real("positions", positions)
    return shifted_sine(positions, *doubled_frequencies(freqs))


def sinusoidal_1d(
    positions: torch.Tensor,
    dim: int,
    *,
    base: float = 10000.0,
    freq_scale: float = 1.0,
) -> torch.Tensor:
    """Transformer sinusoid over continuous positions. positions: [...] -> [..., dim] float32.

    E(p) = [cos(omega p) || sin(omega p)], omega from `sinusoid_frequencies`.
    E(n) . E(n + m) = sum_k cos(omega_k m) depends on m only, for any real n, m.
    """
    check_real("positions", positions, ndims=range(9))
    omega = sinusoid_frequencies(dim, base=base, freq_scale=freq_scale, device=positions.device)
    return sinusoid(positions[..., None], omega[None])


def sinusoidal_2d(positions: torch.Tensor, dim: int, *, rho: str = "exact") -> torch.Tensor:
    """CAPE's 2D sinusoid. positions: [..., 2] (x, y) -> [..., dim] float32.

    phase_k = pi (w_x,k x + w_y,k y); E = [cos(phase) || sin(phase)] (appendix A `CAPE_2d`).
    """
    check_real("positions", positions)
    if positions.shape[-1] != 2:
        raise ValueError(
            f"positions must end with 2 coordinates (x, y), got {tuple(positions.shape)}"
        )
    return sinusoid(positions, cape2d_frequencies(dim, rho=rho, device=positions.device))


def axial_sinusoidal(
    positions: torch.Tensor,
    dim: int,
    *,
    base: float = 10000.0,
    freq_scale: float = 1.0,
    freqs: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-axis sinusoids concatenated (LFF's Sine-2D / Sine-4D). positions: [..., M] -> [..., dim].

    Axis m gets `sinusoidal_1d(positions[..., m], dim / M)`; dim must be divisible by 2M.
    freqs: [M, dim / (2M)] frequencies of each axis instead (e.g. fitted to a grid:
    `cape.functional.frequencies.grid_frequencies_1d`).
    """
    axes = check_real("positions", positions).shape[-1]
    check_even("dim", dim, multiple=2 * axes)
    if freqs is None:
        omega = sinusoid_frequencies(
            dim // axes, base=base, freq_scale=freq_scale, device=positions.device
        )
    else:
        if tuple(freqs.shape) != (axes, dim // (2 * axes)):
            raise ValueError(
                f"freqs must have shape [M, dim / (2M)] = [{axes}, {dim // (2 * axes)}], "
                f"got {tuple(freqs.shape)}"
            )
        omega = freqs.to(device=positions.device, dtype=torch.float32)
    check_phases("positions", positions, lambda: omega.abs().amax(-1))
    phase = positions.to(torch.float32)[..., None] * omega  # [..., M, dim/(2M)]
    return cos_sin(phase).flatten(-2)
