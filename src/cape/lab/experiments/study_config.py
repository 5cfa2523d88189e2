"""What every experiment's config shares: the study-config base (`StudyConfig`), resolution
(preset -> files -> `--set`), the saved config.yaml, the checks of rows, seeds, the kept
checkpoint and a Transformer's sizes, and the training presets."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from cape._checks import check_int, check_rate
from cape.lab.config import apply_overrides, from_mapping, load_file, to_mapping
from cape.lab.io import atomic_write
from cape.lab.train.config import TrainConfig

__all__ = [
    "StudyConfig",
    "merge",
    "resolve_config",
    "save_config",
    "check_folder",
    "row_key",
    "check_position",
    "check_runs",
    "check_best_metric",
    "check_ints",
    "check_transformer",
    "train_preset",
    "MAX_SEED",
]

MAX_SEED = 2**63 - 1  # seeds + a rank stay within torch's and numpy's 64-bit seeds


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


def save_config(path: str | Path, mapping: Mapping[str, Any]) -> Path:
    """The resolved config as YAML (atomic): `cape experiment --config` reads it back."""
    import yaml

    text = yaml.safe_dump(dict(mapping), sort_keys=False, allow_unicode=True)
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def check_folder(key: str, value: object) -> str:
    """A config's folder (`data.root`): a non-empty path string; ValueError naming `key`."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key} must be a folder path, got {value!r}")
    return value


def row_key(name: object) -> str:
    """`rows[<name>]`, the prefix of a row's errors; ValueError unless `name` (the row's
    `name`) is a non-empty string (it names the row's run folders)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"rows[].name must be a non-empty string, got {name!r}")
    return f"rows[{name}]"


def check_position(key: str, name: object) -> str:
    """A row's `position` must be a `cape.build` name (the one vocabulary of encodings)."""
    from cape.build import ENCODINGS

    if not isinstance(name, str) or name.lower() not in ENCODINGS:
        raise ValueError(
            f"{key} must be a cape.build name, one of {sorted(ENCODINGS)}, got {name!r}"
        )
    return name.lower()


def check_runs(rows: Sequence[Any], seeds: Sequence[int]) -> None:
    """What every experiment config needs: >= 1 row, >= 1 seed, unique `rows[].name`."""
    if not rows:
        raise ValueError("rows must list at least one model (name, position)")
    if not seeds:
        raise ValueError("seeds must list at least one seed")
    for i, seed in enumerate(seeds):  # torch, numpy and the samplers take seed + rank
        if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
            raise ValueError(f"seeds[{i}] must be an int in [0, 2**63 - 1], got {seed!r}")
    names = [r.name for r in rows]
    if len(set(names)) != len(names):
        raise ValueError(f"rows[].name must be unique, got {names}")


DataT = TypeVar("DataT")
ModelT = TypeVar("ModelT")
EvalT = TypeVar("EvalT")
RowT = TypeVar("RowT")


@dataclass(kw_only=True)
class StudyConfig(Generic[DataT, ModelT, EvalT, RowT]):
    """The top-level config of a study: its `name` (the run folder's, runs/<name>), the `seeds`
    every row is trained with, its `data`, `model`, `train` and `eval` sections and its `rows`
    (the models compared, by unique `name`). A study's config names its section classes and its
    default name; its own checks follow `check_runs` in `__post_init__`:

        @dataclass
        class VisionConfig(StudyConfig[DataConfig, ModelConfig, EvalConfig, RowConfig]):
            name: str = "vision"

            def __post_init__(self) -> None:
                super().__post_init__()
                ...

    `cape.lab.config.from_mapping` reads each section as the class the study gives it, and
    builds a section the mapping leaves out from that class's defaults."""

    name: str
    seeds: list[int] = field(default_factory=lambda: [0])
    data: DataT
    model: ModelT
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalT
    rows: list[RowT] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_runs(self.rows, self.seeds)

    def row(self, name: str) -> RowT:
        """The row called `name`."""
        return next(r for r in self.rows if r.name == name)  # type: ignore[attr-defined]


def check_best_metric(train: Any, metric: str, mode: str, what: str) -> None:
    """The checkpoint is chosen on `metric` (`mode`), the only eval metric; `what` says why."""
    if (train.best_metric, train.best_mode) != (metric, mode):
        raise ValueError(
            f"train.best_metric must be {metric!r} with train.best_mode {mode!r} "
            f"({what}), got {train.best_metric!r}, {train.best_mode!r}"
        )


def check_ints(section: str, obj: Any, keys: Iterable[str], *, minimum: int = 1) -> None:
    """`check_int` of each of `keys` of `obj` (>= `minimum`); errors name `<section>.<key>`."""
    for key in keys:
        check_int(f"{section}.{key}", getattr(obj, key), minimum=minimum)


def check_transformer(model: Any, sizes: Sequence[str], rates: Sequence[str]) -> None:
    """The `model` section of a Transformer whose encodings may rotate (an even head size):
    each of `sizes` an int >= 1, dim / heads an even integer, each of `rates` (dropouts) in
    [0, 1); errors name `model.<key>`."""
    check_ints("model", model, sizes)
    if model.dim % model.heads or (model.dim // model.heads) % 2:
        raise ValueError(
            f"model.dim / model.heads must be an even integer, got "
            f"dim={model.dim}, heads={model.heads}"
        )
    for key in rates:
        check_rate(f"model.{key}", getattr(model, key))


# the direction in which each experiment's eval metric improves
_BEST_MODE = {"acc": "max", "bleu": "max", "wer": "min", "bpd": "min", "loss": "min"}


def train_preset(
    optimiser: Mapping[str, Any], *, every: int, best: str, log_every: int
) -> dict[str, Any]:
    """The `train` section of a preset: the `TrainConfig` keys in `optimiser` (steps,
    batch_size, lr, weight_decay, warmup_steps), a cosine schedule, gradients clipped at norm 1,
    an evaluation and a checkpoint every `every` steps, the checkpoint of the best eval metric
    `best` kept (the higher accuracy or BLEU, the lower WER, bits per dim or loss), a log line
    every `log_every` steps."""
    if best not in _BEST_MODE:
        raise ValueError(f"best must be one of {sorted(_BEST_MODE)}, got {best!r}")
    return {
        **optimiser,
        "schedule": "cosine",
        "clip_norm": 1.0,
        "eval_every": every,
        "checkpoint_every": every,
        "best_metric": best,
        "best_mode": _BEST_MODE[best],
        "log_every": log_every,
    }
