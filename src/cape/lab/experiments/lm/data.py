"""The language-model experiment's data: the built text corpus (`make_data`) and the training
windows as a dataset the engine can shuffle and resume (`TrainWindows`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from cape.lab.data.text_corpus import TextCorpus, build_text_corpus
from cape.lab.experiments.lm.config import LMConfig

__all__ = ["LMData", "TrainWindows", "make_data", "corpus_stats"]


class TrainWindows(Dataset):
    """`count` windows of `length` + 1 tokens of `tokens` (inputs and next-token targets), each
    at a start drawn uniformly once from `np.random.default_rng(seed)`; item i is always the same
    window, so the engine's resumable sampler replays an interrupted run exactly. A window may
    cross a document boundary (marked by `<eod>`), as in `random_windows`."""

    def __init__(self, tokens: np.ndarray, length: int, count: int, seed: int) -> None:
        if len(tokens) <= length + 1:
            raise ValueError(
                f"data.context must be below the {len(tokens)} tokens of the train split, "
                f"got {length}"
            )
        self.tokens, self.length = tokens, length
        rng = np.random.default_rng(seed)
        self.starts = rng.integers(0, len(tokens) - length - 1, size=count)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> torch.Tensor:
        s = int(self.starts[i])
        return torch.from_numpy(np.asarray(self.tokens[s : s + self.length + 1], dtype=np.int64))


@dataclass
class LMData:
    """The corpus and what a study reads of it: `train` (the train split's tokens), `val` (the
    first `data.val_tokens` of the validation split), `test` (the scored part of `eval.split`)."""

    corpus: TextCorpus
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray

    def windows(self, length: int, count: int, seed: int) -> TrainWindows:
        """`count` training windows of `length` tokens."""
        return TrainWindows(self.train, length, count, seed)


def make_data(cfg: LMConfig) -> LMData:
    """Build (once, cached under `data.root`) or open the corpus and take its splits."""
    d = cfg.data
    entry = build_text_corpus(d.corpus, d.root, tokenizer=d.tokenizer, vocab=d.vocab)
    corpus = TextCorpus(entry)
    test = corpus.tokens(cfg.eval.split)
    if len(test) < 2:
        raise ValueError(
            f"eval.split: the {cfg.eval.split!r} split of {entry} holds no token to predict "
            "(too few documents in the corpus?)"
        )
    if cfg.eval.max_tokens:
        test = test[: cfg.eval.max_tokens + 1]  # + 1: max_tokens tokens are predicted
    return LMData(corpus, corpus.tokens("train"), corpus.tokens("val")[: d.val_tokens + 1], test)


def corpus_stats(data: LMData, cfg: LMConfig) -> dict[str, Any]:
    """What the report says of the corpus: its name, tokenizer, vocabulary, and per split
    documents, bytes, tokens and bytes per token; the scored tokens of the evaluation split."""
    stats = data.corpus.stats
    return {
        "corpus": stats["corpus"],
        "vocabulary": stats["vocabulary"],
        "splits": stats["splits"],
        "source": stats.get("source"),
        "entry": data.corpus.root.name,
        "scored_tokens": max(len(data.test) - 1, 0),
        "scored_split": cfg.eval.split,
    }
