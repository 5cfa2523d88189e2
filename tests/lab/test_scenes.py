"""The detection scenes (`cape.lab.data.scenes`): drawn from their seed alone, boxes that hold
exactly their shape, apart from each other, and a cache built once."""

from __future__ import annotations

import numpy as np
import pytest

from cape.lab.data import scenes as S
from cape.lab.data.scenes import SHAPES, SceneSettings, make_scenes, render_scene, scene_seed


def test_a_scene_is_a_function_of_its_seed():
    a = render_scene([0, 2, 7])
    b = render_scene([0, 2, 7])
    c = render_scene([0, 2, 8])
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x, y)
    assert not np.array_equal(a[0], c[0])
    assert scene_seed("test", 3, 1) != scene_seed("val", 3, 1)


def _background(image: np.ndarray) -> np.ndarray:
    """The most common colour of a noiseless image (its background)."""
    colours, counts = np.unique(image.reshape(-1, 3), axis=0, return_counts=True)
    return colours[counts.argmax()]


@pytest.mark.parametrize("seed", range(12))
def test_boxes_hold_their_shape_and_nothing_else(seed):
    """Without noise, every pixel that differs from the background lies in some box, and each
    box's border rows and columns touch its shape (the box is tight to a pixel)."""
    s = SceneSettings(size=64, noise=0, max_objects=4)
    image, boxes, labels = render_scene([9, 0, seed], s)
    assert image.shape == (64, 64, 3) and image.dtype == np.uint8
    assert boxes.shape == (len(labels), 4) and set(labels.tolist()) <= set(range(len(SHAPES)))
    assert ((boxes >= 0) & (boxes <= 1)).all() and (boxes[:, 2:] > boxes[:, :2]).all()
    drawn = (image != _background(image)).any(-1)
    inside = np.zeros_like(drawn)
    for x0, y0, x1, y1 in boxes * 64:
        inside[int(np.floor(y0)) : int(np.ceil(y1)), int(np.floor(x0)) : int(np.ceil(x1))] = True
        edge = drawn[int(np.floor(y0)) : int(np.ceil(y1)), int(np.floor(x0)) : int(np.ceil(x1))]
        assert edge[0].any() and edge[-1].any() and edge[:, 0].any() and edge[:, -1].any()
    assert not (drawn & ~inside).any()


def test_boxes_keep_apart_and_sides_stay_in_range():
    s = SceneSettings(min_side=0.1, max_side=0.4, max_objects=5)
    sides, counts = [], []
    for i in range(60):
        _, boxes, _ = render_scene([1, 0, i], s)
        counts.append(len(boxes))
        sides += np.maximum(boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]).tolist()
        for a in range(len(boxes)):
            for b in range(a + 1, len(boxes)):
                p, q = boxes[a], boxes[b]
                gap = max(q[0] - p[2], p[0] - q[2], q[1] - p[3], p[1] - q[3])
                assert gap >= 0.02 - 1e-6
    assert min(sides) >= 0.1 - 1e-6 and max(sides) <= 0.4 + 1e-6
    assert min(counts) >= 1 and max(counts) <= 5 and len(set(counts)) > 2


def test_cache_is_built_once_then_read(tmp_path, monkeypatch):
    s = SceneSettings(size=32)
    first = make_scenes(tmp_path, "val", 6, s, seed=2)
    assert len(first) == 6 and first.images.shape == (6, 32, 32, 3)
    assert first.offsets[-1] == len(first.boxes) == len(first.labels)
    for i in range(6):  # the cache holds the scenes as drawn from their seeds
        image, boxes, labels = render_scene(scene_seed("val", i, 2), s)
        got_boxes, got_labels = first.objects(i)
        assert np.array_equal(first.images[i], image) and np.array_equal(got_labels, labels)
        assert np.allclose(got_boxes, boxes)

    def boom(*a, **k):
        raise AssertionError("rendered again")

    monkeypatch.setattr(S, "render_scene", boom)
    again = make_scenes(tmp_path, "val", 6, s, seed=2)
    assert np.array_equal(again.images, first.images)
    assert len(list(tmp_path.glob("scenes_val_*.npz"))) == 1
    with pytest.raises(AssertionError, match="rendered again"):  # other settings: another file
        make_scenes(tmp_path, "val", 6, SceneSettings(size=32, noise=0), seed=2)


def test_a_damaged_cache_is_set_aside_and_made_again(tmp_path):
    s = SceneSettings(size=16)
    make_scenes(tmp_path, "test", 3, s)
    [path] = tmp_path.glob("scenes_test_*.npz")
    path.write_bytes(b"not a zip")
    again = make_scenes(tmp_path, "test", 3, s)
    assert len(again) == 3 and list(tmp_path.glob("scenes_test_*.npz.damaged-*"))


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"size": 4}, ["size", "8"]),
        ({"min_objects": 3, "max_objects": 2}, ["max_objects", "min_objects"]),
        ({"min_side": 0.5, "max_side": 0.3}, ["min_side", "max_side"]),
        ({"max_side": 0.9}, ["max_side", "0.6"]),
        ({"noise": 200}, ["noise", "127"]),
    ],
)
def test_bad_settings_name_the_field(kwargs, words):
    with pytest.raises((ValueError, TypeError)) as err:
        SceneSettings(**kwargs)
    for w in words:
        assert w in str(err.value)


def test_bad_arguments_name_them(tmp_path):
    with pytest.raises(ValueError, match="split"):
        make_scenes(tmp_path, "train2", 3)
    with pytest.raises((ValueError, TypeError), match="count"):
        make_scenes(tmp_path, "val", -1)
    with pytest.raises(TypeError, match="settings"):
        make_scenes(tmp_path, "val", 3, {"size": 32})  # type: ignore[arg-type]
