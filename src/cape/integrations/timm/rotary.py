"""2-D rotary inside every attention block of a timm ViT (`add_rotary`).

Every block's q and k are rotated after timm's q_norm / k_norm (forward hooks on them), before
its fused `scaled_dot_product_attention`, which is kept. The positions are drawn once per
forward by a forward hook of `patch_embed` (so `forward`, `forward_features` and
`forward_intermediates` all draw), CAPE-augmented in train mode, and every block reads that one
draw, as cape's own stacks do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..._checks import check_bool
from ...augment import Augmentation
from ...build import build, encoding_options
from ...encodings.in_attention import PositionContext
from ...functional.rotary import apply_rotary
from ...models.plan import moves_positions
from .checks import check_fit_grid, check_model, patch_grid, with_grid
from .pos_embed import plan_removal
from .record import note, spec

__all__ = ["ROTARY_NAMES", "RotaryPositions", "add_rotary", "plan_rotary"]

ROTARY_NAMES = ("rotary2d", "rope-axial", "rope-mixed")
_ATTENTION = ("qkv", "q_norm", "k_norm", "num_heads", "head_dim")
_HOOKED = ("q_norm", "k_norm")  # modules whose outputs (q, k) the rotation hooks


class _Drawn:
    """This forward's positions, held outside the module: torch.export traces a module's
    tensor attributes as state, which these are not. A copy or a pickle of the model leaves
    them out (a traced forward leaves fake tensors here)."""

    value: torch.Tensor | None = None

    def __getstate__(self) -> dict:
        return {}


class RotaryPositions(nn.Module):
    """The (x, y) positions that every block's rotary reads in one forward, drawn once.

    `positions`: set by a forward hook of `patch_embed` (so every forward path draws): [1 or B,
    P + H'W', 2] float32, the P prefix tokens at (0, 0) then the patch grid row-major
    (`grid_positions`), with CAPE's augmentation drawn per sample in train mode for all tokens
    together (one global shift / scale per image, which cancels between tokens, as in
    `cape.models.ViT`). augmentation: CAPE's `Augmentation` (None: none). generator: for
    reproducible draws. No parameters or buffers (nothing in the state_dict).
    """

    def __init__(self, augmentation: Augmentation | None, num_prefix_tokens: int) -> None:
        super().__init__()
        self.augmentation = augmentation
        self.num_prefix_tokens = num_prefix_tokens
        self.generator: torch.Generator | None = None
        self._drawn = _Drawn()

    @property
    def positions(self) -> torch.Tensor | None:
        """This forward's positions [1 or B, P + H'W', 2] (None before the first forward)."""
        return self._drawn.value

    def draw(self, grid: torch.Tensor, batch: int) -> torch.Tensor:
        """grid: [1, H'W', 2] patch positions -> the positions of this forward (class doc)."""
        prefix = grid.new_zeros(1, self.num_prefix_tokens, 2)
        pos = torch.cat([prefix, grid], dim=1)
        aug = self.augmentation
        if moves_positions(aug, self.training):
            pos = aug(pos.expand(batch, -1, -1), training=self.training, generator=self.generator)
        self._drawn.value = pos
        return pos

    def current(self, tokens: int) -> torch.Tensor:
        """The positions of this forward, for an attention over `tokens` tokens."""
        pos = self._drawn.value
        if pos is None or pos.shape[1] != tokens:
            got = None if pos is None else pos.shape[1]
            raise RuntimeError(
                f"attention over {tokens} tokens, but the model's forward gave positions for "
                f"{got}: call the blocks through the model (its patch_embed draws them)"
            )
        return pos

    def extra_repr(self) -> str:
        return f"num_prefix_tokens={self.num_prefix_tokens}, augmentation={self.augmentation}"


class _DrawPositions:
    """Forward hook of `patch_embed`: draws this forward's positions (`RotaryPositions.draw`)
    from the patch grid; the tokens pass unchanged. probe: a rotary (what grid it reads)."""

    def __init__(self, state: RotaryPositions, probe: nn.Module) -> None:
        self.state, self.probe = state, probe

    def __call__(self, module: nn.Module, args: tuple, out: torch.Tensor) -> None:
        height, width = patch_grid(module, args[0], out)
        grid = self.probe.grid_positions(height, width, device=out.device)
        self.state.draw(grid, out.shape[0])


