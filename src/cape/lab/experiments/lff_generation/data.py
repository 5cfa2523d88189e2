"""The LFF image-generation study's data: rendered characters as flattened intensity sequences."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from cape.lab.experiments.lff_generation.config import DataConfig, GenerationConfig
from cape.lab.experiments.lff_generation.model import flatten_images
from cape.lab.experiments.vision.config import DataConfig as ImageDataConfig
from cape.lab.experiments.vision.data import VisionData

__all__ = ["SequenceDataset", "GenerationData", "make_data"]


class SequenceDataset(Dataset):
    """Items: one image's intensities, uint8 [L]; the default collate makes [B, L]."""

    def __init__(self, seqs: torch.Tensor) -> None:
        self.seqs = seqs

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.seqs[i]


class GenerationData:
    """The train and val ("held-out") images of `cfg` as flattened uint8 sequences [N, S*S*3].

    Rendered once by `cape.lab.data.make_split` (cached on disk in `cfg.root`, rank 0 first under
    torchrun, through the vision experiment's `VisionData`), flattened with `flatten_images`.
    """

    def __init__(self, cfg: DataConfig) -> None:
        self.cfg = cfg
        self._images = VisionData(
            ImageDataConfig(
                root=cfg.root,
                train=cfg.train,
                val=cfg.val,
                test=0,
                seed=cfg.seed,
                workers=cfg.workers,
                transform="rgb",
            )
        )
        self._memo: dict[str, torch.Tensor] = {}

    def sequences(self, split: str) -> torch.Tensor:
        """uint8 [N, S*S*3] of split "train" or "val"."""
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        if split not in self._memo:
            images, _ = self._images.arrays(split, self.cfg.size)
            self._memo[split] = flatten_images(torch.from_numpy(images))
        return self._memo[split]

    def dataset(self, split: str) -> SequenceDataset:
        return SequenceDataset(self.sequences(split))


def make_data(cfg: GenerationConfig) -> GenerationData:
    """The images the config names (rendered and cached on first use)."""
    return GenerationData(cfg.data)
