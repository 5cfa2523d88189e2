"""The protocol of the absolute encodings: positions in, augmentation, float32 maths, cast out.

An absolute encoding maps positions `[B, T, M]` to an embedding `[B, T, D]` that the caller adds
to (or concatenates with) its content. Every one of them is called the same way,

    enc(x=None, *, positions=None, mask=None, lengths=None, hop=None, grid=None, extent=None,
        generator=None) -> [B, T, D] in x's dtype

and declares what positions it reads, so that a model asks the encoding instead of branching on
its name:

- `pos_dim`: M, the coordinates per position (1 for tokens or seconds, 2 for image x/y, 4 for
  box edges...);
- `units`: "continuous" (any real coordinates: token indices, seconds, image coordinates) or
  "index" (rows of a learned table: real positions are floored or quantised, so seconds mean
  nothing to it);
- `grid_positions(H, W)`: the positions it reads for an H x W patch grid (continuous image
  coordinates in [-extent, extent], or integer (column, row) indices for the tables and LFF's
  per-axis sinusoid);
- `kind`: "absolute" (added to the content); the encodings that act inside attention (`RelPos`,
  `Rotary`) say "attention" and `NoPos` says "none".

Subclasses implement `embed(positions) -> float32`; this base handles given positions, the
default ones (token indices, timestamps from `hop`, a `grid`), padding, augmentation in training
mode, disabling autocast and the final cast to the content dtype. What differs between the
encodings goes through hooks, not through a second `forward`: `read_positions` (another layout
of given positions), `call_augmentation` (an augmentation that needs a grid), `grid_augmentation`
(one that depends on it) and `sequence_table` / `grid_table` (cached or learned tables).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn

from .._checks import (
    _may_inspect_values,
    check_generator,
    check_int,
    check_phases,
    check_tensor,
    checked_inputs,
    max_abs,
)
from .._fusion import can_fuse, fused
from ..augment import Augmentation, check_augmentation
from ..positions import as_positions, resolve_mask, timestamps, token_positions
from .grids import GridLayout, check_grids, resolve_grid

__all__ = ["PositionalEncoding", "Float32Buffers", "float32_region", "check_encoding_content"]


def float32_region(device: torch.device) -> contextlib.AbstractContextManager:
    """Disable autocast so phases are computed in float32 whatever the caller's autocast."""
    return torch.autocast(device_type=device.type, enabled=False)


class Float32Buffers(nn.Module):
    """A module whose `register_float32` buffers stay float32 wherever it goes.

    torch's `.to(dtype)`, `.half()` and `.bfloat16()` cast every floating-point buffer,
    persistent or not; frequencies or slopes rounded to bfloat16 would shift every phase by
    whole radians at large positions. These buffers follow the module's device only: after
    each `_apply`, one whose dtype changed is restored from its float32 master (on the CPU)."""

    def register_float32(self, name: str, tensor: torch.Tensor) -> None:
        """A non-persistent float32 buffer `name` (nothing in the state_dict) from `tensor`, a
        CPU tensor; the buffer is made on the default device (meta under `torch.device("meta")`)."""
        master = tensor.detach().to("cpu", torch.float32).contiguous()
        self.__dict__.setdefault("_float32_masters", {})[name] = master
        self.register_buffer(name, master.to(torch.empty(0).device), persistent=False)

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        super()._apply(fn, recurse)
        for name, master in self.__dict__.get("_float32_masters", {}).items():
            buffer = self._buffers.get(name)
            if buffer is not None and buffer.dtype != torch.float32:
                self._buffers[name] = master.to(buffer.device)
        return self


def check_encoding_content(x: object, dim: int, ndims: tuple[int, ...] = (3,)) -> None:
    """x, an encoding's content (None: none given), must be a floating-point tensor of rank in
    `ndims` (3: [B, T, D], 4: [B, H, W, D]) ending with D = dim."""
    if x is None:
        return
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() not in ndims or x.shape[-1] != dim:
        want = " or ".join("[B, T, D]" if n == 3 else "[B, H, W, D]" for n in ndims)
        raise ValueError(f"x must have shape {want} with D = {dim}, got {tuple(x.shape)}")
    if not x.is_floating_point():  # the embedding is cast to x's dtype: ints would truncate
        raise TypeError(f"x must be a floating-point tensor (the content), got {x.dtype}")


