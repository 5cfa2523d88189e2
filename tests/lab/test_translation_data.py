"""The English->Spanish corpus (Apertium), its splits and the joint BPE tokenizer."""

from __future__ import annotations

import logging
import pickle
import shutil
from pathlib import Path

import pytest

from cape.lab.data.translation import apertium
from cape.lab.data.translation import corpus as translation
from cape.lab.data.translation.command import translation_main
from cape.lab.data.translation.corpus import (
    CorpusError,
    _clean_pairs,
    english_sentences,
    load_pairs,
    long_buckets,
    make_translation_corpus,
    split_names,
    translate_apertium,
    verify_translation_corpus,
)

needs_apertium = pytest.mark.skipif(
    shutil.which("apertium") is None or not Path("/usr/share/wordnet/data.noun").is_file(),
    reason="needs apertium, apertium-eng-spa and wordnet-base (scripts/setup.sh)",
)
SETTINGS = dict(
    limit=1200, val=40, test=80, long_per_bucket=20, stacked=8, max_train_words=8, fortunes=False
)
BUILD = dict(chunk=300, workers=2, progress=False)


def _all_pairs(root: Path) -> dict[str, list[tuple[str, str]]]:
    return {s: load_pairs(root, s) for s in split_names(8)}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, dict]:
    if shutil.which("apertium") is None:
        pytest.skip("needs apertium")
    root = tmp_path_factory.mktemp("mt") / "corpus"
    return root, make_translation_corpus(root, **SETTINGS, **BUILD)


@needs_apertium
def test_paragraph_mode_keeps_sentences_aligned():
    sentences = ["The cat is black.", "I saw a blorfz.", "The man\n\nwalked   home.", "Hello."]
    out = translate_apertium(sentences, workers=2, chunk=3, progress=False)
    assert len(out) == 4
    assert "gato" in out[0] and "negro" in out[0]
    assert "blorfz" in out[1] and "*" not in out[1]  # -u: no unknown-word marks
    assert "hombre" in out[2] and "\n" not in out[2]  # blank line inside a sentence: one line
    assert out[3] == "Hola."


def test_misaligned_output_raises_naming_the_chunk(monkeypatch):
    def fake(text: str) -> str:  # drops the last paragraph of every call
        return "\n\n".join(text.strip("\n").split("\n\n")[:-1]) + "\n"

    monkeypatch.setattr(apertium, "_apertium", fake)
    with pytest.raises(CorpusError, match=r"chunk 0 \(0-1\).*1 paragraphs for 2 sentences"):
        translate_apertium(["One two three.", "Four five six."], workers=1, progress=False)
    with pytest.raises(ValueError, match="sentence 1 is empty"):
        translate_apertium(["One two three.", "  "], progress=False)


def test_shifted_output_with_the_right_count_raises(monkeypatch):
    # one paragraph split and another merged: the count matches, the pairs between are shifted
    sentences = [("word " * (2 + 5 * (i % 2))).strip() + "." for i in range(40)]

    def shifted(text: str) -> str:  # identity translation, but everything moved one down
        paras = text.strip("\n").split("\n\n")
        return "\n\n".join(["extra words here"] + paras[:-1]) + "\n"

    monkeypatch.setattr(apertium, "_apertium", shifted)
    with pytest.raises(CorpusError, match=r"chunk 0 .* outside \[0.5, 2\]"):
        translate_apertium(sentences, workers=1, progress=False)
    monkeypatch.setattr(apertium, "_apertium", lambda text: text)  # aligned: accepted
    assert translate_apertium(sentences, workers=1, progress=False) == sentences


def test_arguments_are_checked_by_name():
    with pytest.raises(ValueError, match="chunk"):
        translate_apertium(["a b c"], chunk=0)
    with pytest.raises(ValueError, match="workers"):
        translate_apertium(["a b c"], workers=0)
    with pytest.raises(ValueError, match="val"):
        make_translation_corpus("/nonexistent/x", val=-1)
    with pytest.raises(TypeError, match="limit"):
        make_translation_corpus("/nonexistent/x", limit=1.5)
    with pytest.raises(ValueError, match="max_train_words"):
        long_buckets(0)
    with pytest.raises(ValueError, match="fortunes"):
        english_sentences(fortunes="yes")


def test_clean_pairs_lowercases_filters_ratio_and_duplicates():
    src = ["The Cat  is black.", "the cat is BLACK.", "One two three four.", "A\tb c d", "x y z"]
    tgt = ["El gato es negro.", "otro", "uno", "Una\tB  c d", "a b c d e f g"]
    pairs, dup, ratio = _clean_pairs(src, tgt)
    assert pairs == [("the cat is black.", "el gato es negro."), ("a b c d", "una b c d")]
    assert dup == 1  # the second cat, by source after lower-casing
    assert ratio == 2  # 1/4 words and 7/3 words


