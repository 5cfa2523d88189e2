"""cape.lab.data.speech.tokens: the CTC letter vocabulary, greedy and prefix-beam decoding."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from cape.lab.data.speech.tokens import (
    BLANK,
    TOKENS,
    VOCAB_SIZE,
    ctc_beam_decode,
    ctc_collapse,
    ctc_greedy_decode,
    ctc_prefix_beam_search,
    decode,
    encode,
)


def test_vocabulary_layout():
    assert VOCAB_SIZE == 29 and BLANK == 0
    assert TOKENS[1] == "a" and TOKENS[26] == "z" and TOKENS[27] == "'" and TOKENS[28] == "|"


def test_encode_decode_roundtrip():
    ids = encode("  Don't   STOP me ")
    assert ids.dtype == torch.int64
    assert ids.tolist() == [4, 15, 14, 27, 20, 28, 19, 20, 15, 16, 28, 13, 5]
    assert decode(ids) == "don't stop me"
    assert encode("").tolist() == [] and decode([]) == ""
    assert decode([0, 8, 0, 9, 28, 28, 0]) == "hi"  # blanks skipped, boundaries collapse


def test_encode_unknown_characters():
    with pytest.raises(ValueError, match="vocabulary"):
        encode("hello, world")
    with pytest.raises(ValueError, match="vocabulary"):
        encode("a|b")
    assert decode(encode("hello, world 42 !", unknown="drop")) == "hello world"
    with pytest.raises(TypeError):
        encode(3)
    with pytest.raises(ValueError, match="ids"):
        decode([29])


def test_ctc_collapse():
    assert ctc_collapse([0, 1, 1, 0, 1, 2, 2, 0, 0, 3]) == [1, 1, 2, 3]
    assert ctc_collapse(torch.tensor([5, 5, 5])) == [5]
    assert ctc_collapse([]) == []


def _one_hot_scores(paths: list[list[int]], frames: int, peak: float = 0.97) -> torch.Tensor:
    """Per-frame distributions with `peak` mass on the path's token, the rest spread evenly."""
    lp = torch.full((len(paths), frames, VOCAB_SIZE), (1 - peak) / (VOCAB_SIZE - 1))
    for b, path in enumerate(paths):
        for t, s in enumerate(path):
            lp[b, t, s] = peak
    return lp.log()


def test_greedy_decode_collapses_and_respects_lengths():
    h, i, blank, bd = 8, 9, 0, 28
    path0 = [h, h, blank, i, i, bd, bd, h, blank, h]  # "hi hh"
    path1 = [i, blank, i, i, blank, blank, h, h, h, h]  # "iih" then garbage past length 3
    lp = _one_hot_scores([path0, path1], 10)
    assert ctc_greedy_decode(lp) == ["hi hh", "iih"]
    assert ctc_greedy_decode(lp, torch.tensor([10, 3])) == ["hi hh", "ii"]


def test_beam_matches_greedy_on_peaked_distributions():
    rng = np.random.default_rng(0)
    paths = [rng.integers(0, VOCAB_SIZE, size=25).tolist() for _ in range(4)]
    lp = _one_hot_scores(paths, 25, peak=0.99)
    lengths = torch.tensor([25, 20, 7, 0])
    assert ctc_beam_decode(lp, lengths, beam_width=4) == ctc_greedy_decode(lp, lengths)


def _brute_force(lp: np.ndarray) -> dict[tuple[int, ...], float]:
    """Every labelling's probability: the sum over all V^T frame paths that collapse to it."""
    frames, vocab = lp.shape
    probs: dict[tuple[int, ...], float] = {}
    for path in itertools.product(range(vocab), repeat=frames):
        label = tuple(ctc_collapse(list(path)))
        probs[label] = probs.get(label, 0.0) + math.exp(sum(lp[t, s] for t, s in enumerate(path)))
    return probs


@pytest.mark.parametrize("seed", range(6))
def test_beam_search_against_enumeration_of_all_paths(seed):
    rng = np.random.default_rng(seed)
    frames, vocab = 5, 3
    logits = rng.normal(scale=1.5, size=(frames, vocab))
    lp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    exact = _brute_force(lp)
    best = max(exact, key=exact.get)
    # a beam wide enough to never prune is exact for every labelling
    beam = ctc_prefix_beam_search(torch.from_numpy(lp), beam_width=1000)
    assert beam[0][0] == best
    assert len(beam) == len(exact)
    for label, score in beam:
        assert math.isclose(math.exp(score), exact[label], rel_tol=1e-9)
    assert math.isclose(sum(math.exp(s) for _, s in beam), 1.0, rel_tol=1e-9)
    # a narrow beam still finds the best labelling on these small examples
    assert ctc_prefix_beam_search(lp, beam_width=4)[0][0] == best


def test_beam_beats_greedy_where_paths_add_up():
    # two frames, p(blank) = 0.6, p(a) = 0.4: best path "" (0.36) but P("a") = 0.64
    lp = np.log(np.array([[0.6, 0.4], [0.6, 0.4]]))
    best, score = ctc_prefix_beam_search(lp, beam_width=2)[0]
    assert best == (1,) and math.isclose(math.exp(score), 0.64)
    scores = torch.full((1, 2, VOCAB_SIZE), -1e4)
    scores[0, :, 0] = math.log(0.6)
    scores[0, :, 1] = math.log(0.4)
    assert ctc_greedy_decode(scores) == [""]
    assert ctc_beam_decode(scores, beam_width=2) == ["a"]


def test_decoder_argument_checks():
    with pytest.raises(ValueError, match="log_probs"):
        ctc_greedy_decode(torch.zeros(1, 4, 10))
    with pytest.raises(ValueError, match="lengths"):
        ctc_greedy_decode(torch.zeros(1, 4, VOCAB_SIZE), torch.tensor([5]))
    with pytest.raises(ValueError, match="beam_width"):
        ctc_beam_decode(torch.zeros(1, 4, VOCAB_SIZE), beam_width=0)
    with pytest.raises(ValueError, match="blank"):
        ctc_prefix_beam_search(np.zeros((3, 2)), blank=2)
