"""A synthetic lookup task whose answer is a relative position: the token k places back.

Each sequence holds T tokens drawn uniformly and independently from V content symbols; the
target at position t is the token at t - k (`offset` k). Positions t < k have no target and are
not scored (`IGNORE`, the cross-entropy's ignore index), nor is padding. Training sequences have
lengths uniform in [min_len, max_len] (padded, with a mask); test sets have one fixed length each,
e.g. 1x, 2x, 4x and 8x the longest training sequence. Everything is drawn from a seed through
its own `torch.Generator` per split (`make_splits`), so a split does not change when the size of
another one does.

Without positions the task cannot be solved: a model blind to positions (permutation-equivariant)
sees only its own token and the multiset of the sequence, and the token k back is then a uniform
draw from the others; `position_blind_accuracy` is the best such a model can do, `chance_level`
(1 / V) the accuracy of a guess that reads nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

from cape._checks import check_int

__all__ = [
    "IGNORE",
    "LookupSet",
    "LookupDataset",
    "Splits",
    "lookup_targets",
    "make_set",
    "make_splits",
    "chance_level",
    "position_blind_accuracy",
]

IGNORE = -100  # torch.nn.functional.cross_entropy's default ignore_index


@dataclass(frozen=True)
class LookupSet:
    """N sequences: tokens [N, T] int64 in [0, V) (0 at padding), mask [N, T] bool (True at real
    tokens, a prefix of each row), targets [N, T] int64 (`IGNORE` where not scored); lengths [N]."""

    tokens: torch.Tensor
    mask: torch.Tensor
    targets: torch.Tensor

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def lengths(self) -> torch.Tensor:
        """[N] int64: real tokens per sequence."""
        return self.mask.sum(1)

    @property
    def scored(self) -> int:
        """The number of targets that count (not `IGNORE`)."""
        return int((self.targets != IGNORE).sum())


def lookup_targets(tokens: torch.Tensor, mask: torch.Tensor, offset: int) -> torch.Tensor:
    """tokens [N, T], mask [N, T] bool -> targets [N, T]: tokens[:, t - offset] where t >= offset
    and t is a real token, else `IGNORE`."""
    check_int("offset", offset)
    targets = torch.full_like(tokens, IGNORE)
    width = tokens.shape[1]
    if offset < width:
        targets[:, offset:] = tokens[:, : width - offset]
    return torch.where(mask, targets, IGNORE)


def make_set(
    n: int,
    min_len: int,
    max_len: int,
    *,
    vocab: int,
    offset: int,
    generator: torch.Generator,
) -> LookupSet:
    """N sequences with lengths uniform in [min_len, max_len] (min_len = max_len: one fixed
    length, no padding), padded to max_len; tokens uniform in [0, vocab)."""
    check_int("n", n)
    check_int("vocab", vocab, minimum=2)
    check_int("min_len", min_len, minimum=offset + 1)  # every sequence has a scored token
    check_int("max_len", max_len, minimum=min_len)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=generator)
    mask = torch.arange(max_len)[None] < lengths[:, None]  # [N, T]
    tokens = torch.randint(vocab, (n, max_len), generator=generator) * mask  # 0 at padding
    return LookupSet(tokens, mask, lookup_targets(tokens, mask, offset))


@dataclass(frozen=True)
class Splits:
    """train and val: lengths in [min_len, max_len]; test: one `LookupSet` per test length."""

    train: LookupSet
    val: LookupSet
    test: dict[int, LookupSet]


def _stream(seed: int, index: int) -> torch.Generator:
    """The generator of split `index`, independent of the sizes of the others. torch's CPU
    generator keeps only 32 bits of its seed (2^32 + 5 draws as 5 does): the pair (seed, index)
    is mixed into 32 bits by numpy's `SeedSequence`, made for this."""
    import numpy as np

    return torch.Generator().manual_seed(
        int(np.random.SeedSequence([seed, index]).generate_state(1)[0])
    )


def make_splits(
    train: int,
    val: int,
    test: int,
    test_lengths: Sequence[int],
    *,
    vocab: int = 16,
    offset: int = 3,
    min_len: int = 16,
    max_len: int = 32,
    seed: int = 0,
) -> Splits:
    """Training and validation sets at lengths [min_len, max_len] and `test` sequences at each
    of `test_lengths` (e.g. 32, 64, 128, 256: 1x to 8x max_len), all from `seed`."""
    check_int("seed", seed, minimum=0)
    common = dict(vocab=vocab, offset=offset)
    return Splits(
        train=make_set(train, min_len, max_len, **common, generator=_stream(seed, 0)),
        val=make_set(val, min_len, max_len, **common, generator=_stream(seed, 1)),
        test={
            length: make_set(test, length, length, **common, generator=_stream(seed, 2 + length))
            for length in test_lengths
        },
    )


class LookupDataset(Dataset):
    """A `LookupSet` for `cape.lab.train.Trainer`: items are indices, `collate(indices)` ->
    {"tokens": [B, T'], "mask": [B, T'], "targets": [B, T']}, T' the batch's longest sequence."""

    def __init__(self, data: LookupSet) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> int:
        return index

    def collate(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        idx = torch.as_tensor(list(indices), dtype=torch.long)
        width = int(self.data.lengths[idx].max()) if len(idx) else 0
        d = self.data
        return {
            "tokens": d.tokens[idx, :width],
            "mask": d.mask[idx, :width],
            "targets": d.targets[idx, :width],
        }


def chance_level(vocab: int) -> float:
    """1 / V: the accuracy of a guess that reads nothing (a fraction)."""
    return 1.0 / check_int("vocab", vocab, minimum=2)


def position_blind_accuracy(data: LookupSet, vocab: int) -> float:
    """The expected accuracy (a fraction) of the best position-blind guess on `data`.

    A permutation-equivariant model sees, at position t, its token and the multiset of the
    sequence; the token k back is then a uniform draw from the other tokens, so the best guess
    is their most frequent symbol, right with probability (its count) / (length - 1)."""
    check_int("vocab", vocab, minimum=2)
    onehot = torch.nn.functional.one_hot(data.tokens, vocab) * data.mask[..., None]  # [N, T, V]
    others = onehot.sum(1, keepdim=True) - onehot  # counts without the token itself
    hit = others.max(-1).values / (data.lengths[:, None] - 1).clamp_min(1)  # [N, T]
    scored = data.targets != IGNORE
    return float(hit[scored].double().mean()) if scored.any() else float("nan")
