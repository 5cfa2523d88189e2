"""Augmentations that sample the positions of a training sequence (CAPE's successors), each a
`cape.PositionAugmentation` like `cape.Augmentation`: identity in eval mode (unless asked:
randomized positions may sample at evaluation too, as their authors' models do), draws on the
positions' device from an optional generator, padding kept at 0, the draws of a token reading
only shapes and which tokens are real (never later tokens' content), so causal models take them.

- `RandomizedPositions` (Ruoss et al., ACL 2023, sec. 3): the T real positions of a training
  sequence become an ordered random subset of {0, ..., N - 1}, uniform over the subsets, N the
  longest length the model will be tested on.
- `PoSE` (Zhu et al., ICLR 2024, sec. 3.2): the window's real tokens are cut into chunks, chunk i
  shifted by a skipping bias u_i, u_0 = 0 <= u_1 <= ... <= L_t - L_c, so that over draws the
  relative distances of the whole target window [0, L_t) are met while training at L_c.
- `RandomFloatPositions` (Shimizu et al., Findings of EACL 2026, as summaries of it state the
  rule): the T real positions are T sorted draws of U[0, 1) times the training length L:
  continuous random positions, random spacings, within the training range.

They are 1-D (M = 1): token indices, or seconds with `spacing` the step between frames (the
lengths count tokens or frames; positions come out in the positions' units). `AUGMENTATION_KINDS`
maps the "kind" of a mapping (`{"kind": "randomized", "max_length": 4096}`, the form config
files and `cape.build` take) to its class; `augmentation_from_mapping` makes one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar

import torch

from . import _augment_core as core
from ._checks import (
    LIMIT,
    _may_inspect_values,
    check_bool,
    check_float,
    check_int,
    check_limit,
    max_abs,
)
from .augment import AUGMENTATION_FIELDS, Augmentation, PositionAugmentation

__all__ = [
    "RandomizedPositions",
    "PoSE",
    "RandomFloatPositions",
    "AUGMENTATION_KINDS",
    "augmentation_from_mapping",
]


def _check_spacing(value: object) -> float:
    return check_limit("spacing", check_float("spacing", value, strict=True))


def _one_axis(cls: str, pos: torch.Tensor, name: str) -> None:
    if pos.shape[-1] != 1:  # named as the augmentation too: an encoding may have made them
        raise ValueError(
            f"augmentation: {cls} samples 1-D positions (M = 1: tokens or seconds), got "
            f"{name} of shape {tuple(pos.shape)}"
        )


def _fits(cls: str, option: str, value: int, pos: torch.Tensor, name: str) -> None:
    """A training sequence of T tokens must fit the option's length (the shape is read, not the
    mask: no value of the device is read)."""
    if pos.shape[1] > value:
        raise ValueError(
            f"{name}: {cls} places T = {pos.shape[1]} tokens within {option} = {value}; give "
            f"{option} >= the training length"
        )


def _keys_dtype(pos: torch.Tensor) -> torch.dtype:
    """float64 keys where the device has them: 2^53 values make ties among N keys negligible."""
    return torch.float32 if pos.device.type == "mps" else torch.float64


def _valid(mask: torch.Tensor | None, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(n [B, 1] real tokens per sample, rank [B, T] of each token among its sample's real ones,
    0 at padding), int64."""
    batch, length = pos.shape[:2]
    if mask is None:
        rank = torch.arange(length, device=pos.device).expand(batch, length)
        return torch.full((batch, 1), length, device=pos.device), rank
    rank = (mask.long().cumsum(dim=1) - 1).clamp_min(0)
    return mask.long().sum(dim=1, keepdim=True), rank


