"""What the models share about their encodings: per-model default options of `cape.build`
names, the check that an encoding reads the positions a model has, and taking over an
encoding's augmentation (to synchronise it across inputs, as the translation model does)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from ..augment import Augmentation
from ..build import encoding_class

__all__ = ["resolve_options", "check_pos_dim", "take_augmentation", "attention_size"]


def resolve_options(
    name: str, options: object, defaults: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """`position_options` over a model's defaults for `name` -> the options for `cape.build`.

    A given `augmentation` replaces a default `preset` (they would set the same fields twice).
    """
    if options is not None and not isinstance(options, dict):
        raise TypeError(f"position_options must be a dict or None, got {type(options).__name__}")
    out = dict(defaults.get(name, {}))
    if options and "augmentation" in options:
        out.pop("preset", None)
    return {**out, **(options or {})}


def attention_size(name: str, dim: int, heads: int) -> int:
    """The `dim` that `cape.build(name, ...)` takes for an in-attention encoding of a model of
    width `dim` with `heads` heads: the head size dim / heads, or the number of heads for an
    encoding that holds one value per head (its class says `per_head = True`: ALiBi, FIRE)."""
    if getattr(encoding_class(name, key="position"), "per_head", False):
        return heads
    return dim // heads


def check_pos_dim(name: str, encoding: nn.Module, want: int, what: str) -> None:
    """`encoding` (built for `name`) must read `want`-D positions: what the model has."""
    if encoding.pos_dim != want:
        raise ValueError(f"position {name!r} reads {encoding.pos_dim}-D positions; {what}")


def take_augmentation(encoding: nn.Module, *, causal: bool = True) -> Augmentation | None:
    """The encoding's augmentation, removed from it: the model applies it itself (synchronised
    across inputs, or drawn once for every layer). With `causal` (a decoder), mean-normalisation
    is refused: a target position would depend on later tokens."""
    aug = getattr(encoding, "augmentation", None)
    if causal and aug is not None and aug.normalize:
        raise ValueError(
            "normalize=True (mean-normalisation) would make a target position depend on later "
            "tokens; the decoder is causal: use normalize=False"
        )
    if aug is not None:
        encoding.augmentation = None
    return aug
