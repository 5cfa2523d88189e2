"""Positions taken out of a model for a while: does it use them?

`without_positions(model)` removes, for the duration of a `with` block, every encoding the
position plan put in the model (`cape.models.plan`): every absolute cape encoding a module
holds (a stack's or the ViT's `position`, a translator's `src_position` / `tgt_position`; a
module of the user's own making is left in) and every attention's rotation and biases. The
models skip an input encoding that is None. What is left is the same model with no way to
tell one place from another (as `nopos`, with the trained content weights). If its accuracy
barely moves, the model does not use its positions, and no length or size effect of its
encoding can show.

    with without_positions(model) as had:  # had: whether there was anything to take out
        blind = evaluate(model)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

from ..encodings.base import PositionalEncoding
from .attention import MultiheadAttention

__all__ = ["without_positions", "has_positions"]


def _taken(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """(owner, attribute, module) of every encoding in `model`: each absolute cape encoding
    held by a module that is not itself one, and each attention's rotation and biases."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    found = []
    for owner in model.modules():
        if isinstance(owner, PositionalEncoding):
            continue
        for name, held in owner._modules.items():
            if isinstance(held, PositionalEncoding) and held.kind != "none":
                found.append((owner, name, held))
        if isinstance(owner, MultiheadAttention):
            if owner.rotary is not None:
                found.append((owner, "rotary", owner.rotary))
            if len(owner.biases):
                found.append((owner, "biases", owner.biases))
    return found


def has_positions(model: nn.Module) -> bool:
    """Whether `model` holds any encoding that `without_positions` would take out."""
    return bool(_taken(model))


@contextlib.contextmanager
def without_positions(model: nn.Module) -> Iterator[bool]:
    """`model` with no positions inside the block (module docstring); yields whether it had
    any. Everything is put back on leaving, also after an error."""
    taken = _taken(model)
    for owner, name, _ in taken:
        setattr(owner, name, nn.ModuleList() if name == "biases" else None)
    try:
        yield bool(taken)
    finally:
        for owner, name, held in reversed(taken):
            setattr(owner, name, held)
