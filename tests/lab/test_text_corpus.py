"""Text corpora for causal language models (cape.lab.data.text_corpus, `cape data text`).

Most tests build tiny folders of .txt files (a few dozen documents): the point is the split, the
tokenizers, the arrays and the cache, not the data. The Debian corpora are read (and one is
built) where their packages are installed, skipped with the package's name where not."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cape.lab.cli import main
from cape.lab.data.text_corpus import (
    TextCorpus,
    build_text_corpus,
    eval_windows,
    random_windows,
    read_documents,
    split_of,
    window_count,
)
from cape.lab.data.text_corpus import sources as src

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _folder(root: Path, n: int = 40) -> dict[str, str]:
    """`n` small documents (some non-ASCII, one in a sub-folder) as .txt files in `root`; their
    texts by relative path."""
    texts = {}
    for i in range(n):
        rel = f"sub/doc{i:02d}.txt" if i == 3 else f"doc{i:02d}.txt"
        texts[rel] = f"Document {i}: the quick brown fox {'jumps ' * (i % 5)}over café ☕ {i}\n"
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(texts[rel], encoding="utf-8")
    return texts


def _doc_texts(corpus: TextCorpus, split: str) -> list[str]:
    """Each document of `split` decoded from the token array between its start and its <eod>."""
    tokens = np.asarray(corpus.tokens(split))
    starts = list(corpus.starts(split)) + [len(tokens)]
    out = []
    for a, b in zip(starts[:-1], starts[1:], strict=True):
        assert tokens[b - 1] == corpus.eod_id
        out.append(corpus.tokenizer.decode(tokens[a : b - 1]))
    return out


def test_splits_are_disjoint_by_document_and_deterministic(tmp_path: Path) -> None:
    texts = _folder(tmp_path / "docs")
    a = TextCorpus(build_text_corpus(tmp_path / "docs", tmp_path / "a"))
    b = TextCorpus(build_text_corpus(tmp_path / "docs", tmp_path / "b"))
    ids = {s: a.documents(s) for s in ("train", "val", "test")}
    assert sorted(sum(ids.values(), [])) == sorted(texts)  # every document once
    assert all(len(set(x) & set(y)) == 0 for x in ids.values() for y in ids.values() if x is not y)
    assert len(ids["train"]) > len(ids["val"]) and ids["train"]
    for split in ids:
        assert b.documents(split) == ids[split]
        assert np.array_equal(a.tokens(split), b.tokens(split))
        assert all(split_of(d, (0.9, 0.05, 0.05)) == split for d in ids[split])
    # a document's split depends on its id alone, not on the rest of the corpus
    for rel in list(texts)[:20]:
        (tmp_path / "docs" / rel).unlink()
    c = TextCorpus(build_text_corpus(tmp_path / "docs", tmp_path / "c"))
    for split in ids:
        assert set(c.documents(split)) <= set(ids[split])
    # other fractions move documents, still disjoint and complete
    d = TextCorpus(
        build_text_corpus(tmp_path / "docs", tmp_path / "c", fractions=(0.5, 0.25, 0.25))
    )
    assert d.root != c.root
    assert sorted(sum((d.documents(s) for s in ids), [])) == sorted(
        c.documents("train") + c.documents("val") + c.documents("test")
    )


def test_byte_tokenizer_round_trips_every_document(tmp_path: Path) -> None:
    texts = _folder(tmp_path / "docs")
    corpus = TextCorpus(build_text_corpus(tmp_path / "docs", tmp_path / "out"))
    assert corpus.vocab_size == 257 and corpus.eod_id == 256
    for split in ("train", "val", "test"):
        tokens = corpus.tokens(split)
        assert tokens.dtype == np.uint16 and (len(tokens) == 0 or tokens.max() <= 256)
        assert _doc_texts(corpus, split) == [texts[d] for d in corpus.documents(split)]


def test_bpe_is_trained_on_the_train_split_only(tmp_path: Path) -> None:
    pytest.importorskip("sentencepiece")
    root = tmp_path / "docs"
    root.mkdir()
    marks = {}
    for i in range(40):  # each document has its own character, used nowhere else
        marks[f"d{i:02d}.txt"] = chr(0x4E00 + i)
        text = f"line {i} of plain words and more plain words {marks[f'd{i:02d}.txt'] * 3}\n" * 5
        (root / f"d{i:02d}.txt").write_text(text, encoding="utf-8")
    corpus = TextCorpus(build_text_corpus(root, tmp_path / "out", tokenizer="bpe", vocab=320))
    pieces = set(corpus.tokenizer.pieces())
    for split in ("train", "val", "test"):
        for doc in corpus.documents(split):
            assert (marks[doc] in pieces) == (split == "train"), (doc, split)
        want = [(root / d).read_text(encoding="utf-8") for d in corpus.documents(split)]
        assert _doc_texts(corpus, split) == want  # held-out characters fall back to bytes
    assert corpus.stats["vocabulary"]["trained_on"] == "train"
    assert corpus.vocab_size == 320 and corpus.tokenizer.unk_id not in corpus.tokens("val")


@pytest.mark.parametrize("n", [1, 2, 17, 64, 65, 100])
@pytest.mark.parametrize("length", [1, 8, 16])
def test_eval_windows_cover_the_split_without_overlap(n: int, length: int) -> None:
    tokens = np.arange(n, dtype=np.uint16)
    for batch_size in (1, 3):
        batches = list(eval_windows(tokens, length, batch_size))
        rows = [(x, y) for bx, by in batches for x, y in zip(bx, by, strict=True)]
        assert len(rows) == window_count(n, length)
        targets = np.concatenate([y for _, y in rows]) if rows else np.zeros(0)
        assert np.array_equal(targets, tokens[1:])  # each token after the first, once, in order
        assert all(np.array_equal(y, x + 1) and len(x) <= length for x, y in rows)
        kept = [
            y for bx, by in eval_windows(tokens, length, batch_size, drop_last=True) for y in by
        ]
        assert len(kept) == (n - 1) // length == window_count(n, length, drop_last=True)
        assert all(len(y) == length for y in kept)


def test_random_windows_are_shifted_slices_and_reproducible() -> None:
    tokens = np.arange(1000, dtype=np.uint16)
    a, b = random_windows(tokens, 32, 4, seed=7), random_windows(tokens, 32, 4, seed=7)
    for _ in range(5):
        (xa, ya), (xb, yb) = next(a), next(b)
        assert xa.shape == ya.shape == (4, 32) and xa.dtype == np.int64
        assert np.array_equal(xa, xb) and np.array_equal(ya, yb)
        assert np.array_equal(ya, xa + 1) and np.all(np.diff(xa, axis=1) == 1)
        assert xa.min() >= 0 and ya.max() <= 999
    with pytest.raises(ValueError, match="length"):
        next(random_windows(tokens[:10], 10, 1))


def test_statistics_agree_with_the_arrays(tmp_path: Path) -> None:
    texts = _folder(tmp_path / "docs")
    (tmp_path / "docs" / "zcopy.txt").write_text(texts["doc05.txt"], encoding="utf-8")
    (tmp_path / "docs" / "blank.txt").write_text("\n", encoding="utf-8")
    corpus = TextCorpus(build_text_corpus(tmp_path / "docs", tmp_path / "out"))
    stats = json.loads((corpus.root / "stats.json").read_text(encoding="utf-8"))
    assert stats["duplicates_dropped"] == 1 and stats["skipped"] == {"blank.txt": "empty"}
    assert "zcopy.txt" not in sum((corpus.documents(s) for s in stats["splits"]), [])
    for split, s in stats["splits"].items():
        ids = corpus.documents(split)
        assert s["documents"] == len(ids) == len(corpus.starts(split))
        assert s["tokens"] == len(corpus.tokens(split)) == s["bytes"] + s["documents"]
        assert s["bytes"] == sum(len(texts[d].encode("utf-8")) for d in ids)
        if s["tokens"]:
            bpb = corpus.bits_per_byte(math.log(2), split)  # 1 bit per token
            assert bpb == pytest.approx(s["tokens"] / s["bytes"])
    md = (corpus.root / "stats.md").read_text(encoding="utf-8")
    assert all(str(s["tokens"]) in md for s in stats["splits"].values())


def test_an_interrupted_build_is_finished(tmp_path: Path) -> None:
    _folder(tmp_path / "docs")
    entry = build_text_corpus(tmp_path / "docs", tmp_path / "out")
    first = {p.name: p.read_bytes() for p in entry.glob("*.npy")}
    (entry / "stats.json").unlink()
    (entry / "test.npy").unlink()
    (entry / ".test.npy.tmp-dead.npy").write_bytes(b"half")  # a killed writer's temporary
    assert build_text_corpus(tmp_path / "docs", tmp_path / "out") == entry
    assert {p.name: p.read_bytes() for p in entry.glob("*.npy")} == first
    assert not list(entry.glob(".*tmp-*"))


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda d: None, "is empty"),
        (lambda d: (d / "notes.md").write_text("x"), "holds no .txt file"),
        (
            lambda d: (d / "a.txt").write_bytes(b"ok\n") and (d / "b.txt").write_bytes(b"caf\xe9"),
            "b.txt is not UTF-8",
        ),
        (lambda d: (d / "a.txt").write_text("  \n"), "every .txt file"),
    ],
    ids=["empty", "no-txt", "not-utf8", "all-empty"],
)
def test_a_bad_user_folder_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture, make, named
) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    make(folder)
    assert main(["data", "text", "--corpus", str(folder), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err and str(folder) in err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--corpus", "no/such/folder"], "--corpus"),
        (["--split", "0.9,0.2,0.1"], "--split"),
        (["--vocab", "1000"], "--vocab"),
        (["--tokenizer", "bpe", "--vocab", "50"], "--vocab"),
        (["--tokenizer", "bpe", "--vocab", "1180591620717411303424"], "--vocab"),
        (["--tokenizer", "bpe", "--vocab", str(2**31)], "--vocab"),
        (["--split", "nan,0,0"], "--split"),
        (["--split", "0.9,nan,0.1"], "--split"),
        (["--split", "inf,0,0"], "--split"),
        (["--split", "1e400,0,0"], "--split"),
        (["--out", os.fsdecode(b"{tmp}/o\xff")], "o\\xff' is not a UTF-8 path"),
    ],
)
def test_bad_arguments_exit_2_naming_them(tmp_path: Path, capsys, argv, named) -> None:
    _folder(tmp_path / "docs", 5)
    base = ["data", "text", "--corpus", str(tmp_path / "docs"), "--out", str(tmp_path / "o")]
    assert main(base + [a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err


def test_what_a_folder_holds_besides_documents_is_listed(tmp_path: Path, capsys) -> None:
    # links in a loop or to nothing, a folder named x.txt, a pipe, a link to a folder: not
    # documents, each listed in stats.json's "skipped" with its reason and said on stdout
    docs = tmp_path / "docs"
    _folder(docs, 8)
    os.symlink("loop2.txt", docs / "loop1.txt")
    os.symlink("loop1.txt", docs / "loop2.txt")
    os.symlink("nowhere.txt", docs / "dangling.txt")
    (docs / "folder.txt").mkdir()
    (docs / "folder.txt" / "inner.txt").write_text("read: a file inside a folder named .txt\n")
    os.mkfifo(docs / "pipe.txt")
    os.symlink(".", docs / "again")  # a link to a folder: not followed (no document twice)
    (docs / "blank.txt").write_text(" \n")
    assert main(["data", "text", "--corpus", str(docs), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "skipped 7 files (stats.json lists each)" in out, out
    (entry,) = (tmp_path / "o").iterdir()
    stats = json.loads((entry / "stats.json").read_text())
    assert stats["skipped"] == {
        "again": "a link to a folder (not followed)",
        "dangling.txt": "a dangling symlink",
        "folder.txt": "a folder, not a file",
        "loop1.txt": "a symlink loop",
        "loop2.txt": "a symlink loop",
        "pipe.txt": "not a regular file (a pipe, socket or device)",
        "blank.txt": "empty",
    }
    ids = [
        i for split in json.loads((entry / "documents.json").read_text()).values() for i in split
    ]
    assert sorted(ids) == sorted([*_folder(tmp_path / "ref", 8), "folder.txt/inner.txt"])
    (docs / "dangling.txt").unlink()  # what is skipped is part of the cache key: a new entry
    assert build_text_corpus(docs, tmp_path / "o") != entry


@pytest.mark.parametrize("where", ["file", "folder"])
def test_names_that_are_not_utf8_are_named(tmp_path: Path, capsys, where: str) -> None:
    bad = os.fsdecode(b"caf\xe9")  # bytes a Latin-1 system writes: not UTF-8
    docs = tmp_path / (bad if where == "folder" else "docs")
    _folder(docs, 5)
    if where == "file":
        (docs / f"{bad}.txt").write_text("a document\n")
    assert main(["data", "text", "--corpus", str(docs), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not UTF-8" in err and "caf\\xe9" in err, err
    assert f"error: {'--corpus folder' if where == 'folder' else 'file'} b'" in err, err
    assert "surrogates" not in err


def test_two_processes_build_one_corpus_once(tmp_path: Path) -> None:
    _folder(tmp_path / "docs")
    code = "import sys; from cape.lab.cli import main; sys.exit(main(sys.argv[1:]))"
    argv = ["data", "text", "--corpus", str(tmp_path / "docs"), "--out", str(tmp_path / "out")]
    env = {**os.environ, "PYTHONPATH": SRC, "CAPE_DEBUG": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    assert all(rc == 0 for rc, _, _ in results), [err[-2000:] for _, _, err in results]
    assert results[0][1] == results[1][1]  # the same corpus printed by both
    entries = [p for p in (tmp_path / "out").iterdir() if p.is_dir()]
    assert len(entries) == 1
    assert not [p for p in entries[0].iterdir() if ".tmp-" in p.name]
    corpus = TextCorpus(entries[0])
    assert sum(corpus.stats["splits"][s]["documents"] for s in ("train", "val", "test")) == 40


_PACKAGED = {
    "kjv": (src.BIBLE_DATA, "bible-kjv"),
    "jargon": (src.JARGON_DICT, "dict-jargon"),
    "fortunes": (src.FORTUNES_DIR / "fortunes", "fortunes-min"),
}


def _need(corpus: str) -> None:
    if corpus in _PACKAGED and not _PACKAGED[corpus][0].exists():
        pytest.skip(f"the Debian package {_PACKAGED[corpus][1]} is not installed")


@pytest.mark.parametrize("corpus", ["kjv", "jargon", "fortunes", "stdlib"])
def test_each_corpus_reads_as_unique_utf8_documents(corpus: str) -> None:
    _need(corpus)
    source = read_documents(corpus)
    ids = [d for d, _ in source.docs]
    assert len(ids) == len(set(ids)) > 100
    assert all(isinstance(t, str) and t.strip() for _, t in source.docs)
    if corpus == "kjv":  # 66 books, 1189 chapters, Genesis first and Revelation last
        books = {d.rstrip("0123456789") for d in ids}
        assert len(books) == 66 and len(ids) == 1189
        assert source.docs[0][1].startswith("In the beginning God created")
        assert source.docs[-1][1].rstrip().endswith("Amen.")
    if corpus == "stdlib":
        assert source.info["python"] == ".".join(map(str, sys.version_info[:3]))
        assert not any(set(Path(d).parts) & src.STDLIB_SKIP for d in ids)
        assert "os.py" in ids
    else:
        assert all(v for v in source.info["packages"].values() if v is not None)


def test_the_jargon_file_builds_with_consistent_statistics(tmp_path: Path) -> None:
    _need("jargon")
    corpus = TextCorpus(build_text_corpus("jargon", tmp_path))
    stats = corpus.stats
    assert stats["source"]["packages"]["dict-jargon"]
    total = sum(s["documents"] for s in stats["splits"].values())
    assert total == len(read_documents("jargon").docs) - stats["duplicates_dropped"]
    for split, s in stats["splits"].items():
        assert len(corpus.tokens(split)) == s["tokens"] == s["bytes"] + s["documents"]
        assert 0.02 < s["documents"] / total < 0.95
