"""cape.lab.metrics: WER / CER (edits counted by jiwer) and their corpus-level and per-duration-bin
aggregation, checked against counts worked out by hand and a textbook edit-distance table."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cape.lab.metrics import DURATION_BINS, cer, error_counts, wer, wer_by_bin


def _naive_distance(a, b) -> int:
    """The textbook full-table dynamic programme (independent of jiwer)."""
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) + 1):
        table[i][0] = i
    for j in range(len(b) + 1):
        table[0][j] = j
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            table[i][j] = min(
                table[i - 1][j] + 1,
                table[i][j - 1] + 1,
                table[i - 1][j - 1] + (a[i - 1] != b[j - 1]),
            )
    return table[-1][-1]


@pytest.mark.parametrize(
    ("ref", "hyp", "expected"),
    [
        # identical: no edit; 11 characters with the two spaces
        ("the cat sat", "the cat sat", (0, 3, 0, 11)),
        # cat -> bat (1 word sub, 1 char sub), "down" inserted (1 word, " down" = 5 chars)
        ("the cat sat", "the bat sat down", (2, 3, 6, 11)),
        # everything deleted
        ("a b c d", "", (4, 4, 7, 7)),
        # nothing to match: insertions only, no reference word
        ("", "x y", (2, 0, 3, 0)),
        # one word each; kitten -> sitting is 3 character edits (k->s, e->i, +g)
        ("kitten", "sitting", (1, 1, 3, 6)),
        # swapped words: 2 word subs; "a b" -> "b a" is 2 char subs
        ("a b", "b a", (2, 2, 2, 3)),
        # runs of whitespace count as one space: "a b" (3 chars) against "a"
        ("  a\tb ", "a", (1, 2, 2, 3)),
    ],
)
def test_error_counts_by_hand(ref: str, hyp: str, expected: tuple[int, int, int, int]) -> None:
    keys = ("word_edits", "words", "char_edits", "chars")
    assert error_counts(ref, hyp) == dict(zip(keys, expected, strict=True))


def _random_sentences(rng, n):
    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "it's", "x"]
    return [" ".join(rng.choice(words, size=rng.integers(0, 12))) for _ in range(n)]


def test_error_counts_match_a_textbook_edit_distance() -> None:
    rng = np.random.default_rng(1)
    refs, hyps = _random_sentences(rng, 200), _random_sentences(rng, 200)
    for r, h in zip(refs, hyps, strict=True):
        c = error_counts(r, h)
        assert c["word_edits"] == _naive_distance(r.split(), h.split())
        assert c["char_edits"] == _naive_distance(r, h)  # single spaces already
        assert (c["words"], c["chars"]) == (len(r.split()), len(r))


def test_corpus_level_not_mean_of_utterances() -> None:
    refs, hyps = ["a b c d", "e"], ["a b c d", "f"]
    assert wer(refs, hyps) == pytest.approx(1 / 5)  # mean of per-utterance rates would be 0.5
    assert cer(refs, hyps) == pytest.approx(1 / 8)  # 7 + 1 characters, one substitution
    assert wer("a", "a b c") == 2.0  # insertions can push WER past 1
    # 3 + 5 reference words; edits 1 (sub) + 2 (one sub, one deletion)
    assert wer(["a b c", "d e f g h"], ["a x c", "d e y g"]) == pytest.approx(3 / 8)


def test_metric_errors() -> None:
    with pytest.raises(ValueError, match="same length"):
        wer(["a"], ["a", "b"])
    with pytest.raises(ValueError, match="no words"):
        wer([""], ["a"])
    with pytest.raises(ValueError, match="no characters"):
        cer(["  "], ["a"])
    with pytest.raises(TypeError, match="hyps"):
        cer(["a"], [3])
    with pytest.raises(TypeError, match="refs must be a str or a list"):
        wer(7, ["a"])


DURATIONS = [1.0, 5.9, 6.0, 12.0, 44.0, 50.0]
REFS = ["a b", "c d e", "f", "g h", "i j k l", "m"]
HYPS = ["a b", "c x", "f", "", "i j k l m", "n"]
# per utterance, by hand: (word_edits, words, char_edits, chars)
#   "a b"/"a b" 0,2,0,3 | "c d e"/"c x" d->x, -e: 2,3 ; chars d->x, -" e": 3,5 | "f"/"f" 0,1,0,1
#   "g h"/"" 2,2,3,3 | "i j k l"/"+m" 1,4 ; +" m" 2,7 | "m"/"n" 1,1,1,1


def test_wer_by_bin_default_bins() -> None:
    rows = wer_by_bin(DURATIONS, REFS, HYPS)
    assert [(r["low"], r["high"]) for r in rows] == [tuple(map(float, b)) for b in DURATION_BINS]
    by = {(int(r["low"]), int(r["high"])): r for r in rows}
    counted = ("count", "words", "word_edits", "chars", "char_edits")
    assert tuple(by[0, 6][k] for k in counted) == (2, 5, 2, 8, 3)
    assert (by[0, 6]["wer"], by[0, 6]["cer"]) == pytest.approx((2 / 5, 3 / 8))
    assert tuple(by[6, 10][k] for k in counted) == (1, 1, 0, 1, 0)  # 6.0 s: low is inclusive
    assert (by[6, 10]["wer"], by[6, 10]["cer"]) == (0.0, 0.0)
    assert tuple(by[10, 15][k] for k in counted) == (1, 2, 2, 3, 3)
    assert (by[10, 15]["wer"], by[10, 15]["cer"]) == (1.0, 1.0)
    for empty in ((15, 20), (20, 30)):
        assert tuple(by[empty][k] for k in counted) == (0, 0, 0, 0, 0)
        assert math.isnan(by[empty]["wer"]) and math.isnan(by[empty]["cer"])
    assert tuple(by[30, 45][k] for k in counted) == (1, 4, 1, 7, 2)
    assert (by[30, 45]["wer"], by[30, 45]["cer"]) == pytest.approx((1 / 4, 2 / 7))
    assert sum(r["count"] for r in rows) == 5  # 50 s lies outside every bin


def test_wer_by_bin_custom_and_overlapping_bins() -> None:
    (whole,) = wer_by_bin(DURATIONS, REFS, HYPS, bins=[(0, 100)])
    assert (whole["count"], whole["words"], whole["word_edits"]) == (6, 13, 6)
    assert (whole["chars"], whole["char_edits"]) == (20, 9)
    assert (whole["wer"], whole["cer"]) == pytest.approx((6 / 13, 9 / 20))
    # overlapping bins: an utterance counts in each bin that holds it
    low, high = wer_by_bin(np.array(DURATIONS), REFS, HYPS, bins=[(0, 7), (5, 13)])
    assert (low["count"], low["words"], low["word_edits"]) == (3, 6, 2)
    assert (high["count"], high["words"], high["word_edits"]) == (3, 6, 4)
    assert high["wer"] == pytest.approx(4 / 6)


def test_wer_by_bin_errors() -> None:
    with pytest.raises(ValueError, match="durations must have one entry per utterance"):
        wer_by_bin([1.0], REFS, HYPS)
    with pytest.raises(ValueError, match="durations must be finite"):
        wer_by_bin([-1.0, *DURATIONS[1:]], REFS, HYPS)
    with pytest.raises(ValueError, match=r"bins\[0\] must have low < high"):
        wer_by_bin(DURATIONS, REFS, HYPS, bins=[(5, 5)])
    with pytest.raises(TypeError, match=r"bins\[1\] must be a \(low, high\) pair"):
        wer_by_bin(DURATIONS, REFS, HYPS, bins=[(0, 5), 7])
