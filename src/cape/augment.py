"""Step 2 of the data flow: augmentations of positions, one family with one contract.

`PositionAugmentation` is the contract every augmentation keeps (`cape.Augmentation`, CAPE's,
and those of `cape.position_sampling`: randomized positions, PoSE, random float sampling): a
pure function positions [B, T, M] -> [B, T, M] float32, identity in eval mode (apart from a
normalising one), random draws on the positions' device from an optional generator, padding
kept at 0, the draws of a token never reading later tokens' content, and `pair` for
encoder-decoder models.

CAPE's augmentation (CAPE sec. 4) applies, in the paper's order: i) mean-normalisation over real
tokens, ii) global shift Delta ~ U(-Dmax, Dmax) per sample and axis, iii) local shift
eps ~ U(-emax, emax) per token and axis, iv) global scaling lambda with
log lambda ~ U(-log Lmax, log Lmax) per sample, shared by the axes:
``p' = (p - mean(p) + Delta + eps) * lambda``. In eval mode only the normalisation applies.

Random numbers are drawn on the positions' device (from `generator` if given) in a fixed order:
global shift `[B, M]`, scale `[B]`, local shift `[T, B, M]`. The local draw is token-major so
that, on a generator that fills tensors sequentially (the CPU one), extra padding appended at
the end of a batch leaves the draws of the real tokens unchanged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from . import _augment_core as core
from ._augment_core import Amount
from ._checks import check_bool, check_finite, check_float, check_generator, check_limit

__all__ = [
    "PositionAugmentation",
    "Augmentation",
    "check_augmentation",
    "AUGMENTATION_FIELDS",
    "mean_normalize",
    "augment_positions",
    "augment_pair",
]


class PositionAugmentation:
    """The contract of every augmentation of positions (`cape.Augmentation` and the classes of
    `cape.position_sampling`), validated once at construction.

    Calling it: positions [B, T, M] float, mask [B, T] bool (True at real tokens) or None ->
    [B, T, M] float32 with 0 at padding. In eval mode (`training=False`) it is the identity,
    unless `normalize` (mean-normalisation reads every position of the call, in eval too).
    Random draws happen on the positions' device, from `generator` when given (reproducible),
    and the draws of a token depend on shapes and on which tokens are real, never on later
    tokens' content (causal models may use it when `normalize` is False).

    random: whether training draws anything (`draws(training)`: whether a call in that mode
    does). normalize: whether a call reads every position of
    the call (a causal model and a key/value cache cannot allow that). axes: the M it takes
    (None: any; 1 for the samplers of 1-D sequences). `reach(extent)`: an upper
    bound of |augmented position| when every |input position| <= extent (what phase checks
    read). `pair`: source and target of an encoder-decoder model. `as_mapping()`: the JSON form
    `{"kind": ..., **fields}` that `cape.build(..., augmentation=...)` and config files take.
    """

    kind: ClassVar[str] = ""
    axes: ClassVar[int | None] = None

    @property
    def random(self) -> bool:
        raise NotImplementedError

    @property
    def normalize(self) -> bool:
        return False

    def draws(self, training: bool) -> bool:
        """Whether a call in this mode draws random positions: `random` in training only (an
        augmentation that also samples at evaluation says so here)."""
        return training and self.random

    def reach(self, extent: float) -> float:
        raise NotImplementedError

    def __call__(
        self,
        positions: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        training: bool = True,
        generator: torch.Generator | None = None,
        name: str = "positions",
    ) -> torch.Tensor:
        raise NotImplementedError

    def pair(
        self,
        source: torch.Tensor,
        target: torch.Tensor,
        source_mask: torch.Tensor | None = None,
        target_mask: torch.Tensor | None = None,
        *,
        alpha: float = 1.0,
        training: bool = True,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """source [B, S, M], target [B, T, M] -> both augmented, float32. This default (every
        method without a synchronisation of its own): the source is scaled by `alpha` (target
        / source tokens of the corpus), then each side is augmented with its own draws, the
        source's first."""
        src, tgt = _check_pair(source, target, source_mask, target_mask, alpha)
        check_bool("training", training)
        check_generator("generator", generator)
        kw: dict[str, Any] = dict(training=training, generator=generator)
        return self(src, source_mask, name="source", **kw), self(
            tgt, target_mask, name="target", **kw
        )

    def as_mapping(self) -> dict[str, Any]:
        """{"kind": ..., field: value ...}: the form config files and `cape.build` take."""
        fields = dataclasses.asdict(self) if dataclasses.is_dataclass(self) else {}  # type: ignore[arg-type]
        return {"kind": self.kind, **fields}

    def _checked(
        self,
        positions: torch.Tensor,
        mask: torch.Tensor | None,
        training: bool,
        generator: torch.Generator | None,
        name: str,
    ) -> torch.Tensor:
        """The checks every call makes -> positions as float32 [B, T, M]."""
        core.check_positions(positions, mask, name=name)
        check_bool("training", training)
        check_generator("generator", generator)
        if generator is not None:
            core.check_generator_device(generator, positions)
        return positions.to(torch.float32)


