"""cape inside timm's Vision Transformer: a 2-D encoding for `pos_embed`, 2-D rotary in attention.

Duck-typed on the attributes of timm's `VisionTransformer` (`patch_embed`, `pos_embed`,
`cls_token`, `reg_token`, `num_prefix_tokens`, `no_embed_class`, `blocks[i].attn` with `qkv`,
`q_norm`, `k_norm`): this module imports neither timm nor torchvision.

- `replace_pos_embed(model, "cape2d", preset="image")`: the learned `pos_embed` is removed and a
  cape encoding of the patch grid is added to the patch tokens instead, for whatever grid the
  input gives (any image size with timm's `dynamic_img_size=True`); CAPE's augmentation in train
  mode only. Prefix tokens (class, registers) get no cape position.
- `add_rotary(model, "rotary2d", max_global_scaling=1.4)`: every attention block rotates q and
  k (after timm's q_norm / k_norm, before its fused `scaled_dot_product_attention`, which is
  kept) by the 2-D patch positions; the prefix tokens sit at (0, 0), the image centre. CAPE's
  augmentation is drawn once per forward for every block (as cape's own stacks do).
- `remove_pos_embed(model)`: what both do to `pos_embed` (below), on its own.

Removing `pos_embed`: the rows that belonged to the prefix tokens (`no_embed_class=False`) are
folded into `cls_token` / `reg_token` (a prefix token's input, token + its row, is unchanged).
A load_state_dict pre-hook does the same to a stock timm checkpoint, so that
`model.load_state_dict(stock_state_dict)` loads strictly: its `pos_embed` is folded and dropped
(the patch rows are what cape replaces). Encodings with parameters of their own (`lff`,
`rope-mixed`) add keys that a stock checkpoint lacks: load it with `strict=False`.

Both work through hooks (forward hooks on `patch_embed`, `q_norm`, `k_norm`; a pre-hook on
`patch_drop` for `pos_drop`): the state_dict keys stay timm's, and `forward`,
`forward_features` and `forward_intermediates` all see the positions.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..augment import Augmentation
from ..build import build, encoding_options
from ..encodings.in_attention import PositionContext
from ..functional.rotary import apply_rotary
from ..models.plan import moves_positions

__all__ = ["replace_pos_embed", "add_rotary", "remove_pos_embed", "RotaryPositions"]

ROTARY_NAMES = ("rotary2d", "rope-axial", "rope-mixed")
_VIT = "a timm VisionTransformer (timm.create_model('vit_...'))"
_ATTENTION = ("qkv", "q_norm", "k_norm", "num_heads", "head_dim")


def _check_model(model: object, needs: tuple[str, ...]) -> nn.Module:
    """model must be an nn.Module with the attributes `needs` (timm's ViT has them)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be {_VIT}, got {type(model).__name__}")
    missing = [name for name in needs if not hasattr(model, name)]
    if missing:
        raise TypeError(f"model must be {_VIT}; {type(model).__name__} has no {missing}")
    return model


def _fit_grid(model: nn.Module, fit_grid: bool | tuple[int, int] | None) -> tuple | None:
    """fit_grid: True (the model's training grid, `patch_embed.grid_size`), a pair (H, W) or
    None / False -> (H, W) or None."""
    if fit_grid is None or fit_grid is False:
        return None
    if fit_grid is True:
        return tuple(int(n) for n in model.patch_embed.grid_size)
    if not isinstance(fit_grid, (tuple, list)) or len(fit_grid) != 2:
        raise TypeError(f"fit_grid must be True, False, None or a pair (H, W), got {fit_grid!r}")
    return tuple(fit_grid)


def _with_grid(name: str, options: dict[str, Any], grid: tuple | None) -> dict[str, Any]:
    """options plus fit_grid=grid where the encoding `name` takes it and it was not given."""
    if grid is not None and "fit_grid" in encoding_options(name):
        return {"fit_grid": grid, **options}
    return dict(options)


def _patch_grid(patch_embed: nn.Module, images: torch.Tensor, out: torch.Tensor) -> tuple:
    """The (H', W') patch grid of patch_embed's output: [B, H', W', D] (timm's
    `dynamic_img_size`) or [B, H'W', D] on the grid of the images' size."""
    if out.dim() == 4:  # NHWC
        return out.shape[1], out.shape[2]
    if hasattr(patch_embed, "dynamic_feat_size") and images.dim() == 4:
        height, width = patch_embed.dynamic_feat_size(tuple(images.shape[-2:]))
    else:
        height, width = patch_embed.grid_size
    if out.dim() != 3 or out.shape[1] != height * width:
        raise ValueError(
            f"patch_embed's output must be [B, H', W', D] or [B, H'W', D] with (H', W') = "
            f"{(height, width)} for images {tuple(images.shape)}, got {tuple(out.shape)}"
        )
    return int(height), int(width)


# --- pos_embed removed, its prefix rows folded into the prefix tokens --------------------------


class _FoldPosEmbed:
    """load_state_dict pre-hook: folds a checkpoint's `pos_embed` rows of the prefix tokens into
    them (tokens: (name, rows) in timm's order, cls then registers) and drops `pos_embed`."""

    def __init__(self, tokens: list[tuple[str, int]], no_embed_class: bool) -> None:
        self.tokens, self.no_embed_class = tokens, no_embed_class

    def __call__(self, state_dict: dict, prefix: str, *args: Any) -> None:
        pos = state_dict.pop(prefix + "pos_embed", None)  # torch loads from a copy of the dict
        if pos is None or self.no_embed_class:  # deit-3 style: no rows for the prefix tokens
            return
        start = 0
        for name, rows in self.tokens:
            key = prefix + name
            if key in state_dict:
                token = state_dict[key]
                state_dict[key] = token + pos[:, start : start + rows].to(token.dtype)
            start += rows


class _PosDrop:
    """Forward pre-hook of `patch_drop`: timm skips `pos_drop` when `pos_embed` is None; this
    applies it where timm does, to all tokens [B, N, D] after `_pos_embed`."""

    def __init__(self, dropout: nn.Module) -> None:
        self.dropout = dropout

    def __call__(self, module: nn.Module, args: tuple) -> tuple:
        return (self.dropout(args[0]), *args[1:])


def _prefix_tokens(model: nn.Module) -> list[tuple[str, int]]:
    """(name, rows) of the prefix tokens in timm's order: cls_token, then reg_token."""
    tokens = []
    for name in ("cls_token", "reg_token"):
        token = getattr(model, name, None)
        if token is not None:
            tokens.append((name, int(token.shape[1])))
    if sum(rows for _, rows in tokens) != int(model.num_prefix_tokens):
        raise ValueError(
            f"model.num_prefix_tokens ({model.num_prefix_tokens}) must count cls_token and "
            f"reg_token's rows, got {tokens}"
        )
    return tokens


def remove_pos_embed(model: nn.Module) -> None:
    """Remove timm ViT's learned `pos_embed` [1, P + H*W or H*W, D] (module docstring).

    Its prefix rows are folded into `cls_token` [1, 1, D] / `reg_token` [1, R, D]; a
    load_state_dict pre-hook does the same to checkpoints loaded later (a stock one loads
    strictly). `pos_drop` keeps acting (timm skips it without `pos_embed`). Calling it again
    does nothing.
    """
    _check_model(model, ("pos_embed", "num_prefix_tokens", "no_embed_class", "pos_drop"))
    if getattr(model, "cape_pos_embed_removed", False):
        return
    fold = _FoldPosEmbed(_prefix_tokens(model), bool(model.no_embed_class))
    if model.pos_embed is not None:
        tokens = {name: getattr(model, name) for name, _ in fold.tokens}
        folded = {name: token.detach() for name, token in tokens.items()}
        folded["pos_embed"] = model.pos_embed.detach()
        fold(folded, "")  # the hook's own fold, on the model's current values
        with torch.no_grad():
            for name, token in tokens.items():
                token.copy_(folded[name])
    model.pos_embed = None  # timm's _pos_embed then only prepends the prefix tokens
    model._register_load_state_dict_pre_hook(fold)
    if getattr(model.pos_drop, "p", 0.0) > 0:
        if not hasattr(model, "patch_drop"):
            raise ValueError("model.pos_drop has p > 0 but the model has no patch_drop to hook")
        model.patch_drop.register_forward_pre_hook(_PosDrop(model.pos_drop))
    model.cape_pos_embed_removed = True


# --- an absolute 2-D encoding of the patch grid ------------------------------------------------


class _AddPositions:
    """Forward hook of `patch_embed`: patch tokens [B, H', W', D] or [B, H'W', D] + the
    encoding of their (H', W') grid (augmented in train mode: `encoding.training`)."""

    def __init__(self, encoding: nn.Module) -> None:
        self.encoding = encoding

    def __call__(self, module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
        height, width = _patch_grid(module, args[0], out)
        flat = out.reshape(out.shape[0], height * width, out.shape[-1])
        return out + self.encoding(flat, grid=(height, width)).reshape(out.shape)


def _absolute(position: str | nn.Module, dim: int, grid: tuple | None, options: dict) -> nn.Module:
    """A 2-D absolute encoding of width dim: a `cape.build` name (+ options) or a module."""
    if isinstance(position, str):
        encoding = build(position, dim, **_with_grid(position, options, grid))
    elif isinstance(position, nn.Module):
        if options:
            raise TypeError(f"options {sorted(options)} apply to a name, not to a module")
        encoding = position
    else:
        raise TypeError(f"position must be a cape.build name or an nn.Module, got {position!r}")
    if getattr(encoding, "kind", None) != "absolute" or getattr(encoding, "pos_dim", 0) != 2:
        raise ValueError(
            "position must be a 2-D absolute encoding (cape2d, sinpos2d, sine-2d, lff, "
            f"abspos2d...); got {type(encoding).__name__} (rotary: use add_rotary)"
        )
    if getattr(encoding, "dim", dim) != dim:
        raise ValueError(f"position's dim must be the model's embed_dim {dim}, got {encoding.dim}")
    return encoding


def replace_pos_embed(
    model: nn.Module,
    position: str | nn.Module = "cape2d",
    *,
    fit_grid: bool | tuple[int, int] | None = True,
    **options: Any,
) -> nn.Module:
    """Make a timm ViT add a cape 2-D encoding to its patch tokens instead of `pos_embed`.

    model: timm's `VisionTransformer` (changed in place). position: a `cape.build` name of a
    2-D absolute encoding ("cape2d", "sinpos2d", "sine-2d", "lff"...) with `options` (e.g.
    preset="image"), or a ready module with dim = model.embed_dim. fit_grid: True fits the
    frequencies to the training grid `model.patch_embed.grid_size` where the name takes
    fit_grid (cape2d, sinpos2d, sine-2d); a pair (H, W) fits another; False/None keeps the
    encoding's own. Returns the encoding, registered as `model.cape_pos_embed`.

    Per forward, patch tokens [B, H', W', D] (`dynamic_img_size=True`: any image size) or
    [B, H'W', D] get `encoding(tokens, grid=(H', W'))` [B, H'W', D] added; prefix tokens get
    none (their learned rows are folded in: `remove_pos_embed`). Train mode draws CAPE's
    augmentation per sample; eval is deterministic.
    """
    _check_model(model, ("patch_embed", "embed_dim", "pos_embed"))
    if hasattr(model, "cape_pos_embed"):
        raise ValueError("model already has a cape encoding (model.cape_pos_embed)")
    grid = _fit_grid(model, fit_grid)
    encoding = _absolute(position, int(model.embed_dim), grid, options)
    remove_pos_embed(model)
    model.cape_pos_embed = encoding  # a submodule: model.train() / .eval() / .to() reach it
    model.patch_embed.register_forward_hook(_AddPositions(encoding))
    return encoding


# --- 2-D rotary inside every attention block ---------------------------------------------------


class RotaryPositions(nn.Module):
    """The (x, y) positions that every block's rotary reads in one forward, drawn once.

    Set by a forward hook of `patch_embed` (so every forward path draws): [1 or B, P + H'W', 2]
    float32, the P prefix tokens at (0, 0) then the patch grid row-major (`grid_positions`),
    with CAPE's augmentation drawn per sample in train mode for all tokens together (one
    global shift / scale per image, which cancels between tokens, as in `cape.models.ViT`).
    augmentation: CAPE's `Augmentation` (None: none). generator: for reproducible draws.
    No parameters or buffers (nothing in the state_dict).
    """

    def __init__(self, augmentation: Augmentation | None, num_prefix_tokens: int) -> None:
        super().__init__()
        self.augmentation = augmentation
        self.num_prefix_tokens = num_prefix_tokens
        self.generator: torch.Generator | None = None
        self.positions: torch.Tensor | None = None

    def draw(self, grid: torch.Tensor, batch: int) -> torch.Tensor:
        """grid: [1, H'W', 2] patch positions -> the positions of this forward (class doc)."""
        prefix = grid.new_zeros(1, self.num_prefix_tokens, 2)
        pos = torch.cat([prefix, grid], dim=1)
        aug = self.augmentation
        if moves_positions(aug, self.training):
            pos = aug(pos.expand(batch, -1, -1), training=self.training, generator=self.generator)
        self.positions = pos
        return pos

    def current(self, tokens: int) -> torch.Tensor:
        """The positions of this forward, for an attention over `tokens` tokens."""
        pos = self.positions
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
        height, width = _patch_grid(module, args[0], out)
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


def _block_rotary(index: int, block: nn.Module, name: str, options: dict) -> nn.Module:
    """The rotary of block `index` (its attention's head_dim and heads), augmentation removed."""
    attn = getattr(block, "attn", None)
    missing = [a for a in _ATTENTION if not hasattr(attn, a)]
    if missing:
        raise TypeError(
            f"model.blocks[{index}].attn must be timm's Attention ({', '.join(_ATTENTION)}); "
            f"{type(attn).__name__} has no {missing}"
        )
    if "heads" in encoding_options(name):  # rope-mixed: frequencies per head
        options = {"heads": int(attn.num_heads), **options}
    rotary = build(name, int(attn.head_dim), **options)
    return rotary


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
    drawn once per forward for all blocks, in train mode only (normalize also in eval).
    """
    _check_model(model, ("patch_embed", "blocks", "num_prefix_tokens"))
    if position not in ROTARY_NAMES:
        raise ValueError(f"position must be one of {list(ROTARY_NAMES)}, got {position!r}")
    if hasattr(model, "cape_rotary"):
        raise ValueError("model already has cape's rotary (model.cape_rotary)")
    if getattr(getattr(model, "patch_drop", None), "prob", 0.0) > 0:
        # PatchDropout keeps a random subset of tokens: their positions would be unknown here
        raise ValueError("patch_drop_rate must be 0 with add_rotary (tokens are dropped by index)")
    opts = _with_grid(position, options, _fit_grid(model, fit_grid))
    rotaries = [_block_rotary(i, b, position, opts) for i, b in enumerate(model.blocks)]
    if not rotaries:
        raise ValueError("model.blocks must hold at least one attention block")
    # the model draws for every block at once (cape.models.plan: draw="shared"); the blocks'
    # rotaries keep theirs (a grid fitted to its scaling reads it) but read drawn positions
    augmentation = rotaries[0].augmentation
    state = RotaryPositions(augmentation, int(model.num_prefix_tokens))
    if drop_pos_embed:
        remove_pos_embed(model)
    model.cape_rotary = state
    model.patch_embed.register_forward_hook(_DrawPositions(state, rotaries[0]))
    for block, rotary in zip(model.blocks, rotaries, strict=True):
        block.attn.cape_rotary = rotary
        rotation = _BlockRotation(state, rotary)
        block.attn.q_norm.register_forward_hook(rotation)
        block.attn.k_norm.register_forward_hook(rotation)
    return state
