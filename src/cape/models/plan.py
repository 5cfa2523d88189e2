"""One position plan for every model: where an encoding goes, and who draws its augmentation.

A model asks `position_plan(name, dim=D, heads=H, options=...)` once, in its constructor, and
gets a `PositionPlan`:

- `absolute`: the module added to the input (`kind = "absolute"`), or None;
- `layer()`: the in-attention module of one layer (`kind = "attention"`: rotary, RoPE-ViT,
  relpos, ALiBi, FIRE), or None when the encoding adds at the input. An encoding without
  parameters (rotary, ALiBi) is one module for the whole stack, as torchtune hands one rotary
  to every layer; one with parameters (relpos, FIRE, RoPE-Mixed) gets one per layer;
- `augmentation`: CAPE's augmentation of the positions that the in-attention layers read,
  drawn **once per forward** by the stack (`draw="shared"`, the default) and handed to every
  layer in its `PositionContext`. `draw="per_layer"` (an option of the plan:
  `position_options={"draw": "per_layer"}`) gives every layer a module of its own that holds
  the augmentation and draws it: an ablation, not the method.

`owner="model"` (`sync=True`) hands the augmentation to the model itself, which synchronises it
across inputs (the translation model: one global shift for source and target); the stacks then
draw nothing. The plan reads what it needs (the positions an encoding reads, its augmentation)
from the encoding's class and options (`cape.build`'s registry), before any module is made.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from .._checks import check_choice, check_float, check_int, check_mask
from ..augment import Augmentation
from ..build import encoding_entry
from ..positions import as_positions, grid_indices, grid_positions, token_positions

__all__ = ["DRAWS", "PositionPlan", "position_plan", "resolve_options", "add_position"]

DRAWS = ("shared", "per_layer")  # who draws an in-attention augmentation: the stack, each layer


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
    if getattr(encoding_entry(name, key="position").cls, "per_head", False):
        return heads
    return dim // heads


def _refuse_normalize(augmentation: object) -> None:
    """Refuse, for a causal model, an augmentation that mean-normalises: the mean over a call's
    positions would make a token's position depend on later tokens."""
    if augmentation is not None and getattr(augmentation, "normalize", False):
        raise ValueError(
            "normalize=True (mean-normalisation) would make a token's position depend on later "
            "tokens; this model is causal: use normalize=False"
        )


def moves_positions(augmentation: Augmentation | None, training: bool) -> bool:
    """Whether a call of `augmentation` in this mode changes any position: mean-normalisation
    always, the random draws where it draws in this mode (None: nothing)."""
    return augmentation is not None and (augmentation.normalize or augmentation.draws(training))


@dataclasses.dataclass(eq=False)
class PositionPlan:
    """Where a model's positions go (module docstring). Made by `position_plan`.

    name: the `cape.build` name (or the module's class name). kind: "absolute", "attention" or
    "none". absolute: the module added at the input. factory: makes one in-attention module
    (None: nothing in attention). augmentation: drawn once per forward by `owner` ("stack" or
    "model"); None when there is none or each layer draws its own (`draw="per_layer"`).
    pos_dim, units: the positions the encoding reads (M; "continuous" or "index").
    augmented: the stack (or the model) draws for every layer: the layers' modules do not
    draw (`augmented_by_stack`). One module serves every layer when it holds no parameters.
    """

    name: str
    kind: str
    absolute: nn.Module | None = None
    factory: Callable[[], nn.Module] | None = None
    augmentation: Augmentation | None = None
    draw: str = "shared"
    owner: str = "stack"
    pos_dim: int = 1
    units: str = "continuous"
    augmented: bool = False
    _made: nn.Module | None = dataclasses.field(default=None, repr=False)
    _absolute_factory: Callable[[], nn.Module] | None = dataclasses.field(default=None, repr=False)

    @property
    def in_attention(self) -> bool:
        """Whether the layers carry the positions (rotary, relpos, ALiBi, FIRE...)."""
        return self.factory is not None

    def layer(self) -> nn.Module | None:
        """The in-attention module of one layer (None when the encoding adds at the input): the
        stack's one module when it holds no parameters and the stack draws, else a new one."""
        if self.factory is None:
            return None
        return self._made if self._made is not None else self.factory()

    def another_absolute(self) -> nn.Module | None:
        """A second input encoding like `absolute` (a decoder's own table), or `absolute`
        itself when it holds no parameters (a sinusoid is shared)."""
        if self.absolute is None or not any(True for _ in self.absolute.parameters()):
            return self.absolute
        assert self._absolute_factory is not None
        return self._absolute_factory()

    def without_absolute(self) -> PositionPlan:
        """The same plan for a stack whose model adds the input encoding itself."""
        return dataclasses.replace(self, absolute=None)

    @property
    def augmented_by_stack(self) -> bool:
        """Whether the positions the layers read come augmented (by the stack or the model):
        the modules then draw nothing of their own."""
        return self.augmented

    @property
    def stack_augmentation(self) -> Augmentation | None:
        """What a stack draws once per forward for its layers (None: nothing)."""
        if self.owner != "stack" or self.factory is None:
            return None
        return self.augmentation

    def grid_positions(
        self, height: int, width: int, *, extent: float | None = None, device=None
    ) -> torch.Tensor:
        """The positions the in-attention encoding reads on an H x W patch grid -> [1, H*W, 2]:
        (x, y) in [-extent, extent] (continuous units; extent 1 by default) or integer (column,
        row) indices."""
        if self.pos_dim != 2:
            raise ValueError(f"grid: {self.name} reads {self.pos_dim}-D positions, a grid needs 2")
        if self.units == "index":
            if extent is not None:
                raise ValueError(
                    f"extent applies to continuous coordinates; {self.name} reads integer "
                    "(column, row) indices"
                )
            return grid_indices(height, width, batch=1, device=device)
        ext = 1.0 if extent is None else check_float("extent", extent, strict=True)
        return grid_positions(height, width, extent=ext, batch=1, device=device)

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
    return PositionPlan(
        name, kind, absolute, factory, draw="per_layer",
        pos_dim=getattr(absolute, "pos_dim", 1), units=getattr(absolute, "units", "continuous"),
    )  # fmt: skip


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
    entry = encoding_entry(position, key="position")  # a `cape.build` name, or the list of them
    name = position.lower()
    opts = resolve_options(name, dict(options) if options is not None else None, defaults)
    draw = opts.pop("draw", "shared")
    check_choice("position_options['draw']", draw, DRAWS)
    if entry.cls.kind != "attention":
        if "draw" in (options or {}):
            raise ValueError(
                f"position_options['draw'] applies to encodings inside attention; {name!r} is "
                "added at the input (one draw per forward)"
            )
        plan = _input_plan(name, entry, dim, opts, sync=sync, causal=causal)
    else:
        if sync and draw == "per_layer":
            raise ValueError(
                "position_options['draw']='per_layer' cannot be synchronised across inputs: this "
                "model draws one augmentation for all of them"
            )
        plan = _attention_plan(name, entry, attention_size(name, dim, heads), opts, draw, sync,
                               causal)  # fmt: skip
    _check_pos_dim(plan, pos_dim, what)
    return plan


