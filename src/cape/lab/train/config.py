"""`TrainConfig`: every knob of the training loop, validated when it is built.

It is the `train` section of every experiment config: errors name the key as `train.<key>`,
whether it comes from a file, a `--set train.<key>=...` override or the constructor.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from cape._checks import check_choice, check_float, check_int

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
    off. `progress_every`: off a terminal, a progress line (step, loss, steps/s, ETA) every so
    many seconds (0: none; a terminal shows a bar instead). The best checkpoint keeps the eval
    metric `best_metric`, lower (`min`) or higher (`max`).
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
    progress_every: float = 30.0
    seed: int = 0
    deterministic: bool = False
    best_metric: str = "loss"
    best_mode: str = "min"
    num_workers: int = 0
    device: str = "auto"

    def __post_init__(self) -> None:
        # the project's shared validators, so errors read the same everywhere
        for key, allowed in _CHOICES.items():
            check_choice(f"train.{key}", getattr(self, key), allowed)
        for key in ("steps", "batch_size", "grad_accum", "keep_last"):
            check_int(f"train.{key}", getattr(self, key), minimum=1)
        for key in (
            "warmup_steps",
            "eval_every",
            "checkpoint_every",
            "log_every",
            "num_workers",
            "seed",
        ):
            check_int(f"train.{key}", getattr(self, key), minimum=0)
        check_float("train.lr", self.lr, strict=True)
        check_float("train.weight_decay", self.weight_decay)
        check_float("train.progress_every", self.progress_every)
        if self.clip_norm is not None:
            check_float("train.clip_norm", self.clip_norm, strict=True)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
