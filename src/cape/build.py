"""`cape.build(name, dim, **options)`: every encoding by name, for configs and the CLI."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from torch import nn

from .augment import Augmentation
from .encodings.fourier import LearnableFourierFeatures
from .encodings.learned import AbsPos1d, AbsPos2d, EmbedND
from .encodings.none import NoPos
from .encodings.relative import RelPos
from .encodings.rotary import Rotary
from .encodings.sinusoidal import CAPE1d, CAPE2d, SineND

__all__ = ["build", "ENCODINGS"]

_AUGMENTATION = ("max_global_shift", "max_local_shift", "max_global_scaling")


def _no_augmentation(cls: type, name: str) -> Callable[..., nn.Module]:
    def make(dim: int, **options: Any) -> nn.Module:
        given = [k for k in _AUGMENTATION if k in options]
        if given:
            raise ValueError(f"{name} has no augmentation; use 'cape1d'/'cape2d' for {given}")
        return cls(dim, **options)

    make._target = cls  # type: ignore[attr-defined]  # for the option listing
    make._fixed = _AUGMENTATION  # type: ignore[attr-defined]
    return make


def _preset(cls: type) -> Callable[..., nn.Module]:
    def make(dim: int, preset: str | None = None, **options: Any) -> nn.Module:
        if preset is None:
            return cls(dim, **options)
        if cls is CAPE2d:
            if preset != "image":
                raise ValueError(f"preset for cape2d must be 'image', got {preset!r}")
            return cls.preset(dim, **options)
        return cls.preset(preset, dim, **options)

    make._target = cls  # type: ignore[attr-defined]
    make._takes_preset = True  # type: ignore[attr-defined]
    return make


def _fixed(cls: type, **fixed: Any) -> Callable[..., nn.Module]:
    def make(dim: int, **options: Any) -> nn.Module:
        clash = sorted(set(fixed) & set(options))
        if clash:
            raise ValueError(f"options {clash} are fixed by this encoding's name")
        return cls(dim, **fixed, **options)

    make._target = cls  # type: ignore[attr-defined]
    make._fixed = tuple(fixed)  # type: ignore[attr-defined]
    return make


# name -> constructor(dim, **options). `dim` is the embedding size, or the attention head
# size for the encodings that act inside attention (relpos, rotary).
ENCODINGS: dict[str, Callable[..., nn.Module]] = {
    "nopos": NoPos,
    "sinpos": _no_augmentation(CAPE1d, "sinpos"),
    "cape1d": _preset(CAPE1d),
    "sinpos2d": _no_augmentation(CAPE2d, "sinpos2d"),
    "cape2d": _preset(CAPE2d),
    "abspos": AbsPos1d,
    "abspos2d": AbsPos2d,
    "relpos": RelPos,
    "rotary": Rotary,
    "lff": LearnableFourierFeatures,
    # the Learnable Fourier Features paper's baselines
    "sine-1d": _no_augmentation(CAPE1d, "sine-1d"),
    "sine-2d": _fixed(SineND, pos_dim=2),
    "sine-4d": _fixed(SineND, pos_dim=4),
    "embed-1d": AbsPos1d,
    "embed-2d": EmbedND,
    "embed-4d": EmbedND,
}


def _options(factory: Callable[..., nn.Module]) -> list[str]:
    target = getattr(factory, "_target", factory)
    skip = ("self", "dim", *getattr(factory, "_fixed", ()))
    names = [p for p in inspect.signature(target).parameters if p not in skip]
    return names + (["preset"] if getattr(factory, "_takes_preset", False) else [])


def build(name: str, dim: int, **options: Any) -> nn.Module:
    """Make an encoding by name: `build("cape2d", 768, preset="image")`.

    Names: see `ENCODINGS`. Options are the class's keyword arguments; unknown names or options
    raise ValueError/TypeError listing what is allowed. An `augmentation` option (rotary, lff)
    may be a mapping of `cape.Augmentation`'s fields, as config files write it.
    """
    if not isinstance(name, str) or name.lower() not in ENCODINGS:
        raise ValueError(f"name must be one of {sorted(ENCODINGS)}, got {name!r}")
    factory = ENCODINGS[name.lower()]
    allowed = _options(factory)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise TypeError(f"unknown option(s) {unknown} for encoding {name!r}; allowed: {allowed}")
    if isinstance(options.get("augmentation"), dict):  # configs spell it as a mapping
        options["augmentation"] = Augmentation(**options["augmentation"])
    return factory(dim, **options)
