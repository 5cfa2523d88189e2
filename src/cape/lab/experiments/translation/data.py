"""Data of the translation experiment: the corpus tokenised, training batches, test sets.

Sequences as the model reads them: source `[BOS] x1..xn [EOS]` (the BOS gives CAPE's decoder
the first position back after a global shift, appendix D.1), target input `[BOS] y1..ym`,
target output `y1..ym [EOS]`. Positions are computed by the model (`Seq2Seq.positions`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from cape.lab.apps.translate import pad_batch, source_ids
from cape.lab.data.speech.batching import DurationBatchSampler
from cape.lab.data.translation.bpe import Tokenizer, train_bpe
from cape.lab.data.translation.corpus import (
    load_pairs,
    make_translation_corpus,
    verify_translation_corpus,
)
from cape.lab.experiments.translation.config import DataConfig, EvalConfig
from cape.lab.train import distributed as D

__all__ = ["TranslationData", "Example", "collate_fn", "LONG_SPLITS", "ensure_corpus"]

LONG_SPLITS = ("test_21-30", "test_31-40", "test_41+")
"""The long-sentence test buckets (source words), never seen in training."""


class Example:
    """One sentence pair: raw texts and BPE ids (no BOS/EOS)."""

    __slots__ = ("src", "tgt", "src_ids", "tgt_ids")

    def __init__(self, src: str, tgt: str, src_ids: list[int], tgt_ids: list[int]) -> None:
        self.src, self.tgt, self.src_ids, self.tgt_ids = src, tgt, src_ids, tgt_ids


def ensure_corpus(cfg: DataConfig) -> tuple[Path, Path]:
    """Make (or finish) the corpus and its BPE model on rank 0, verify everywhere; returns
    (corpus root, BPE model path)."""
    root = Path(cfg.root)
    if D.get_rank() == 0:
        # the corpus's own split sizes; a limited (smoke-test) corpus gets proportional ones
        sizes = (
            {
                "val": cfg.limit // 20,
                "test": cfg.limit // 10,
                "long_per_bucket": cfg.limit // 20,
                "stacked": cfg.limit // 50,
            }
            if cfg.limit
            else {}
        )
        make_translation_corpus(
            root, seed=cfg.seed, workers=cfg.workers, limit=cfg.limit or None, **sizes
        )
        train_bpe(root, vocab_size=cfg.vocab_size)
    D.barrier()
    verify_translation_corpus(root)
    return root, train_bpe(root, vocab_size=cfg.vocab_size)


def _examples(tok: Tokenizer, pairs: Sequence[tuple[str, str]]) -> list[Example]:
    src_ids = tok.encode_batch([s for s, _ in pairs])
    tgt_ids = tok.encode_batch([t for _, t in pairs])
    return [Example(s, t, a, b) for (s, t), a, b in zip(pairs, src_ids, tgt_ids, strict=True)]


class TranslationData:
    """The corpus in memory as `Example`s: `train` (pairs whose model inputs, source with BOS
    and EOS and target with BOS, have <= data.max_tokens tokens; the first data.train of them),
    `val`, and `test(split)`."""

    def __init__(self, data: DataConfig, evaluation: EvalConfig) -> None:
        self.cfg, self.eval_cfg = data, evaluation
        self.root, self.bpe_path = ensure_corpus(data)
        self.tokenizer = Tokenizer(self.bpe_path)
        train = _examples(self.tokenizer, load_pairs(self.root, "train"))
        # as the model reads them: BOS x EOS (source), BOS y / y EOS (target)
        keep = [e for e in train if max(len(e.src_ids) + 2, len(e.tgt_ids) + 1) <= data.max_tokens]
        self.dropped_long = len(train) - len(keep)
        self.train = keep[: data.train] if data.train else keep
        self.val = _examples(self.tokenizer, load_pairs(self.root, "val")[: data.val or None])
        self._tests: dict[str, list[Example]] = {}

    @property
    def alpha(self) -> float:
        """CAPE's source scale (appendix D.1): target tokens / source tokens over `train`."""
        src = sum(len(e.src_ids) for e in self.train)
        return sum(len(e.tgt_ids) for e in self.train) / max(src, 1)

    def test(self, split: str) -> list[Example]:
        """ "test", a long bucket of `LONG_SPLITS` or "stacked", cut to the eval config's size."""
        if split not in self._tests:
            limit = {"test": self.eval_cfg.test, "stacked": self.eval_cfg.stacked}.get(
                split, self.eval_cfg.long_per_bucket
            )
            pairs = load_pairs(self.root, split)
            self._tests[split] = _examples(self.tokenizer, pairs[: limit or None])
        return self._tests[split]

    def batches(self, seed: int, batch_size: int) -> DurationBatchSampler:
        """Batches of `batch_size` pairs of similar (perturbed) length, reshuffled per epoch."""
        lengths = [max(len(e.src_ids), len(e.tgt_ids)) + 1.0 for e in self.train]
        return DurationBatchSampler(
            lengths, batch_size, seed=seed, rank=D.get_rank(), world_size=D.get_world_size()
        )

    def train_length(self) -> int:
        """The longest target (with EOS) among the training pairs, in tokens."""
        return max(len(e.tgt_ids) + 1 for e in self.train)

    def summary(self) -> dict[str, Any]:
        """Sizes for the report: pairs and mean tokens per side of each split used."""
        out: dict[str, Any] = {}
        splits = {
            "train": self.train,
            "val": self.val,
            **{s: self.test(s) for s in ("test", *LONG_SPLITS, "stacked")},
        }
        for name, exs in splits.items():
            n = max(len(exs), 1)
            out[name] = {
                "pairs": len(exs),
                "src_tokens": sum(len(e.src_ids) for e in exs) / n,
                "tgt_tokens": sum(len(e.tgt_ids) for e in exs) / n,
            }
        out["alpha"] = self.alpha
        out["dropped_over_max_tokens"] = self.dropped_long
        out["vocab_size"] = self.tokenizer.vocab_size
        return out


def collate_fn(tok: Tokenizer):
    """collate(list[Example]) -> {src, src_mask, tgt_in, tgt_out, tgt_mask} tensors."""

    def collate(examples: Sequence[Example]) -> dict[str, torch.Tensor]:
        src, src_mask = pad_batch([source_ids(e.src_ids, tok) for e in examples], tok.pad_id)
        tgt_in, tgt_mask = pad_batch([[tok.bos_id, *e.tgt_ids] for e in examples], tok.pad_id)
        tgt_out, _ = pad_batch([[*e.tgt_ids, tok.eos_id] for e in examples], tok.pad_id)
        return {
            "src": src,
            "src_mask": src_mask,
            "tgt_in": tgt_in,
            "tgt_out": tgt_out,
            "tgt_mask": tgt_mask,
        }

    return collate
