"""cape.lab.metrics: own Levenshtein WER / CER, cross-checked against jiwer."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cape.lab.metrics import DURATION_BINS, cer, edit_distance, error_counts, wer, wer_by_bin


def _naive_distance(a, b) -> int:
    """The textbook full-table dynamic programme (independent of the vectorised rows)."""
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) + 1):
        table[i][0] = i
    for j in range(len(b) + 1):
        table[0][j] = j
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            table[i][j] = min(
                table[i - 1][j] + 1, table[i][j - 1] + 1, table[i - 1][j - 1] + (a[i - 1] != b[j - 1])
            )
    return table[-1][-1]


def test_edit_distance_known_values():
    assert edit_distance("kitten", "sitting") == 3
    assert edit_distance("", "abc") == 3 and edit_distance("abc", "") == 3
    assert edit_distance([], []) == 0
    assert edit_distance("the cat sat".split(), "the cat sat down".split()) == 1
    assert edit_distance("abcdef", "fedcba") == 6


def test_edit_distance_against_naive_table():
    rng = np.random.default_rng(0)
    for _ in range(300):
        a = rng.integers(0, 4, size=rng.integers(0, 12)).tolist()
        b = rng.integers(0, 4, size=rng.integers(0, 12)).tolist()
        assert edit_distance(a, b) == _naive_distance(a, b)


def _random_sentences(rng, n):
    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "it's", "x"]
    out = []
    for _ in range(n):
        out.append(" ".join(rng.choice(words, size=rng.integers(1, 12))))
    return out


def test_wer_and_cer_match_jiwer():
    jiwer = pytest.importorskip("jiwer")
    rng = np.random.default_rng(1)
    refs = _random_sentences(rng, 40)
    hyps = _random_sentences(rng, 40)
    hyps[3] = refs[3]
    hyps[5] = ""  # all deletions
    assert math.isclose(wer(refs, hyps), jiwer.wer(refs, hyps), rel_tol=1e-12)
    assert math.isclose(cer(refs, hyps), jiwer.cer(refs, hyps), rel_tol=1e-12)
    for r, h in zip(refs[:10], hyps[:10], strict=True):
        assert math.isclose(wer(r, h), jiwer.wer(r, h), rel_tol=1e-12)


def test_corpus_level_not_mean_of_utterances():
    refs, hyps = ["a b c d", "e"], ["a b c d", "f"]
    assert wer(refs, hyps) == pytest.approx(1 / 5)  # mean of per-utterance rates would be 0.5
    assert error_counts("a  b", "a") == {"word_edits": 1, "words": 2, "char_edits": 2, "chars": 3}
    assert wer("a", "a b c") == 2.0  # insertions can push WER past 1


def test_metric_errors():
    with pytest.raises(ValueError, match="same length"):
        wer(["a"], ["a", "b"])
    with pytest.raises(ValueError, match="no words"):
        wer([""], ["a"])
    with pytest.raises(TypeError, match="hyps"):
        cer(["a"], [3])


def test_wer_by_bin():
    durations = [1.0, 5.9, 6.0, 12.0, 44.0, 50.0]
    refs = ["a b", "c d e", "f", "g h", "i j k l", "m"]
    hyps = ["a b", "c x", "f", "", "i j k l m", "n"]
    rows = wer_by_bin(durations, refs, hyps)
    assert [(r["low"], r["high"]) for r in rows] == [tuple(map(float, b)) for b in DURATION_BINS]
    by = {(r["low"], r["high"]): r for r in rows}
    first = by[(0.0, 6.0)]
    assert first["count"] == 2 and first["words"] == 5 and first["word_edits"] == 2
    assert first["wer"] == pytest.approx(wer(refs[:2], hyps[:2]))
    assert first["cer"] == pytest.approx(cer(refs[:2], hyps[:2]))
    assert by[(6.0, 10.0)]["count"] == 1 and by[(6.0, 10.0)]["wer"] == 0.0
    assert by[(10.0, 15.0)]["wer"] == 1.0
    assert by[(15.0, 20.0)]["count"] == 0 and math.isnan(by[(15.0, 20.0)]["wer"])
    assert by[(30.0, 45.0)]["wer"] == pytest.approx(0.25)
    assert sum(r["count"] for r in rows) == 5  # 50 s lies outside every bin
    custom = wer_by_bin(durations, refs, hyps, bins=[(0, 100)])
    assert custom[0]["wer"] == pytest.approx(wer(refs, hyps))
    with pytest.raises(ValueError, match="durations"):
        wer_by_bin([1.0], refs, hyps)
    with pytest.raises(ValueError, match="bins"):
        wer_by_bin(durations, refs, hyps, bins=[(5, 5)])
