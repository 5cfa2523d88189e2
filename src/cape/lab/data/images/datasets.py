"""Torch datasets over image arrays: the rendered characters and users' own image folders."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from cape.lab.data.images.fonts import FontSplit
from cape.lab.data.images.render import load_split, make_split
from cape.lab.errors import DamagedFile, UsageError

__all__ = ["ArrayImageDataset", "ImageFolderDataset", "char_dataset"]


def _normalizer(normalize: bool | tuple[Sequence[float], Sequence[float]]):
    if normalize is False or normalize is None:
        return None
    if normalize is True:
        normalize = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    mean, std = normalize
    mean_t = torch.as_tensor(mean, dtype=torch.float32).reshape(-1, 1, 1)
    std_t = torch.as_tensor(std, dtype=torch.float32).reshape(-1, 1, 1)
    if mean_t.numel() != 3 or std_t.numel() != 3 or bool((std_t <= 0).any()):
        raise ValueError(f"normalize must be (mean[3], std[3]) with std > 0, got {normalize!r}")
    return mean_t, std_t


def _to_tensor(img: np.ndarray, norm) -> torch.Tensor:
    img = np.ascontiguousarray(img)
    if not img.flags.writeable:  # Pillow's arrays are read-only; torch wants a writable one
        img = img.copy()
    x = torch.from_numpy(img).permute(2, 0, 1).float().div_(255.0)
    if norm is not None:
        x = (x - norm[0]) / norm[1]
    return x


class ArrayImageDataset(Dataset):
    """Images in memory -> (float32 ``[3, H, W]``, label).

    `images`: uint8 ``[N, S, S, 3]`` (or a list of uint8 ``[h, w, 3]`` of any sizes);
    `labels`: ``[N]`` ints. Pixels are scaled to [0, 1]; `normalize=True` maps them to [-1, 1],
    `normalize=(mean, std)` subtracts and divides per channel.
    """

    def __init__(
        self,
        images: np.ndarray | Sequence[np.ndarray],
        labels: np.ndarray | Sequence[int],
        normalize: bool | tuple[Sequence[float], Sequence[float]] = False,
    ) -> None:
        self.labels = np.asarray(labels, dtype=np.int64)
        if len(images) != len(self.labels):
            raise ValueError(f"{len(images)} images but {len(self.labels)} labels")
        for im in images[:1]:
            if np.asarray(im).dtype != np.uint8 or np.asarray(im).ndim != 3:
                raise TypeError("images must be uint8 [H, W, 3]")
        self.images = images
        self._norm = _normalizer(normalize)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return _to_tensor(np.asarray(self.images[i]), self._norm), int(self.labels[i])

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All at once: (float32 ``[N, 3, S, S]``, int64 ``[N]``); same-size images only."""
        x = torch.from_numpy(np.ascontiguousarray(self.images)).permute(0, 3, 1, 2).float() / 255
        if self._norm is not None:
            x = (x - self._norm[0]) / self._norm[1]
        return x, torch.from_numpy(self.labels.copy())


def char_dataset(
    root: str | Path,
    split: str,
    count: int,
    size: int = 32,
    seed: int = 0,
    fonts: FontSplit | Sequence[str | Path] | None = None,
    normalize: bool | tuple[Sequence[float], Sequence[float]] = False,
    **kwargs,
) -> ArrayImageDataset:
    """`make_split` then load it as an `ArrayImageDataset`."""
    images, labels, _ = load_split(make_split(root, split, count, size, seed, fonts, **kwargs))
    return ArrayImageDataset(images, labels, normalize)


_IMAGE_SUFFIXES = (
    ".png",
    ".jpg",
    ".jpeg",
    ".bmp",
    ".gif",
    ".tif",
    ".tiff",
    ".webp",
    ".ppm",
    ".pgm",
)


def _class_images(folder: Path) -> list[Path]:
    """The image files of class folder `folder`, sorted; UsageError naming a folder with none
    (an empty class would be trained as a class that never occurs)."""
    files = sorted(
        p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in _IMAGE_SUFFIXES
    )
    if not files:
        raise UsageError(
            f"class folder {str(folder)!r} holds no images ({', '.join(_IMAGE_SUFFIXES)}); "
            "add images to it or remove it"
        )
    return files


class ImageFolderDataset(Dataset):
    """Your own images: `root/<class>/<image>`; classes are the sorted sub-folder names (not
    the hidden ones, whose names start with ".").

    A class folder without images is a UsageError naming it; an image that cannot be read (cut
    short, not an image) is a `DamagedFile` naming it, raised by `load`.

    `size`: images are resized to ``size x size`` (LANCZOS), or kept at their own size when None.
    `split`: None (all images) or "train"/"val"/"test", drawn per class with `fractions` from a
    permutation seeded by (`seed`, class index): deterministic, stratified, disjoint.
    Items are (float32 ``[3, H, W]`` in [0, 1] or normalised as in `ArrayImageDataset`, label).
    """

    SPLITS = ("train", "val", "test")

    def __init__(
        self,
        root: str | Path,
        size: int | None = 32,
        split: str | None = None,
        fractions: Sequence[float] = (0.8, 0.1, 0.1),
        seed: int = 0,
        normalize: bool | tuple[Sequence[float], Sequence[float]] = False,
    ) -> None:
        root = Path(root)
        if not root.is_dir():
            raise FileNotFoundError(f"root {str(root)!r} is not a folder")
        if size is not None and (not isinstance(size, int) or size < 1):
            raise ValueError(f"size must be a positive int or None, got {size!r}")
        if split is not None and split not in self.SPLITS:
            raise ValueError(f"split must be None or one of {self.SPLITS}, got {split!r}")
        fr = np.asarray(fractions, dtype=np.float64)
        if fr.shape != (3,) or (fr < 0).any() or fr.sum() <= 0:
            raise ValueError(f"fractions must be 3 non-negative numbers, got {fractions!r}")
        self.root, self.size, self.split = root, size, split
        # hidden folders (.ipynb_checkpoints, .git) are not classes
        self.classes = sorted(
            p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")
        )
        if not self.classes:
            raise FileNotFoundError(f"no class sub-folders in {str(root)!r}")
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        bounds = np.cumsum(fr) / fr.sum()
        self.samples: list[tuple[Path, int]] = []
        for ci, c in enumerate(self.classes):
            files = _class_images(root / c)
            if split is not None:
                n = len(files)
                cuts = np.round(bounds * n).astype(int)
                perm = np.random.default_rng([seed, ci]).permutation(n)
                k = self.SPLITS.index(split)
                lo = 0 if k == 0 else cuts[k - 1]
                files = [files[j] for j in sorted(perm[lo : cuts[k]].tolist())]
            self.samples.extend((p, ci) for p in files)
        self._norm = _normalizer(normalize)

    def __len__(self) -> int:
        return len(self.samples)

    def load(self, i: int) -> np.ndarray:
        """Image `i` as uint8 ``[H, W, 3]`` (resized to `size` when set)."""
        path = self.samples[i][0]
        try:
            with Image.open(path) as im:
                im = im.convert("RGB")
                if self.size is not None:
                    im = im.resize((self.size, self.size), Image.Resampling.LANCZOS)
                return np.asarray(im)
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
            reason = " ".join(str(e).split()) or type(e).__name__
            raise DamagedFile(
                f"image {str(path)!r} is damaged or not an image ({reason}); replace or remove it",
                path,
            ) from e

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return _to_tensor(self.load(i), self._norm), self.samples[i][1]
