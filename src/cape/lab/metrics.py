"""Word and character error rates for CAPE's ASR evaluation (CAPE sec. 5.2, Table 2, Figs 6-8).

Corpus-level rates, as ASR papers report them: WER = (total word edits) / (total reference
words) over all utterances, edits being the Levenshtein distance (substitutions, deletions and
insertions, each of cost 1), counted by `jiwer`. CER is the same over characters.

Text conventions (`jiwer`'s defaults for clean text): words are `text.split()`; the characters
of an utterance are those of `" ".join(text.split())`, spaces between words included. No other
normalisation (case, punctuation) is done: normalise before scoring.

`wer_by_bin` splits a test set by utterance duration (CAPE's Figures 6-8 plot WER against
duration bins of the test audio) and scores each bin as a corpus.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from cape.lab.data.speech.synth import DURATION_BINS  # the test corpus' bins: wer_by_bin's default

__all__ = ["DURATION_BINS", "wer", "cer", "error_counts", "wer_by_bin"]

_COUNTS = ("words", "chars", "word_edits", "char_edits")


def _texts(name: str, value: str | Sequence[str]) -> list[str]:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} must be a str or a list of str, got {type(value).__name__}")
    for i, v in enumerate(value):
        if not isinstance(v, str):
            raise TypeError(f"{name}[{i}] must be a str, got {type(v).__name__}")
    return list(value)


def _pairs(refs: str | Sequence[str], hyps: str | Sequence[str]) -> list[tuple[str, str]]:
    r, h = _texts("refs", refs), _texts("hyps", hyps)
    if len(r) != len(h):
        raise ValueError(f"refs and hyps must have the same length, got {len(r)} and {len(h)}")
    return list(zip(r, h, strict=True))


def error_counts(ref: str, hyp: str) -> dict[str, int]:
    """One utterance -> {"word_edits", "words", "char_edits", "chars"} (reference sizes)."""
    rc, hc = " ".join(ref.split()), " ".join(hyp.split())
    import jiwer  # the speech extra: imported where it counts, so other studies' help needs none

    words, chars = jiwer.process_words(rc, hc), jiwer.process_characters(rc, hc)
    return {
        "word_edits": words.substitutions + words.deletions + words.insertions,
        "words": len(ref.split()),
        "char_edits": chars.substitutions + chars.deletions + chars.insertions,
        "chars": len(rc),
    }


def _rate(edits: int, total: int, what: str) -> float:
    if total == 0:
        raise ValueError(f"the references hold no {what}: the error rate is undefined")
    return edits / total


def wer(refs: str | Sequence[str], hyps: str | Sequence[str]) -> float:
    """Corpus word error rate: sum of word edit distances / total reference words (a fraction;
    x 100 for %). refs, hyps: one string each or equal-length lists. Can exceed 1 (insertions).
    Raises ValueError when the references have no word at all."""
    counts = [error_counts(r, h) for r, h in _pairs(refs, hyps)]
    return _rate(sum(c["word_edits"] for c in counts), sum(c["words"] for c in counts), "words")


def cer(refs: str | Sequence[str], hyps: str | Sequence[str]) -> float:
    """Corpus character error rate over `" ".join(text.split())` (spaces count as characters)."""
    counts = [error_counts(r, h) for r, h in _pairs(refs, hyps)]
    edits, chars = sum(c["char_edits"] for c in counts), sum(c["chars"] for c in counts)
    return _rate(edits, chars, "characters")


def wer_by_bin(
    durations: Sequence[float] | np.ndarray,
    refs: Sequence[str],
    hyps: Sequence[str],
    bins: Sequence[tuple[float, float]] = DURATION_BINS,
) -> list[dict[str, float]]:
    """Corpus WER and CER per duration bin: one dict per bin, in the order of `bins`.

    durations: [N] seconds of the N utterances; bins: (low, high) seconds, an utterance falls in
    every bin with low <= duration < high (overlapping bins are allowed; utterances outside all
    bins are not counted). Each dict: low, high, count (utterances), words, chars (reference
    sizes), word_edits, char_edits, wer, cer (corpus-level within the bin; NaN when the bin has
    no reference word / character).
    """
    pairs = _pairs(refs, hyps)
    d = np.asarray(durations, dtype=np.float64).reshape(-1)
    if d.size != len(pairs):
        raise ValueError(
            f"durations must have one entry per utterance ({len(pairs)}), got {d.size}"
        )
    if not np.all(np.isfinite(d)) or np.any(d < 0):
        raise ValueError("durations must be finite and >= 0 seconds")
    checked = []
    for i, b in enumerate(bins):
        if not isinstance(b, (tuple, list)) or len(b) != 2:
            raise TypeError(f"bins[{i}] must be a (low, high) pair, got {b!r}")
        lo, hi = float(b[0]), float(b[1])
        if not lo < hi:
            raise ValueError(f"bins[{i}] must have low < high, got {tuple(b)}")
        checked.append((lo, hi))
    counts = [error_counts(r, h) for r, h in pairs]
    out = []
    for lo, hi in checked:
        members = [c for c, t in zip(counts, d, strict=True) if lo <= t < hi]
        sums = {k: sum(c[k] for c in members) for k in _COUNTS}
        row = {"low": lo, "high": hi, "count": len(members), **sums}
        row["wer"] = row["word_edits"] / row["words"] if row["words"] else math.nan
        row["cer"] = row["char_edits"] / row["chars"] if row["chars"] else math.nan
        out.append(row)
    return out
