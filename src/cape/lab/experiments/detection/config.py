"""Configuration of the detection experiment (LFF paper sec. 4.2, Tables 1-2) and its presets.

DETR on COCO scaled to a CPU: scenes of shapes (`cape.lab.data.scenes`) for COCO's images; a
3-convolution stem of stride 8 for the ResNet-50 of stride 32; image sides of 48-96 px (grids
of 6 x 6 to 12 x 12 cells) for DETR's smaller sides of 480-800 px (grids of 15 to 25 cells);
a Transformer of width 64 with 2 + 2 layers for DETR's 256 with 6 + 6.

Positions are those of the feature map's cells, (x, y) = (column, row). Table 2's protocol
(`data.normalize: false`): counted in cells from the top-left corner, so a larger image has
larger positions, and the `data.held_out` largest sizes are never trained on. Table 1's
(`normalize: true`): each image's cell centres divided by its grid, in (0, 1), every size in
training. Embed-2D reads integer (column, row) indices either way (the paper: "Embed-2D treats
each position as a discrete value").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from cape._checks import check_bool, check_choice, check_float, check_int, check_rate
from cape.lab.data.scenes import SceneSettings
from cape.lab.experiments.study_config import StudyConfig, check_folder, check_ints, row_key

__all__ = [
    "STRIDE",
    "POSITIONS",
    "DataConfig",
    "ModelConfig",
    "RowConfig",
    "EvalConfig",
    "DetectionConfig",
    "position_options",
    "position_unit",
]

STRIDE = 8  # px per feature-map cell: the stem's three stride-2 convolutions
# the encodings a row may name (`cape.build` names); "nopos" is the content-only model
POSITIONS = ("nopos", "sine-2d", "embed-2d", "lff", "cape2d", "rotary2d")
# rows whose encodings read CAPE's image units: the largest training grid spans 2, as [-1, 1]
CAPE_UNITS = ("cape2d", "rotary2d")


@dataclass
class DataConfig:
    """The scenes (`cape.lab.data.scenes`, cached in `root`) and the sizes of DETR's resizing.

    sizes: the image sides (px, multiples of 8), increasing; a training batch is resized to one
    of them, drawn per batch (DETR draws per image; one per batch needs no padding). held_out:
    the largest `held_out` sizes are used for evaluation only (Table 2: 3; Table 1: 0).
    normalize: positions in (0, 1) per image (Table 1) or counted in cells (Table 2).
    The scenes are stored at the largest size; the other fields are `SceneSettings`'."""

    root: str = "data/scenes"
    train: int = 4000
    val: int = 200
    test: int = 500
    sizes: list[int] = field(default_factory=lambda: [48, 56, 64, 72, 80, 88, 96])
    held_out: int = 3
    normalize: bool = False
    min_objects: int = 1
    max_objects: int = 3
    min_side: float = 0.12
    max_side: float = 0.4
    noise: int = 24
    seed: int = 0

    def __post_init__(self) -> None:
        check_folder("data.root", self.root)
        check_ints("data", self, ("train", "val", "test"))
        check_ints("data", self, ("seed", "held_out"), minimum=0)
        check_bool("data.normalize", self.normalize)
        if not self.sizes or any(
            isinstance(s, bool) or not isinstance(s, int) or s < STRIDE or s % STRIDE
            for s in self.sizes
        ):
            raise ValueError(f"data.sizes must be multiples of {STRIDE} px, got {self.sizes}")
        if sorted(set(self.sizes)) != list(self.sizes):
            raise ValueError(f"data.sizes must increase, got {self.sizes}")
        if self.held_out >= len(self.sizes):
            raise ValueError(
                f"data.held_out must leave a training size: < {len(self.sizes)}, "
                f"got {self.held_out}"
            )
        # the scenes' own checks, named data.<key>; stored at the largest size
        SceneSettings.check(SimpleNamespace(**vars(self), size=max(self.sizes)), "data.")

    def scene_settings(self) -> SceneSettings:
        """The scenes' settings: stored at the largest size."""
        return SceneSettings(
            size=max(self.sizes),
            min_objects=self.min_objects,
            max_objects=self.max_objects,
            min_side=self.min_side,
            max_side=self.max_side,
            noise=self.noise,
        )

    @property
    def train_sizes(self) -> list[int]:
        return list(self.sizes[: len(self.sizes) - self.held_out])

    @property
    def train_grid(self) -> int:
        """Cells per side of the largest training size."""
        return max(self.train_sizes) // STRIDE

    @property
    def max_grid(self) -> int:
        """Cells per side of the largest size."""
        return max(self.sizes) // STRIDE


