"""Configuration of the vision experiment (CAPE sec. 5.1, appendix B) and its presets.

The paper's protocol scaled to this CPU: 224 px -> 32 px and patch 16 -> 4 (an 8 x 8 grid,
as the paper's 14 x 14 is the ViT's), evaluation at 24/32/56/96 px for the paper's
160/224/384/672, UniViT over {20, 24, ..., 44} px for its [128, 320] step 32.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from cape._checks import check_choice, check_int
from cape.lab.experiments.study_config import (
    StudyConfig,
    check_ints,
    check_position,
    row_key,
    train_preset,
)

__all__ = [
    "DataConfig",
    "ModelConfig",
    "RowConfig",
    "EvalConfig",
    "VisionConfig",
    "PRESETS",
    "PRESET_NOTES",
]


@dataclass
class DataConfig:
    """Where images come from. `source`: rendered on the machine and cached in `root`: "chars"
    (one character, 36 classes) or "relations" (an X and an O; 4 classes: where the X is, a task
    that needs positions); or a folder of class sub-folders (split `fractions` train/val/test by
    `seed`).
    `transform`: "contrast" (colour-invariant, `cape.lab.data.contrast_image`) or "rgb"."""

    source: str = "chars"
    root: str = "data/chars"
    train: int = 10000
    val: int = 1000
    test: int = 1000
    test_fonts: int = 0
    native: int = 0
    seed: int = 0
    workers: int = 2
    fractions: list[float] = field(default_factory=lambda: [0.8, 0.1, 0.1])
    transform: str = "contrast"

    def __post_init__(self) -> None:
        from cape.lab.data.images.transforms import TRANSFORMS

        check_choice("data.transform", self.transform, tuple(TRANSFORMS))
        check_ints("data", self, ("train", "val"))
        check_ints("data", self, ("test", "test_fonts", "native", "seed", "workers"), minimum=0)
        if self.source not in ("chars", "relations") and self.test_fonts:
            raise ValueError(
                "data.test_fonts needs rendered images (data.source chars or relations)"
            )
        if self.source != "chars" and self.native:
            raise ValueError("data.native needs data.source='chars'")


@dataclass
class ModelConfig:
    """The ViT's size (`cape.models.ViT` arguments)."""

    patch: int = 4
    dim: int = 96
    depth: int = 4
    heads: int = 4
    mlp_ratio: float = 2.0
    dropout: float = 0.0


@dataclass
class RowConfig:
    """One row of the tables: a ViT with `position` (a 2-D `cape.build` name) and its options.

    `train_size`: px of training images. `univit_sizes`: non-empty makes it a UniViT: each
    batch is resized to one size drawn from this list (the images are rendered at the largest).
    `packed`: with `univit_sizes`, each image of a batch gets its own size and the batch is
    packed with padding masks (`ViT.forward_packed`) instead of resized to one size.
    `finetune_size`/`finetune_steps`: after training, fine-tune at that size.
    `model`: fields of `ModelConfig` this row changes (e.g. {"dim": 64}: a narrower ViT, as
    the smaller models of Figure 4).
    """

    name: str = ""
    position: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    train_size: int = 32
    univit_sizes: list[int] = field(default_factory=list)
    packed: bool = False
    finetune_size: int = 0
    finetune_steps: int = 0

    def __post_init__(self) -> None:
        key = row_key(self.name)
        check_position(f"{key}.position", self.position)
        check_int(f"{key}.train_size", self.train_size)
        for s in self.univit_sizes:
            check_int(f"{key}.univit_sizes[]", s)
        check_ints(key, self, ("finetune_size", "finetune_steps"), minimum=0)
        if self.packed and not self.univit_sizes:
            raise ValueError(f"{key}.packed needs univit_sizes (the sizes to mix)")
        if bool(self.finetune_size) != bool(self.finetune_steps):
            raise ValueError(f"{key}: set finetune_size and finetune_steps together")
        allowed = [f.name for f in dataclasses.fields(ModelConfig) if f.name != "patch"]
        unknown = sorted(set(self.model) - set(allowed))
        if unknown:
            raise ValueError(f"{key}.model: unknown key(s) {unknown}; allowed: {allowed}")

    def model_config(self, base: ModelConfig) -> ModelConfig:
        """`base` with this row's `model` changes, checked as a `ModelConfig`."""
        return dataclasses.replace(base, **self.model)

    @property
    def data_size(self) -> int:
        """The px the training images are rendered at."""
        return max(self.univit_sizes) if self.univit_sizes else self.train_size


