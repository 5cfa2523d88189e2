"""timm ViT's learned `pos_embed` removed, and a cape 2-D encoding of the patch grid added to
the patch tokens instead (`replace_pos_embed`).

Removing `pos_embed`: the rows that belonged to the prefix tokens (`no_embed_class=False`) are
folded into `cls_token` / `reg_token` (a prefix token's input, token + its row, is unchanged).
A load_state_dict pre-hook does the same to a stock timm checkpoint, so that
`model.load_state_dict(stock_state_dict)` loads strictly: its `pos_embed` is folded and dropped
(the patch rows are what cape replaces).

Each install checks everything (and builds its encoding) before it changes the model: a
refused call leaves the model as it was. `plan_*` return the change as a function, so that
cape's loader checks every recorded install before it makes any.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ...build import build
from .checks import check_fit_grid, check_model, patch_grid, with_grid
from .record import note, spec

__all__ = ["remove_pos_embed", "replace_pos_embed", "plan_removal", "plan_encoding"]

_POS_EMBED = ("pos_embed", "num_prefix_tokens", "no_embed_class", "pos_drop", "patch_embed")


class _FoldPosEmbed:
    """load_state_dict pre-hook: folds a checkpoint's `pos_embed` rows of the prefix tokens into
    them (tokens: (name, rows) in timm's order, cls then registers) and drops `pos_embed`."""

    def __init__(self, tokens: list[tuple[str, int]], no_embed_class: bool) -> None:
        self.tokens, self.no_embed_class = tokens, no_embed_class

    def __call__(self, module: nn.Module, state_dict: dict, prefix: str, *args: Any) -> None:
        self.fold(state_dict, prefix)

    def fold(self, state_dict: dict, prefix: str) -> None:
        """Fold and drop `prefix + "pos_embed"` of state_dict, in place."""
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
            f"reg_token's rows, got {tokens} (a distillation token is not supported)"
        )
    return tokens


def plan_removal(model: nn.Module) -> Callable[[], None]:
    """Check that `pos_embed` can be removed -> the removal (nothing when already done)."""
    check_model(model, _POS_EMBED)
    if getattr(model, "cape_pos_embed_removed", False):
        return lambda: None
    fold = _FoldPosEmbed(_prefix_tokens(model), bool(model.no_embed_class))
    drops = getattr(model.pos_drop, "p", 0.0) > 0
    if drops and not hasattr(model, "patch_drop"):
        raise ValueError("model.pos_drop has p > 0 but the model has no patch_drop to hook")

    def remove() -> None:
        if getattr(model, "cape_pos_embed_removed", False):  # another planned install did it
            return
        note(model)  # the record first: it says whether timm had a table
        if model.pos_embed is not None:
            tokens = {name: getattr(model, name) for name, _ in fold.tokens}
            folded = {name: token.detach() for name, token in tokens.items()}
            folded["pos_embed"] = model.pos_embed.detach()
            fold.fold(folded, "")  # the hook's own fold, on the model's current values
            with torch.no_grad():
                for name, token in tokens.items():
                    token.copy_(folded[name])
            note(model, pos_embed="removed")
        model.pos_embed = None  # timm's _pos_embed then only prepends the prefix tokens
        model.register_load_state_dict_pre_hook(fold)
        if drops:
            model.patch_drop.register_forward_pre_hook(_PosDrop(model.pos_drop))
        model.cape_pos_embed_removed = True

    return remove


def remove_pos_embed(model: nn.Module) -> None:
    """Remove timm ViT's learned `pos_embed` [1, P + H*W or H*W, D] (module docstring).

    Its prefix rows are folded into `cls_token` [1, 1, D] / `reg_token` [1, R, D]; a
    load_state_dict pre-hook does the same to checkpoints loaded later (a stock one loads
    strictly). `pos_drop` keeps acting (timm skips it without `pos_embed`). Calling it again
    does nothing. The model's state_dict holds a zero `pos_embed` for stock timm (the same
    outputs) and cape's record (`cape.integrations.timm.record`).
    """
    plan_removal(model)()


class _AddPositions:
    """Forward hook of `patch_embed`: patch tokens [B, H', W', D] or [B, H'W', D] + the
    encoding of their (H', W') grid (augmented in train mode: `encoding.training`)."""

    def __init__(self, encoding: nn.Module) -> None:
        self.encoding = encoding

    def __call__(self, module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
        height, width = patch_grid(module, args[0], out)
        flat = out.reshape(out.shape[0], height * width, out.shape[-1])
        positions = self.encoding(flat, grid=(height, width))
        return out + positions.reshape(positions.shape[0], *out.shape[1:]).to(out.dtype)


def _absolute(position: object, dim: int, grid: tuple | None, options: dict) -> nn.Module:
    """A 2-D absolute encoding of width dim: a `cape.build` name (+ options) or a module."""
    if isinstance(position, str):
        encoding = build(position, dim, **with_grid(position, options, grid))
    elif isinstance(position, nn.Module):
        if options:
            raise TypeError(f"options {sorted(options)} apply to a name, not to a module")
        encoding = position
    else:
        raise TypeError(
            f"position must be a cape.build name or an nn.Module, got {type(position).__name__} "
            f"{position!r:.60}"
        )
    if getattr(encoding, "kind", None) != "absolute" or getattr(encoding, "pos_dim", 0) != 2:
        raise ValueError(
            "position must be a 2-D absolute encoding (cape2d, sinpos2d, sine-2d, lff, "
            f"abspos2d...); got {type(encoding).__name__} (rotary: use add_rotary)"
        )
    if getattr(encoding, "dim", dim) != dim:
        raise ValueError(f"position's dim must be the model's embed_dim {dim}, got {encoding.dim}")
    return encoding


def _encoding_spec(encoding: nn.Module) -> dict[str, Any]:
    """What makes the encoding again: its cape.build spec, or why there is none."""
    made = getattr(encoding, "build_spec", None)
    if made is None:
        return {"name": type(encoding).__name__, "unsaved": "a module not made by cape.build"}
    return spec(made["name"], made["options"], dim=made["dim"])


def plan_encoding(
    model: nn.Module, position: object, fit_grid: object, options: dict[str, Any]
) -> tuple[nn.Module, Callable[[], None]]:
    """Check everything and build the encoding -> (encoding, the change: `replace_pos_embed`)."""
    check_model(model, ("patch_embed", "embed_dim", *_POS_EMBED))
    if hasattr(model, "cape_pos_embed"):
        raise ValueError("model already has a cape encoding (model.cape_pos_embed)")
    grid = check_fit_grid(model, fit_grid)
    encoding = _absolute(position, int(model.embed_dim), grid, options)
    remove = plan_removal(model)

    def install() -> None:
        remove()
        model.cape_pos_embed = encoding  # a submodule: model.train() / .eval() / .to() reach it
        model.patch_embed.register_forward_hook(_AddPositions(encoding))
        note(model, encoding=_encoding_spec(encoding))

    return encoding, install


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
    augmentation per sample; eval is deterministic. The model's state_dict holds cape's record
    and, as `pos_embed`, the eval-mode encoding of the training grid (what stock timm reads).
    """
    encoding, install = plan_encoding(model, position, fit_grid, options)
    install()
    return encoding
