"""Offline character images: determinism, one object at every resolution, caches, datasets."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from cape.lab.data import (
    CHARSET,
    SPLITS,
    ArrayImageDataset,
    FontSplit,
    ImageFolderDataset,
    find_fonts,
    font_split,
    load_native_sizes,
    load_split,
    make_native_sizes,
    make_split,
    render_char,
    render_sample,
    sample_spec,
    split_seeds,
    usable_fonts,
)


@pytest.fixture(scope="module")
def fonts() -> FontSplit:
    return font_split()


def _mad(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).mean())


def test_same_seed_same_pixels_different_seeds_differ(fonts):
    a, la = render_sample(7, fonts.train, 32)
    b, lb = render_sample(7, fonts.train, 32)
    assert a.dtype == np.uint8 and a.shape == (32, 32, 3)
    assert np.array_equal(a, b) and la == lb
    c, _ = render_sample(8, fonts.train, 32)
    assert not np.array_equal(a, c)
    font = fonts.train[0]
    assert np.array_equal(render_char("Q", font, 3, 20), render_char("Q", font, 3, 20))
    assert not np.array_equal(render_char("Q", font, 3, 20), render_char("Q", font, 4, 20))


def test_same_seed_is_same_object_at_every_resolution(fonts):
    same, other = [], []
    for s in range(12):
        direct = render_sample(s, fonts.train, 16)[0]
        big = render_sample(s, fonts.train, 64)[0]
        shrunk = np.asarray(Image.fromarray(big).resize((16, 16), Image.Resampling.LANCZOS))
        same.append(_mad(direct, shrunk))
        other.append(_mad(direct, render_sample(s + 100, fonts.train, 16)[0]))
    assert np.mean(same) < 4.0, same
    assert np.mean(same) < 0.1 * np.mean(other), (same, other)


def test_bad_arguments_raise(fonts):
    with pytest.raises(ValueError, match="size"):
        render_char("A", fonts.train[0], 0, 0)
    with pytest.raises(ValueError, match="char"):
        render_char("AB", fonts.train[0], 0, 16)
    with pytest.raises(ValueError, match="split"):
        split_seeds("nope", 3)
    with pytest.raises(ValueError, match="split"):
        make_split("/nonexistent", "native", 3, 16)


def test_split_seeds_disjoint():
    seen: set[int] = set()
    for seed in (0, 1):
        for split in (*SPLITS, "native"):
            s = split_seeds(split, 500, seed)
            assert s.dtype == np.int64 and len(set(s.tolist())) == 500
            assert seen.isdisjoint(s.tolist())
            seen.update(s.tolist())


def test_fonts_filtered_and_held_out_disjoint(fonts):
    usable = usable_fonts()
    assert usable == sorted(usable) and len(usable) >= 10
    assert not any("D050000L" in p.name or "Symbol" in p.name for p in usable)
    assert set(fonts.train).isdisjoint(fonts.held_out)
    assert sorted(fonts.train + fonts.held_out) == usable
    assert fonts.held_out == tuple(usable[4::5])
    assert font_split() == fonts
    # the held-out test split draws only held-out fonts, the others only train fonts
    for split in SPLITS:
        pool = fonts.held_out if split == "test_fonts" else fonts.train
        for s in split_seeds(split, 30).tolist():
            assert sample_spec(s, pool)[1] in pool


def test_no_fonts_names_the_packages(tmp_path):
    with pytest.raises(FileNotFoundError, match="fonts-dejavu-core"):
        find_fonts([tmp_path])


def test_split_labels_cover_all_classes(tmp_path, fonts):
    path = make_split(tmp_path, "train", 360, 12, fonts=fonts, workers=1)
    images, labels, seeds = load_split(path)
    assert images.shape == (360, 12, 12, 3) and images.dtype == np.uint8
    assert labels.dtype == np.int64 and seeds.dtype == np.int64
    assert labels.min() >= 0 and labels.max() < len(CHARSET)
    assert set(labels.tolist()) == set(range(len(CHARSET)))
    assert np.array_equal(seeds, split_seeds("train", 360))
    assert np.array_equal(images[5], render_sample(int(seeds[5]), fonts.train, 12)[0])
    assert not list(tmp_path.glob("*.shards"))  # shards removed after the merge by default


def test_cache_is_atomic_resumable_and_independent_of_workers(tmp_path, fonts):
    kw = dict(fonts=fonts, shard_size=20, keep_shards=True)
    path = make_split(tmp_path / "a", "val", 50, 16, workers=1, **kw)
    first = load_split(path)
    shards = sorted(path.with_name(path.stem + ".shards").glob("shard_*.npz"))
    assert len(shards) == 3
    stamps = {p: p.stat().st_mtime_ns for p in shards}
    # an interrupted run: one shard and the merged file missing, temporary files left behind
    shards[1].unlink()
    path.unlink()
    (shards[0].parent / f".{shards[1].name}.x7q2.npz").write_bytes(b"half written")
    (path.parent / f".{path.name}.k3j9.npz").write_bytes(b"half written")
    assert make_split(tmp_path / "a", "val", 50, 16, workers=1, **kw) == path
    again = load_split(path)
    for x, y in zip(first, again, strict=True):
        assert np.array_equal(x, y)
    assert shards[0].stat().st_mtime_ns == stamps[shards[0]]  # reused, not redrawn
    assert shards[2].stat().st_mtime_ns == stamps[shards[2]]
    # the cache is found without rendering; two worker processes give the same pixels
    assert make_split(tmp_path / "a", "val", 50, 16, workers=1, **kw) == path
    other = load_split(make_split(tmp_path / "b", "val", 50, 16, workers=2, **kw))
    for x, y in zip(first, other, strict=True):
        assert np.array_equal(x, y)
    # a different request never reads this cache
    assert make_split(tmp_path / "a", "val", 40, 16, workers=1, **kw) != path


def test_native_sizes_round_trip(tmp_path, fonts):
    path = make_native_sizes(tmp_path, 25, low=12, high=40, fonts=fonts, shard_size=10, workers=1)
    with np.load(path, allow_pickle=False) as z:
        assert z["pixels"].dtype == np.uint8 and z["pixels"].ndim == 1
        assert z["offsets"].shape == (26,) and z["offsets"][-1] == z["pixels"].size
    images, labels, seeds = load_native_sizes(path)
    assert len(images) == len(labels) == len(seeds) == 25
    sizes = {im.shape[0] for im in images}
    assert len(sizes) > 5 and min(sizes) >= 12 and max(sizes) <= 40
    assert set(seeds.tolist()).isdisjoint(split_seeds("test", 25).tolist())
    for im, label, s in list(zip(images, labels, seeds, strict=True))[:5]:
        assert im.shape == (im.shape[0], im.shape[0], 3)
        ref, ref_label = render_sample(int(s), fonts.train, im.shape[0])
        assert np.array_equal(im, ref) and ref_label == label
    ds = ArrayImageDataset(images, labels)
    assert ds[0][0].shape == (3, images[0].shape[0], images[0].shape[0])


def test_array_dataset(fonts):
    images = np.stack([render_sample(s, fonts.train, 8)[0] for s in range(4)])
    ds = ArrayImageDataset(images, [0, 1, 2, 3])
    x, y = ds[2]
    assert x.shape == (3, 8, 8) and x.dtype == torch.float32 and y == 2
    assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0
    assert torch.allclose(x, torch.from_numpy(images[2]).permute(2, 0, 1).float() / 255)
    xn, _ = ArrayImageDataset(images, [0, 1, 2, 3], normalize=True)[2]
    assert torch.allclose(xn, 2 * x - 1, atol=1e-6)
    xs, ys = ds.tensors()
    assert xs.shape == (4, 3, 8, 8) and torch.equal(xs[2], x) and ys.tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="labels"):
        ArrayImageDataset(images, [0, 1])


def test_image_folder_dataset(tmp_path):
    rng = np.random.default_rng(0)
    for cls in ("cat", "ant", "bee"):
        (tmp_path / cls).mkdir()
        for i in range(10):
            h, w = int(rng.integers(5, 20)), int(rng.integers(5, 20))
            arr = rng.integers(0, 256, size=(h, w), dtype=np.uint8)  # grey: converted to RGB
            Image.fromarray(arr).save(tmp_path / cls / f"{i:02d}.png")
    (tmp_path / "notes.txt").write_text("not a class")
    (tmp_path / "ant" / "readme.txt").write_text("not an image")

    full = ImageFolderDataset(tmp_path, size=8)
    assert full.classes == ["ant", "bee", "cat"] and len(full) == 30
    x, y = full[0]
    assert x.shape == (3, 8, 8) and y == 0
    native = ImageFolderDataset(tmp_path, size=None)
    with Image.open(native.samples[3][0]) as im:
        assert native[3][0].shape == (3, im.height, im.width)

    parts = {s: ImageFolderDataset(tmp_path, 8, split=s, seed=1) for s in ("train", "val", "test")}
    names = {s: [p for p, _ in d.samples] for s, d in parts.items()}
    assert [len(v) for v in names.values()] == [24, 3, 3]
    assert sorted(sum(names.values(), [])) == sorted(p for p, _ in full.samples)
    assert names["train"] == [
        p for p, _ in ImageFolderDataset(tmp_path, 8, "train", seed=1).samples
    ]
    assert names["train"] != [
        p for p, _ in ImageFolderDataset(tmp_path, 8, "train", seed=2).samples
    ]
    assert {y for _, y in parts["val"].samples} == {0, 1, 2}  # stratified per class
    with pytest.raises(ValueError, match="split"):
        ImageFolderDataset(tmp_path, 8, split="dev")