class PositionalEncoding(GridLayout, Float32Buffers):
    """Base of the absolute encodings (module docstring: the protocol).

    dim: D, the embedding size. pos_dim: M, coordinates per position.
    augmentation: CAPE's `Augmentation` (None = no augmentation, positions used as given).
    """

    kind = "absolute"
    units = "continuous"

    def __init__(self, dim: int, pos_dim: int, augmentation: Augmentation | None = None) -> None:
        super().__init__()
        self.dim = check_int("dim", dim)
        self.pos_dim = check_int("pos_dim", pos_dim)
        self.augmentation = check_augmentation(augmentation, pos_dim=self.pos_dim)

    # -- to implement ----------------------------------------------------------------------
    def embed(self, positions: torch.Tensor) -> torch.Tensor:
        """positions: [B, T, M] float32 -> [B, T, D] float32 (or a compute dtype of params)."""
        raise NotImplementedError

    # -- the positions it reads ------------------------------------------------------------
    def sequence_positions(
        self,
        batch: int,
        length: int,
        *,
        hop: float | torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        device: torch.device | str | None = None,
    ) -> torch.Tensor:
        """Positions of a sequence: token indices 0..T-1, or frame-centre timestamps (i + 0.5) *
        hop seconds when `hop` is given (float, [B] or [B, T]) -> [B, T, 1] float32, 0 at
        padding."""
        if self.pos_dim != 1:
            raise ValueError(
                f"{type(self).__name__} reads {self.pos_dim}-D positions: pass positions "
                f"[B, T, {self.pos_dim}]"
                + (" or grid=(H, W)" if self.pos_dim == 2 else "")
                + " (x alone or hop give 1-D ones)"
            )
        if hop is None:
            return token_positions(batch, length, mask=mask, device=device)
        if self.units == "index":
            raise ValueError(
                f"hop: {type(self).__name__} reads table indices, not seconds; omit hop "
                "(frames are counted) or use an encoding with continuous units"
            )
        return timestamps(batch, length, hop, mask=mask, device=device)

    # -- shared ----------------------------------------------------------------------------
    def prepare(
        self,
        positions: torch.Tensor,
        mask: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        augmentation: Augmentation | None = None,
    ) -> torch.Tensor:
        """Checked positions [B, T, M] float32 (`forward` checks the ones it is given; the ones
        cape builds are finite and in range) -> augmented in train mode, 0 at padding.

        augmentation: overrides `self.augmentation` for this call (e.g. a grid-dependent emax).
        The augmentation's own value checks are skipped (`checked_inputs`): its input was
        checked here, and `check_range` checks what it makes.
        """
        aug = self.call_augmentation(augmentation)
        if aug is None:
            return positions
        with checked_inputs():
            return aug(positions, mask, training=self.training, generator=generator)

    def call_augmentation(self, augmentation: Augmentation | None) -> Augmentation | None:
        """The augmentation of a `prepare` call: the one given (a grid's), else
        `self.augmentation`; an encoding refuses here what it cannot augment without a grid."""
        return augmentation if augmentation is not None else self.augmentation

    def read_positions(self, positions: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """positions as given -> [B, T, M] before `forward` checks them: an encoding that also
        reads another layout ([B, T, G, M] groups, integer bins) converts it here."""
        return positions

    def encode(
        self,
        positions: torch.Tensor,
        mask: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        dtype: torch.dtype | None = None,
        augmentation: Augmentation | None = None,
        source: str = "positions",
        add_to: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """positions: [B, T, M] float32, checked -> embedding [B, T, D] in `dtype` (0 at padding);
        add_to + embedding in its dtype when the content is given. source: the argument the
        positions come from, named if their phases overflow."""
        with float32_region(positions.device):
            pos = self.prepare(positions, mask, generator, augmentation)
            self.check_range(source, pos)
            return self.finish(pos, mask, dtype, add_to)

    def finish(
        self,
        pos: torch.Tensor,
        mask: torch.Tensor | None,
        dtype: torch.dtype | None,
        add_to: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Augmented positions [..., M] float32 -> the embedding [..., D] in `dtype`, 0 at
        padding; add_to + embedding (in add_to's dtype) when given: one compiled kernel where
        `cape.fusion` allows it (`embed_kernel`), else the embedding added into its own buffer."""
        kernel = self.embed_kernel() if add_to is not None else None
        if kernel is not None and can_fuse(add_to):
            add_embedding, tensors = kernel
            return fused(add_embedding, add_to, pos, mask, *tensors)
        out = self.embed(pos)
        if mask is not None:
            out = out * mask[..., None].to(out.dtype)
        if add_to is not None:
            return _add_into(out.to(add_to.dtype), add_to)
        return out if dtype is None else out.to(dtype)

    def embed_kernel(self) -> tuple[Callable[..., torch.Tensor], tuple[torch.Tensor, ...]] | None:
        """For the fused path (`cape.fusion`): a module-level pure function (x, positions, mask,
        *tensors) -> x + embedding (0 at padding, in x's dtype), and those tensors; None: this
        encoding is not fused."""
        return None

    def forward(
        self,
        x: torch.Tensor | None = None,
        *,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        lengths: torch.Tensor | None = None,
        hop: float | torch.Tensor | None = None,
        grid: tuple[int, int] | None = None,
        extent: float | None = None,
        generator: torch.Generator | None = None,
        add: bool = False,
    ) -> torch.Tensor:
        """x: [B, T, D] content (for B, T, device and dtype), or [B, H, W, D] for a grid.

        Positions, one of: `positions` [B, T(, M)] (with `grid` a list of each sample's (H, W)
        when they were laid out on grids: a packed batch of images); `hop` seconds per frame
        (float, [B] or [B, T]: frame-centre timestamps, 1-D encodings); `grid` (H, W) (or x
        [B, H, W, D]): `grid_positions(H, W, extent=extent)`; none of them: token indices 0..T-1
        (1-D).
        mask [B, T] bool (True = real) or lengths [B]: padding gets a zero embedding.
        Returns the embedding in x's shape and dtype (float32 [B, T, D] without x); with
        add=True, x + embedding (`add_to`).
        """
        check_generator("generator", generator)
        if add and x is None:
            raise ValueError("add=True adds the embedding to x: give x")
        grids, grid = _check_layout(positions, hop, grid)
        if grid is not None or (isinstance(x, torch.Tensor) and x.dim() == 4):
            if mask is not None or lengths is not None:
                raise ValueError(
                    "mask/lengths apply to given positions; a full grid has no padding"
                )
            self.check_content(x, ndims=(3, 4))
            return self.forward_grid(x, grid, extent, generator, add)
        if extent is not None and grids is None:
            raise ValueError("extent applies to a grid: pass grid=(H, W) or x [B, H, W, D]")
        if x is None and positions is None:
            raise ValueError("give x ([B, T, D]), positions ([B, T, M]) or grid=(H, W)")
        self.check_content(x, ndims=(3,))
        if positions is None and mask is None and lengths is None:
            table = self.sequence_table(x, hop)  # x: [B, T, D] here
            if table is not None:  # a cached or learned table: never written into
                return x + table if add else table
        ref = x if x is not None else positions
        assert ref is not None
        batch, length = ref.shape[0], ref.shape[1]
        mask = resolve_mask(batch, length, lengths, mask)
        if positions is None:
            positions = self.sequence_positions(
                batch, length, hop=hop, mask=mask, device=ref.device
            )
        else:
            if x is not None and tuple(positions.shape[:2]) != (batch, length):
                raise ValueError(
                    f"positions must start with [B, T] = [{batch}, {length}], "
                    f"got {tuple(positions.shape)}"
                )
            positions = self.read_positions(positions, mask)
            positions = as_positions(positions, mask=mask, dims=self.pos_dim)
        dtype = None if x is None else x.dtype
        aug = None if grids is None else self.grid_augmentation(grids, extent, ref.device)
        source = "hop" if hop is not None else "positions"
        add_to = x if add else None
        return self.encode(positions, mask, generator, dtype, aug, source, add_to)

    def sequence_table(
        self, x: torch.Tensor, hop: float | torch.Tensor | None
    ) -> torch.Tensor | None:
        """The embedding of x [B, T, D]'s default positions (no padding) from a cached table,
        [B, T, D] in x's dtype; None = compute it (no cache, or not deterministic here)."""
        return None

    def grid_augmentation(
        self, grids: list[tuple[int, int]], extent: float | None, device: torch.device
    ) -> Augmentation | None:
        """The augmentation of positions laid out on these grids (one (H, W) per sample), when it
        depends on the grid (CAPE2d's emax = 1/N); None = `self.augmentation` as it is."""
        return None

    def forward_grid(
        self,
        x: torch.Tensor | None,
        grid: tuple[int, int] | None,
        extent: float | None,
        generator: torch.Generator | None,
        add: bool = False,
    ) -> torch.Tensor:
        """The embedding of a full H x W grid (`grid_positions`), in x's shape ([B, H, W, D] or
        [B, H*W, D]; [1, H*W, D] float32 without x); x + embedding with `add`."""
        table = self.grid_table(x, grid, extent)
        if table is not None:
            return x + table if add else table
        height, width, batch, shape = resolve_grid(x, grid, self.dim)
        device = x.device if x is not None else torch.device("cpu")
        grid_pos = self.grid_positions(height, width, extent=extent, batch=batch, device=device)
        pos = self.read_positions(grid_pos, None)  # index units: integer cells to read
        aug = self.grid_augmentation([(height, width)], extent, device)
        with float32_region(device):
            pos = self.prepare(pos, None, generator, aug)
            self.check_range("extent", pos)
            # embed straight into the output's shape: a reshaped view would make the in-place
            # add (add_to) go through autograd's slow view-rebase path
            pos = pos.reshape(shape[:-1] + (self.pos_dim,))
            return self.finish(pos, None, None if x is None else x.dtype, x if add else None)

    def grid_table(
        self, x: torch.Tensor | None, grid: tuple[int, int] | None, extent: float | None
    ) -> torch.Tensor | None:
        """The embedding of a full grid (as `forward_grid`) from a table, when it is one: a
        learned grid, a cached eval-mode one; None = compute it from `grid_positions`."""
        return None

    def check_range(self, name: str, positions: torch.Tensor) -> None:
        """Refuse positions (from the argument `name`) whose phases |p| x frequency would
        overflow float32 (CPU only): encodings with `frequencies` [M, K] check them here."""
        if not _may_inspect_values(positions):
            return
        freqs = getattr(self, "frequencies", None)
        if isinstance(freqs, torch.Tensor):
            check_phases(name, positions, max_abs(freqs.t()))

    def check_content(self, x: torch.Tensor | None, ndims: tuple[int, ...] = (3,)) -> None:
        """x (the content) must be a tensor of rank in `ndims` ending with D = self.dim."""
        check_encoding_content(x, self.dim, ndims)

    def add_to(self, x: torch.Tensor, **kwargs: object) -> torch.Tensor:
        """x + self(x, **kwargs), the default combination: `self(x, add=True, **kwargs)`.

        x: [B, T, D] (or the module's grid shape). A computed embedding takes the content in
        its own buffer (no second output), or, where `cape.fusion` allows it, one compiled
        kernel makes the embedding and adds it; cached and learned tables are added as they are.
        The module's forward hooks see its output, x + embedding.
        """
        return self(x, add=True, **kwargs)  # type: ignore[arg-type]

    def extra_repr(self) -> str:
        aug = "" if self.augmentation is None else f", augmentation={self.augmentation}"
        return f"dim={self.dim}, pos_dim={self.pos_dim}{aug}"


def _check_layout(
    positions: torch.Tensor | None,
    hop: float | torch.Tensor | None,
    grid: tuple[int, int] | list[tuple[int, int]] | None,
) -> tuple[list[tuple[int, int]] | None, tuple[int, int] | None]:
    """One way of giving positions -> (the grids given positions were laid out on, or None;
    the full grid to make, or None). The positions' details (M, dtype, values) come later."""
    if positions is not None:
        check_tensor("positions", positions, ndims=(2, 3, 4))
    grids = None
    if positions is not None and isinstance(grid, list):  # the grids positions come from
        grids, grid = check_grids(grid, positions.shape[0]), None
    layouts = (("positions", positions), ("hop", hop), ("grid", grid))
    given = [k for k, v in layouts if v is not None]
    if len(given) > 1:
        raise ValueError(f"give one of positions, hop and grid, got {given}")
    return grids, grid  # type: ignore[return-value]


def _add_into(emb: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """x + emb, written into emb when it is a fresh tensor outside autograd (autograd still
    tracks x): one buffer fewer. Not under torch.compile: the compiled graph fuses the add."""
    fresh = (
        not torch.compiler.is_compiling()
        and emb._base is None
        and not emb.requires_grad
        and emb.is_contiguous()
        and emb.shape == x.shape
    )
    return emb.add_(x) if fresh else x + emb
