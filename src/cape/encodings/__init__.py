"""Step 3 of the data flow: positions -> features. One file per family of encodings."""

from .alibi import ALiBi
from .axial import SineND
from .base import PositionalEncoding
from .fire import FIRE
from .fourier import LearnableFourierFeatures
from .grids import count_aliased
from .learned import AbsPos1d, AbsPos2d, EmbedND
from .none import NoPos
from .relative import RelPos
from .rope2d import RoPE2d
from .rotary import Rotary
from .sinusoidal import PRESETS, CAPE1d, CAPE2d

__all__ = [
    "PositionalEncoding",
    "count_aliased",
    "LearnableFourierFeatures",
    "AbsPos1d",
    "AbsPos2d",
    "EmbedND",
    "NoPos",
    "RelPos",
    "Rotary",
    "RoPE2d",
    "ALiBi",
    "FIRE",
    "CAPE1d",
    "CAPE2d",
    "PRESETS",
    "SineND",
]
