"""One position plan for every model: where an encoding goes, and who draws its augmentation.

A model asks `position_plan(name, dim=D, heads=H, options=...)` once, in its constructor, and
gets a `PositionPlan`:

- `absolute`: the module added to the input (`kind = "absolute"`), or None;
- `layer()`: a new in-attention module for one layer (`kind = "attention"`: rotary, RoPE-ViT,
  relpos, ALiBi, FIRE), or None when the encoding adds at the input;
- `augmentation`: CAPE's augmentation of the positions that the in-attention layers read,
  drawn **once per forward** by the stack (`draw="shared"`, the default) and handed to every
  layer, as x-transformers computes rotary once per stack. `draw="per_layer"` (an option of the
  plan: `position_options={"draw": "per_layer"}`) leaves the augmentation inside each layer's
  module instead, so that every layer draws its own: an ablation, not the method.

`owner="model"` (`sync=True`) hands the augmentation to the model itself, which synchronises it
across inputs (the translation model: one global shift for source and target); the stacks then
draw nothing. The names are those of `cape.build`; per-model defaults go in `defaults`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from .._checks import check_choice, check_int, check_mask
from ..augment import Augmentation
from ..build import build, encoding_class
from ..positions import as_positions, token_positions

__all__ = ["DRAWS", "PositionPlan", "position_plan", "resolve_options", "add_position"]

DRAWS = ("shared", "per_layer")  # who draws an in-attention augmentation: the stack, each layer
PLAN_OPTIONS = ("draw",)  # options of the plan itself, taken out before `cape.build`


def resolve_options(
    name: str, options: object, defaults: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, Any]:
    """`position_options` over a model's defaults for `name` -> the options for `cape.build`.

    A given `augmentation` replaces a default `preset` (they would set the same fields twice).
    """
    if options is not None and not isinstance(options, dict):
        raise TypeError(f"position_options must be a dict or None, got {type(options).__name__}")
    out = dict((defaults or {}).get(name, {}))
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


def take_augmentation(encoding: nn.Module) -> Augmentation | None:
    """The encoding's augmentation, removed from it: the model or stack applies it instead."""
    aug = getattr(encoding, "augmentation", None)
    if aug is not None:
        encoding.augmentation = None
    return aug


def _refuse_normalize(encoding: nn.Module) -> None:
    """Refuse an encoding whose augmentation mean-normalises for a causal model: the mean over a
    call's positions would make a token's position depend on later tokens."""
    aug = getattr(encoding, "augmentation", None)
    if aug is not None and aug.normalize:
        raise ValueError(
            "normalize=True (mean-normalisation) would make a token's position depend on later "
            "tokens; this model is causal: use normalize=False"
        )


def moves_positions(augmentation: Augmentation | None, training: bool) -> bool:
    """Whether a call of `augmentation` in this mode changes any position: mean-normalisation
    always, the random draws in training only (None: nothing)."""
    return augmentation is not None and (
        augmentation.normalize or (training and augmentation.random)
    )


@dataclasses.dataclass(eq=False)
class PositionPlan:
    """Where a model's positions go (module docstring). Made by `position_plan`.

    name: the `cape.build` name (or the module's class name). kind: "absolute", "attention" or
    "none". absolute: the module added at the input. factory: makes one in-attention module.
    augmentation: drawn once per forward by `owner` ("stack" or "model"); None when there is
    none or each layer draws its own (`draw="per_layer"`). probe: one module of the encoding,
    not part of any model, that answers what positions it reads (`pos_dim`, `units`,
    `grid_positions`).
    """

    name: str
    kind: str
    absolute: nn.Module | None = None
    factory: Callable[[], nn.Module] | None = None
    augmentation: Augmentation | None = None
    draw: str = "shared"
    owner: str = "stack"
    probe: nn.Module | None = None

    @property
    def in_attention(self) -> bool:
        """Whether the layers carry the positions (rotary, relpos, ALiBi, FIRE...)."""
        return self.factory is not None

    @property
    def pos_dim(self) -> int:
        """M, the coordinates per position the encoding reads (1 when it reads none)."""
        return getattr(self.probe, "pos_dim", 1)

    @property
    def units(self) -> str:
        """ "continuous" or "index" (a learned table's rows): how its positions are counted."""
        return getattr(self.probe, "units", "continuous")

    def layer(self) -> nn.Module | None:
        """A new in-attention module for one layer (None when the encoding adds at the input)."""
        if self.factory is None:
            return None
        made = self.factory()
        if self.draw == "shared":  # the stack (or the model) draws for every layer at once
            take_augmentation(made)
        return made

    def another_absolute(self) -> nn.Module | None:
        """A second input encoding like `absolute` (a decoder's own table), or `absolute`
        itself when it holds no parameters (a sinusoid is shared)."""
        if self.absolute is None or not any(True for _ in self.absolute.parameters()):
            return self.absolute
        assert self.probe is not None and self.factory is None
        made = build(self.name, self.absolute.dim, **self._options)
        if self.owner == "model":
            take_augmentation(made)
        return made

    def without_absolute(self) -> PositionPlan:
        """The same plan for a stack whose model adds the input encoding itself."""
        return dataclasses.replace(self, absolute=None)

    @property
    def stack_augmentation(self) -> Augmentation | None:
        """What a stack draws once per forward for its layers (None: nothing)."""
        if self.owner != "stack" or self.factory is None:
            return None
        return self.augmentation

    def layer_positions(
        self,
        positions: torch.Tensor | None,
        mask: torch.Tensor | None,
        shape: tuple[int, int],
        device: torch.device,
        training: bool,
        generator: torch.Generator | None,
    ) -> torch.Tensor | None:
        """The positions every layer reads: given ([B, T(, M)]) or token indices, augmented
        once (the shared draw) -> [B, T, M] float32; `positions` as they are without one."""
        if mask is not None:
            check_mask("mask", mask, shape)
        aug = self.stack_augmentation
        if not moves_positions(aug, training):
            return positions
        if positions is None:
            pos = token_positions(*shape, mask=mask, device=device)
        else:
            pos = as_positions(positions, mask=mask, dims=self.pos_dim)
        return aug(pos, mask, training=training, generator=generator)

    _options: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)


