"""cape.lab.data.images.relations: two-glyph scenes whose class is where the X is from the O."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from cape.lab.data.images.fonts import font_split
from cape.lab.data.images.glyphs import CANVAS
from cape.lab.data.images.relations import RELATIONS, _layout, render_relation
from cape.lab.data.images.render import load_split, make_split

FONTS = font_split()


def _centres(corners, sizes):
    return [(x + w / 2, y + h / 2) for (x, y), (w, h) in zip(corners, sizes, strict=True)]


@pytest.mark.parametrize("label", range(4))
def test_layout_puts_the_x_on_the_class_side_of_the_o(label: int) -> None:
    """Over many draws: the offset X - O points along the class's axis (image y grows down),
    sideways by at most 0.6 of it; both boxes lie inside the canvas and do not overlap."""
    rng = np.random.default_rng(label)
    sizes = ((70, 80), (75, 70))
    for _ in range(300):
        corners = _layout(rng, label, sizes, CANVAS)
        (xx, xy), (ox, oy) = _centres(corners, sizes)
        along = {0: ox - xx, 1: xx - ox, 2: oy - xy, 3: xy - oy}[label]  # > 0 on the class side
        sideways = abs(xy - oy) if label < 2 else abs(xx - ox)
        assert along >= 0.35 * CANVAS - 1 and sideways <= 0.6 * along + 1, RELATIONS[label]
        for (x, y), (w, h) in zip(corners, sizes, strict=True):
            assert 0 <= x and x + w <= CANVAS and 0 <= y and y + h <= CANVAS
        (x1, y1), (x2, y2) = corners
        apart_x = x1 + sizes[0][0] <= x2 + 1 or x2 + sizes[1][0] <= x1 + 1
        apart_y = y1 + sizes[0][1] <= y2 + 1 or y2 + sizes[1][1] <= y1 + 1
        assert apart_x or apart_y


def test_class_is_seed_mod_4_and_one_seed_is_one_scene_at_every_size() -> None:
    fonts = FONTS.train
    for seed in range(8):
        small, label = render_relation(seed, fonts, 32)
        assert label == seed % 4 and small.shape == (32, 32, 3) and small.dtype == np.uint8
        big, again = render_relation(seed, fonts, CANVAS)
        assert again == label
        shrunk = np.asarray(Image.fromarray(big).resize((32, 32), Image.Resampling.LANCZOS))
        assert np.array_equal(shrunk, small)  # the same scene, shrunk once
    assert not np.array_equal(render_relation(1, fonts, 32)[0], render_relation(5, fonts, 32)[0])


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="size"):
        render_relation(0, FONTS.train, 0)
    with pytest.raises(ValueError, match="seed"):
        render_relation(-1, FONTS.train, 16)
    with pytest.raises(ValueError, match="fonts"):
        render_relation(0, [], 16)


def test_cached_split_is_balanced_and_keyed_by_task(tmp_path) -> None:
    path = make_split(tmp_path, "train", 12, 16, task="relations", workers=1)
    images, labels, seeds = load_split(path)
    assert path.name.startswith("relations_train_16px_")
    assert images.shape == (12, 16, 16, 3) and np.bincount(labels).tolist() == [3, 3, 3, 3]
    assert np.array_equal(labels, seeds % 4)
    chars = make_split(tmp_path, "train", 12, 16, workers=1)
    assert chars != path and chars.name.startswith("chars_train_16px_")
    with pytest.raises(ValueError, match="task must be one of"):
        make_split(tmp_path, "train", 4, 16, task="boxes")
