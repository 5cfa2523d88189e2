"""The vision experiment's data module: train/val/test images at any size, rendered on the machine
(characters, or two-glyph scenes whose class is where things are: each size a true render of the
same samples) or from a user's image folder."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from cape.lab.data.images.datasets import ArrayImageDataset, ImageFolderDataset
from cape.lab.data.images.fonts import CHARSET
from cape.lab.data.images.relations import RELATIONS
from cape.lab.data.images.render import (
    TASKS,
    load_native_sizes,
    load_split,
    make_native_sizes,
    make_split,
)
from cape.lab.data.images.transforms import apply_transform
from cape.lab.experiments.vision.config import DataConfig
from cape.lab.train import distributed as D

__all__ = ["VisionData", "TransformedDataset", "resize_images", "to_tensors"]


def to_tensors(
    images: np.ndarray, labels: np.ndarray, transform: str = "rgb"
) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 [N, S, S, 3], labels [N] -> (float32 [N, 3, S, S] in [-1, 1], int64 [N])."""
    x, y = ArrayImageDataset(images, labels).tensors()
    return apply_transform(x, transform), y


class TransformedDataset(Dataset):
    """uint8 images whose transform runs per batch: items are (uint8 [S, S, 3], label) and
    `collate` (the DataLoader's collate_fn) makes (float32 [B, 3, S, S] in [-1, 1], int64 [B]).
    Batched, the transform costs a fraction of what it does image by image."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, transform: str) -> None:
        apply_transform(torch.zeros(3, 2, 2), transform)  # validate the name now
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return self.images[i], int(self.labels[i])

    def collate(self, items: list[tuple[np.ndarray, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        images = np.stack([im for im, _ in items])
        labels = np.asarray([y for _, y in items], dtype=np.int64)
        return to_tensors(images, labels, self.transform)


def resize_images(images: list[np.ndarray] | np.ndarray, size: int) -> np.ndarray:
    """Each uint8 [h, w, 3] resized to [size, size, 3] (Lanczos, as the folder loader)."""
    out = np.empty((len(images), size, size, 3), dtype=np.uint8)
    for i, im in enumerate(images):
        if im.shape[0] == size and im.shape[1] == size:
            out[i] = im
        else:
            out[i] = np.asarray(Image.fromarray(im).resize((size, size), Image.Resampling.LANCZOS))
    return out


def _main_rank_first(make: Callable[[], Path]) -> Path:
    """Run a cached, atomic `make` on rank 0 first (it renders), then on the other ranks (they
    only find the file it wrote): one render, every rank gets the path."""
    path = make() if D.is_main() else None
    D.barrier()
    return path or make()


class VisionData:
    """Splits by name ("train", "val", "test", "test_fonts") at any px size, cached in memory.

    For rendered characters, rank 0 renders (cached on disk, resumable) while the other ranks
    wait, then every rank reads the same files.
    """

    def __init__(self, cfg: DataConfig) -> None:
        self.cfg = cfg
        self.counts = {
            "train": cfg.train,
            "val": cfg.val,
            "test": cfg.test,
            "test_fonts": cfg.test_fonts,
        }
        self._memo: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}

    @property
    def rendered(self) -> bool:
        """Whether the images are rendered on the machine (a task of `TASKS`), not a folder."""
        return self.cfg.source in TASKS

    @property
    def num_classes(self) -> int:
        if self.cfg.source == "chars":
            return len(CHARSET)
        if self.cfg.source == "relations":
            return len(RELATIONS)
        return len(self._folder(None).classes)

    def count(self, split: str) -> int:
        """Images in `split`: the configured count, or for a folder the images it really holds."""
        if self.rendered or split == "test_fonts":
            return self.counts[split]
        return len(self._folder(split))

    @lru_cache(maxsize=4)  # noqa: B019  (one VisionData per experiment)
    def _folder(self, split: str | None) -> ImageFolderDataset:
        return ImageFolderDataset(self.cfg.source, None, split, self.cfg.fractions, self.cfg.seed)

    def arrays(self, split: str, size: int) -> tuple[np.ndarray, np.ndarray]:
        """(uint8 [N, size, size, 3], int64 labels [N]) of `split` at `size` px."""
        key = (split, size)
        if key not in self._memo:
            if split not in self.counts:
                raise ValueError(f"split must be one of {sorted(self.counts)}, got {split!r}")
            if self.rendered:
                c = self.cfg
                path = _main_rank_first(
                    lambda: make_split(
                        c.root,
                        split,
                        self.counts[split],
                        size,
                        c.seed,
                        workers=c.workers,
                        task=c.source,
                    )
                )
                images, labels, _ = load_split(path)
            else:
                if split == "test_fonts":
                    raise ValueError(
                        f"split 'test_fonts' needs rendered images (data.source one of {TASKS})"
                    )
                folder = self._folder(split)
                images = resize_images([folder.load(i) for i in range(len(folder))], size)
                labels = np.asarray([c for _, c in folder.samples], dtype=np.int64)
            self._memo[key] = (images, labels)
        return self._memo[key]

    def dataset(self, split: str, size: int) -> TransformedDataset:
        """A torch dataset of (float32 [3, size, size], label) items."""
        return TransformedDataset(*self.arrays(split, size), self.cfg.transform)

    def tensors(self, split: str, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(float32 [N, 3, size, size], int64 [N]) of a whole split, transformed."""
        return to_tensors(*self.arrays(split, size), self.cfg.transform)

    def native(self) -> tuple[list[np.ndarray], np.ndarray]:
        """Test images at their own native sizes (`data.native` of them; chars only)."""
        c = self.cfg
        if c.source != "chars" or c.native < 1:
            raise ValueError(
                "the native-size test set needs data.source='chars' and data.native > 0"
            )
        path = _main_rank_first(
            lambda: make_native_sizes(c.root, c.native, c.seed, workers=c.workers)
        )
        images, labels, _ = load_native_sizes(path)
        return images, labels
