"""SpecAugment frequency and time masking as used for CAPE's ASR models (CAPE app. C.2).

The paper: "there are two frequency masks, and ten time masks with maximum time mask ratio of
p = 0.1, the maximum frequency bands masked by one frequency mask is 30, and the maximum frames
masked by the time mask is 50; time warping is not used."

Conventions chosen here (per sample, independently for every sample of a batch):

- frequency mask: width w ~ U{0, ..., min(freq_width, F)}, first band f0 ~ U{0, ..., F - w};
  bands [f0, f0 + w) are masked on every valid frame.
- time mask: width w ~ U{0, ..., min(time_width, floor(time_ratio * L))} for a sample of L valid
  frames, first frame t0 ~ U{0, ..., L - w}; frames [t0, t0 + w) are masked on every band.
- masks may overlap; masked entries are set to `value` (0: the mean of per-sequence normalised
  features). Frames at or past a sample's length (padding) are never touched.

All masks are drawn at once ([B, masks] uniforms) and applied by comparisons with an arange: no
Python loop over masks or samples and no host synchronisation, on CPU and CUDA alike.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

from cape._checks import check_float, check_int, check_lengths, check_tensor
from cape.lab.data.settings import Settings

__all__ = ["MaskSettings", "SpecAugment", "spec_augment", "spec_augment_masks"]

_MASK_COUNTS = ("freq_masks", "freq_width", "time_masks", "time_width")


@dataclass(frozen=True)
class MaskSettings(Settings):
    """SpecAugment's masks (the paper's defaults) and the value masked entries become.

    freq_masks masks of at most freq_width bands; time_masks masks of at most
    min(time_width, floor(time_ratio * length)) frames; time_ratio in [0, 1].
    """

    freq_masks: int = 2
    freq_width: int = 30
    time_masks: int = 10
    time_ratio: float = 0.1
    time_width: int = 50
    value: float = 0.0

    @staticmethod
    def check(settings: Any, prefix: str = "") -> None:
        """Check the mask fields of `settings` (this class, or a config with fields of the same
        names: the ASR `FeatureConfig`); `prefix` starts each name in the messages."""
        for key in _MASK_COUNTS:
            check_int(f"{prefix}{key}", getattr(settings, key), minimum=0)
        ratio = settings.time_ratio
        if check_float(f"{prefix}time_ratio", ratio) > 1.0:
            raise ValueError(f"{prefix}time_ratio must lie in [0, 1], got {ratio}")

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "time_ratio", float(self.time_ratio))
        object.__setattr__(self, "value", check_float("value", self.value, minimum=-float("inf")))


def _uniform_ints(upper: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Integers uniform in {0, ..., upper[i]} elementwise: int64 of any shape -> same shape."""
    device = generator.device if generator is not None else upper.device
    u = torch.rand(upper.shape, generator=generator, device=device, dtype=torch.float64)
    draw = torch.floor(u.to(upper.device) * (upper.to(torch.float64) + 1.0)).to(torch.int64)
    return torch.minimum(draw, upper)  # u < 1 already; guards float rounding


def _band_mask(starts: torch.Tensor, widths: torch.Tensor, size: int) -> torch.Tensor:
    """starts, widths [B, M] -> [B, size] bool: True inside any [start, start + width)."""
    idx = torch.arange(size, device=starts.device)
    inside = (idx >= starts[..., None]) & (idx < (starts + widths)[..., None])  # [B, M, size]
    return inside.any(dim=1)


