"""Configuration of the LFF image-generation study (Li et al. 2021, sec. 4.1, Figure 3) and its
presets.

The paper: a 6-layer Reformer (d 1024, 8 heads, d_ff 4096) on ImageNet 64x64, 100k steps, bits
per dim on held-out images vs training step, mean and 95% CI over 3 runs. Here: rendered
characters (`cape.lab.data`) at 12 px by default (sequences of 12*12*3 = 432 intensities) and a
small causal Transformer, so that every row trains in minutes on a CPU; `paper` keeps the paper's
sizes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cape._checks import check_choice, check_int, check_rate
from cape.lab.data.images.render import CANVAS
from cape.lab.experiments.lff_generation.model import POSITIONS, PixelPositions
from cape.lab.experiments.study_config import (
    StudyConfig,
    check_best_metric,
    check_ints,
    row_key,
    train_preset,
)

__all__ = [
    "DataConfig",
    "ModelConfig",
    "RowConfig",
    "EvalConfig",
    "GenerationConfig",
    "PRESETS",
    "PRESET_NOTES",
]


@dataclass
class DataConfig:
    """Rendered characters (`cape.lab.data.make_split`, cached in `root`) at `size` x `size` px, RGB
    uint8. `train` images to learn from, `val` held-out images (the "val" split: other seeds,
    same fonts) for bits per dim. `workers`: render processes."""

    root: str = "data/chars"
    size: int = 12
    train: int = 2000
    val: int = 100
    seed: int = 0
    workers: int = 2

    def __post_init__(self) -> None:
        check_int("data.size", self.size, minimum=2)
        if self.size > CANVAS:
            raise ValueError(f"data.size must be an int in [2, {CANVAS}], got {self.size}")
        check_ints("data", self, ("train", "val"))
        check_ints("data", self, ("seed", "workers"), minimum=0)


@dataclass
class ModelConfig:
    """The causal Transformer: width `dim` = pixel encoding (`dim - channel_dim`) + channel
    embedding (`channel_dim`), `depth` layers, `heads`, FFN width `ffn_dim`."""

    dim: int = 64
    channel_dim: int = 16
    depth: int = 2
    heads: int = 4
    ffn_dim: int = 256
    dropout: float = 0.0

    def __post_init__(self) -> None:
        check_ints("model", self, ("dim", "channel_dim", "depth", "heads", "ffn_dim"))
        check_rate("model.dropout", self.dropout)
        if self.dim % self.heads:
            raise ValueError(
                f"model.dim ({self.dim}) must be divisible by model.heads ({self.heads})"
            )
        if self.channel_dim >= self.dim or (self.dim - self.channel_dim) % 4:
            raise ValueError(
                f"model.channel_dim must be below model.dim ({self.dim}) and leave a pixel "
                f"encoding width dim - channel_dim divisible by 4 (Sine-2D: two sinusoids), "
                f"got channel_dim={self.channel_dim}"
            )


@dataclass
class RowConfig:
    """One curve of Figure 3: `position` (one of `POSITIONS`) with its `options` (`cape.build`
    keywords of the pixel encoding)."""

    name: str = ""
    position: str = ""
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        row_key(self.name)
        check_choice(f"rows[{self.name}].position", self.position, POSITIONS)


@dataclass
class EvalConfig:
    """`batch_size`: images per forward when measuring bits per dim."""

    batch_size: int = 50

    def __post_init__(self) -> None:
        check_int("eval.batch_size", self.batch_size)


@dataclass
class GenerationConfig(StudyConfig[DataConfig, ModelConfig, EvalConfig, RowConfig]):
    """The whole study: every row trained once per seed; held-out bits per dim measured every
    `train.eval_every` steps (the Trainer's eval_fn, `train.best_metric` = "bpd")."""

    name: str = "lff-generation"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.train.eval_every < 1:
            raise ValueError(
                "train.eval_every must be >= 1: the bits-per-dim curve is measured "
                f"every eval_every steps, got {self.train.eval_every}"
            )
        check_best_metric(self.train, "bpd", "min", "the only eval metric")
        m, s = self.model, self.data.size
        for row in self.rows:  # build each pixel encoding once: bad options fail here
            try:
                PixelPositions(row.position, m.dim, m.channel_dim, s, s, row.options)
            except (TypeError, ValueError) as e:
                raise type(e)(f"rows[{row.name}].options ({row.position}): {e}") from None


_OPTIMISER = dict(steps=200, batch_size=24, lr=2e-3, weight_decay=0.0, warmup_steps=20)
_TRAIN_QUICK = train_preset(_OPTIMISER, every=50, best="bpd", log_every=10)
# Figure 3a (baselines and the method) then 3b (its components), then CAPE.
_ROWS = [
    {"name": "Embed-1D", "position": "embed-1d"},
    {"name": "Embed-2D", "position": "embed-2d"},
    {"name": "Sine-1D", "position": "sine-1d"},
    {"name": "Sine-2D", "position": "sine-2d"},
    {"name": "Learnable-Fourier+MLP", "position": "lff"},
    {"name": "Learnable-Fourier", "position": "lff", "options": {"mlp": False}},
    {"name": "MLP", "position": "lff", "options": {"fourier": False}},
    {"name": "CAPE 2D", "position": "cape2d", "options": {"preset": "image"}},
]
_QUICK = ("Embed-2D", "Sine-2D", "Learnable-Fourier+MLP")
# the channel embedding alone: a causal model can still count its way to a position
_NOPOS = {"name": "No position", "position": "nopos"}

# name -> config mapping (apply `--config` files and `--set` overrides on top)
PRESETS: dict[str, dict[str, Any]] = {
    # the default: content only and Figure 3a's ranking (LFF+MLP, Embed-2D, Sine-2D), 2 seeds,
    # 12 px, 600 steps: 10 min 29 s from a fresh clone. At 200 and 450 steps no position was
    # level with the best row (nothing used its positions yet); at 600 every row loses bits per
    # dim without them. Embed-1D, whose claim (level with Sine-1D) needs Sine-1D, is in cpu-full
    "quick": {
        "name": "lff-generation-quick",
        "seeds": [0, 1],
        "data": {"size": 12, "train": 2000, "val": 100},
        "train": {
            **_TRAIN_QUICK,
            "steps": 600,
            "warmup_steps": 60,
            "eval_every": 200,
            "checkpoint_every": 200,
        },
        "rows": [_NOPOS, *(r for r in _ROWS if r["name"] in _QUICK)],
    },
    # every row, 3 seeds (Figure 3's mean and 95% CI), quick's model and images, 300 steps:
    # 24 runs, about 40 minutes on 2 CPU cores
    "cpu-full": {
        "name": "lff-generation-cpu-full",
        "seeds": [0, 1, 2],
        "data": {"size": 12, "train": 10000, "val": 200},
        "train": {**_TRAIN_QUICK, "steps": 300, "warmup_steps": 30},
        "rows": _ROWS,
    },
    # the paper's sizes: 6 layers, d 1024 (pixel 768 + channel 256), 8 heads, d_ff 4096, 64 px
    # (sequences of 12,288), 8 images per step per device; full attention in place of
    # Reformer's LSH attention. GPU only.
    "paper": {
        "name": "lff-generation-paper",
        "seeds": [0, 1, 2],
        "data": {"size": 64, "train": 100000, "val": 1000, "workers": 8},
        "model": {"dim": 1024, "channel_dim": 256, "depth": 6, "heads": 8, "ffn_dim": 4096},
        "train": {
            **_TRAIN_QUICK,
            "steps": 100000,
            "batch_size": 8,
            "lr": 1e-3,
            "warmup_steps": 4000,
            "precision": "bf16",
            "eval_every": 5000,
            "checkpoint_every": 1000,
            "log_every": 100,
            "num_workers": 2,
            "device": "cuda",
        },
        "eval": {"batch_size": 8},
        "rows": _ROWS,
    },
}

# one line per preset: what `cape experiment NAME --help` says of it
PRESET_NOTES: dict[str, str] = {
    "quick": "12 px images, 4 rows x 2 seeds, 600 steps: about 11 minutes on 2 CPU cores",
    "cpu-full": "every row (Figure 3's mean and 95% CI): about 40 minutes on 2 CPU cores",
    "paper": "GPU only: the paper's sizes (6 layers, d 1024, 64 px images)",
}
