"""The training-time augmentation of `position_ids` in a transformers model: a forward
pre-hook that acts in train mode only (evaluation, `generate()` and a Trainer's evaluation loop
see the model's own positions), recorded in the config so that `from_pretrained` installs it
again; a save warns that a stock load does not."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from ...augment import PositionAugmentation
from .install import check_model, record
from .tables import TABLES

__all__ = ["augmented_position_ids", "augment_position_ids", "AugmentationHook"]


def augmented_position_ids(
    augmentation: PositionAugmentation,
    attention_mask: torch.Tensor | None = None,
    *,
    position_ids: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Augmented `position_ids` [B, T] float32 for one training batch.

    attention_mask: [B, T] (1 at real tokens, 0 at padding, transformers' form). position_ids:
    [B, T] given positions; default: real tokens counted from 0 (cumsum(mask) - 1, as
    transformers' generate counts left-padded prompts), so padding, left or right, moves no
    real token. The draws ignore padding; padded tokens get 0. Give at least one of
    attention_mask and position_ids. normalize=True is refused: the mean over a sequence
    reads a causal LM's future tokens, and a common shift changes nothing for rotary.
    """
    if not isinstance(augmentation, PositionAugmentation):
        kinds = "cape.Augmentation, RandomizedPositions, PoSE or RandomFloatPositions"
        raise TypeError(f"augmentation must be a {kinds}, got {augmentation!r}")
    if augmentation.normalize:
        raise ValueError(
            "augmentation: normalize=True subtracts the mean over the whole sequence, which reads "
            "a causal LM's future tokens (and rotary ignores a common shift): use normalize=False"
        )
    mask = _bool_mask(attention_mask, position_ids)
    if position_ids is None:
        position_ids = (mask.long().cumsum(dim=1) - 1).clamp(min=0)
    elif not isinstance(position_ids, torch.Tensor) or tuple(position_ids.shape) != tuple(
        mask.shape
    ):
        shape = getattr(position_ids, "shape", type(position_ids).__name__)
        raise ValueError(
            f"position_ids must be a tensor [B, T] = {tuple(mask.shape)} like attention_mask, "
            f"got {shape}"
        )
    pos = torch.where(mask, position_ids.to(torch.float32), 0.0)[..., None]  # [B, T, 1]
    return augmentation(pos, mask, training=True, generator=generator)[..., 0]


def _bool_mask(attention_mask: object, position_ids: object) -> torch.Tensor:
    """[B, T] bool, True at real tokens, from transformers' 0/1 attention_mask (all True
    without one)."""
    if attention_mask is None:
        if position_ids is None:
            raise ValueError("give attention_mask [B, T] or position_ids [B, T] (or both)")
        if not isinstance(position_ids, torch.Tensor) or position_ids.dim() != 2:
            shape = getattr(position_ids, "shape", type(position_ids).__name__)
            raise ValueError(f"position_ids must be a tensor [B, T], got {shape}")
        return torch.ones(position_ids.shape, dtype=torch.bool, device=position_ids.device)
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2:
        shape = getattr(attention_mask, "shape", type(attention_mask).__name__)
        raise ValueError(
            f"attention_mask must be [B, T] with 1 at real tokens and 0 at padding, got {shape} "
            "(a 4-D or packed mask is not supported)"
        )
    return attention_mask != 0


def _cache_length(kwargs: dict) -> int:
    for name in ("cache", "past_key_values"):
        cache = kwargs.get(name)
        if cache is not None and hasattr(cache, "get_seq_length"):
            return int(cache.get_seq_length())
    return 0


def _stock_table(model: nn.Module) -> str | None:
    """The path of a stock learned table that `position_ids` index (None: none)."""
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in TABLES and isinstance(module, nn.Embedding):
            return name
    return None


def augment_position_ids(
    model: nn.Module,
    augmentation: PositionAugmentation,
    *,
    generator: torch.Generator | None = None,
) -> AugmentationHook:
    """Install an augmentation of `position_ids` on a transformers model (a forward pre-hook):
    in train mode each call's `position_ids` (given, or real tokens counted from 0) become
    `augmented_position_ids(augmentation, attention_mask, ...)`; in eval mode it does nothing,
    so evaluation and `generate()` (and a Trainer's evaluation loop) see the model's own
    positions. Returns the hook's handle (`.remove()`). Call the model with keywords
    (input_ids, attention_mask, position_ids); train mode with a non-empty KV cache is refused
    (one draw must cover the whole sequence). Refused at install: a model whose positions index
    a learned table (non-integer ids cannot index it: install_positions first)."""
    check_model(model, "a transformers model")
    augmented_position_ids(augmentation, torch.ones(1, 1))  # the checks, once, here
    table = _stock_table(model)
    if table is not None:
        raise ValueError(
            f"model: {type(model).__name__} indexes a learned table with position_ids "
            f"({table}, an nn.Embedding): augmented positions are not integers; put a cape "
            "encoding in its place first (install_positions), whose augmentation then acts"
        )

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        if not module.training:
            return None
        if len(args) > 1:
            raise ValueError(
                "augment_position_ids: pass attention_mask and position_ids by keyword "
                f"(got {len(args)} positional arguments)"
            )
        if _cache_length(kwargs):
            raise ValueError(
                "augment_position_ids: train mode with a non-empty KV cache; call model.eval() "
                "to decode (the augmentation is a training-time one)"
            )
        mask, ids = kwargs.get("attention_mask"), kwargs.get("position_ids")
        if mask is None and ids is None:
            tokens = args[0] if args else kwargs.get("input_ids")
            if tokens is None:
                tokens = kwargs["inputs_embeds"][..., 0]
            mask = torch.ones(tokens.shape[:2], dtype=torch.long, device=tokens.device)
        kwargs["position_ids"] = augmented_position_ids(
            augmentation, mask, position_ids=ids, generator=generator
        )
        return args, kwargs

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    record(model, "augment_position_ids", augmentation.as_mapping())
    warn = model._register_state_dict_hook(_warn_hook_lost)
    return AugmentationHook(handle, warn, model)


def _warn_hook_lost(module: nn.Module, state: dict, prefix: str, local: Any) -> None:
    if prefix:  # the model's own state_dict, not a parent's
        return
    spec = (getattr(getattr(module, "config", None), "cape", None) or {}).get(
        "augment_position_ids"
    )
    if spec is not None:
        warnings.warn(
            f"cape: the training-time augmentation of position_ids {spec} is a hook, not a "
            "weight: a stock transformers from_pretrained does not install it; "
            "cape.integrations.hf.from_pretrained does",
            stacklevel=2,
        )


class AugmentationHook:
    """The handle `augment_position_ids` returns: `.remove()` takes the hook, its save warning
    and its record in the config away (also as a `with` block)."""

    def __init__(self, hook: RemovableHandle, warn: RemovableHandle, model: nn.Module) -> None:
        self._hook, self._warn, self._model = hook, warn, model

    def remove(self) -> None:
        self._hook.remove()
        self._warn.remove()
        record(self._model, "augment_position_ids", None)

    def __enter__(self) -> AugmentationHook:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()