def plan_of_modules(
    absolute: nn.Module | None, factory: Callable[[], nn.Module] | None
) -> PositionPlan:
    """A plan for modules made by the caller (the stacks' `position=` and `relative_factory=`):
    each in-attention module keeps its own augmentation (drawn per layer)."""
    if absolute is not None and not isinstance(absolute, nn.Module):
        raise TypeError(f"position must be an nn.Module or None, got {type(absolute).__name__}")
    if getattr(absolute, "kind", None) == "attention":
        raise TypeError(
            f"position must be an absolute encoding; {type(absolute).__name__} acts inside "
            "attention: pass its cape.build name, or relative_factory=lambda: a new one per layer"
        )
    if getattr(absolute, "kind", None) == "none":  # NoPos reads no positions: nothing to add
        absolute = None
    kind = "attention" if factory is not None else "absolute" if absolute is not None else "none"
    name = type(absolute).__name__ if absolute is not None else kind
    return PositionPlan(name, kind, absolute, factory, draw="per_layer", probe=absolute)


def position_plan(
    position: str | nn.Module | PositionPlan | None,
    *,
    dim: int,
    heads: int,
    options: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Mapping[str, Any]] | None = None,
    sync: bool = False,
    causal: bool = False,
    pos_dim: int | None = None,
    what: str = "",
) -> PositionPlan:
    """The plan of a model of width `dim` with `heads` heads for `position`.

    position: a `cape.build` name, an absolute encoding module (used as it is), a plan (returned
    as it is) or None (no positions). options: keywords of `cape.build` for that name, plus the
    plan's own `draw` ("shared": the stack draws CAPE's augmentation once per forward for every
    layer; "per_layer": each layer draws its own). defaults: per-name options of the model,
    under `options`. sync: the model draws the augmentation itself, for the input encodings too
    (it synchronises several inputs). causal: refuse mean-normalisation (a decoder). pos_dim: the
    M of the positions the model has; `what` says what the model needs when they differ.
    """
    if isinstance(position, PositionPlan):
        return position
    check_int("dim", dim)
    check_int("heads", heads)
    if position is None:
        return PositionPlan("none", "none")
    if isinstance(position, nn.Module):
        if options:
            raise ValueError("position_options apply to a position name, not to a module")
        if getattr(position, "kind", None) not in ("absolute", "none", "attention"):
            raise TypeError(
                f"position must be a cape encoding module, got {type(position).__name__}"
            )
        plan = plan_of_modules(position, None)
        _check_pos_dim(plan, pos_dim, what)
        return plan
    cls = encoding_class(position, key="position")  # a `cape.build` name, or the list of them
    name = position.lower()
    opts = resolve_options(name, dict(options) if options is not None else None, defaults)
    draw = opts.pop("draw", "shared")
    check_choice("position_options['draw']", draw, DRAWS)
    kind = cls.kind
    if kind == "none":
        probe = build(name, dim, **opts)  # nopos: nothing to add, but its options are checked
        return PositionPlan(name, "none", probe=probe)
    if kind == "absolute":
        if "draw" in (options or {}):
            raise ValueError(
                f"position_options['draw'] applies to encodings inside attention; {name!r} is "
                "added at the input (one draw per forward)"
            )
        plan = _absolute_plan(name, build(name, dim, **opts), sync=sync, causal=causal)
        plan._options = opts
        _check_pos_dim(plan, pos_dim, what)
        return plan
    if sync and draw == "per_layer":
        raise ValueError(
            "position_options['draw']='per_layer' cannot be synchronised across inputs: this "
            "model draws one augmentation for all of them"
        )
    size = attention_size(name, dim, heads)
    probe = build(name, size, **opts)  # the options are checked once, here
    if causal:  # a shared draw or each layer's own: either would read later tokens
        _refuse_normalize(probe)
    aug = getattr(probe, "augmentation", None) if draw == "shared" else None

    def factory() -> nn.Module:
        return build(name, size, **opts)

    plan = PositionPlan(name, kind, None, factory, aug, draw, "model" if sync else "stack", probe)
    plan._options = opts
    _check_pos_dim(plan, pos_dim, what)
    return plan


def _absolute_plan(name: str, absolute: nn.Module, *, sync: bool, causal: bool) -> PositionPlan:
    """The plan of an encoding added at the input: the stack draws its augmentation in the
    module's forward, or the model once for all its inputs (`sync`, the augmentation taken out)."""
    if causal:
        _refuse_normalize(absolute)
    aug = take_augmentation(absolute) if sync else None
    owner = "model" if sync else "stack"
    plan = PositionPlan(name, "absolute", absolute, None, aug, "shared", owner)
    plan.probe = absolute
    return plan


def _check_pos_dim(plan: PositionPlan, want: int | None, what: str) -> None:
    if want is not None and plan.probe is not None and plan.pos_dim != want:
        raise ValueError(f"position {plan.name!r} reads {plan.pos_dim}-D positions; {what}")


def add_position(position: nn.Module, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """x + position(x, **kwargs): through the encoding's `add_to` when it has one (one buffer,
    and the fused kernel of `cape.fusion` in training), else a plain add (a user's module)."""
    add_to = getattr(position, "add_to", None)
    return add_to(x, **kwargs) if add_to is not None else x + position(x, **kwargs)