def _by_rank(sorted_values: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
    """The k-th value [B, T] of each sample given to its k-th real token -> [B, T, 1]."""
    return sorted_values.gather(1, rank)[..., None]


@dataclass(frozen=True)
class RandomizedPositions(PositionAugmentation):
    """Randomized positional encodings (Ruoss et al., ACL 2023): in training, the T real
    positions of each sequence are replaced by an ordered random subset of {0, ..., N - 1}
    (`kind` "randomized"): sorted, distinct, every subset of T of the N equally likely (the T
    smallest of N i.i.d. keys, float64 where the device has it); identity in eval mode unless
    `sample_at_eval`.

    max_length: N, the longest length the model will be tested on (>= every training T).
    spacing: the step between two positions in the positions' units (1 for token indices, the
    hop in seconds for frames): the subset is spacing x {k}, so seconds stay seconds.
    sample_at_eval: draw a subset at every call, in eval mode too, as the authors' models do
    (their reference code samples at evaluation, `noisy_fixed_positional_encodings`); False
    keeps cape's contract, eval the identity (0..T-1 is itself one of the subsets). A model
    that samples at evaluation has no key/value cache (a key's position changes with T).
    Draws: N keys per sample [B, N], whatever T (appended padding changes nothing). `pair`:
    each side draws its own subset.
    """

    kind: ClassVar[str] = "randomized"
    axes: ClassVar[int | None] = 1

    max_length: int
    spacing: float = 1.0
    sample_at_eval: bool = False

    def __post_init__(self) -> None:
        check_int("max_length", self.max_length)
        object.__setattr__(self, "spacing", _check_spacing(self.spacing))
        check_limit("max_length", self.spacing * self.max_length, " x spacing")
        check_bool("sample_at_eval", self.sample_at_eval)

    @property
    def random(self) -> bool:
        return True

    def draws(self, training: bool) -> bool:
        return training or self.sample_at_eval

    def reach(self, extent: float) -> float:
        """Eval: the positions as given; training: at most spacing x (N - 1)."""
        return max(float(extent), self.spacing * (self.max_length - 1))

    def __call__(
        self,
        positions: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        training: bool = True,
        generator: torch.Generator | None = None,
        name: str = "positions",
    ) -> torch.Tensor:
        """positions: [B, T, 1] float, mask: [B, T] bool -> [B, T, 1] float32, 0 at padding."""
        pos = self._checked(positions, mask, training, generator, name)
        _one_axis("RandomizedPositions", pos, name)
        if not self.draws(training):
            return core.zero_padding(pos, mask)
        _fits("RandomizedPositions", "max_length", self.max_length, pos, name)
        batch, length = pos.shape[:2]
        n, rank = _valid(mask, pos)
        keys = core.rand((batch, self.max_length), generator, pos, _keys_dtype(pos))
        chosen = keys.topk(length, dim=1, largest=False).indices  # by key: the first n are a
        # uniform subset of size n (exchangeable keys); the rest become N and sort last
        first = torch.arange(length, device=pos.device) < n
        chosen = torch.where(first, chosen, self.max_length).sort(dim=1).values
        out = _by_rank(chosen, rank).to(torch.float32) * self.spacing
        return core.zero_padding(out, mask)


@dataclass(frozen=True)
class PoSE(PositionAugmentation):
    """Positional skip-wise training (Zhu et al., ICLR 2024, sec. 3.2; `kind` "pose"): in
    training the n real tokens of a window (L_c = n) are cut into `chunks` chunks and the
    positions of chunk i move by spacing x u_i: u_0 = 0 and u_i uniform on {u_(i-1), ...,
    L_t - n} (integers), so positions stay below L_t and, over draws, the relative distances
    cover [0, L_t); identity in eval mode (the paper evaluates with plain positions).

    target_length: L_t, the window to reach (>= every training T). chunks: N >= 2 (the paper's
    default 2). spacing: the step of one token in the positions' units (1 for indices).
    Chunk lengths: the N - 1 cuts a uniform random subset of the n - 1 gaps between real tokens
    (every split into non-empty chunks equally likely; fewer real tokens than chunks leave the
    last chunks empty). The authors' released code draws, for N = 2, the first chunk's length
    from {1, ..., ceil(n / 2)} instead. Only positions move: which text fills each chunk (the
    paper's v_i) is the data pipeline's. Draws: biases [N - 1, B], then cut keys [T, B]
    (token-major: appended padding changes nothing). `pair`: each side draws its own.
    """

    kind: ClassVar[str] = "pose"
    axes: ClassVar[int | None] = 1

    target_length: int
    chunks: int = 2
    spacing: float = 1.0

    def __post_init__(self) -> None:
        check_int("target_length", self.target_length)
        check_int("chunks", self.chunks, minimum=2)
        object.__setattr__(self, "spacing", _check_spacing(self.spacing))
        check_limit("target_length", self.spacing * self.target_length, " x spacing")

    @property
    def random(self) -> bool:
        return True

    def reach(self, extent: float) -> float:
        """|p| + spacing x (L_t - 1) at most (the largest skip)."""
        return float(extent) + self.spacing * (self.target_length - 1)

    def __call__(
        self,
        positions: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        training: bool = True,
        generator: torch.Generator | None = None,
        name: str = "positions",
    ) -> torch.Tensor:
        """positions: [B, T, 1] float, mask: [B, T] bool -> [B, T, 1] float32, 0 at padding."""
        pos = self._checked(positions, mask, training, generator, name)
        _one_axis("PoSE", pos, name)
        if not training:
            return core.zero_padding(pos, mask)
        _fits("PoSE", "target_length", self.target_length, pos, name)
        if _may_inspect_values(pos) and pos.numel():  # p + the largest skip, in float32
            reach = self.reach(float(max_abs(pos, mask).max()))
            if reach > LIMIT:
                raise ValueError(f"{name}: PoSE's skips could reach {reach:.3g} > {LIMIT:.0e}")
        n, rank = _valid(mask, pos)
        skips = self._skips(n, pos, generator)  # [B, N]
        chunk = (rank[..., None] >= self._cuts(n, pos, generator)[:, None, :]).sum(dim=-1)
        out = pos + skips.gather(1, chunk)[..., None].to(torch.float32) * self.spacing
        return core.zero_padding(out, mask)

    def _skips(
        self, n: torch.Tensor, pos: torch.Tensor, generator: torch.Generator | None
    ) -> torch.Tensor:
        """u [B, N] int64: u_0 = 0, u_i uniform on {u_(i-1), ..., L_t - n}."""
        dtype = _keys_dtype(pos)
        draws = core.rand((self.chunks - 1, pos.shape[0]), generator, pos, dtype)
        room = (self.target_length - n[:, 0]).to(dtype)  # L_t - n >= 0 (T <= L_t)
        u = [torch.zeros_like(room)]
        for i in range(self.chunks - 1):
            step = torch.floor(draws[i] * (room - u[-1] + 1.0))  # in {0, ..., room - u}
            u.append(torch.minimum(u[-1] + step, room))
        return torch.stack(u, dim=1).long()

    def _cuts(
        self, n: torch.Tensor, pos: torch.Tensor, generator: torch.Generator | None
    ) -> torch.Tensor:
        """The N - 1 cuts [B, N - 1] int64, sorted: a chunk starts at each (ranks 1..n-1),
        n where the sample has too few real tokens (an empty last chunk)."""
        batch, length = pos.shape[:2]
        keys = core.rand((length, batch), generator, pos, _keys_dtype(pos)).t()  # [B, T]
        gap = torch.arange(length, device=pos.device)  # candidate cut before rank r (r >= 1)
        usable = (gap >= 1) & (gap < n)
        keys = torch.where(usable, keys, math.inf)
        k = min(self.chunks - 1, length)
        picked = keys.topk(k, dim=1, largest=False)
        cuts = torch.where(torch.isfinite(picked.values), picked.indices, n)
        if k < self.chunks - 1:  # T < N - 1: the missing cuts are at n (empty chunks)
            cuts = torch.cat([cuts, n.expand(batch, self.chunks - 1 - k)], dim=1)
        return cuts.sort(dim=1).values


@dataclass(frozen=True)
class RandomFloatPositions(PositionAugmentation):
    """Random float sampling (Shimizu et al., Findings of EACL 2026; `kind` "random-float"): in
    training the n real positions of a sequence are n sorted i.i.d. draws of U[0, 1), times
    `train_length` L: continuous positions in [0, L) with random spacings; identity in eval.

    train_length: L, the training length in the positions' units (tokens, or seconds).
    The sampling rule and the evaluation at the deterministic coordinates (2i - 1) /
    (2 max(L, n)) (i = 1..n) are as a published summary of the paper states them (arXiv
    2602.14050; the paper's own text could not be read here); the scale L is cape's choice,
    so that, times L, those coordinates are the token indices + 1/2 up to L tokens and
    position interpolation by n / L beyond.
    cape keeps eval the identity; with rotary, `scaling="pi", train_length=L` (no factor)
    interpolates beyond L as that rule does (the common 1/2 leaves rotary's relative angles
    unchanged). Draws: [T, B] (token-major: appended padding changes nothing). `pair`: each
    side draws its own.
    """

    kind: ClassVar[str] = "random-float"
    axes: ClassVar[int | None] = 1

    train_length: float

    def __post_init__(self) -> None:
        length = check_float("train_length", self.train_length, strict=True)
        object.__setattr__(self, "train_length", check_limit("train_length", length))

    @property
    def random(self) -> bool:
        return True

    def reach(self, extent: float) -> float:
        """Eval: the positions as given; training: below L."""
        return max(float(extent), self.train_length)

    def __call__(
        self,
        positions: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        training: bool = True,
        generator: torch.Generator | None = None,
        name: str = "positions",
    ) -> torch.Tensor:
        """positions: [B, T, 1] float, mask: [B, T] bool -> [B, T, 1] float32, 0 at padding."""
        pos = self._checked(positions, mask, training, generator, name)
        _one_axis("RandomFloatPositions", pos, name)
        if not training:
            return core.zero_padding(pos, mask)
        batch, length = pos.shape[:2]
        _, rank = _valid(mask, pos)
        draws = core.rand((length, batch), generator, pos).t()  # [B, T]
        if mask is not None:  # padding's draws sort after the real ones
            draws = torch.where(mask, draws, math.inf)
        out = _by_rank(draws.sort(dim=1).values, rank) * self.train_length
        return core.zero_padding(out, mask)


# "kind" of a mapping -> class (`cape.build`'s augmentation=, config files, CausalLM.spec)
AUGMENTATION_KINDS: dict[str, type[PositionAugmentation]] = {
    cls.kind: cls for cls in (Augmentation, RandomizedPositions, PoSE, RandomFloatPositions)
}


def augmentation_from_mapping(
    mapping: Mapping[str, Any], name: str = "augmentation"
) -> PositionAugmentation:
    """{"kind": one of `AUGMENTATION_KINDS`, field: value ...} -> that augmentation (its
    `as_mapping()` form); a mapping without "kind" holds CAPE's fields (`cape.Augmentation`).
    Unknown kinds or fields raise naming `name`."""
    values = dict(mapping)
    kind = values.pop("kind", "cape")
    if not isinstance(kind, str) or kind not in AUGMENTATION_KINDS:
        kinds = sorted(AUGMENTATION_KINDS)
        raise ValueError(f"{name}['kind'] must be one of {kinds}, got {kind!r}")
    cls = AUGMENTATION_KINDS[kind]
    allowed = AUGMENTATION_FIELDS if cls is Augmentation else tuple(f.name for f in fields(cls))
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise TypeError(
            f"unknown {name} field(s) {unknown} for kind {kind!r}; allowed: {list(allowed)}"
        )
    missing = [f.name for f in fields(cls) if f.name not in values and _required(f)]
    if missing:
        raise TypeError(f"{name} of kind {kind!r} needs {missing}")
    return cls(**values)


def _required(f: Any) -> bool:
    return f.default is MISSING and f.default_factory is MISSING