@dataclass
class EvalConfig:
    """What is measured after training.

    sizes: test resolutions (px, multiples of the patch). extents: CAPE Table 6 position
    rescaling at evaluation, any of "1", "ratio" (r / r_train), "sqrt" (sqrt(r / r_train)), for
    the continuous encodings. tta: average the class probabilities at r - patch, r, r + patch
    (Table 1). native: the resize-strategy study on images of native sizes (Table 5).
    figures: embedding components and similarity maps of the trained models.
    """

    sizes: list[int] = field(default_factory=lambda: [24, 32, 56, 96])
    batch_size: int = 200
    extents: list[str] = field(default_factory=list)
    tta: bool = False
    native_bins: list[int] = field(default_factory=lambda: [12, 32, 56, 96, 129])
    figures: bool = True

    def __post_init__(self) -> None:
        check_int("eval.batch_size", self.batch_size)
        for e in self.extents:
            check_choice("eval.extents[]", e, ("1", "ratio", "sqrt"))
        if sorted(self.native_bins) != list(self.native_bins) or len(self.native_bins) < 2:
            raise ValueError(
                f"eval.native_bins must be >= 2 increasing edges, got {self.native_bins}"
            )


@dataclass
class VisionConfig(StudyConfig[DataConfig, ModelConfig, EvalConfig, RowConfig]):
    """The whole experiment: every row is trained once per seed and evaluated the same way."""

    name: str = "vision"

    def __post_init__(self) -> None:
        super().__post_init__()
        p = self.model.patch
        sizes = list(self.eval.sizes) + [
            s for r in self.rows for s in (r.train_size, *r.univit_sizes)
        ]
        sizes += [r.finetune_size for r in self.rows if r.finetune_size]
        bad = sorted({s for s in sizes if s % p})
        if bad:
            raise ValueError(f"image sizes {bad} are not multiples of model.patch={p}")


