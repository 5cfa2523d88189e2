"""The maths of every encoding as pure functions (float32 in, float32 out).

Modules in `cape.encodings` are thin wrappers holding configuration and parameters.
"""

from .alibi import alibi_bias, alibi_slopes
from .fire import fire_bias, fire_distance
from .fourier import fourier_features, learnable_fourier_features, lff_kernel
from .frequencies import (
    aliased,
    count_aliased,
    grid_frequencies_1d,
    grid_frequencies_2d,
    grid_radii,
    grid_sampling,
)
from .relative import num_buckets, relative_index, relpos_attention
from .rope2d import axial_frequencies, mixed_angles, mixed_frequencies, rope2d_magnitudes
from .rope_scaling import (
    extension_factor,
    ntk_base,
    position_midpoint,
    position_span,
    scaled_frequencies,
    xpos_scale,
    xpos_zeta,
    yarn_temperature,
)
from .rotary import apply_rotary, rotary_angles
from .sinusoidal import (
    axial_sinusoidal,
    cape2d_frequencies,
    cos_sin,
    doubled_frequencies,
    shifted_sine,
    sinusoid,
    sinusoid_frequencies,
    sinusoidal_1d,
    sinusoidal_2d,
)

__all__ = [
    "axial_sinusoidal",
    "cape2d_frequencies",
    "cos_sin",
    "doubled_frequencies",
    "shifted_sine",
    "sinusoid",
    "sinusoid_frequencies",
    "sinusoidal_1d",
    "sinusoidal_2d",
    "fourier_features",
    "learnable_fourier_features",
    "lff_kernel",
    "num_buckets",
    "relative_index",
    "relpos_attention",
    "apply_rotary",
    "rotary_angles",
    "ntk_base",
    "position_span",
    "position_midpoint",
    "extension_factor",
    "scaled_frequencies",
    "yarn_temperature",
    "xpos_zeta",
    "xpos_scale",
    "rope2d_magnitudes",
    "axial_frequencies",
    "mixed_frequencies",
    "mixed_angles",
    "alibi_slopes",
    "alibi_bias",
    "fire_distance",
    "fire_bias",
    "grid_sampling",
    "aliased",
    "count_aliased",
    "grid_radii",
    "grid_frequencies_2d",
    "grid_frequencies_1d",
]
