"""Data caches built by several processes at once: one builds each entry (under a lock beside
it), the others wait and read it; every one exits 0 with the same data, and nothing half-built
is left behind. Then the leftovers of a killed builder: found, removed, the entry rebuilt.

Each corpus is tiny (a few images, utterances, sentences): the processes start together and the
point is the race, not the data."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cape.lab.data.images.render import load_split, make_split

SRC = str(Path(__file__).resolve().parents[2] / "src")
PROCESSES = 3


def _together(code: str, *args: str, n: int = PROCESSES) -> list[subprocess.CompletedProcess]:
    """Run `python -c code *args` in `n` processes started at once; their results."""
    env = {**os.environ, "PYTHONPATH": SRC, "CAPE_DEBUG": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(n)
    ]
    done = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return done


def _cape_together(*argv: str) -> list[subprocess.CompletedProcess]:
    return _together(
        "import sys; from cape.lab.cli import main; sys.exit(main(sys.argv[1:]))", *argv
    )


def _leftovers(root: Path) -> list[Path]:
    """What a half-finished build leaves: shard folders and atomic_write's temporaries."""
    return [p for p in root.rglob("*") if p.name.endswith(".shards") or ".tmp-" in p.name]


def _all_ok(results: list[subprocess.CompletedProcess]) -> None:
    for r in results:
        assert r.returncode == 0, r.stderr[-3000:]


def test_cape_data_chars_in_three_processes_at_once(tmp_path: Path) -> None:
    root = tmp_path / "chars"
    argv = ["data", "chars", "--root", str(root), "--sizes", "12", "--train", "8", "--val", "2"]
    results = _cape_together(*argv, "--test", "2", "--native", "2", "--workers", "1")
    _all_ok(results)
    assert len({r.stdout for r in results}) == 1  # every process names the same files
    assert _leftovers(root) == []
    files = sorted(root.glob("*.npz"))
    assert len(files) == 5  # train, val, test, test_fonts, native
    images, labels, _ = load_split(next(root.glob("chars_train_12px_*.npz")))
    assert images.shape == (8, 12, 12, 3) and labels.shape == (8,)


_TRAIN_RELATIONS = """
import hashlib, sys
from cape.lab.data.images.render import load_split, make_split
path = make_split(sys.argv[1], "train", 9, 12, shard_size=2, workers=1, task="relations")
images, labels, seeds = load_split(path)
print(path.name, hashlib.sha1(images.tobytes() + labels.tobytes()).hexdigest())
"""


def test_a_split_of_many_shards_in_three_processes_at_once(tmp_path: Path) -> None:
    """The reported race: five shards, read while another process would remove them."""
    results = _together(_TRAIN_RELATIONS, str(tmp_path))
    _all_ok(results)
    assert len({r.stdout for r in results}) == 1
    assert _leftovers(tmp_path) == []


_SPEECH = """
import json, sys
from cape.lab.data.speech.corpus import load_manifest, make_speech_corpus
root = sys.argv[1]
make_speech_corpus(root, train=2, val=1, test_per_bin=0, seed=3, workers=1, progress=False)
print(json.dumps([load_manifest(root, s) for s in ("train", "val")], sort_keys=True))
"""


def test_the_speech_corpus_in_three_processes_at_once(tmp_path: Path) -> None:
    pytest.importorskip("soundfile")
    from cape.lab.data.speech.corpus import verify_corpus

    root = tmp_path / "speech"
    results = _together(_SPEECH, str(root))
    _all_ok(results)
    assert len({r.stdout for r in results}) == 1
    assert [len(x) for x in json.loads(results[0].stdout)] == [2, 1]
    assert _leftovers(root) == []
    assert verify_corpus(root)["train"]["utterances"] == 2


_TRANSLATION = """
import json, sys
from cape.lab.data.translation.bpe import train_bpe
from cape.lab.data.translation.corpus import make_translation_corpus
root = sys.argv[1]
manifest = make_translation_corpus(
    root, limit=80, val=4, test=4, long_per_bucket=2, stacked=1, max_train_words=8,
    fortunes=False, workers=1, chunk=30, progress=False,
)
model = train_bpe(root, vocab_size=60)
print(json.dumps(manifest["counts"]), model.name, model.read_bytes().hex()[:64])
"""


def test_the_translation_corpus_and_bpe_in_three_processes_at_once(tmp_path: Path) -> None:
    pytest.importorskip("sentencepiece")
    if shutil.which("apertium") is None:
        pytest.skip("apertium is not installed")
    root = tmp_path / "translation"
    results = _together(_TRANSLATION, str(root))
    _all_ok(results)
    assert len({r.stdout for r in results}) == 1
    assert _leftovers(root) == []
    assert len(list((root / "chunks").glob("*.tsv"))) == 3  # 80 sentences in chunks of 30


# --------------------------------------------------------------------- a killed builder's leftovers


def _split(root: Path, **kw) -> Path:
    return make_split(root, "val", 6, 12, shard_size=2, workers=1, **kw)


def test_a_killed_builders_shards_and_temporaries_are_found_and_rebuilt(tmp_path, caplog) -> None:
    fresh = _split(tmp_path / "fresh")
    root = tmp_path / "stale"
    path = _split(root, keep_shards=True)
    shards = path.with_name(path.stem + ".shards")
    path.unlink()  # killed before the merge: shards, one cut short, and temporaries remain
    cut = shards / "shard_00001.npz"
    cut.write_bytes(cut.read_bytes()[:100])
    (shards / ".shard_00002.npz.tmp-x1y2.npz").write_bytes(b"half a shard")
    (root / f".{path.name}.tmp-a1b2.npz").write_bytes(b"half a merge")
    again = _split(root)
    assert again == path and _leftovers(root) == []
    said = caplog.text
    assert "shard_00001.npz is damaged" in said and "left by a build that did not finish" in said
    for a, b in zip(load_split(fresh), load_split(again), strict=True):
        np.testing.assert_array_equal(a, b)


def test_shards_left_beside_a_finished_file_are_removed(tmp_path: Path) -> None:
    path = _split(tmp_path, keep_shards=True)  # as if killed between the merge and the cleanup
    assert path.with_name(path.stem + ".shards").is_dir()
    assert _split(tmp_path) == path
    assert _leftovers(tmp_path) == []


def test_a_corpus_builders_temporaries_are_removed(tmp_path: Path) -> None:
    pytest.importorskip("soundfile")
    from cape.lab.data.speech.corpus import make_speech_corpus

    root = tmp_path / "speech"
    make_speech_corpus(root, train=1, val=0, test_per_bin=0, seed=3, workers=1, progress=False)
    (root / "train" / ".000001.wav.tmp-k9.wav").write_bytes(b"RIFF half")  # a killed writer's
    (root / "train" / "000001.wav").write_bytes(b"RIFF half")  # a WAV without its record
    summary = make_speech_corpus(
        root, train=2, val=0, test_per_bin=0, seed=3, workers=1, progress=False
    )
    assert summary["train"] == {"made": 1, "kept": 1, "repaired": 1}
    assert _leftovers(root) == []