def _check_pair(
    source: torch.Tensor,
    target: torch.Tensor,
    source_mask: torch.Tensor | None,
    target_mask: torch.Tensor | None,
    alpha: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The checks of a pair -> (source x alpha, target), float32."""
    check_limit("alpha", check_float("alpha", alpha, strict=True))
    core.check_positions(source, source_mask, "source", "source_mask")
    core.check_positions(target, target_mask, "target", "target_mask")
    if source.shape[0] != target.shape[0] or source.shape[-1] != target.shape[-1]:
        raise ValueError(
            f"source {tuple(source.shape)} and target {tuple(target.shape)} must share B and M"
        )
    src = source.to(torch.float32) * alpha
    check_finite("source", src, source_mask, what=" once scaled by alpha")
    return src, target.to(torch.float32)


@dataclass(frozen=True)
class Augmentation(PositionAugmentation):
    """CAPE's augmentation settings, validated once.

    max_global_shift: Dmax, a float or one per axis (tokens, seconds or image units).
    max_local_shift: emax, a float or one per axis; <= half the spacing keeps the order.
    max_global_scaling: Lmax >= 1 (1 = no scaling).
    normalize: subtract the mean position of each sample's real tokens (train and eval).

    Its `kind` in the mapping form (`as_mapping()`) is "cape"; `pair` is synchronised.
    """

    kind: ClassVar[str] = "cape"

    max_global_shift: float | tuple[float, ...] = 0.0
    max_local_shift: float | tuple[float, ...] = 0.0
    max_global_scaling: float = 1.0
    normalize: bool = False  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if isinstance(self.max_local_shift, str) and self.max_local_shift == "auto":
            raise TypeError(
                "max_local_shift='auto' (emax = extent/N per axis of the grid being encoded) is "
                "not an Augmentation value: it is CAPE2d's option "
                "CAPE2d(dim, augmentation=..., auto_local_shift=True), or 'auto' among "
                "cape.build('cape2d', ...)'s fields"
            )
        object.__setattr__(
            self, "max_global_shift", core.check_amount("max_global_shift", self.max_global_shift)
        )
        object.__setattr__(
            self, "max_local_shift", core.check_amount("max_local_shift", self.max_local_shift)
        )
        object.__setattr__(self, "max_global_scaling", core.check_scaling(self.max_global_scaling))
        if not isinstance(self.normalize, bool):
            raise TypeError(f"normalize must be a bool, got {self.normalize!r}")

    @property
    def random(self) -> bool:
        """True when training draws anything at all."""
        return (
            core.nonzero(self.max_global_shift)
            or core.nonzero(self.max_local_shift)
            or (self.max_global_scaling > 1.0)
        )

    def reach(self, extent: float) -> float:
        """(extent + Dmax + emax) x Lmax (the largest amount of each, over the axes)."""
        shift, local = (
            max(v) if isinstance(v, tuple) else v
            for v in (self.max_global_shift, self.max_local_shift)
        )
        return (float(extent) + shift + local) * self.max_global_scaling

    def __call__(
        self,
        positions: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        training: bool = True,
        generator: torch.Generator | None = None,
        name: str = "positions",
    ) -> torch.Tensor:
        return augment_positions(
            positions,
            mask,
            max_global_shift=self.max_global_shift,
            max_local_shift=self.max_local_shift,
            max_global_scaling=self.max_global_scaling,
            normalize=self.normalize,
            training=training,
            generator=generator,
            name=name,
        )

    def pair(
        self,
        source: torch.Tensor,
        target: torch.Tensor,
        source_mask: torch.Tensor | None = None,
        target_mask: torch.Tensor | None = None,
        *,
        alpha: float = 1.0,
        training: bool = True,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`augment_pair` with these settings: synchronised, one global shift and scale per
        sample for both sides, independent local shifts (mean-normalisation is the caller's)."""
        return augment_pair(
            source,
            target,
            source_mask,
            target_mask,
            alpha=alpha,
            max_global_shift=self.max_global_shift,
            max_local_shift=self.max_local_shift,
            max_global_scaling=self.max_global_scaling,
            training=training,
            generator=generator,
        )


# the fields, as keywords of `cape.build` and keys of config files (`cape.PRESETS` too)
AUGMENTATION_FIELDS = ("max_global_shift", "max_local_shift", "max_global_scaling", "normalize")


def check_augmentation(
    value: object, name: str = "augmentation", pos_dim: int | None = None
) -> PositionAugmentation | None:
    """The one check of an encoding's `augmentation=` argument: an augmentation (a
    `cape.PositionAugmentation`: `cape.Augmentation`, `cape.RandomizedPositions`, `cape.PoSE`,
    `cape.RandomFloatPositions`) or None, returned as it is. Anything else (a mapping included:
    that is the form of `cape.build` and config files) raises TypeError naming `name`; one that
    takes another number of coordinates (`axes`) than the encoding's `pos_dim` ValueError."""
    if isinstance(value, PositionAugmentation):
        axes = value.axes
        if pos_dim is not None and axes is not None and axes != pos_dim:
            raise ValueError(
                f"{name}: {type(value).__name__} takes {axes}-D positions; this encoding reads "
                f"{pos_dim}-D ones"
            )
        return value
    if value is None:
        return value
    raise TypeError(
        f"{name} must be a cape.Augmentation or None, or another cape augmentation "
        f"(cape.RandomizedPositions, cape.PoSE, cape.RandomFloatPositions), got {value!r}"
    )


def mean_normalize(positions: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Subtract each sample's mean over real tokens. positions: [B, T, M] floating point,
    mask: [B, T] bool -> [B, T, M] in positions' dtype (integer positions: convert them first,
    e.g. with `cape.as_positions`)."""
    core.check_positions(positions, mask)
    out = core.mean_normalize(positions, mask)
    check_finite("positions", out, mask, what=" once mean-normalised (|p - mean| overflows)")
    return out


def augment_positions(
    positions: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    max_global_shift: Amount = 0.0,
    max_local_shift: Amount = 0.0,
    max_global_scaling: float = 1.0,
    normalize: bool = False,
    training: bool = True,
    generator: torch.Generator | None = None,
    name: str = "positions",
) -> torch.Tensor:
    """CAPE augmentation. positions: [B, T, M] float, mask: [B, T] bool -> [B, T, M] float32.

    Amounts are floats, one float per axis, or tensors broadcastable to `[B, M]` (per sample,
    e.g. emax = 1/N for images of different grids in one batch). Padded tokens are ignored by
    the mean and set to 0 in the output. In eval mode (`training=False`) only `normalize` acts.
    name: what errors call the positions (a caller's argument, e.g. "q_positions").
    """
    core.check_positions(positions, mask, name=name)
    check_bool("normalize", normalize)
    check_bool("training", training)
    check_generator("generator", generator)
    pos = positions.to(torch.float32)
    # the options are checked in eval mode too, where they draw nothing
    dmax = core.amount("max_global_shift", max_global_shift, pos)
    emax = core.amount("max_local_shift", max_local_shift, pos)
    lmax = core.check_scaling(max_global_scaling)
    if normalize:
        pos = mean_normalize(pos, mask)
    if not training:
        return core.zero_padding(pos, mask)
    core.check_reach(name, pos, mask, (dmax, emax), lmax)
    shift, scale = core.global_draws(pos, dmax, lmax, generator)
    local = core.local_draw(pos, emax, generator)
    return core.apply(pos, mask, shift, local, scale)


def augment_pair(
    source: torch.Tensor,
    target: torch.Tensor,
    source_mask: torch.Tensor | None = None,
    target_mask: torch.Tensor | None = None,
    *,
    alpha: float = 1.0,
    max_global_shift: Amount = 0.0,
    max_local_shift: Amount = 0.0,
    max_global_scaling: float = 1.0,
    training: bool = True,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Synchronised augmentation for encoder-decoder pairs (CAPE sec. 5.3, appendix D.1).

    source: [B, S, M], target: [B, T, M]. Source positions are scaled by `alpha` (target/source
    token ratio of the training corpus) so both sides span about the same interval; no
    mean-normalisation (both start aligned at the first position); the same global shift and
    scale for the source and target of a sample; independent local shifts.
    """
    src, tgt = _check_pair(source, target, source_mask, target_mask, alpha)
    check_bool("training", training)
    check_generator("generator", generator)
    dmax = core.amount("max_global_shift", max_global_shift, src)
    emax = core.amount("max_local_shift", max_local_shift, src)
    lmax = core.check_scaling(max_global_scaling)
    if not training:
        return core.zero_padding(src, source_mask), core.zero_padding(tgt, target_mask)
    core.check_reach("source", src, source_mask, (dmax, emax), lmax)
    core.check_reach("target", tgt, target_mask, (dmax, emax), lmax)
    shift, scale = core.global_draws(src, dmax, lmax, generator)
    src_local = core.local_draw(src, emax, generator)
    tgt_local = core.local_draw(tgt, emax, generator)
    return (
        core.apply(src, source_mask, shift, src_local, scale),
        core.apply(tgt, target_mask, shift, tgt_local, scale),
    )