def test_fortunes_keep_prose_only(tmp_path, monkeypatch):
    (tmp_path / "off").mkdir()
    (tmp_path / "off" / "rude").write_text("Rude words are here.\n%\n")
    (tmp_path / "jokes.dat").write_bytes(b"\x00\x01binary")
    (tmp_path / "jokes").write_text(
        "A day for firm decisions!  Or is it?\n%\n"
        "Be cheerful while you\nare alive.\n\t\t-- Phathotep, 24th Century B.C.\n%\n"
        "#define NULL 0 /* silly */\n%\n"
        "  ___  \n |o o| \n%\n"
        "B\bBo\bol\bld text is fine here.\n%\n"
        "Grandpa's Law:\n\nfragment of a line.\n"
    )
    monkeypatch.setattr(apertium, "FORTUNES_DIR", tmp_path)
    got = apertium.fortune_sentences()
    assert got == [
        "A day for firm decisions!",
        "Or is it?",
        "Be cheerful while you are alive.",
        "Bold text is fine here.",
    ]


@needs_apertium
def test_english_sentences_are_unique_one_line_and_sized():
    a = english_sentences(fortunes=False)
    assert len(a) > 100_000 and len(set(a)) == len(a)
    assert a[:1000] == english_sentences(fortunes=False)[:1000]
    assert all(3 <= len(s.split()) <= 80 and s == " ".join(s.split()) for s in a[:5000])
    assert any(c.isupper() for s in a[:5000] for c in s)  # original case


def test_long_buckets_follow_max_train_words():
    assert [b[0] for b in long_buckets(20)] == ["test_21-30", "test_31-40", "test_41+"]
    assert split_names(8) == [
        "train", "val", "test", "test_9-18", "test_19-28", "test_29+", "stacked"
    ]  # fmt: skip


@needs_apertium
def test_splits_are_disjoint_lowercase_and_bucketed(corpus):
    root, manifest = corpus
    splits = _all_pairs(root)
    assert manifest["counts"] == {k: len(v) for k, v in splits.items()}
    assert verify_translation_corpus(root) == manifest["counts"]
    assert (manifest["counts"]["val"], manifest["counts"]["test"]) == (40, 80)
    assert manifest["counts"]["train"] > 300 and 0.5 <= manifest["train_ratio"] <= 2
    sources = {k: {s for s, _ in v} for k, v in splits.items() if k != "stacked"}
    names = list(sources)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not sources[a] & sources[b], (a, b)
    for name in ("train", "val", "test"):
        assert all(len(s.split()) <= 8 for s in sources[name])
    for name, lo, hi in long_buckets(8):
        assert 0 < len(sources[name]) <= 20
        assert all(lo <= len(s.split()) <= (hi or 80) for s in sources[name])
    for pairs in splits.values():
        for s, t in pairs:
            assert s == s.lower() and t == t.lower() and "\t" not in s + t
            assert s == " ".join(s.split()) and t == " ".join(t.split())


def _segment(src: str, tgt: str, pool: dict[str, str], depth: int = 0) -> int | None:
    """How many pool pairs joined by spaces give (src, tgt); None when they cannot."""
    if not src and not tgt:
        return depth
    for s, t in pool.items():
        if src.startswith(s) and tgt.startswith(t):
            rest = _segment(src[len(s) :].lstrip(" "), tgt[len(t) :].lstrip(" "), pool, depth + 1)
            if rest is not None:
                return rest
    return None


@needs_apertium
def test_stacked_joins_two_to_four_held_out_pairs(corpus):
    root, manifest = corpus
    splits = _all_pairs(root)
    held_out = dict(p for k in ("test", *(b[0] for b in long_buckets(8))) for p in splits[k])
    stacked = splits["stacked"]
    assert len(stacked) == 8
    for src, tgt in stacked:
        assert _segment(src, tgt, held_out) in (2, 3, 4)
        assert _segment(src, tgt, dict(splits["train"])) is None


@needs_apertium
def test_same_settings_are_a_no_op_other_settings_raise(corpus, capsys, monkeypatch):
    root, manifest = corpus

    def no_translation(*args, **kwargs):
        raise AssertionError("a finished corpus was translated again")

    # a no-op: the finished corpus is read back without a translation step
    with monkeypatch.context() as m:
        m.setattr(translation, "_translate_cached", no_translation)
        assert make_translation_corpus(root, **SETTINGS, **BUILD) == manifest
    with pytest.raises(ValueError, match="seed=0.*seed=1"):
        make_translation_corpus(root, **{**SETTINGS, "seed": 1}, **BUILD)
    argv = ["--root", str(root), "--limit", "1200", "--val", "40", "--test", "80"]
    argv += ["--long-per-bucket", "20", "--stacked", "8", "--max-train-words", "8"]
    assert translation_main([*argv, "--no-fortunes", "--no-progress"]) == 0
    assert "val: 40 pairs" in capsys.readouterr().out
    assert translation_main([*argv, "--no-progress"]) == 2  # fortunes differs
    assert "fortunes=False" in capsys.readouterr().err


