"""Configs: YAML or TOML files, `--set key.sub=value` overrides, typed dataclasses.

A config is a nested mapping; `from_mapping(cls, mapping)` turns it into (nested) dataclasses
and rejects unknown keys, naming the key and the allowed ones. Values of `--set` are parsed as
YAML scalars (`--set model.dim=256`, `--set train.precision=bf16`, `--set data.sizes=[24,32]`).
"""

from __future__ import annotations

import dataclasses
import re
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["load_file", "apply_overrides", "from_mapping", "to_mapping"]


def load_file(path: str | Path) -> dict[str, Any]:
    """Read a .yaml/.yml or .toml config into a dict. ValueError names the file (and the line
    and column where the parser gives them) for a missing, unreadable or malformed one."""
    path = Path(path)
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        raise ValueError(f"config file {str(path)!r} {what}")
    if path.suffix not in (".yaml", ".yml", ".toml"):
        raise ValueError(f"config file must end in .yaml, .yml or .toml, got {str(path)!r}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"config file {str(path)!r} is not UTF-8 text: {e}") from e
    data = _parse(path, text)
    if not isinstance(data, dict):
        raise ValueError(f"config file {str(path)!r} must hold a mapping at the top level")
    return data


def _parse(path: Path, text: str) -> Any:
    """The content of config `path` by its suffix; ValueError "FILE: invalid FORMAT at line L,
    column C: PROBLEM" (lines and columns counted from 1) for a malformed one."""
    where = f"config file {str(path)!r}: invalid"
    if path.suffix == ".toml":
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover
            import tomli as tomllib
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:  # its message ends "(at line L, column C)"
            raise ValueError(f"{where} TOML: {e}") from e
    import yaml

    try:
        return yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"{where} YAML{_yaml_problem(e)}") from e


def _yaml_problem(e: Exception) -> str:
    """' at line L, column C: PROBLEM' of a YAML error (PyYAML's marks count from 0)."""
    mark = getattr(e, "problem_mark", None)
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(e, "problem", None) or str(e)
    context = getattr(e, "context", None)
    return f"{at}: {problem}" + (f" ({context})" if context else "")


def apply_overrides(config: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Return a copy of `config` with each `dotted.key=value` applied (value parsed as YAML)."""
    import yaml

    out = _deep_copy(config)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects key=value (e.g. model.dim=256), got {item!r}")
        parts = key.strip().split(".")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {key}: {part!r} is not a section")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as e:
            raise ValueError(
                f"--set {key}: {raw!r} is not a valid YAML value{_yaml_problem(e)}"
            ) from e
        node[parts[-1]] = _scalar(value)
    return out


_EXPONENT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _scalar(value: Any) -> Any:
    """YAML 1.1 reads "3e-3" (no dot) as a string; a user writing it means the number."""
    if isinstance(value, str) and _EXPONENT.fullmatch(value.strip()):
        return float(value)
    return value


def _deep_copy(m: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in m.items()}


def from_mapping(cls: type, mapping: Mapping[str, Any], prefix: str = "") -> Any:
    """Build dataclass `cls` from `mapping`; nested dataclass fields take nested mappings.

    Unknown keys raise ValueError naming the dotted key and the allowed keys; values are checked
    against simple annotations (bool, int, float, str, tuples/lists, Literal choices).
    """
    if not isinstance(mapping, Mapping):
        raise ValueError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {mapping!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(map(str, set(mapping) - set(fields)))  # str: YAML keys can be numbers
    if unknown:
        raise ValueError(
            f"unknown config key(s) {[prefix + k for k in unknown]}; allowed under "
            f"{prefix.rstrip('.') or 'the top level'}: {sorted(fields)}"
        )
    hints = _field_types(cls)
    kwargs = {name: _convert(hints[name], v, prefix + name) for name, v in mapping.items()}
    for name, f in fields.items():  # a section left out that has no default: its defaults
        missing = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if missing and name not in kwargs and dataclasses.is_dataclass(hints[name]):
            kwargs[name] = from_mapping(hints[name], {}, f"{prefix}{name}.")
    return cls(**kwargs)


def _field_types(cls: type) -> dict[str, Any]:
    """The annotations of dataclass `cls`, each type parameter of a generic base replaced by
    the class `cls` gives it (`class C(Base[DataConfig])`: Base's `data: DataT` reads
    `DataConfig`, its `rows: list[RowT]` a list of the row class)."""
    given: dict[Any, Any] = {}
    for klass in reversed(cls.__mro__):
        for base in getattr(klass, "__orig_bases__", ()):
            params = getattr(typing.get_origin(base), "__parameters__", ())
            given.update(zip(params, typing.get_args(base), strict=False))

    def resolved(hint: Any) -> Any:
        if isinstance(hint, typing.TypeVar):
            return given.get(hint, Any)
        params = getattr(hint, "__parameters__", ())
        return hint[tuple(given.get(p, Any) for p in params)] if params else hint

    return {name: resolved(hint) for name, hint in typing.get_type_hints(cls).items()}


def _convert(hint: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return from_mapping(hint, value, key + ".")
    if origin is typing.Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            raise ValueError(f"{key} must be one of {list(allowed)}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None:
            return None
        return _convert(args[0], value, key) if len(args) == 1 else value
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{key} must be a list, got {value!r}")
        (inner, *_) = typing.get_args(hint) or (Any,)
        items = [_convert(inner, v, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    return _convert_scalar(hint, value, key)


def _convert_scalar(hint: Any, value: Any, key: str) -> Any:
    """`value` checked against a bool, int, float or str annotation (a float accepts an int and
    returns it as a float); any other annotation takes the value as it is."""
    if hint is bool and not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, got {value!r}")
    if hint is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"{key} must be an integer, got {value!r}")
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{key} must be a number, got {value!r}")
        return float(value)
    if hint is str and not isinstance(value, str):
        raise ValueError(f"{key} must be a string, got {value!r}")
    return value


def to_mapping(obj: Any) -> dict[str, Any]:
    """A dataclass config back to plain dicts/lists (for config.json in a run directory)."""

    def plain(v: Any) -> Any:
        if isinstance(v, tuple):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    return plain(dataclasses.asdict(obj))
