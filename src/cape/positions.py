"""Step 1 of the data flow: build float32 positions `[B, T, M]`.

Every builder returns float32 coordinates whatever the model's dtype (bf16 holds only 256
consecutive integers exactly). Padding is explicit: `lengths` `[B]` or `mask` `[B, T]` (True at
real tokens); padded tokens get position 0 so that everything downstream stays finite.
"""

from __future__ import annotations

import torch

from ._checks import (
    FLOAT32_MAX,
    check_finite,
    check_float,
    check_int,
    check_lengths,
    check_limit,
    check_mask,
    check_positive_tensor,
    check_tensor,
)

__all__ = [
    "lengths_to_mask",
    "resolve_mask",
    "token_positions",
    "timestamps",
    "grid_positions",
    "grid_indices",
    "as_positions",
]


def lengths_to_mask(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """lengths: [B] ints in [0, max_len] -> mask: [B, max_len] bool, True at real tokens."""
    check_int("max_len", max_len, minimum=0)
    check_tensor("lengths", lengths, ndims=(1,))
    check_lengths("lengths", lengths, lengths.shape[0], max_len)
    steps = torch.arange(max_len, device=lengths.device)
    return steps[None, :] < lengths[:, None]


def resolve_mask(
    batch: int,
    length: int,
    lengths: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """One `[B, T]` bool mask (True = real token) from `lengths` or `mask`; None if neither."""
    if lengths is not None and mask is not None:
        raise ValueError("give either lengths or mask, not both")
    if lengths is not None:
        check_tensor("lengths", lengths, ndims=(1,))
        check_lengths("lengths", lengths, batch, length)
        return lengths_to_mask(lengths, length)
    if mask is not None:
        check_mask("mask", mask, (batch, length))
    return mask


def _zero_padding(pos: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    # where, not multiply: NaN placeholders at padding must not survive as NaN * 0
    return pos if mask is None else torch.where(mask[..., None], pos, 0.0)


def token_positions(
    batch: int,
    length: int,
    *,
    lengths: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    device: torch.device | str | None = None,
    start: int = 0,
) -> torch.Tensor:
    """Token indices start..start+T-1 -> positions: [B, T, 1] float32 (0 at padding).

    start: the tokens already seen, e.g. a key/value cache's length when decoding."""
    check_int("batch", batch, minimum=0)
    check_int("length", length, minimum=0)
    check_int("start", start, minimum=0)
    mask = resolve_mask(batch, length, lengths, mask)
    device = mask.device if mask is not None else device
    pos = torch.arange(start, start + length, device=device, dtype=torch.float32)
    pos = pos[None, :, None].expand(batch, length, 1)
    return _zero_padding(pos, mask)


def timestamps(
    batch: int,
    length: int,
    hop: float | torch.Tensor,
    *,
    lengths: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    offset: float = 0.5,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Frame times in seconds -> positions: [B, T, 1] float32.

    hop: seconds between frames, a float, per sample `[B]`, or per step `[B, T]` (variable STFT
    hop). Frame i is centred at `start_i + offset * hop_i` where `start_i` is the sum of the
    previous hops; for a constant hop that is `(i + offset) * hop` (CAPE sec. 3: "a frame centred
    at t seconds"; offset 0.5 = the middle of the frame's hop interval).
    """
    check_int("batch", batch, minimum=0)
    check_int("length", length, minimum=0)
    check_limit("offset", check_float("offset", offset))
    mask = resolve_mask(batch, length, lengths, mask)
    if not isinstance(hop, torch.Tensor):
        if isinstance(hop, bool) or not isinstance(hop, (int, float)):
            raise TypeError(
                "hop must be a float (seconds per frame) or a tensor [B] or [B, T], "
                f"got {type(hop).__name__} {hop!r}"
            )
        check_float("hop", hop, strict=True)
        last = (max(length - 1, 0) + offset) * hop  # the last frame's time (offset >= 0)
        if hop > FLOAT32_MAX or last > FLOAT32_MAX:
            raise ValueError(
                f"hop: the frame times (length - 1 + offset) * hop reach {last:.3g} s, beyond "
                f"float32 ({FLOAT32_MAX:.3g}); got hop={hop}, offset={offset}, length={length}"
            )
        device = mask.device if mask is not None else device
        steps = torch.arange(length, device=device, dtype=torch.float32) + offset
        pos = (steps * float(hop))[None, :, None].expand(batch, length, 1)
        return _zero_padding(pos, mask)
    check_tensor("hop", hop, ndims=(1, 2))
    if hop.shape[0] != batch or (hop.dim() == 2 and hop.shape[1] != length):
        raise ValueError(
            f"hop must be a float, [B]={batch} or [B, T]=[{batch}, {length}], "
            f"got {tuple(hop.shape)}"
        )
    hop32 = hop.to(torch.float32)
    check_positive_tensor("hop", hop32, None if hop.dim() == 1 else mask)
    if hop.dim() == 1:
        steps = torch.arange(length, device=hop.device, dtype=torch.float32) + offset
        pos = steps[None, :] * hop32[:, None]
    else:
        # start of frame i = sum of hops before it; centre = start + offset * own hop
        pos = torch.cumsum(hop32, dim=1) - (1.0 - offset) * hop32
    check_finite("hop", pos, mask, what=" (the frame times it gives overflow float32)")
    return _zero_padding(pos[..., None], mask)


def _axis(n: int, extent: float, device: torch.device | str | None) -> torch.Tensor:
    if isinstance(n, torch.SymInt):
        # traced with a symbolic size (torch.export): linspace and `n == 1` would fix n. The
        # same positions to float rounding, centred: one patch at 0
        i = torch.arange(n, device=device, dtype=torch.float32)
        return (i - (n - 1) / 2) * (2.0 * extent / torch.sym_max(n - 1, 1))
    if n == 1:  # a single patch sits at the centre, not at -extent
        return torch.zeros(1, device=device, dtype=torch.float32)
    return torch.linspace(-extent, extent, n, device=device, dtype=torch.float32)


def grid_positions(
    height: int,
    width: int,
    *,
    extent: float = 1.0,
    batch: int | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Image patch grid scaled to [-extent, extent] -> positions: [H*W, 2] (or [B, H*W, 2]).

    Row-major (y outer, x inner), matching `x.flatten(1, 2)` of a `[B, H, W, D]` grid.
    `[..., 0]` is x (along the width), `[..., 1]` is y (along the height). `extent` is the
    gamma of CAPE's Table 6 (re-scaling positions to [-gamma, gamma] at evaluation), at most
    1e38. A 0-size grid (H or W = 0) gives no positions, as a sequence of length 0 does.
    """
    check_int("height", height, minimum=0)
    check_int("width", width, minimum=0)
    check_limit("extent", check_float("extent", extent, strict=True))
    ys = _axis(height, extent, device)
    xs = _axis(width, extent, device)
    grid = torch.stack(
        [xs[None, :].expand(height, width), ys[:, None].expand(height, width)], dim=-1
    ).reshape(height * width, 2)
    if batch is None:
        return grid
    check_int("batch", batch, minimum=0)
    return grid[None].expand(batch, -1, -1)


def grid_indices(
    height: int,
    width: int,
    *,
    batch: int | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Integer patch indices (column, row) -> [H*W, 2] int64 (or [B, H*W, 2]).

    The same row-major order and (x, y) axis order as `grid_positions`, for the tables and
    per-axis sinusoids that take grid indices (LFF's Embed-2D, Sine-2D). H or W = 0: empty.
    """
    check_int("height", height, minimum=0)
    check_int("width", width, minimum=0)
    rows = torch.arange(height, device=device).repeat_interleave(width)
    cols = torch.arange(width, device=device).repeat(height)
    grid = torch.stack([cols, rows], dim=-1)
    if batch is None:
        return grid
    check_int("batch", batch, minimum=0)
    return grid[None].expand(batch, -1, -1)


def as_positions(
    positions: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    dims: int | None = None,
    name: str = "positions",
    mask_name: str = "mask",
) -> torch.Tensor:
    """Given coordinates `[B, T]` or `[B, T, M]` -> float32 `[B, T, M]`, checked finite.

    dims: the number of coordinates M the caller expects (None = any). mask: [B, T] bool.
    name, mask_name: the arguments named in errors.
    """
    check_tensor(name, positions, ndims=(2, 3))
    if dims is not None:
        check_int("dims", dims)
    if mask is not None:
        check_mask(mask_name, mask, positions.shape[:2])
    if positions.dtype.is_complex or positions.dtype == torch.bool:
        raise TypeError(f"{name} must be a real tensor, got {positions.dtype}")
    pos = positions.to(torch.float32)
    if pos.dim() == 2:
        pos = pos[..., None]
    if dims is not None and pos.shape[-1] != dims:
        raise ValueError(
            f"{name} must have {dims} coordinate(s) in its last axis, "
            f"got shape {tuple(positions.shape)}"
        )
    check_finite(name, pos, mask)
    return _zero_padding(pos, mask)


def column_positions(positions: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Positions [B, T] or [B, T, M] a public entry point has checked -> float32 [B, T, M],
    0 at padding (`mask` [B, T], or None when it does not describe them); no checks."""
    pos = positions.to(torch.float32)
    pos = pos if pos.dim() == 3 else pos[..., None]
    if mask is None or tuple(mask.shape) != tuple(pos.shape[:2]):
        return pos
    return _zero_padding(pos, mask)
