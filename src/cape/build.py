"""`cape.build(name, dim, **options)`: every encoding by name, for models, configs and the CLI.

The names here are the project's one vocabulary: the models (`ViT`, `CTCModel`, `Seq2Seq`),
the experiment configs, the command line and the reports all use them. `dim` is the embedding
size D of an absolute encoding, or the attention head size of the encodings that act inside
attention (`relpos`, `rotary`, `rotary2d`: their class says `kind = "attention"`), except
`alibi` and `fire`, whose `dim` is the number of heads (one slope / MLP output each;
`attention_size` in `cape.models.plan` picks the right one for a model).

Every encoding that can be augmented takes CAPE's augmentation the same two ways: the four
fields as keywords (`max_global_shift`, `max_local_shift`, `max_global_scaling`, `normalize`)
or `augmentation=` a `cape.Augmentation` or a mapping of its fields (as config files write it).
`augmentation=` also takes the other augmentations of the family (`cape.RandomizedPositions`,
`cape.PoSE`, `cape.RandomFloatPositions`), as objects or as mappings with a "kind"
(`{"kind": "randomized", "max_length": 4096}`: `cape.position_sampling`); they replace a
preset's fields. `preset` ("text", "audio", "image") gives the papers' values per modality
(`cape.PRESETS`); explicit options override them. Every class is then made with
`augmentation=` an augmentation (None when CAPE's does nothing); for `cape2d`,
max_local_shift="auto" (emax = 1/N per axis of the grid, the "image" preset's) becomes
`CAPE2d(auto_local_shift=True)`.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

from torch import nn

from ._checks import check_int
from .augment import AUGMENTATION_FIELDS, Augmentation, PositionAugmentation
from .encodings.alibi import ALiBi
from .encodings.axial import SineND
from .encodings.fire import FIRE
from .encodings.fourier import LearnableFourierFeatures
from .encodings.learned import AbsPos1d, AbsPos2d, EmbedND
from .encodings.none import NoPos
from .encodings.presets import PRESETS, field_options
from .encodings.relative import RelPos
from .encodings.rope2d import RoPE2d
from .encodings.rotary import Rotary
from .encodings.sinusoidal import CAPE1d, CAPE2d
from .position_sampling import augmentation_from_mapping

__all__ = ["build", "ENCODINGS", "encoding_class", "encoding_entry", "encoding_options"]

# constructor keywords that the names do not offer: CAPE2d's auto_local_shift is written
# max_local_shift="auto" among the fields (as presets and configs write it)
_NOT_OFFERED = ("augmentation", *AUGMENTATION_FIELDS, "cache_size", "auto_local_shift")


class Encoding:
    """One entry of `ENCODINGS`: callable as `entry(dim, **options)` (what `build` does).

    cls: the module's class. fixed: constructor options set by the name (sine-2d: pos_dim=2).
    augments: whether the name takes CAPE's augmentation. presets: the modality presets it takes.
    without: constructor options the name does not offer (a 1-D rotary fits no grid).
    """

    def __init__(
        self,
        cls: type,
        *,
        fixed: Mapping[str, Any] | None = None,
        augments: bool = False,
        presets: tuple[str, ...] = (),
        without: tuple[str, ...] = (),
    ) -> None:
        self.cls, self.fixed, self.without = cls, dict(fixed or {}), without
        self.augments, self.presets = augments, presets
        self.name = cls.__name__  # set to the registry name below

    def options(self) -> list[str]:
        """The keywords this name accepts (besides dim), in the constructor's order."""
        params = list(inspect.signature(self.cls).parameters)[1:]  # [0]: dim / head_dim
        skip = {*self.fixed, *self.without, *_NOT_OFFERED}
        names = [p for p in params if p not in skip]
        if self.augments:
            names += [*AUGMENTATION_FIELDS, "augmentation"]
        return names + (["preset"] if self.presets else [])

    def __call__(self, dim: int, **options: Any) -> nn.Module:
        module = self.cls(dim, **self.fixed, **self.kwargs(options))
        # what made it, so that an integration can save it and make it again on load
        module.build_spec = {"name": self.name, "dim": dim, "options": dict(options)}
        return module

    def make(self, dim: int, kwargs: dict[str, Any]) -> nn.Module:
        """The module of constructor keywords made by `kwargs` (no further parsing)."""
        return self.cls(dim, **self.fixed, **kwargs)

    def pos_dim(self, kwargs: dict[str, Any]) -> int:
        """M, the coordinates per position the module of these constructor keywords reads: the
        name's, the keywords', the constructor's default or the class's."""
        if "pos_dim" in self.fixed:
            return int(self.fixed["pos_dim"])
        if "pos_dim" in kwargs:
            return int(kwargs["pos_dim"])
        param = inspect.signature(self.cls).parameters.get("pos_dim")
        if param is not None and param.default is not inspect.Parameter.empty:
            return int(param.default)
        return int(getattr(self.cls, "pos_dim", 1))

    def kwargs(self, options: dict[str, Any]) -> dict[str, Any]:
        """The name's options (checked) -> the class's constructor keywords, the augmentation
        made (`augmentation=` an object or None), the preset's values filled in."""
        options = dict(options)
        allowed = self.options()
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            hint = ""
            if set(unknown) & {*AUGMENTATION_FIELDS, "augmentation"}:
                hint = f" ({self.name!r} has no augmentation: cape1d, cape2d, rotary... do)"
            raise TypeError(
                f"unknown option(s) {unknown} for encoding {self.name!r}; allowed: {allowed}{hint}"
            )
        fields = self._augmentation_fields(options)
        other = None if isinstance(fields, dict) else fields  # not CAPE's: taken as it is
        preset = options.pop("preset", None)
        if preset is not None:
            if preset not in self.presets:
                raise ValueError(f"preset must be one of {list(self.presets)}, got {preset!r}")
            values = dict(PRESETS[preset])
            preset_fields = {k: values.pop(k) for k in AUGMENTATION_FIELDS if k in values}
            fields = preset_fields | fields if other is None else fields
            options = values | options  # the preset's other values (freq_scale), overridable
        if other is not None:
            options["augmentation"] = other
        elif self.augments:
            options.update(field_options(fields, auto_local=issubclass(self.cls, CAPE2d)))  # type: ignore[arg-type]
        return options

    def _augmentation_fields(
        self, options: dict[str, Any]
    ) -> dict[str, Any] | PositionAugmentation:
        """Pop the augmentation (fields or `augmentation=`) from options -> CAPE's fields, or
        another augmentation of the family (an object, or made from a mapping with a "kind")."""
        flat = {k: options.pop(k) for k in AUGMENTATION_FIELDS if k in options}
        given = options.pop("augmentation", None)
        if given is None:
            return flat
        if flat:
            raise ValueError(f"give augmentation or its fields {sorted(flat)}, not both")
        if isinstance(given, Mapping) and given.get("kind", "cape") != "cape":
            given = augmentation_from_mapping(given)
        if isinstance(given, Augmentation):
            return dataclasses.asdict(given)
        if isinstance(given, PositionAugmentation):
            return given
        if isinstance(given, Mapping):
            given = {k: v for k, v in given.items() if k != "kind"}
            unknown = sorted(set(given) - set(AUGMENTATION_FIELDS))
            if unknown:
                raise TypeError(
                    f"unknown augmentation field(s) {unknown}; allowed: {list(AUGMENTATION_FIELDS)}"
                )
            return given
        raise TypeError(
            "augmentation must be a cape augmentation (cape.Augmentation, "
            "cape.RandomizedPositions, cape.PoSE, cape.RandomFloatPositions) or a mapping, "
            f"got {given!r}"
        )


