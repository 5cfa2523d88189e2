"""`ResumableSampler`: the training data order, a function of (seed, epoch, rank) whose position
within an epoch is saved in checkpoints, so a resumed run reads the very batches it would have."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Sampler

__all__ = ["ResumableSampler", "ResumableBatchSampler"]


class _EpochPosition:
    """The saved position of a resumable sampler: the epoch and how much of this rank's share
    of it was consumed (`advance`), as `state_dict` / `load_state_dict` write and read it."""

    epoch: int
    index: int

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch` from its beginning."""
        self.epoch, self.index = epoch, 0

    def advance(self, n: int) -> None:
        """Mark `n` more of this rank's items (samples or batches) as consumed."""
        self.index += n

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])


class ResumableSampler(_EpochPosition, Sampler[int]):
    """Shuffled, rank-sharded indices whose position can be saved and restored mid-epoch.

    Epoch e's order is `randperm(size)` from a generator seeded with seed + e, padded by
    wrapping to a multiple of `num_replicas` and split as `perm[rank::num_replicas]` (as
    DistributedSampler). `index` counts this rank's samples already consumed this epoch; the
    consumer calls `advance(n)`, so prefetching workers do not skew the saved position.
    """

    def __init__(
        self,
        size: int,
        *,
        num_replicas: int = 1,
        rank: int = 0,
        seed: int = 0,
        shuffle: bool = True,
    ) -> None:
        if size < 1:
            raise ValueError(f"ResumableSampler needs a non-empty dataset, got size={size}")
        self.size, self.num_replicas, self.rank = size, num_replicas, rank
        self.seed, self.shuffle = seed, shuffle
        self.epoch = 0
        self.index = 0

    def shard(self) -> list[int]:
        """This rank's indices for the current epoch, [ceil(size / num_replicas)]."""
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            perm = torch.randperm(self.size, generator=g).tolist()
        else:
            perm = list(range(self.size))
        total = math.ceil(self.size / self.num_replicas) * self.num_replicas
        perm = (perm * math.ceil(total / self.size))[:total]
        return perm[self.rank :: self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        return iter(self.shard()[self.index :])

    def __len__(self) -> int:
        return math.ceil(self.size / self.num_replicas) - self.index


class ResumableBatchSampler(_EpochPosition, Sampler[list[int]]):
    """Epoch-wise batches of another batch sampler, resumable mid-epoch (`Trainer(batches=)`).

    `batches` has `all_batches(epoch) -> list[list[int]]` (every rank's batches of that epoch,
    a function of its seed and the epoch), `rank` and `world_size`, as
    `cape.lab.data.DurationBatchSampler`. This rank gets `all_batches(epoch)[rank::world_size]`;
    `index` counts the batches it consumed this epoch (`advance(1)` per batch).
    """

    def __init__(self, batches: Any) -> None:
        for name in ("all_batches", "rank", "world_size"):
            if not hasattr(batches, name):
                raise TypeError(
                    f"batches must have {name!r} (as DurationBatchSampler), "
                    f"got {type(batches).__name__}"
                )
        self.batches = batches
        self.epoch = 0
        self.index = 0

    def shard(self) -> list[list[int]]:
        """This rank's batches of the current epoch."""
        every = self.batches.all_batches(self.epoch)
        return every[self.batches.rank :: self.batches.world_size]

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.shard()[self.index :])

    def __len__(self) -> int:
        return len(self.shard()) - self.index
