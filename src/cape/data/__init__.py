"""Offline data made on the machine: character images from Debian fonts, image datasets, and
log-mel speech features."""

from .datasets import ArrayImageDataset, ImageFolderDataset, char_dataset
from .features import frame_hop_seconds, hop_samples, log_mel, mel_filterbank
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
    "frame_hop_seconds",
    "hop_samples",
    "log_mel",
    "mel_filterbank",
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
