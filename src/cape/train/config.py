"""`TrainConfig`: every knob of the training loop, validated when it is built."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

__all__ = ["TrainConfig"]

_CHOICES: dict[str, tuple[str, ...]] = {
    "optimizer": ("adamw", "adagrad"),
    "schedule": ("cosine", "inverse_sqrt", "constant"),
    "precision": ("fp32", "bf16"),
    "best_mode": ("min", "max"),
    "device": ("auto", "cpu", "cuda"),
}


@dataclass
class TrainConfig:
    """One training run. Steps count optimiser updates (each of `grad_accum` micro-batches).

    `eval_every`, `checkpoint_every` and `log_every` are in optimiser steps; 0 turns the action
    off. The best checkpoint keeps the eval metric `best_metric`, lower (`min`) or higher (`max`).
    """

    steps: int = 1000
    batch_size: int = 32
    grad_accum: int = 1
    lr: float = 1e-3
    weight_decay: float = 0.0
    optimizer: str = "adamw"
    schedule: str = "cosine"
    warmup_steps: int = 0
    clip_norm: float | None = 1.0
    precision: str = "fp32"
    eval_every: int = 0
    checkpoint_every: int = 0
    keep_last: int = 3
    log_every: int = 1
    seed: int = 0
    deterministic: bool = False
    best_metric: str = "loss"
    best_mode: str = "min"
    num_workers: int = 0
    device: str = "auto"

    def __post_init__(self) -> None:
        for key, allowed in _CHOICES.items():
            value = getattr(self, key)
            if value not in allowed:
                raise ValueError(f"TrainConfig.{key} must be one of {allowed}, got {value!r}")
        positive = ("steps", "batch_size", "grad_accum", "keep_last")
        for key in positive:
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"TrainConfig.{key} must be an integer >= 1, got {value!r}")
        non_negative = (
            "warmup_steps",
            "eval_every",
            "checkpoint_every",
            "log_every",
            "num_workers",
            "seed",
        )
        for key in non_negative:
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"TrainConfig.{key} must be an integer >= 0, got {value!r}")
        if not self.lr > 0:
            raise ValueError(f"TrainConfig.lr must be > 0, got {self.lr!r}")
        if self.weight_decay < 0:
            raise ValueError(f"TrainConfig.weight_decay must be >= 0, got {self.weight_decay!r}")
        if self.clip_norm is not None and not self.clip_norm > 0:
            raise ValueError(
                f"TrainConfig.clip_norm must be > 0 or None (no clipping), got {self.clip_norm!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """Build from a dict (e.g. YAML/JSON); unknown keys are an error naming them."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown TrainConfig keys {unknown}; allowed: {sorted(known)}")
        return cls(**data)
