"""What every experiment shares: config resolution (preset -> files -> `--set`), run folders."""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..config import apply_overrides, from_mapping, load_file, to_mapping
from ..io import atomic_write

__all__ = ["merge", "resolve_config", "slug", "save_config"]


def merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge: mappings merge key by key, anything else (lists included) replaces."""
    out = copy.deepcopy(dict(base))
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def resolve_config(
    cls: type,
    presets: Mapping[str, Mapping[str, Any]],
    preset: str | None = None,
    files: Sequence[str | Path] = (),
    overrides: Sequence[str] = (),
) -> tuple[Any, dict[str, Any]]:
    """The config dataclass `cls` from a preset, then each YAML/TOML file, then `key=value`
    overrides; returns (config, the resolved plain mapping for the run record)."""
    if preset is not None and preset not in presets:
        raise ValueError(f"preset must be one of {sorted(presets)}, got {preset!r}")
    mapping: dict[str, Any] = copy.deepcopy(dict(presets[preset])) if preset else {}
    for f in files:
        mapping = merge(mapping, load_file(f))
    mapping = apply_overrides(mapping, overrides)
    config = from_mapping(cls, mapping)
    return config, to_mapping(config)


_GREEK = {"λ": "lambda", "Δ": "delta", "ε": "eps", "γ": "gamma"}


def slug(name: str) -> str:
    """A folder name for a row: "CAPE λ=1" -> "cape-lambda1"."""
    for k, v in _GREEK.items():
        name = name.replace(k, v)
    name = re.sub(r"[^a-z0-9.@+]+", "-", name.lower().replace("=", ""))
    return name.strip("-") or "row"


def save_config(path: str | Path, mapping: Mapping[str, Any]) -> Path:
    """The resolved config as YAML (atomic): `cape experiment --config` reads it back."""
    import yaml

    text = yaml.safe_dump(dict(mapping), sort_keys=False, allow_unicode=True)
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