@needs_apertium
def test_interrupted_build_redoes_only_missing_chunks(corpus, tmp_path, caplog):
    root, manifest = corpus
    assert manifest["chunks"]["made"] == 4  # 1200 sentences in chunks of 300
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    (copy / "manifest.json").unlink()
    (copy / "chunks" / "00002.tsv").unlink()
    again = make_translation_corpus(copy, **SETTINGS, **BUILD)
    assert again["chunks"] == {"size": 300, "kept": 3, "made": 1, "redone": 0}
    assert _all_pairs(copy) == _all_pairs(root)
    assert again["counts"] == manifest["counts"]
    # a corrupt chunk (a line lost) is named and translated again, never skipped
    chunk = copy / "chunks" / "00001.tsv"
    chunk.write_text("".join(chunk.read_text().splitlines(keepends=True)[:-1]))
    (copy / "manifest.json").unlink()
    with caplog.at_level(logging.WARNING, logger="cape.lab.data.translation.corpus"):
        again = make_translation_corpus(copy, **SETTINGS, **BUILD)
    assert again["chunks"]["redone"] == 1 and "00001.tsv: 299 lines, expected 300" in caplog.text
    assert _all_pairs(copy) == _all_pairs(root)


@needs_apertium
def test_verify_and_load_name_the_bad_file(corpus, tmp_path):
    root, manifest = corpus
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    val = copy / "val.tsv"
    val.write_text("".join(val.read_text().splitlines(keepends=True)[:-1]))
    with pytest.raises(CorpusError, match=r"val\.tsv: 39 pairs, the manifest says 40"):
        verify_translation_corpus(copy)
    (copy / "test_9-18.tsv").unlink()
    with pytest.raises(CorpusError, match=r"test_9-18\.tsv: missing"):
        verify_translation_corpus(copy)
    with pytest.raises(FileNotFoundError, match=r"'dev'.*allowed: train, val, test"):
        load_pairs(copy, "dev")


@needs_apertium
def test_bpe_round_trip_special_ids_and_determinism(corpus, tmp_path):
    pytest.importorskip("sentencepiece")
    from cape.lab.data.translation.bpe import Tokenizer, train_bpe

    root, _ = corpus
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(root / "train.tsv", other / "train.tsv")
    path = train_bpe(root, vocab_size=400)
    assert path == root / "bpe400.model" and path.with_suffix(".vocab").is_file()
    assert train_bpe(other, vocab_size=400).read_bytes() == path.read_bytes()
    mtime = path.stat().st_mtime_ns
    assert train_bpe(root, vocab_size=400) == path and path.stat().st_mtime_ns == mtime
    tok = Tokenizer(path)
    assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id, tok.vocab_size) == (0, 1, 2, 3, 400)
    for src, tgt in load_pairs(root, "val")[:20]:
        for text in (src, tgt):
            ids = tok.encode(text)
            assert ids and min(ids) > 3 and tok.decode(ids) == text
    ids = tok.encode("el gato es negro")
    assert tok.decode([2, *ids, 3, 0, 0]) == tok.decode(ids) == "el gato es negro"
    assert tok.decode([2, *ids[:1], 3, *ids[1:]]) == tok.decode(ids[:1])  # stops at eos
    assert tok.encode_batch(["el gato", "negro"]) == [tok.encode("el gato"), tok.encode("negro")]
    clone = pickle.loads(pickle.dumps(tok))
    assert clone.path == tok.path and clone.encode("el gato es negro") == ids
    with pytest.raises(ValueError, match="vocab_size"):
        train_bpe(root, vocab_size=0)
    with pytest.raises(FileNotFoundError, match="model_path"):
        Tokenizer(root / "nope.model")
    with pytest.raises(TypeError, match="text"):
        tok.encode(3)  # type: ignore[arg-type]


def test_train_bpe_without_sentencepiece_names_the_package_before_reading(tmp_path, monkeypatch):
    from cape.lab.data.translation.bpe import train_bpe

    monkeypatch.setitem(__import__("sys").modules, "sentencepiece", None)  # import fails
    with pytest.raises(
        ImportError, match=r"needs sentencepiece: pip install 'cape\[translation\]'"
    ):
        train_bpe(tmp_path, vocab_size=100)  # no corpus there: the package is named first
