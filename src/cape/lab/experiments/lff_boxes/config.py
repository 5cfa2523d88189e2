"""Configuration of the LFF boxes experiment (LFF paper sec. 4.4, Tables 3-4) and its presets.

The paper's widget-captioning screen encoder (6 layers, 8 heads, hidden 128, 100k steps) is
replaced by a question answering task over procedural screens (`cape.lab.data.boxes`) that needs
the boxes' spatial relations; "seen" / "unseen" are test screens whose coordinates do / do not
occur in training (Table 4). Every encoding gets the box edges (top, left, bottom, right)
divided by canvas - 1, in [0, 1], and is added to the box tokens' content embedding; the
rotary peers (RoPE-ViT's axial and mixed rotations, over the 4 edges) instead rotate
queries and keys in every layer by the edges counted in cells (one cell = one of RoPE-ViT's
patches), the question token taking the query box's edges.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cape._checks import check_choice, check_float, check_int
from cape.augment import Augmentation
from cape.lab.data.boxes import ScreenSettings
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
    "LffBoxesConfig",
    "PRESETS",
    "PRESET_NOTES",
    "POSITIONS",
    "position_options",
    "encoding_size",
]

# the encodings a row may name (`cape.build` names); "nopos" is the content-only model
POSITIONS = ("nopos", "embed-4d", "sine-4d", "lff", "rope-axial", "rope-mixed")
ROTARY = ("rope-axial", "rope-mixed")  # in attention: built at the head size


@dataclass
class DataConfig:
    """The screens (`cape.lab.data.boxes.make_splits`): sizes of train/val and of each test split
    (test_seen, and test_unseen = test_seen moved by one cell), canvas (even), boxes per
    screen, the largest box side in cells (even), the planting probability, the seed."""

    train: int = 50000
    val: int = 1000
    test: int = 2000
    canvas: int = 64
    min_boxes: int = 5
    max_boxes: int = 9
    max_size: int = 16
    plant: float = 0.7
    seed: int = 0

    def __post_init__(self) -> None:
        check_ints("data", self, ("train", "val", "test"))
        ScreenSettings.check(self, "data.")
        check_int("data.seed", self.seed, minimum=0)


@dataclass
class ModelConfig:
    """The screen encoder (`cape.models.TransformerEncoder`) and the LFF defaults of the rows.

    gamma_cells: LFF's gamma (std of W_r = 1/gamma) in cells; rows get gamma = gamma_cells /
    (canvas - 1) for positions in [0, 1] unless their options set it. fourier_dim, hidden_dim:
    |F| and |H| of Algorithm 1 (F = dim / groups without the MLP). embed_init_std: the init
    std of Embed-4D's tables; 1.0 starts them at the scale of the content embedding
    (nn.Embedding's N(0, 1)), as Sine-4D (amplitude 1) and LFF start near it. With `EmbedND`'s
    own default 0.02 the position signal starts 50x weaker than the content: in a 1200-step
    quick run Embed-4D then stayed at 35% (content-only level) while Sine-4D reached 61%."""

    dim: int = 64
    depth: int = 3
    heads: int = 4
    ffn_dim: int = 128
    dropout: float = 0.0
    fourier_dim: int = 64
    hidden_dim: int = 32
    gamma_cells: float = 2.0
    embed_init_std: float = 1.0

    def __post_init__(self) -> None:
        check_ints("model", self, ("dim", "depth", "heads", "ffn_dim", "fourier_dim", "hidden_dim"))
        if self.dim % self.heads or self.dim % 8:
            raise ValueError(
                f"model.dim must be divisible by model.heads and by 8 (Sine-4D: "
                f"2 x 4 axes), got dim={self.dim}, heads={self.heads}"
            )
        check_float("model.dropout", self.dropout)
        check_float("model.gamma_cells", self.gamma_cells, strict=True)
        check_float("model.embed_init_std", self.embed_init_std)


@dataclass
class RowConfig:
    """One row of the tables: an encoding of the boxes (`position`, one of `POSITIONS`), its
    `cape.build` options over the defaults of `position_options`, and `augment`: CAPE's
    augmentation (`cape.Augmentation` fields) of the box corners in training, one global shift
    per axis (y, x) per screen shared by all corners, so that the relations are kept."""

    name: str = ""
    position: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    augment: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        row_key(self.name)
        check_choice(f"rows[{self.name}].position", self.position, POSITIONS)
        if self.position == "nopos" and (self.options or self.augment):
            raise ValueError(f"rows[{self.name}]: position 'nopos' takes no options or augment")
        if self.position == "lff" and "groups" in self.options:
            check_choice(f"rows[{self.name}].options.groups", self.options["groups"], (1, 2, 4))
        for key in (
            "pos_dim",
            "augmentation",
            "max_global_shift",
            "max_local_shift",
            "max_global_scaling",
            "normalize",
        ):
            if key in self.options:
                raise ValueError(
                    f"rows[{self.name}].options.{key} is set by the experiment; "
                    f"use rows[{self.name}].augment for CAPE's augmentation"
                )
        try:
            Augmentation(**self.augment)
        except (TypeError, ValueError) as e:
            raise ValueError(f"rows[{self.name}].augment: {e}") from None

    def augmentation(self) -> Augmentation | None:
        return Augmentation(**self.augment) if self.augment else None


@dataclass
class EvalConfig:
    """batch_size: screens per evaluation batch. reference: the row that the Welch t-tests of
    the report compare every other row with (the paper's Embed-4D)."""

    batch_size: int = 500
    reference: str = "Embed-4D"

    def __post_init__(self) -> None:
        check_int("eval.batch_size", self.batch_size)


def position_options(row: RowConfig, model: ModelConfig, canvas: int) -> dict[str, Any]:
    """The `cape.build(row.position, model.dim, **options)` options of a row: the experiment's
    defaults for positions in [0, 1] on this canvas, then the row's own options.

    embed-4d: one bin per coordinate value (sizes canvas, bin centres at v / (canvas - 1)),
    init_std from `model`.
    sine-4d: freq_scale canvas - 1 (phases as on integer coordinates). lff: groups (default 1)
    of 4 / groups coordinates, fourier_dim, hidden_dim and gamma from `model`. rope-axial,
    rope-mixed: the 4 edges (pos_dim 4), mixed with the model's heads; built at the head size
    (`encoding_size`) and fed positions in cells by the model."""
    unit = 1.0 / (canvas - 1)
    if row.position == "embed-4d":
        base: dict[str, Any] = {
            "sizes": [canvas] * 4,
            "low": -0.5 * unit,
            "high": 1.0 + 0.5 * unit,
            "init_std": model.embed_init_std,
        }
    elif row.position == "sine-4d":
        base = {"freq_scale": float(canvas - 1)}
    elif row.position == "lff":
        groups = row.options.get("groups", 1)
        mlp = row.options.get("mlp", True)
        base = {
            "groups": groups,
            "pos_dim": 4 // groups,
            "hidden_dim": model.hidden_dim,
            "fourier_dim": model.fourier_dim if mlp else model.dim // groups,
            "gamma": model.gamma_cells * unit,
        }
    elif row.position in ROTARY:
        base = {"pos_dim": 4, **({"heads": model.heads} if row.position == "rope-mixed" else {})}
    else:
        base = {}
    return {**base, **row.options}


def encoding_size(row: RowConfig, model: ModelConfig) -> int:
    """The `dim` of `cape.build` for the row: the model width, or the head size in attention."""
    return model.dim // model.heads if row.position in ROTARY else model.dim


@dataclass
class LffBoxesConfig(StudyConfig[DataConfig, ModelConfig, EvalConfig, RowConfig]):
    """The whole experiment: every row is trained once per seed and evaluated the same way."""

    name: str = "lff-boxes"

    def __post_init__(self) -> None:
        from cape.build import build

        super().__post_init__()
        check_best_metric(self.train, "acc", "max", "the validation accuracy")
        for row in self.rows:  # build every encoding once: bad options fail here, named
            if row.position == "nopos":
                continue
            try:
                build(
                    row.position,
                    encoding_size(row, self.model),
                    **position_options(row, self.model, self.data.canvas),
                )
            except (TypeError, ValueError) as e:
                raise ValueError(f"rows[{row.name}].options: {e}") from None


_OPTIMISER = dict(steps=1500, batch_size=128, lr=2e-3, weight_decay=0.01, warmup_steps=100)
_TRAIN_QUICK = train_preset(_OPTIMISER, every=500, best="acc", log_every=20)
_CAPE_AUGMENT = {"max_global_shift": 0.05, "max_global_scaling": 1.05}
_ROWS = [
    {"name": "Embed-4D", "position": "embed-4d"},
    {"name": "MLP", "position": "lff", "options": {"fourier": False}},
    {"name": "Sine-4D", "position": "sine-4d"},
    {"name": "Learnable-Fourier-2/2", "position": "lff", "options": {"groups": 2, "mlp": False}},
    *[
        {
            "name": f"Fixed-Fourier+MLP-{g}/{4 // g}",
            "position": "lff",
            "options": {"groups": g, "learnable": False},
        }
        for g in (1, 2, 4)
    ],
    *[
        {"name": f"Learnable-Fourier+MLP-{g}/{4 // g}", "position": "lff", "options": {"groups": g}}
        for g in (1, 2, 4)
    ],
    {"name": "CAPE Sine-4D", "position": "sine-4d", "augment": _CAPE_AUGMENT},
    {"name": "No position", "position": "nopos"},
]
_QUICK_NAMES = ("Embed-4D", "Sine-4D", "Learnable-Fourier+MLP-4/1", "CAPE Sine-4D")
# the encodings people pick instead of CAPE: RoPE-ViT's rotations over the 4 edges, alone and
# with CAPE's augmentation of the corners, next to the rows they are read against
_PEERS = [
    *[r for r in _ROWS if r["name"] in (*_QUICK_NAMES, "No position")],
    *[
        {"name": f"{label}{suffix}", "position": name, **extra}
        for label, name in (("RoPE-Axial-4D", "rope-axial"), ("RoPE-Mixed-4D", "rope-mixed"))
        for suffix, extra in (("", {}), ("+CAPE", {"augment": _CAPE_AUGMENT}))
    ],
]

_CPU_FULL: dict[str, Any] = {
    "name": "lff-boxes-cpu-full",
    "seeds": [0, 1, 2],
    "data": {"train": 50000, "val": 1000, "test": 5000},
    "train": _TRAIN_QUICK,
}

# name -> config mapping (apply `--config` files and `--set` overrides on top)
PRESETS: dict[str, dict[str, Any]] = {
    # the default: Table 4's rows + CAPE + content only, 2 seeds: 10 x 1500 steps, about
    # 5 minutes on 2 CPU cores
    "quick": {
        "name": "lff-boxes-quick",
        "seeds": [0, 1],
        "data": {"train": 50000, "val": 1000, "test": 2000},
        "train": _TRAIN_QUICK,
        "rows": [r for r in _ROWS if r["name"] in (*_QUICK_NAMES, "No position")],
    },
    # every row of Table 3 (+ CAPE, + content only), 3 seeds, quick's training and screens
    # (shared data cache) with larger test sets: 36 runs, about 45 minutes on 2 CPU cores
    "cpu-full": {**_CPU_FULL, "rows": _ROWS},
    # RoPE-ViT's rotations (+CAPE) next to Table 4's rows, cpu-full's settings: 27 runs
    "peers": {**_CPU_FULL, "name": "lff-boxes-peers", "rows": _PEERS},
    # the paper's screen encoder: 6 layers, 8 heads, hidden 128, on a GPU
    "paper": {
        "name": "lff-boxes-paper",
        "seeds": [0, 1, 2],
        "data": {"train": 500000, "val": 5000, "test": 10000},
        "model": {"dim": 128, "depth": 6, "heads": 8, "ffn_dim": 512, "dropout": 0.1},
        "train": {
            **_TRAIN_QUICK,
            "steps": 100000,
            "batch_size": 256,
            "lr": 1e-3,
            "warmup_steps": 4000,
            "eval_every": 5000,
            "checkpoint_every": 5000,
            "device": "auto",
        },
        "eval": {"batch_size": 2000},
        "rows": _ROWS,
    },
}

# one line per preset: what `cape experiment NAME --help` says of it
PRESET_NOTES: dict[str, str] = {
    "quick": "Table 4's rows + CAPE + content only, 2 seeds: about 4 minutes on 2 CPU cores",
    "cpu-full": ("every row of Table 3 (+ CAPE, + content only): about 45 minutes on 2 CPU cores"),
    "peers": "RoPE-Axial and RoPE-Mixed (+CAPE) next to Table 4's rows, cpu-full's settings",
    "paper": "GPU: the paper's screen encoder (6 layers, 8 heads, hidden 128)",
}
