"""The CTC letter vocabulary of CAPE's ASR models and CTC decoding (CAPE sec. 5.2, app. C.2).

"Our token set consists of 26 English alphabet letters, augmented with the apostrophe and a word
boundary token." Here that is 28 output tokens plus the CTC blank, 29 classes in all:

    index 0      : the CTC blank ("<b>"), never produced by `encode`
    indices 1-26 : "a" ... "z"
    index 27     : "'" (apostrophe)
    index 28     : "|" (word boundary)

`encode` lower-cases the text and writes the boundary *between* words only ("hi there" ->
h i | t h e r e); `decode` maps "|" back to a single space. So `CTCModel(VOCAB_SIZE)` gives the
right output width, with blank = 0 as `torch.nn.functional.ctc_loss` expects by default.

Decoders: `ctc_greedy_decode` (best path: argmax per frame, collapse repeats, drop blanks) and
`ctc_beam_decode` (CTC prefix beam search without a language model, which sums the
probabilities of all paths of a labelling, kept to `beam_width` prefixes per frame).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
import torch

from cape._checks import check_choice, check_int, check_lengths, check_tensor

__all__ = [
    "BLANK",
    "BOUNDARY",
    "TOKENS",
    "VOCAB_SIZE",
    "encode",
    "decode",
    "ctc_collapse",
    "ctc_greedy_decode",
    "ctc_prefix_beam_search",
    "ctc_beam_decode",
]

BLANK = 0
BOUNDARY = "|"
TOKENS: tuple[str, ...] = ("<b>", *"abcdefghijklmnopqrstuvwxyz", "'", BOUNDARY)
VOCAB_SIZE = len(TOKENS)  # 29 = blank + 26 letters + apostrophe + word boundary
_INDEX = {t: i for i, t in enumerate(TOKENS) if i != BLANK}


def encode(text: str, *, unknown: str = "error") -> torch.Tensor:
    """text -> token ids [N] int64 (never the blank).

    Lower-cases, splits on whitespace and joins the words with "|". unknown: "error" raises
    ValueError on a character outside a-z, "'" (after lower-casing; "|" in the text is also
    refused), "drop" removes such characters (a word left empty disappears).
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    check_choice("unknown", unknown, ("error", "drop"))
    words = []
    for word in text.lower().split():
        kept = []
        for ch in word:
            if ch in _INDEX and ch != BOUNDARY:
                kept.append(_INDEX[ch])
            elif unknown == "error":
                raise ValueError(
                    f'text has a character outside the vocabulary (a-z and "\'"): {ch!r} in '
                    f"{text!r}; pass unknown='drop' to remove such characters"
                )
        if kept:
            words.append(kept)
    ids: list[int] = []
    for i, word in enumerate(words):
        if i:
            ids.append(_INDEX[BOUNDARY])
        ids.extend(word)
    return torch.tensor(ids, dtype=torch.int64)


def _as_id_list(name: str, ids: torch.Tensor | np.ndarray | Sequence[int]) -> list[int]:
    if isinstance(ids, torch.Tensor):
        if ids.dim() != 1 or ids.is_floating_point() or ids.dtype == torch.bool:
            raise ValueError(
                f"{name} must be a 1-D integer tensor, got {ids.dtype} {tuple(ids.shape)}"
            )
        out = ids.tolist()
    else:
        out = [int(i) for i in np.asarray(ids).reshape(-1)] if len(ids) else []
    bad = [i for i in out if not 0 <= i < VOCAB_SIZE]
    if bad:
        raise ValueError(f"{name} must lie in [0, {VOCAB_SIZE}), got {bad[:5]}")
    return out


def decode(ids: torch.Tensor | np.ndarray | Sequence[int]) -> str:
    """token ids [N] -> text: blanks skipped, "|" becomes a space, spaces collapsed and stripped.

    No CTC collapsing of repeats (use `ctc_collapse` or the CTC decoders for frame outputs).
    """
    chars = [TOKENS[i] for i in _as_id_list("ids", ids) if i != BLANK]
    return " ".join("".join(chars).replace(BOUNDARY, " ").split())


def ctc_collapse(path: torch.Tensor | np.ndarray | Sequence[int]) -> list[int]:
    """A CTC frame path [T] -> its labelling: merge runs of equal ids, then drop blanks."""
    return [i for i, _ in itertools.groupby(_as_id_list("path", path)) if i != BLANK]