def spec_augment_masks(
    batch: int,
    frames: int,
    bands: int,
    lengths: torch.Tensor | None = None,
    settings: MaskSettings | None = None,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    **overrides: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw SpecAugment masks -> (time_mask [B, T] bool, freq_mask [B, F] bool); True = masked.

    lengths: [B] valid frames per sample (None = all `frames`); time masks lie inside
    [0, lengths[b]). The entry (b, t, f) of the features is masked when
    `time_mask[b, t] | freq_mask[b, f]` and t < lengths[b] (`spec_augment` applies that).
    settings: the masks (None = the paper's); keywords named like its fields (freq_masks=...)
    override them. generator: random source; its device is where the uniforms are drawn.
    """
    check_int("batch", batch, minimum=0)
    check_int("frames", frames, minimum=0)
    check_int("bands", bands)
    s = MaskSettings.resolve(settings, overrides)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator or None, got {type(generator).__name__}"
        )
    if lengths is None:
        lengths = torch.full((batch,), frames, dtype=torch.int64, device=device)
    else:
        check_tensor("lengths", lengths, ndims=(1,))
        check_lengths("lengths", lengths, batch, frames)
        target = lengths.device if device is None else device
        lengths = lengths.to(device=target, dtype=torch.int64)
    dev = lengths.device

    # frequency masks: the same width limit for every sample
    f_limit = min(s.freq_width, bands)
    f_upper = torch.full((batch, s.freq_masks), f_limit, dtype=torch.int64, device=dev)
    f_width = _uniform_ints(f_upper, generator)  # [B, Mf]
    f_start = _uniform_ints(bands - f_width, generator)  # in {0, ..., F - w}
    freq_mask = _band_mask(f_start, f_width, bands)

    # time masks: width <= min(time_width, floor(ratio * L)), start in {0, ..., L - w}
    ratio_cap = torch.floor(lengths.to(torch.float64) * s.time_ratio).to(torch.int64)
    t_upper = torch.clamp(ratio_cap, max=s.time_width)[:, None].expand(batch, s.time_masks)
    t_width = _uniform_ints(t_upper, generator)  # [B, Mt]
    t_start = _uniform_ints(lengths[:, None] - t_width, generator)
    time_mask = _band_mask(t_start, t_width, frames)
    return time_mask, freq_mask


def spec_augment(
    features: torch.Tensor,
    lengths: torch.Tensor | None = None,
    settings: MaskSettings | None = None,
    *,
    generator: torch.Generator | None = None,
    **overrides: Any,
) -> torch.Tensor:
    """SpecAugment (no time warping): features [B, T, F] or [T, F] -> same shape, a new tensor.

    lengths: [B] valid frames (None = all T; for [T, F] input a [1] tensor or None).
    settings: the masks and the masked value (None = the paper's: 2 frequency masks of at most
    30 bands, 10 time masks of at most min(50, floor(0.1 * length)) frames, value 0); keywords
    named like its fields (freq_width=10, value=-1.5, ...) override them. Masked entries become
    `value`; padding is untouched. Differentiable w.r.t. features (masked entries get zero
    gradient). No host syncs.
    """
    check_tensor("features", features, ndims=(2, 3), floating=True)
    s = MaskSettings.resolve(settings, overrides)
    batched = features.dim() == 3
    x = features if batched else features[None]
    batch, frames, bands = x.shape
    time_mask, freq_mask = spec_augment_masks(
        batch, frames, bands, lengths, s, generator=generator, device=x.device
    )
    masked = time_mask[:, :, None] | freq_mask[:, None, :]  # [B, T, F]
    if lengths is not None:
        valid = torch.arange(frames, device=x.device) < lengths.to(x.device)[:, None]
        masked = masked & valid[:, :, None]
    out = torch.where(masked, torch.as_tensor(s.value, dtype=x.dtype, device=x.device), x)
    return out if batched else out[0]


class SpecAugment(nn.Module):
    """`spec_augment` as a module, active only in training mode (identity in eval mode).

    SpecAugment(settings=None, **overrides): the masks as for `spec_augment`.
    forward(features [B, T, F] or [T, F], lengths [B] | None, *, generator) -> same shape.
    In eval mode the input tensor itself is returned.
    """

    def __init__(self, settings: MaskSettings | None = None, **overrides: Any) -> None:
        super().__init__()
        self.settings = MaskSettings.resolve(settings, overrides)

    def forward(
        self,
        features: torch.Tensor,
        lengths: torch.Tensor | None = None,
        *,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        if not self.training:
            return features
        return spec_augment(features, lengths, self.settings, generator=generator)

    def extra_repr(self) -> str:
        shown = [f.name for f in fields(MaskSettings) if f.name != "value"]
        return ", ".join(f"{name}={getattr(self.settings, name)}" for name in shown)
