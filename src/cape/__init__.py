"""cape: continuous augmented positional embeddings and learnable Fourier features.

Data flow: positions (`cape.positions`) -> augmentation (`cape.augment`) -> encoding
(`cape.encodings`, maths in `cape.functional`) -> combination with content (the model).
"""

from . import functional, models
from ._checks import value_checks, value_checks_enabled
from ._fusion import fusion, fusion_enabled
from .augment import (
    Augmentation,
    PositionAugmentation,
    augment_pair,
    augment_positions,
    mean_normalize,
)
from .build import ENCODINGS, build, encoding_class, encoding_options
from .encodings import (
    FIRE,
    PRESETS,
    AbsPos1d,
    AbsPos2d,
    ALiBi,
    CAPE1d,
    CAPE2d,
    EmbedND,
    LearnableFourierFeatures,
    NoPos,
    PositionalEncoding,
    RelPos,
    RoPE2d,
    Rotary,
    SineND,
    count_aliased,
)
from .position_sampling import PoSE, RandomFloatPositions, RandomizedPositions
from .positions import (
    as_positions,
    grid_indices,
    grid_positions,
    lengths_to_mask,
    timestamps,
    token_positions,
)

__version__ = "0.1.0"

__all__ = [
    "functional",
    "models",
    "Augmentation",
    "PositionAugmentation",
    "RandomizedPositions",
    "PoSE",
    "RandomFloatPositions",
    "augment_pair",
    "augment_positions",
    "mean_normalize",
    "ENCODINGS",
    "build",
    "encoding_class",
    "encoding_options",
    "CAPE1d",
    "CAPE2d",
    "PRESETS",
    "AbsPos1d",
    "AbsPos2d",
    "EmbedND",
    "LearnableFourierFeatures",
    "NoPos",
    "PositionalEncoding",
    "RelPos",
    "Rotary",
    "RoPE2d",
    "ALiBi",
    "FIRE",
    "SineND",
    "count_aliased",
    "as_positions",
    "grid_indices",
    "grid_positions",
    "lengths_to_mask",
    "timestamps",
    "token_positions",
    "value_checks",
    "value_checks_enabled",
    "fusion",
    "fusion_enabled",
]