def _check_scores(log_probs: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    check_tensor("log_probs", log_probs, ndims=(3,), floating=True)
    batch, frames, vocab = log_probs.shape
    if vocab != VOCAB_SIZE:
        raise ValueError(
            f"log_probs must have shape [B, T, {VOCAB_SIZE}], got {tuple(log_probs.shape)}"
        )
    if lengths is None:
        return torch.full((batch,), frames, dtype=torch.int64)
    check_lengths("lengths", lengths, batch, frames)
    return lengths.to("cpu", torch.int64)


def ctc_greedy_decode(log_probs: torch.Tensor, lengths: torch.Tensor | None = None) -> list[str]:
    """Best-path decoding: log_probs [B, T, 29] (any scores), lengths [B] | None -> B strings.

    Argmax per frame (on log_probs' device), then per sample: the first lengths[b] frames,
    repeats merged, blanks dropped, decoded with `decode`. One host copy of the [B, T] argmax.
    """
    lengths = _check_scores(log_probs, lengths)
    best = log_probs.argmax(dim=-1).cpu()  # [B, T]
    return [decode(ctc_collapse(best[b, : int(n)])) for b, n in enumerate(lengths)]


def _logsumexp(a: float, b: float) -> float:
    if a == -math.inf:
        return b
    if b == -math.inf:
        return a
    hi, lo = (a, b) if a >= b else (b, a)
    return hi + math.log1p(math.exp(lo - hi))


def _accumulate(
    beams: dict[tuple[int, ...], list[float]], prefix: tuple[int, ...], slot: int, value: float
) -> None:
    """beams[prefix][slot] = logsumexp(beams[prefix][slot], value), creating the entry (not
    for an impossible extension: value -inf)."""
    if value == -math.inf:
        return
    entry = beams.setdefault(prefix, [-math.inf, -math.inf])
    entry[slot] = _logsumexp(entry[slot], value)


def ctc_prefix_beam_search(
    log_probs: torch.Tensor | np.ndarray, *, beam_width: int = 8, blank: int = BLANK
) -> list[tuple[tuple[int, ...], float]]:
    """CTC prefix beam search of one utterance: log_probs [T, V] -> [(labelling, log prob)].

    Each prefix keeps two log probabilities: of the paths so far that end in a blank and that
    end in its last label. Per frame every prefix is extended by every symbol (a repeat of the
    last label extends the prefix only after a blank) and the `beam_width` most probable
    prefixes are kept. Returns the final beam, best first; the score of a labelling is the
    log of the summed probability of its kept paths (exact when the beam never prunes).
    log_probs must be normalised per frame (log_softmax) for the scores to be probabilities.
    """
    check_int("beam_width", beam_width)
    lp = (
        log_probs.detach().cpu().double().numpy()
        if isinstance(log_probs, torch.Tensor)
        else (np.asarray(log_probs, dtype=np.float64))
    )
    if lp.ndim != 2:
        raise ValueError(f"log_probs must have shape [T, V], got {lp.shape}")
    vocab = lp.shape[1]
    check_int("blank", blank, minimum=0)
    if blank >= vocab:
        raise ValueError(f"blank must be < V = {vocab}, got {blank}")
    neg = -math.inf
    # prefix -> (log P(paths ending in blank), log P(paths ending in the prefix's last label))
    beam: dict[tuple[int, ...], tuple[float, float]] = {(): (0.0, neg)}
    for frame in lp:
        frame_list = frame.tolist()
        nxt: dict[tuple[int, ...], list[float]] = {}
        for prefix, (p_blank, p_label) in beam.items():
            total = _logsumexp(p_blank, p_label)
            last = prefix[-1] if prefix else None
            for s, p in enumerate(frame_list):
                if p == neg:
                    continue
                if s == blank:
                    _accumulate(nxt, prefix, 0, total + p)
                elif s == last:
                    _accumulate(
                        nxt, prefix, 1, p_label + p
                    )  # repeat without a blank: same labelling
                    _accumulate(nxt, prefix + (s,), 1, p_blank + p)  # blank in between: a new label
                else:
                    _accumulate(nxt, prefix + (s,), 1, total + p)
        if not nxt:
            raise ValueError("log_probs has a frame where every symbol has probability 0 (-inf)")
        ranked = sorted(nxt.items(), key=lambda kv: -_logsumexp(kv[1][0], kv[1][1]))
        beam = {k: (v[0], v[1]) for k, v in ranked[:beam_width]}
    out = [(k, _logsumexp(*v)) for k, v in beam.items()]
    out.sort(key=lambda kv: -kv[1])
    return out


def ctc_beam_decode(
    log_probs: torch.Tensor, lengths: torch.Tensor | None = None, *, beam_width: int = 8
) -> list[str]:
    """Prefix beam search (no LM): log_probs [B, T, 29] log_softmax, lengths [B] -> B strings.

    Per sample, the most probable labelling over its first lengths[b] frames among those kept
    by `ctc_prefix_beam_search`, decoded with `decode`. Pure Python per frame: for evaluation.
    """
    lengths = _check_scores(log_probs, lengths)
    check_int("beam_width", beam_width)
    scores = log_probs.detach().cpu().double()
    texts = []
    for b, n in enumerate(lengths.tolist()):
        best = ctc_prefix_beam_search(scores[b, :n], beam_width=beam_width)[0][0]
        texts.append(decode(list(best)))
    return texts
