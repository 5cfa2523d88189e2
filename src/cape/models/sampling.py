"""Choosing the next token from a language model's logits: greedy (argmax) or sampled with a
temperature and an optional top-k cut. Used by `CausalLM.generate`; no model is read here."""

from __future__ import annotations

import torch

from .._checks import check_float, check_generator, check_int

__all__ = ["check_sampling", "next_token"]


def check_sampling(
    temperature: object, top_k: object, generator: object, vocab_size: int
) -> tuple[float, int | None]:
    """temperature: a float >= 0 (0 = greedy); top_k: None or an int in [1, vocab_size];
    generator: None or a `torch.Generator` -> (temperature, top_k)."""
    temp = check_float("temperature", temperature)
    if top_k is not None:
        check_int("top_k", top_k)
        assert isinstance(top_k, int)
        if top_k > vocab_size:
            raise ValueError(f"top_k must lie in [1, vocab_size={vocab_size}], got {top_k}")
    check_generator("generator", generator)
    return temp, top_k


def next_token(
    logits: torch.Tensor,
    temperature: float = 0.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """logits: [B, V] float -> next token ids [B] long.

    temperature 0: the argmax (top_k changes nothing: the argmax is in every top-k). Else one
    draw from softmax(logits / temperature) restricted to the top_k largest logits (None = all
    V; ties with the k-th largest stay in), from `generator` (on the logits' device).
    """
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    # softmax(l / T) = softmax((l - max l) / T): the shifted logits are <= 0, so a denormal T
    # sends every one below the maximum to -inf (the greedy limit, ties sampled alike) and a
    # huge T sends them to 0 (the uniform limit); the maxima stay 0 even where T underflows
    # float32 (0 / 0 would be NaN)
    shifted = logits.float() - logits.float().amax(dim=-1, keepdim=True)
    scores = torch.where(shifted == 0, 0.0, shifted / temperature)
    if top_k is not None and top_k < scores.shape[-1]:
        kth = scores.topk(top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]