def _input_plan(name, entry, dim, opts, *, sync: bool, causal: bool) -> PositionPlan:
    """The plan of an encoding added at the input (or of nopos): the stack draws its
    augmentation in the module's forward, or the model once for all its inputs (`sync`: the
    modules are made without it)."""
    kwargs = entry.kwargs(opts)  # every option checked once, here
    aug = kwargs.get("augmentation")
    if causal:
        _refuse_normalize(aug)
    if sync and "augmentation" in kwargs:
        kwargs["augmentation"] = None

    def make() -> nn.Module:
        return entry.make(dim, dict(kwargs))

    module = make()
    if entry.cls.kind == "none":  # nopos: nothing to add, its options checked
        return PositionPlan(name, "none")
    return PositionPlan(
        name, "absolute", module, None, aug if sync else None, "shared",
        "model" if sync else "stack", module.pos_dim, module.units, _absolute_factory=make,
    )  # fmt: skip


def _attention_plan(name, entry, size, opts, draw, sync, causal) -> PositionPlan:
    """The plan of an encoding inside attention: one module for the stack when it holds no
    parameters, the augmentation drawn by the stack (or the
    model: `sync`) unless each layer draws its own (`draw="per_layer"`). The modules keep
    their augmentation (a grid fitted to its scaling reads it): the stack's `PositionContext`
    says the positions are augmented already."""
    kwargs = entry.kwargs(opts)  # every option checked once, here, without making a module
    aug = kwargs.get("augmentation")
    if causal:  # a shared draw or each layer's own: either would read later tokens
        _refuse_normalize(aug)

    def factory() -> nn.Module:
        return entry.make(size, dict(kwargs))

    # One module made here answers whether the encoding holds parameters: without any (rotary,
    # ALiBi) it is the module of every layer; with some (relpos, FIRE, RoPE-Mixed) each layer
    # gets its own, and this one's draws keep what a seed initialises, so that a seed gives the
    # models whose results are archived under results/.
    first = factory()
    shared = draw == "shared" and not any(True for _ in first.parameters())
    return PositionPlan(
        name, "attention", None, factory, aug if draw == "shared" else None, draw,
        "model" if sync else "stack", entry.pos_dim(kwargs), entry.cls.units,
        augmented=draw == "shared", _made=first if shared else None,
    )  # fmt: skip


def _check_pos_dim(plan: PositionPlan, want: int | None, what: str) -> None:
    if want is not None and plan.kind != "none" and plan.pos_dim != want:
        raise ValueError(f"position {plan.name!r} reads {plan.pos_dim}-D positions; {what}")


def add_position(position: nn.Module, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """x + position(x, **kwargs): through the encoding's `add_to` when it has one (one buffer,
    and the fused kernel of `cape.fusion` in training), else a plain add (a user's module)."""
    add_to = getattr(position, "add_to", None)
    return add_to(x, **kwargs) if add_to is not None else x + position(x, **kwargs)