@dataclass
class ModelConfig:
    """The small DETR (`model.Detr`). queries: the object queries (at least the largest object
    count). pre_norm: LayerNorm before each sub-layer (DETR's option) rather than after.
    input_positions: an absolute encoding is also added once to the encoder's input, besides
    the queries and keys of every attention (`model.Detr`). fourier_dim, hidden_dim: LFF's |F|
    and |H|; gamma_cells: its gamma (W_r std 1/gamma) in cells. embed_init_std: the init std of
    Embed-2D's tables (1.0: the scale of the content, as DETR's U(0, 1) init)."""

    dim: int = 64
    heads: int = 4
    enc_layers: int = 2
    dec_layers: int = 2
    ffn_dim: int = 128
    queries: int = 6
    dropout: float = 0.0
    pre_norm: bool = True
    input_positions: bool = False
    fourier_dim: int = 32
    hidden_dim: int = 32
    gamma_cells: float = 2.0
    embed_init_std: float = 1.0

    def __post_init__(self) -> None:
        sizes = ("dim", "heads", "enc_layers", "dec_layers", "ffn_dim", "queries")
        check_ints("model", self, (*sizes, "fourier_dim", "hidden_dim"))
        if self.dim % self.heads or (self.dim // self.heads) % 2 or self.dim % 4:
            raise ValueError(
                f"model.dim must be a multiple of 4 and model.dim / model.heads even, got "
                f"dim={self.dim}, heads={self.heads}"
            )
        check_rate("model.dropout", self.dropout)
        check_bool("model.pre_norm", self.pre_norm)
        check_bool("model.input_positions", self.input_positions)
        check_float("model.gamma_cells", self.gamma_cells, strict=True)
        check_float("model.embed_init_std", self.embed_init_std)


@dataclass
class RowConfig:
    """One row of the tables: `position` (one of `POSITIONS`) and its `cape.build` options over
    the experiment's defaults (`position_options`). In the options, `fit_grid: true` fits the
    frequencies to the largest training grid and `max_local_shift: auto` is half a cell (CAPE's
    emax = 1/N in its units)."""

    name: str = ""
    position: str = ""
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        row_key(self.name)
        check_choice(f"rows[{self.name}].position", self.position, POSITIONS)
        if self.position == "nopos" and self.options:
            raise ValueError(f"rows[{self.name}]: position 'nopos' takes no options")
        for key in ("pos_dim", "sizes", "dim"):
            if key in self.options:
                raise ValueError(f"rows[{self.name}].options.{key} is set by the experiment")


@dataclass
class EvalConfig:
    """What is measured after training. batch_size: images per forward. small_side,
    large_side: COCO's area ranges for objects of this scale: small below (small_side x
    side)^2, large above (large_side x side)^2 (COCO's 32^2 and 96^2 px would make every
    object here medium or large). examples: test images drawn with the boxes each row finds
    (first seed); score: the least score of a drawn box."""

    batch_size: int = 100
    small_side: float = 0.16
    large_side: float = 0.25
    examples: int = 4
    score: float = 0.5

    def __post_init__(self) -> None:
        check_int("eval.batch_size", self.batch_size)
        check_int("eval.examples", self.examples, minimum=0)
        small = check_float("eval.small_side", self.small_side, strict=True)
        large = check_float("eval.large_side", self.large_side, strict=True)
        if not small < large <= 1.0:
            raise ValueError(
                f"eval.small_side < eval.large_side <= 1 must hold, got {small}, {large}"
            )
        if not 0.0 <= check_float("eval.score", self.score) <= 1.0:
            raise ValueError(f"eval.score must lie in [0, 1], got {self.score}")


def position_unit(row: RowConfig, data: DataConfig) -> float:
    """What one position unit of the model's grid ((x, y) in cells, or in (0, 1) normalised) is
    multiplied by for the row's encoding: 2 / (largest training grid) in cells, 2 normalised,
    for the encodings in CAPE's image units; 1 for the others."""
    if row.position not in CAPE_UNITS:
        return 1.0
    return 2.0 if data.normalize else 2.0 / data.train_grid


def position_options(row: RowConfig, model: ModelConfig, data: DataConfig) -> dict[str, Any]:
    """The `cape.build(row.position, dim, **options)` options of a row (dim: the model width,
    the head size for rotary2d): the experiment's defaults, then the row's own options.

    sine-2d: DETR's sinusoid (base 10000) of cell indices, or of (0, 1) x 2 pi when normalised
    (DETR's `normalize=True, scale=2 pi`). embed-2d: one row per cell index of the largest grid
    (rows past the training grid stay at their init). lff: pos_dim 2, |F|, |H| and gamma in
    cells (gamma / train grid when normalised). cape2d, rotary2d: `fit_grid: true` -> the
    largest training grid; `max_local_shift: auto` -> half a cell."""
    opts = dict(row.options)
    if row.position == "sine-2d":
        base: dict[str, Any] = {"freq_scale": 2 * math.pi if data.normalize else 1.0}
    elif row.position == "embed-2d":
        base = {"sizes": [data.max_grid, data.max_grid], "init_std": model.embed_init_std}
    elif row.position == "lff":
        gamma = model.gamma_cells / (data.train_grid if data.normalize else 1.0)
        base = {"pos_dim": 2, "hidden_dim": model.hidden_dim}
        if opts.get("fourier", True):
            base.update(fourier_dim=model.fourier_dim, gamma=gamma)
    elif row.position in CAPE_UNITS:
        base = {}
        if opts.get("fit_grid") is True:
            opts["fit_grid"] = [data.train_grid, data.train_grid]
        if opts.get("max_local_shift") == "auto":
            # a cell of the largest training grid spans 2 / grid units either way
            opts["max_local_shift"] = 1.0 / data.train_grid
    else:
        base = {}
    return {**base, **opts}


@dataclass
class DetectionConfig(StudyConfig[DataConfig, ModelConfig, EvalConfig, RowConfig]):
    """The whole experiment: every row is trained once per seed and evaluated the same way."""

    name: str = "detection"

    def __post_init__(self) -> None:
        from cape.build import build

        super().__post_init__()
        m = self.model
        if m.queries < self.data.max_objects:
            raise ValueError(
                f"model.queries must be at least data.max_objects ({self.data.max_objects}): "
                f"one prediction per object, got {m.queries}"
            )
        for row in self.rows:  # build every encoding once: bad options fail here, named
            if row.position == "nopos":
                continue
            dim = m.dim // m.heads if row.position == "rotary2d" else m.dim
            try:
                build(row.position, dim, **position_options(row, m, self.data))
            except (TypeError, ValueError) as e:
                raise ValueError(f"rows[{row.name}].options: {e}") from None
