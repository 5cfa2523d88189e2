"""Fonts for the offline character images: discovery, a legibility filter and a train/held-out
split.

Fonts come from Debian packages (nothing is downloaded at run time). The order is the sorted path,
so the list, the filter and the split are the same on every machine with the same packages.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from PIL import ImageFont

__all__ = [
    "CHARSET",
    "DEBIAN_FONT_PACKAGES",
    "FONT_DIRS",
    "FontSplit",
    "find_fonts",
    "font_split",
    "renders_charset",
    "usable_fonts",
]

CHARSET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
"""The 36 classes: a character's label is its index here."""

FONT_DIRS: tuple[str, ...] = ("/usr/share/fonts",)
DEBIAN_FONT_PACKAGES: tuple[str, ...] = (
    "fonts-dejavu-core",
    "fonts-dejavu-extra",
    "fonts-liberation2",
    "fonts-freefont-ttf",
    "fonts-urw-base35",
)
_SUFFIXES = (".ttf", ".otf")
# Fonts that map 0-9A-Z to other symbols (Greek letters, dingbats): distinct glyphs, wrong shapes.
_SYMBOL_FAMILY = re.compile(r"symbol|dingbat|wingding|webding|emoji|ornament", re.IGNORECASE)
_SYMBOL_FILE = re.compile(r"symbol|dingbat|D050000L", re.IGNORECASE)


def _install_hint() -> str:
    return "install fonts with: apt-get install -y " + " ".join(DEBIAN_FONT_PACKAGES)


def find_fonts(dirs: Iterable[str | Path] | None = None) -> list[Path]:
    """All .ttf/.otf files under `dirs` (default `FONT_DIRS`), sorted by path, duplicates removed.

    Raises FileNotFoundError naming the Debian packages to install when there are none.
    """
    dirs = FONT_DIRS if dirs is None else tuple(dirs)
    seen: dict[Path, Path] = {}
    for d in dirs:
        d = Path(d)
        if not d.is_dir():
            continue
        for p in sorted(d.rglob("*")):
            if p.suffix.lower() in _SUFFIXES and p.is_file():
                seen.setdefault(p.resolve(), p)
    fonts = sorted(seen.values())
    if not fonts:
        raise FileNotFoundError(
            f"no TrueType/OpenType fonts found under {', '.join(map(str, dirs))}; {_install_hint()}"
        )
    return fonts


@functools.cache
def renders_charset(font_path: str | Path, charset: str = CHARSET, px: int = 48) -> bool:
    """True when the font draws every character of `charset` with ink and all glyphs differ.

    Symbol and dingbat fonts (which put other shapes at the letters' code points) are rejected
    by family and file name; fonts that cannot be opened are rejected.
    """
    path = Path(font_path)
    if _SYMBOL_FILE.search(path.name):
        return False
    try:
        font = ImageFont.truetype(str(path), px)
    except OSError:
        return False
    family = font.getname()[0] or ""
    if _SYMBOL_FAMILY.search(family):
        return False
    masks = []
    for ch in charset:
        mask = font.getmask(ch)
        if mask.getbbox() is None:
            return False
        masks.append((mask.size, bytes(mask)))
    return len(set(masks)) == len(charset)


def usable_fonts(dirs: Iterable[str | Path] | None = None) -> list[Path]:
    """`find_fonts` filtered by `renders_charset`, sorted; FileNotFoundError when none is left."""
    fonts = [p for p in find_fonts(dirs) if renders_charset(str(p))]
    if not fonts:
        raise FileNotFoundError(f"no font renders all of {CHARSET!r}; {_install_hint()}")
    return fonts


@dataclass(frozen=True)
class FontSplit:
    """Fonts to train on and fonts held out for the unseen-font test (disjoint, both sorted)."""

    train: tuple[Path, ...]
    held_out: tuple[Path, ...]


def font_split(fonts: Sequence[str | Path] | None = None, every: int = 5) -> FontSplit:
    """Split sorted `fonts` (default `usable_fonts()`): every `every`-th font (the 5th, 10th, ...)
    is held out, the rest are train fonts. Deterministic given the paths."""
    if not isinstance(every, int) or every < 2:
        raise ValueError(f"every must be an int >= 2, got {every!r}")
    paths = sorted(Path(p) for p in (usable_fonts() if fonts is None else fonts))
    if len(paths) < every:
        raise ValueError(
            f"need at least {every} fonts to hold one out, got {len(paths)}; {_install_hint()}"
        )
    train = tuple(p for i, p in enumerate(paths) if i % every != every - 1)
    held = tuple(p for i, p in enumerate(paths) if i % every == every - 1)
    return FontSplit(train=train, held_out=held)