# Rotary's options for 1-D positions only (length extension, xPos): not offered by rotary2d
ROTARY_1D = (
    "scaling", "train_length", "factor", "yarn_alpha", "yarn_beta", "scaling_options", "xpos",
    "xpos_scale_base", "xpos_center",
)  # fmt: skip

ENCODINGS: dict[str, Encoding] = {
    "nopos": Encoding(NoPos),
    "sinpos": Encoding(CAPE1d),
    "cape1d": Encoding(CAPE1d, augments=True, presets=("text", "audio")),
    "sinpos2d": Encoding(CAPE2d),
    "cape2d": Encoding(CAPE2d, augments=True, presets=("image",)),
    "abspos": Encoding(AbsPos1d, augments=True),
    "abspos2d": Encoding(AbsPos2d),
    "relpos": Encoding(RelPos),
    "rotary": Encoding(Rotary, augments=True, presets=("text", "audio"), without=("fit_grid",)),
    "rotary2d": Encoding(Rotary, fixed={"pos_dim": 2}, augments=True, without=ROTARY_1D),
    "rope-axial": Encoding(RoPE2d, fixed={"variant": "axial"}, augments=True, without=("heads",)),
    "rope-mixed": Encoding(RoPE2d, fixed={"variant": "mixed"}, augments=True),  # heads=H
    "alibi": Encoding(ALiBi, augments=True),  # dim: the number of heads
    "fire": Encoding(FIRE, augments=True),  # dim: the number of heads
    "lff": Encoding(LearnableFourierFeatures, augments=True),
    # the Learnable Fourier Features paper's baselines
    "sine-1d": Encoding(CAPE1d),
    "sine-2d": Encoding(SineND, fixed={"pos_dim": 2}, augments=True),
    "sine-4d": Encoding(SineND, fixed={"pos_dim": 4}, augments=True, without=("fit_grid",)),
    "embed-1d": Encoding(AbsPos1d, augments=True),
    "embed-2d": Encoding(EmbedND, augments=True),
    "embed-4d": Encoding(EmbedND, augments=True),
}


for _name, _encoding in ENCODINGS.items():
    _encoding.name = _name


def _entry(name: object, key: str = "name") -> Encoding:
    if not isinstance(name, str):
        raise TypeError(
            f"{key} must be a cape.build name (str), got {type(name).__name__} {name!r}"
        )
    if name.lower() not in ENCODINGS:
        raise ValueError(f"{key} must be one of {sorted(ENCODINGS)}, got {name!r}")
    return ENCODINGS[name.lower()]


def encoding_class(name: str, *, key: str = "name") -> type:
    """The class `build(name, ...)` makes: its `kind` ("absolute", "attention" or "none"),
    `units` and docstring say how a model uses it. key: the argument named in errors."""
    return _entry(name, key).cls


def encoding_entry(name: str, *, key: str = "name") -> Encoding:
    """The registry's entry of `name` (`ENCODINGS`): its class, options and constructor
    keywords. key: the argument named in errors."""
    return _entry(name, key)


def encoding_options(name: str) -> list[str]:
    """The options `build(name, dim, ...)` accepts (what `cape encodings` lists)."""
    return _entry(name).options()


def build(name: str, dim: int, **options: Any) -> nn.Module:
    """Make an encoding by name: `build("cape2d", 768, preset="image")`.

    Names: see `ENCODINGS`. Options are the class's keyword arguments (`encoding_options`),
    plus CAPE's augmentation and `preset` where the name takes them (module docstring);
    unknown names or options raise ValueError/TypeError listing what is allowed.
    """
    entry = _entry(name)
    check_int("dim", dim)  # named as given here (the classes say dim or head_dim)
    return entry(dim, **options)