_IMAGE_CAPE = {"preset": "image"}
_OPTIMISER = dict(steps=600, batch_size=128, lr=2e-3, weight_decay=0.05, warmup_steps=60)
_TRAIN_QUICK = train_preset(_OPTIMISER, every=150, best="acc", log_every=10)
_QUICK_ROWS = [
    {"name": "nopos", "position": "nopos"},
    {"name": "abspos", "position": "abspos2d"},
    {"name": "sinpos", "position": "sinpos2d"},
    {"name": "CAPE", "position": "cape2d", "options": _IMAGE_CAPE},
]
_UNIVIT = [20, 24, 28, 32, 36, 40, 44]
_ROTARY_AUG = {"max_global_shift": 0.5, "max_local_shift": 0.125, "max_global_scaling": 1.4}
_FULL_ROWS = [
    *_QUICK_ROWS,
    {
        "name": "CAPE λ=1",
        "position": "cape2d",
        "options": {"preset": "image", "max_global_scaling": 1.0},
    },
    {
        "name": "CAPE Δ=0",
        "position": "cape2d",
        "options": {"preset": "image", "max_global_shift": 0.0},
    },
    {
        "name": "CAPE ε=0",
        "position": "cape2d",
        "options": {"preset": "image", "max_local_shift": 0.0},
    },
    {"name": "LFF", "position": "lff"},
    {"name": "Sine-2D", "position": "sine-2d"},
    {"name": "Embed-2D", "position": "embed-2d"},
    {"name": "rotary+CAPE", "position": "rotary2d", "options": {"augmentation": _ROTARY_AUG}},
    {"name": "sinpos@24", "position": "sinpos2d", "train_size": 24},
    {"name": "CAPE@24", "position": "cape2d", "options": _IMAGE_CAPE, "train_size": 24},
    {"name": "sinpos@56", "position": "sinpos2d", "train_size": 56},
    {"name": "CAPE@56", "position": "cape2d", "options": _IMAGE_CAPE, "train_size": 56},
    {"name": "abspos ft56", "position": "abspos2d", "finetune_size": 56, "finetune_steps": 150},
    {
        "name": "CAPE ft56",
        "position": "cape2d",
        "options": _IMAGE_CAPE,
        "finetune_size": 56,
        "finetune_steps": 150,
    },
    {"name": "UniViT sinpos", "position": "sinpos2d", "univit_sizes": _UNIVIT},
    {
        "name": "UniViT CAPE λ=1",
        "position": "cape2d",
        "univit_sizes": _UNIVIT,
        "options": {"preset": "image", "max_global_scaling": 1.0},
    },
    {
        "name": "UniViT CAPE λ=1.4",
        "position": "cape2d",
        "univit_sizes": _UNIVIT,
        "options": _IMAGE_CAPE,
    },
    {
        "name": "UniViT CAPE packed",
        "position": "cape2d",
        "univit_sizes": _UNIVIT,
        "packed": True,
        "options": _IMAGE_CAPE,
    },
    # Figure 4: smaller ViTs, against the UniViT evaluated at lower resolutions
    {"name": "CAPE d64", "position": "cape2d", "options": _IMAGE_CAPE, "model": {"dim": 64}},
    {"name": "CAPE depth 2", "position": "cape2d", "options": _IMAGE_CAPE, "model": {"depth": 2}},
    # beyond the paper: every frequency x0.4, so |w| <= 4 pi, the 8 x 8 grid's Nyquist limit
    # (the paper's 14 x 14 grid allows 7 pi); tests whether aliasing explains CAPE/sinpos at 32 px
    {"name": "sinpos freq 0.4", "position": "sinpos2d", "options": {"freq_scale": 0.4}},
    {"name": "CAPE freq 0.4", "position": "cape2d", "options": {**_IMAGE_CAPE, "freq_scale": 0.4}},
]

# The main job: a task that needs positions (where the X is from the O: `relations`), the rows a
# reader needs, two seeds, test sizes below and above training. Frequencies fit the 8 x 8
# training grid (`fit_grid: true`) except in the rows about the paper's (sinpos, CAPE).
_RELATION_ROWS = [
    {"name": "nopos", "position": "nopos"},
    {"name": "abspos", "position": "abspos2d"},
    {"name": "sinpos", "position": "sinpos2d"},
    {"name": "CAPE", "position": "cape2d", "options": _IMAGE_CAPE},
    {"name": "CAPE grid", "position": "cape2d", "options": {**_IMAGE_CAPE, "fit_grid": True}},
    {
        "name": "rotary+CAPE grid",
        "position": "rotary2d",
        "options": {"augmentation": _ROTARY_AUG, "fit_grid": True},
    },
]

# The 2-D rotary encodings people use instead (RoPE-ViT's axial and mixed, Heo et al. 2024),
# each alone and with CAPE's augmentation, next to the main job's rows.
_PEER_ROWS = [
    {"name": "rotary grid", "position": "rotary2d", "options": {"fit_grid": True}},
    {"name": "RoPE-Axial", "position": "rope-axial", "options": {"fit_grid": True}},
    {
        "name": "RoPE-Axial+CAPE",
        "position": "rope-axial",
        "options": {"augmentation": _ROTARY_AUG, "fit_grid": True},
    },
    {"name": "RoPE-Mixed", "position": "rope-mixed", "options": {"fit_grid": True}},
    {
        "name": "RoPE-Mixed+CAPE",
        "position": "rope-mixed",
        "options": {"augmentation": _ROTARY_AUG, "fit_grid": True},
    },
    # the ablation of the position plan's shared draw: every layer draws its own augmentation
    {
        "name": "rotary+CAPE grid per layer",
        "position": "rotary2d",
        "options": {"augmentation": _ROTARY_AUG, "fit_grid": True, "draw": "per_layer"},
    },
]

