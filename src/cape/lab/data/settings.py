"""`Settings`: the base of the data generators' settings objects (`MaskSettings` of SpecAugment,
`ScreenSettings` of the boxes): a frozen dataclass checked on creation, which a function takes
as `settings=None` (the defaults) with keywords named like its fields overriding it; and
`check_made_with`, the check that a cached corpus was made with the settings a call asks for."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["Settings", "check_made_with"]

S = TypeVar("S", bound="Settings")


@dataclass(frozen=True)
class Settings:
    """Subclasses add the fields (with defaults) and `check`, which `__post_init__` calls."""

    def __post_init__(self) -> None:
        self.check(self)

    @staticmethod
    def check(settings: Any, prefix: str = "") -> None:
        """Raise on a bad field of `settings` (this class or a config with fields of the same
        names); `prefix` starts each name in the messages."""

    @classmethod
    def resolve(cls: type[S], settings: S | None, overrides: dict[str, Any]) -> S:
        """`settings` (None: the defaults) with the fields named in `overrides` replaced."""
        if settings is not None and not isinstance(settings, cls):
            raise TypeError(
                f"settings must be a {cls.__name__} or None, got {type(settings).__name__}"
            )
        settings = cls() if settings is None else settings
        return replace(settings, **overrides) if overrides else settings

    @classmethod
    def of(cls: type[S], config: object) -> S:
        """The settings from the fields of the same names on `config`; the others default."""
        names = [f.name for f in fields(cls) if hasattr(config, f.name)]
        return cls(**{name: getattr(config, name) for name in names})


def check_made_with(
    root: Path, what: str, made: Mapping[str, Any], asked: Mapping[str, Any], keys: Iterable[str]
) -> None:
    """ValueError when the `what` (e.g. "corpus") in `root` was `made` with other values than
    the call `asked` for, among `keys`: both sides of each difference named."""
    diff = sorted(k for k in keys if made.get(k) != asked.get(k))
    if diff:
        old = ", ".join(f"{k}={made.get(k)!r}" for k in diff)
        new = ", ".join(f"{k}={asked.get(k)!r}" for k in diff)
        raise ValueError(
            f"{root} holds a {what} made with {old}; this call asks for {new}: "
            "pass the same settings or use a new root"
        )