class _BlockRotation:
    """Forward hook of one attention's `q_norm` and `k_norm`: rotates q or k [B, H, N, hd] by
    the angles of this forward's positions. The angles ([1 or B, N, hd/2], or per head) are
    made by the first of the two calls and freed by the second."""

    def __init__(self, state: RotaryPositions, rotary: nn.Module) -> None:
        self.state, self.rotary = state, rotary
        self._cache: tuple[torch.Tensor, torch.Tensor] | None = None

    def _angles(self, tokens: int) -> torch.Tensor:
        pos = self.state.current(tokens)
        if self._cache is None or self._cache[0] is not pos:
            b, t = pos.shape[:2]
            context = PositionContext(b, t, t, pos.device, pos, augmented=True)
            self._cache = (pos, self.rotary.prepare(context).q_angles)
            return self._cache[1]
        angles, self._cache = self._cache[1], None
        return angles

    def __call__(self, module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
        return apply_rotary(out, self._angles(out.shape[2]))

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_cache": None}  # one forward's angles: not the model's


def _block_rotary(index: int, block: nn.Module, name: str, options: dict) -> nn.Module:
    """The rotary of block `index` (its attention's head_dim and heads)."""
    attn = getattr(block, "attn", None)
    missing = [a for a in _ATTENTION if not hasattr(attn, a)]
    missing += [
        a for a in _HOOKED if hasattr(attn, a) and not isinstance(getattr(attn, a), nn.Module)
    ]
    if missing:
        raise TypeError(
            f"model.blocks[{index}].attn must be timm's Attention ({', '.join(_ATTENTION)}, "
            f"q_norm and k_norm modules); {type(attn).__name__} has no {missing}"
        )
    if "heads" in encoding_options(name):  # rope-mixed: frequencies per head
        options = {"heads": int(attn.num_heads), **options}
    return build(name, int(attn.head_dim), **options)


def plan_rotary(
    model: nn.Module, position: object, fit_grid: object, drop_pos_embed: object, options: dict
) -> tuple[RotaryPositions, list[nn.Module], Callable[[], None]]:
    """Check everything and build every block's rotary -> (positions, the rotaries, the
    change)."""
    check_model(model, ("patch_embed", "blocks", "num_prefix_tokens"))
    if not isinstance(position, str):
        raise TypeError(
            f"position must be one of {list(ROTARY_NAMES)}, got {type(position).__name__}"
        )
    if position not in ROTARY_NAMES:
        raise ValueError(f"position must be one of {list(ROTARY_NAMES)}, got {position!r}")
    check_bool("drop_pos_embed", drop_pos_embed)
    if hasattr(model, "cape_rotary"):
        raise ValueError("model already has cape's rotary (model.cape_rotary)")
    if getattr(getattr(model, "patch_drop", None), "prob", 0.0) > 0:
        # PatchDropout keeps a random subset of tokens: their positions would be unknown here
        raise ValueError("patch_drop_rate must be 0 with add_rotary (tokens are dropped by index)")
    opts = with_grid(position, options, check_fit_grid(model, fit_grid))
    rotaries = [_block_rotary(i, b, position, opts) for i, b in enumerate(model.blocks)]
    if not rotaries:
        raise ValueError("model.blocks must hold at least one attention block")
    remove = plan_removal(model) if drop_pos_embed else None
    # the model draws for every block at once (cape.models.plan: draw="shared"); the blocks'
    # rotaries keep theirs (a grid fitted to its scaling reads it) but read drawn positions
    state = RotaryPositions(rotaries[0].augmentation, int(model.num_prefix_tokens))

    def install() -> None:
        if remove is not None:
            remove()
        model.cape_rotary = state
        model.patch_embed.register_forward_hook(_DrawPositions(state, rotaries[0]))
        for block, rotary in zip(model.blocks, rotaries, strict=True):
            block.attn.cape_rotary = rotary
            rotation = _BlockRotation(state, rotary)
            block.attn.q_norm.register_forward_hook(rotation)
            block.attn.k_norm.register_forward_hook(rotation)
        note(model, rotary=spec(position, opts))

    return state, rotaries, install


def add_rotary(
    model: nn.Module,
    position: str = "rotary2d",
    *,
    fit_grid: bool | tuple[int, int] | None = True,
    drop_pos_embed: bool = True,
    **options: Any,
) -> RotaryPositions:
    """Rotate q and k of every timm attention block by 2-D positions, CAPE-augmented.

    model: timm's `VisionTransformer` (changed in place). position: "rotary2d" (CAPE's rotated
    2-D frequencies), "rope-axial" or "rope-mixed" (RoPE-ViT; mixed learns per-head
    frequencies), with `options` of `cape.build` (augmentation fields such as
    max_global_scaling=1.4, or augmentation=cape.Augmentation(...)). fit_grid: as in
    `replace_pos_embed`. drop_pos_embed: remove the learned `pos_embed` (`remove_pos_embed`);
    False keeps it. Returns the `RotaryPositions` (`model.cape_rotary`); block i's rotary is
    `model.blocks[i].attn.cape_rotary`.

    Per forward, q and k [B, H, N, hd] (N = P + H'W') are rotated after q_norm / k_norm; the
    attention itself (fused SDPA) is timm's. Prefix tokens sit at (0, 0). The augmentation is
    drawn once per forward for all blocks, in train mode only (normalize also in eval). The
    model's state_dict holds cape's record: a stock timm model refuses it by name.
    """
    state, _, install = plan_rotary(model, position, fit_grid, drop_pos_embed, options)
    install()
    return state