_QUICK: dict[str, Any] = {
    "name": "vision-quick",
    "seeds": [0, 1],
    "data": {
        "source": "relations",
        "root": "data/relations",
        "train": 6000,
        "val": 500,
        "test": 500,
    },
    "model": {"dim": 64, "depth": 2},
    "train": {
        **_TRAIN_QUICK,
        "steps": 500,
        "batch_size": 64,
        "warmup_steps": 50,
        "eval_every": 250,
        "checkpoint_every": 250,
    },
    "eval": {"sizes": [24, 32, 48, 64], "figures": False},
    "rows": _RELATION_ROWS,
}

# name -> config mapping (apply `--config` files and `--set` overrides on top)
PRESETS: dict[str, dict[str, Any]] = {
    # the README's main job on `relations`: <= 10 minutes on 2 CPU cores
    "quick": _QUICK,
    # the main job's settings and rows plus the peers (its runs are reused from its folder)
    "peers": {**_QUICK, "name": "vision-peers", "rows": [*_RELATION_ROWS, *_PEER_ROWS]},
    # characters (a task a bag of patches nearly solves): the quick rows, 1 seed
    "chars-quick": {
        "name": "vision-chars-quick",
        "seeds": [0],
        "data": {"train": 10000, "val": 1000, "test": 1000},
        "train": _TRAIN_QUICK,
        "rows": _QUICK_ROWS,
    },
    # every row (the paper's tables, UniViT, smaller ViTs, frequencies x0.4): hours on 2 CPU cores
    "cpu-full": {
        "name": "vision-cpu-full",
        "seeds": [0, 1, 2],
        "data": {"train": 20000, "val": 1000, "test": 2000, "test_fonts": 1000, "native": 2000},
        "train": {
            **_TRAIN_QUICK,
            "steps": 1000,
            "warmup_steps": 100,
            "eval_every": 250,
            "checkpoint_every": 250,
        },
        "eval": {"extents": ["1", "ratio", "sqrt"], "tta": True},
        "rows": _FULL_ROWS,
    },
    # ViT-B/16 at 224 px on GPUs (the paper's sizes; renders capped at 256 px)
    "paper": {
        "name": "vision-paper",
        "seeds": [0, 1, 2],
        "data": {"train": 200000, "val": 5000, "test": 10000, "test_fonts": 5000, "workers": 8},
        "model": {
            "patch": 16,
            "dim": 768,
            "depth": 12,
            "heads": 12,
            "mlp_ratio": 4.0,
            "dropout": 0.1,
        },
        "train": {
            **_TRAIN_QUICK,
            "steps": 30000,
            "batch_size": 256,
            "lr": 1e-3,
            "warmup_steps": 3000,
            "weight_decay": 0.05,
            "precision": "bf16",
            "eval_every": 2000,
            "checkpoint_every": 1000,
            "num_workers": 4,
            "device": "cuda",
        },
        "eval": {
            "sizes": [160, 224, 256],
            "extents": ["1", "ratio", "sqrt"],
            "tta": True,
            "native_bins": [16, 128, 192, 256],
        },
        "rows": [{**r, "train_size": 224} for r in _QUICK_ROWS],
    },
}


# one line per preset: what `cape experiment NAME --help` says of it
PRESET_NOTES: dict[str, str] = {
    "quick": "the README's main job on `relations`: <= 10 minutes on 2 CPU cores",
    "peers": "quick's settings and rows plus the peers (quick's runs reused from its folder)",
    "chars-quick": "the four main encodings on characters (a task a bag of patches nearly solves)",
    "cpu-full": "every row (the paper's tables, UniViT, smaller ViTs): hours on 2 CPU cores",
    "paper": "GPU: ViT-B/16 at 224 px (the paper's sizes)",
}
