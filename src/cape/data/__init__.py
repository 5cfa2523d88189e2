"""Offline data made on the machine: character images from Debian fonts, and image datasets."""

from .datasets import ArrayImageDataset, ImageFolderDataset, char_dataset
from .fonts import CHARSET, DEBIAN_FONT_PACKAGES, FontSplit, find_fonts, font_split, usable_fonts
from .images import (
    CANVAS,
    SPLITS,
    load_native_sizes,
    load_split,
    make_native_sizes,
    make_split,
    render_char,
    render_sample,
    sample_spec,
    split_seeds,
)
from .transforms import TRANSFORMS, apply_transform, contrast_image

__all__ = [
    "CANVAS",
    "CHARSET",
    "DEBIAN_FONT_PACKAGES",
    "SPLITS",
    "TRANSFORMS",
    "ArrayImageDataset",
    "FontSplit",
    "ImageFolderDataset",
    "apply_transform",
    "char_dataset",
    "contrast_image",
    "find_fonts",
    "font_split",
    "load_native_sizes",
    "load_split",
    "make_native_sizes",
    "make_split",
    "render_char",
    "render_sample",
    "sample_spec",
    "split_seeds",
    "usable_fonts",
]
