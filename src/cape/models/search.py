"""Decoding for `Seq2Seq`: greedy search, beam search and teacher-forced per-token NLL.

All three run under `torch.inference_mode()` in eval mode (each module's mode restored after),
so positions are the deterministic eval-mode ones. The source is encoded once. By default the
decoder runs incrementally (`Seq2Seq.start_decoding` / `decode_step`: a key/value cache per
self-attention layer, the memory's cross-attention keys/values projected once), equal to a
teacher-forced pass up to float rounding; `cache=False` re-runs the decoder over the whole
prefix at every step (O(T^2) decoder cost per sentence: the reference).
An xPos without `xpos_center` is centred once for the whole search, where the centre cancels in
the logits, so it takes the cache too (`centred_xpos`). Only the last position is projected.

The padding token is never generated (its log-probability is set to -inf, without
renormalising the others, so scores stay the model's log-probabilities). The only host
synchronisations are the maximum length at the start and one stopping test per step (in
beam search with the cache, the `nonzero` of the sentences still active).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from .._checks import check_float, check_int, check_mask, check_tensor
from ..encodings.rotary import Rotary
from .decode_cache import DecoderCache
from .seq2seq import Seq2Seq, _check_tokens

__all__ = ["can_cache", "centred_xpos", "greedy_decode", "beam_search", "sequence_nll"]


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    # each module's own mode comes back: a frozen part in eval mode stays so
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        for m, training in modes:
            m.training = training


def _check_inputs(
    model: Seq2Seq, src: torch.Tensor, src_mask: torch.Tensor, ids: dict[str, int]
) -> None:
    if not isinstance(model, Seq2Seq):
        raise TypeError(f"model must be a cape Seq2Seq, got {type(model).__name__}")
    check_tensor("src", src, ndims=(2,))
    check_tensor("src_mask", src_mask, ndims=(2,))
    if src_mask.dtype != torch.bool or src_mask.shape != src.shape:
        raise ValueError(
            f"src_mask must be bool of shape {list(src.shape)}, "
            f"got {src_mask.dtype} {list(src_mask.shape)}"
        )
    for name, value in ids.items():
        check_int(name, value, minimum=0)
        if value >= model.vocab_size:
            raise ValueError(f"{name} must lie in [0, vocab_size={model.vocab_size}), got {value}")
    if ids.get("eos_id") == model.pad_id:
        raise ValueError(f"eos_id must differ from the model's pad_id ({model.pad_id})")


def _step_log_probs(
    model: Seq2Seq, tokens: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor
) -> torch.Tensor:
    """Log-probabilities of the next token after `tokens` [N, t] -> [N, V] float32, pad = -inf."""
    return _log_probs(model, model.decode(tokens, memory, memory_mask, last_only=True)[:, -1])


def _log_probs(model: Seq2Seq, logits: torch.Tensor) -> torch.Tensor:
    """Logits [N, V] -> log-probabilities [N, V], pad = -inf."""
    lp = logits.log_softmax(dim=-1)
    lp[:, model.pad_id] = float("-inf")
    return lp


def _strip(rows: torch.Tensor, eos_id: int, pad_id: int) -> list[list[int]]:
    """Generated ids [B, L] -> lists cut at the first EOS or padding (neither included)."""
    out = []
    for row in rows.tolist():
        n = len(row)
        for i, tok in enumerate(row):
            if tok == eos_id or tok == pad_id:
                n = i
                break
        out.append(row[:n])
    return out


def max_lengths(src_mask: torch.Tensor, max_len_a: float, max_len_b: float) -> torch.Tensor:
    """Per-sentence step limit floor(a * source_length + b) (>= 1) -> [B] int64.

    source_length counts the real source tokens (BOS/EOS included when the source has them). A
    step generates one token, EOS included: an output has at most limit - 1 tokens plus EOS, or
    `limit` tokens without EOS when the search ran out of steps.
    """
    check_tensor("src_mask", src_mask, ndims=(2,))
    check_mask("src_mask", src_mask, src_mask.shape)
    a = check_float("max_len_a", max_len_a)
    b = check_float("max_len_b", max_len_b, minimum=-float("inf"))
    lengths = src_mask.sum(dim=1).to(torch.float64)
    return torch.floor(a * lengths + b).to(torch.int64).clamp_min(1)


@contextlib.contextmanager
def centred_xpos(model: torch.nn.Module, centre: int | None) -> Iterator[None]:
    """Within the block, every xPos rotary of `model` without `xpos_center` is centred at
    `centre` (None: left as it is). The centre cancels in q . k (q is scaled by
    zeta^((n - c) / base), k by zeta^(-(m - c) / base)), so the logits are the same up to float
    rounding, and a key scaled once stays valid in a key/value cache."""
    mods = [] if centre is None else [
        m for m in model.modules() if isinstance(m, Rotary) and m.xpos and m.xpos_center is None
    ]  # fmt: skip
    for m in mods:
        m.xpos_center = float(centre)
    try:
        yield
    finally:
        for m in mods:
            m.xpos_center = None


def can_cache(model: Seq2Seq) -> bool:
    """Whether `model`'s decoder can decode incrementally: every rotary in it rotates a key by
    that key's own position (`cape.Rotary.cacheable`; per-call RoPE scaling does not, nor does
    an xPos without `xpos_center` outside `centred_xpos`)."""
    return all(m.cacheable for m in model.decoder.modules() if isinstance(m, Rotary))


def greedy_decode(
    model: Seq2Seq,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    *,
    bos_id: int,
    eos_id: int,
    max_len: int | torch.Tensor,
    cache: bool = True,
) -> list[list[int]]:
    """Argmax decoding. src [B, S] ids, src_mask [B, S] bool -> B lists of ids (no BOS/EOS).

    max_len: steps per sentence (int, or [B] integer tensor, see `max_lengths`): at most
    max_len tokens are generated, EOS included; a sentence stops at its first EOS.
    cache: decode incrementally (key/value cache) where the decoder allows it (`can_cache`);
    False = re-run the decoder over every prefix (the reference computation; same results up
    to float rounding).
    """
    _check_inputs(model, src, src_mask, {"bos_id": bos_id, "eos_id": eos_id})
    batch = src.shape[0]
    if isinstance(max_len, torch.Tensor):
        check_tensor("max_len", max_len, ndims=(1,))
        if max_len.shape[0] != batch or max_len.is_floating_point() or max_len.dtype == torch.bool:
            raise ValueError(
                f"max_len must be an int or a [{batch}] integer tensor, got {max_len.dtype} "
                f"{list(max_len.shape)}"
            )
        limits = max_len.to(src.device, torch.int64)
    else:
        limits = torch.full((batch,), check_int("max_len", max_len, minimum=0), device=src.device)
    with _eval_mode(model):
        memory = model.encode(src, src_mask)
        steps = int(limits.max()) if batch else 0
        tokens = torch.full((batch, steps + 1), model.pad_id, dtype=torch.long, device=src.device)
        tokens[:, 0] = bos_id
        with centred_xpos(model.decoder, steps // 2 if cache else None):
            state = model.start_decoding(memory, src_mask) if cache and can_cache(model) else None
            tokens = _greedy_steps(model, tokens, memory, src_mask, state, limits, eos_id)
    return _strip(tokens[:, 1:], eos_id, model.pad_id)


def _greedy_steps(
    model: Seq2Seq,
    tokens: torch.Tensor,
    memory: torch.Tensor,
    src_mask: torch.Tensor,
    state: DecoderCache | None,
    limits: torch.Tensor,
    eos_id: int,
) -> torch.Tensor:
    """`greedy_decode`'s loop: tokens [B, steps + 1] (BOS first) filled in place, each step
    from the cache (`state`) or, with None, a decoder run over the prefix."""
    alive = limits > 0
    for t in range(tokens.shape[1] - 1):
        if state is not None:
            lp = _log_probs(model, model.decode_step(tokens[:, t : t + 1], state)[0])
        else:
            lp = _step_log_probs(model, tokens[:, : t + 1], memory, src_mask)
        nxt = lp.argmax(dim=-1)
        tokens[:, t + 1] = torch.where(alive, nxt, model.pad_id)
        alive = alive & (nxt != eos_id) & (t + 1 < limits)
        if not bool(alive.any()):
            break
    return tokens


def beam_search(
    model: Seq2Seq,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    *,
    bos_id: int,
    eos_id: int,
    beam: int = 4,
    max_len_a: float = 1.5,
    max_len_b: float = 10,
    length_penalty: float = 1.0,
    cache: bool = True,
) -> list[list[int]]:
    """Beam search over B sentences x `beam` hypotheses -> B lists of ids (no BOS/EOS).

    Each step scores every extension of the live hypotheses; of the best `beam` candidates,
    those ending in EOS are finished (score = sum log p / length ** length_penalty, the length
    counting EOS, as fairseq), and the best `beam` non-EOS candidates stay live. A sentence is
    done with `beam` finished hypotheses or after `max_lengths(src_mask, max_len_a,
    max_len_b)` steps. Returns the best finished hypothesis, else the best live one.
    beam=1 is greedy decoding with the same step limit.

    cache: decode incrementally (key/value cache, reordered with the surviving hypotheses;
    finished sentences leave the batch) where the decoder allows it (`can_cache`). False =
    re-run the decoder over every prefix (the reference computation; same results up to float
    rounding).
    """
    _check_inputs(model, src, src_mask, {"bos_id": bos_id, "eos_id": eos_id})
    k = check_int("beam", beam)
    penalty = check_float("length_penalty", length_penalty, minimum=-float("inf"))
    limits = max_lengths(src_mask, max_len_a, max_len_b).to(src.device)
    batch, pad, device = src.shape[0], model.pad_id, src.device
    with _eval_mode(model):
        memory = model.encode(src, src_mask).repeat_interleave(k, dim=0)  # [B*K, S, D]
        memory_mask = src_mask.repeat_interleave(k, dim=0)
        steps = int(limits.max()) if batch else 0
        beams = _Beams(batch, k, steps, bos_id, eos_id, pad, penalty, limits, device)
        # an xPos centred per call is centred once for the whole search: its cached keys stay
        # valid and the centre cancels in the logits (`centred_xpos`)
        with centred_xpos(model.decoder, steps // 2 if cache else None):
            if not (cache and can_cache(model)):
                return _strip(_beam_steps_uncached(model, beams, memory, memory_mask), eos_id, pad)
            return _strip(_beam_steps_cached(model, beams, memory, memory_mask), eos_id, pad)


def _beam_steps_uncached(
    model: Seq2Seq, beams: _Beams, memory: torch.Tensor, memory_mask: torch.Tensor
) -> torch.Tensor:
    """`beam_search` by decoder runs over every prefix (the reference) -> [B, steps] ids."""
    n, k, steps = beams.tokens.shape[0], beams.tokens.shape[1], beams.tokens.shape[2] - 1
    for t in range(steps):
        flat = beams.tokens[:, :, : t + 1].reshape(n * k, t + 1)
        beams.advance(t, _step_log_probs(model, flat, memory, memory_mask), model.vocab_size)
        if bool(beams.done.all()):
            break
    return beams.best()


def _beam_steps_cached(
    model: Seq2Seq, beams: _Beams, memory: torch.Tensor, memory_mask: torch.Tensor
) -> torch.Tensor:
    """`beam_search` with the key/value cache, reordered with the surviving hypotheses;
    finished sentences leave the batch -> [B, steps] ids."""
    batch, k, steps = beams.tokens.shape[0], beams.tokens.shape[1], beams.tokens.shape[2] - 1
    device = memory.device
    out = torch.full((batch, steps), model.pad_id, dtype=torch.long, device=device)
    state = model.start_decoding(memory, memory_mask)
    ids = torch.arange(batch, device=device)  # sentence of each active row
    for t in range(steps):
        logits, state = model.decode_step(beams.tokens[:, :, t].reshape(-1, 1), state)
        parent = beams.advance(t, _log_probs(model, logits), model.vocab_size)
        keep = (~beams.done).nonzero()[:, 0]  # the step's one host sync
        n, n_keep = beams.done.shape[0], keep.shape[0]
        rows = parent + torch.arange(n, device=device)[:, None] * k  # [n, K] flat parents
        if n_keep < n:  # some sentences finished: record them, drop them from the batch
            out.index_copy_(0, ids, beams.best())
            if n_keep == 0:
                break
            ids, rows = ids[keep], rows[keep]
            beams.select(keep)
        # the memory rows of a sentence's beams are equal: parents need no cross reorder
        state.reorder(rows.reshape(-1), cross=n_keep < n)
    return out


class _Beams:
    """The beam search's bookkeeping for the active sentences (tensors on `device`)."""

    def __init__(
        self,
        batch: int,
        k: int,
        steps: int,
        bos_id: int,
        eos_id: int,
        pad: int,
        penalty: float,
        limits: torch.Tensor,
        device: torch.device,
    ) -> None:
        neg_inf = float("-inf")
        self.k, self.steps, self.eos_id, self.penalty = k, steps, eos_id, penalty
        self.limits = limits
        self.tokens = torch.full((batch, k, steps + 1), pad, dtype=torch.long, device=device)
        self.tokens[:, :, 0] = bos_id
        self.scores = torch.zeros(batch, k, device=device)
        self.scores[:, 1:] = neg_inf  # all hypotheses start equal: keep one
        self.fin_scores = torch.full((batch, k), neg_inf, device=device)
        self.fin_tokens = torch.full((batch, k, steps), pad, dtype=torch.long, device=device)
        self.done = torch.zeros(batch, dtype=torch.bool, device=device)
        self.eos = torch.tensor([eos_id], device=device)

    def advance(self, t: int, lp: torch.Tensor, vocab: int) -> torch.Tensor:
        """Step t with next-token log-probs lp [n*K, V] -> the parent beam of each hypothesis
        [n, K] (itself for done sentences)."""
        batch, k, steps, eos_id, neg_inf = (
            self.done.shape[0],
            self.k,
            self.steps,
            self.eos_id,
            float("-inf"),
        )
        done = self.done
        cand = (
            (self.scores[:, :, None] + lp.view(batch, k, vocab))
            .masked_fill(done[:, None, None], neg_inf)
            .view(batch, k * vocab)
        )
        # finished: EOS among the best k candidates
        top_s, top_i = cand.topk(k, dim=1)
        is_eos = (top_i % vocab == eos_id) & torch.isfinite(top_s)
        new_fin = torch.where(is_eos, top_s / float(t + 1) ** self.penalty, neg_inf)
        prefix = self.tokens[:, :, 1:].gather(1, (top_i // vocab)[..., None].expand(-1, -1, steps))
        prefix[:, :, t] = eos_id
        pool_s = torch.cat([self.fin_scores, new_fin], dim=1)
        self.fin_scores, keep = pool_s.topk(k, dim=1)
        self.fin_tokens = torch.cat([self.fin_tokens, prefix], dim=1).gather(
            1, keep[..., None].expand(-1, -1, steps)
        )
        # live: the best k candidates that do not end in EOS
        live_s, live_i = (
            cand.view(batch, k, vocab)
            .index_fill(2, self.eos, neg_inf)
            .view(batch, -1)
            .topk(k, dim=1)
        )
        parent = live_i // vocab
        grown = self.tokens.gather(1, parent[..., None].expand(-1, -1, steps + 1))
        grown[:, :, t + 1] = live_i % vocab
        grow = ~done
        self.tokens = torch.where(grow[:, None, None], grown, self.tokens)
        self.scores = torch.where(grow[:, None], live_s, self.scores)
        self.done = (
            done | (torch.isfinite(self.fin_scores).sum(dim=1) >= k) | (t + 1 >= self.limits)
        )
        return torch.where(grow[:, None], parent, torch.arange(k, device=parent.device))

    def select(self, keep: torch.Tensor) -> None:
        """Keep the sentences `keep` ([n'] long)."""
        for name in ("tokens", "scores", "fin_scores", "fin_tokens", "done", "limits"):
            setattr(self, name, getattr(self, name).index_select(0, keep))

    def best(self) -> torch.Tensor:
        """The best finished hypothesis per sentence, else the best live one -> [n, steps]."""
        has_fin = torch.isfinite(self.fin_scores[:, 0])  # topk keeps the pool sorted: 0 is the best
        best_live = self.scores.argmax(dim=1)  # live hypotheses of a sentence share one length
        live_best = self.tokens[
            torch.arange(self.done.shape[0], device=self.done.device), best_live, 1:
        ]
        return torch.where(has_fin[:, None], self.fin_tokens[:, 0], live_best)


def sequence_nll(
    model: Seq2Seq,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    tgt_in: torch.Tensor,
    tgt_out: torch.Tensor,
    tgt_mask: torch.Tensor,
) -> torch.Tensor:
    """Teacher-forced per-token negative log-likelihood -> [B, T] float32, 0 at padding.

    tgt_in: decoder inputs [B, T] ([BOS] y1..ym), tgt_out: the tokens to score [B, T]
    (y1..ym [EOS]), tgt_mask: [B, T] bool. Eval mode, no gradients (an evaluation metric;
    the full softmax over the vocabulary, as beam search's scores).
    """
    _check_inputs(model, src, src_mask, {})
    for name, t in (("tgt_in", tgt_in), ("tgt_out", tgt_out), ("tgt_mask", tgt_mask)):
        check_tensor(name, t, ndims=(2,))
        if t.shape != tgt_in.shape or t.shape[0] != src.shape[0]:
            raise ValueError(
                f"{name} must have shape [{src.shape[0]}, T] like tgt_in, got {list(t.shape)}"
            )
        if name == "tgt_mask":
            check_mask(name, t, tgt_in.shape)
        else:
            _check_tokens(name, t, model.vocab_size)
    with _eval_mode(model):
        lp = model(src, src_mask, tgt_in, tgt_mask).log_softmax(dim=-1)
        nll = -lp.gather(-1, tgt_out[..., None].to(torch.long))[..., 0]
        nll = torch.where(tgt_mask, nll, 0.0)
    return nll.clone()  # an ordinary tensor, not an inference-mode one
