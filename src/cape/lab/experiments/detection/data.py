"""The detection experiment's data: the scenes of every split (`make_data`), the images of a
batch at one size, the targets, and the training batches resized as DETR's augmentation."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from cape.lab.data.scenes import SHAPES, Scenes, make_scenes
from cape.lab.experiments.detection.config import DataConfig, DetectionConfig
from cape.lab.experiments.detection.matching import xyxy_to_cxcywh

__all__ = ["DetectionData", "SceneSet", "make_data", "as_images", "targets_of"]

Target = tuple[torch.Tensor, torch.Tensor]  # labels [n], boxes [n, 4] (cx, cy, w, h)


@dataclass
class DetectionData:
    """Every split's scenes (`train`, `val`, `test`) and the data config."""

    cfg: DataConfig
    train: Scenes
    val: Scenes
    test: Scenes

    classes = len(SHAPES)

    def split(self, name: str) -> Scenes:
        if name not in ("train", "val", "test"):
            raise ValueError(f"split must be one of ['train', 'val', 'test'], got {name!r}")
        return getattr(self, name)


def make_data(cfg: DetectionConfig) -> DetectionData:
    """The scenes of every split, rendered into `data.root` once and read from there."""
    d = cfg.data
    settings = d.scene_settings()
    made = {
        s: make_scenes(d.root, s, getattr(d, s), settings, d.seed) for s in ("train", "val", "test")
    }
    return DetectionData(d, **made)


def as_images(pixels: torch.Tensor | object, size: int) -> torch.Tensor:
    """uint8 [B, S0, S0, 3] -> float32 [B, 3, size, size] in [-1, 1], resized (bilinear,
    antialiased, as DETR's resize)."""
    x = torch.as_tensor(pixels).permute(0, 3, 1, 2).to(torch.float32) / 127.5 - 1.0
    if x.shape[-1] != size:
        x = F.interpolate(
            x, size=(size, size), mode="bilinear", antialias=True, align_corners=False
        )
    return x


def targets_of(scenes: Scenes, indices: list[int]) -> list[Target]:
    """The objects of the scenes `indices`: per scene (labels [n], boxes [n, 4] cx, cy, w, h)."""
    out = []
    for i in indices:
        boxes, labels = scenes.objects(i)
        out.append((torch.from_numpy(labels), xyxy_to_cxcywh(torch.from_numpy(boxes))))
    return out


class SceneSet(Dataset):
    """The training scenes as a dataset of indices: `collate` makes the batch {"index": [B],
    "targets": list of `Target`}; `images(index, size)` gives the batch's images at one size,
    from the whole split resized once per size (uint8, on first use): DETR's resize of each
    batch, without its cost at every step."""

    def __init__(self, scenes: Scenes) -> None:
        self.scenes = scenes
        self._at: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self.scenes)

    def __getitem__(self, i: int) -> int:
        return i

    def collate(self, indices: list[int]) -> dict[str, object]:
        return {"index": torch.tensor(indices), "targets": targets_of(self.scenes, indices)}

    def images(self, index: torch.Tensor, size: int) -> torch.Tensor:
        """float32 [B, 3, size, size] in [-1, 1] of the scenes `index` (as `as_images`, to the
        nearest of 256 levels)."""
        if size not in self._at:
            chunks = [
                ((as_images(self.scenes.images[i : i + 500], size) + 1.0) * 127.5)
                .round()
                .clamp(0, 255)
                .to(torch.uint8)
                for i in range(0, len(self.scenes), 500)
            ]
            self._at[size] = torch.cat(chunks) if chunks else torch.zeros(0, 3, size, size)
        return self._at[size][index.cpu()].to(torch.float32) / 127.5 - 1.0
