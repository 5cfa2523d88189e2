"""The language-model experiment's evaluation: perplexity and bits per byte over
non-overlapping windows of every length (the ALiBi paper's protocol, `eval_windows`), and the
loss by position inside the longest windows."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from cape.lab.data.text_corpus import eval_windows
from cape.lab.experiments.lm.config import LMConfig, RowConfig
from cape.lab.experiments.lm.data import LMData
from cape.lab.experiments.lm.model import make_model
from cape.lab.experiments.train_as import evaluation_model, seeded_evaluation

__all__ = ["WindowLoss", "window_loss", "eval_records", "format_records", "position_buckets"]


@dataclass
class WindowLoss:
    """What one length's windows gave: the summed loss (nats) over `count` predicted tokens in
    `windows` windows; `by_position`: the summed loss at each position of the `full` windows of
    the whole length (the shorter last window is left out of it)."""

    total: float
    count: int
    windows: int
    full: int
    by_position: np.ndarray

    @property
    def loss(self) -> float:
        return self.total / self.count if self.count else math.nan


@torch.no_grad()
def window_loss(
    model: nn.Module, tokens: np.ndarray, length: int, batch_tokens: int, device: torch.device
) -> WindowLoss:
    """`model`'s next-token loss over `tokens` cut into non-overlapping windows of `length`
    predictions (`eval_windows`: each token after the first is predicted once, with the context
    of its own window only), max(1, batch_tokens // length) windows a batch."""
    model.eval()
    out = WindowLoss(0.0, 0, 0, 0, np.zeros(length))
    for x, y in eval_windows(tokens, length, max(1, batch_tokens // length)):
        logits = model(torch.from_numpy(x).to(device))
        nll = F.cross_entropy(
            logits.transpose(1, 2), torch.from_numpy(y).to(device), reduction="none"
        ).double()
        out.total += float(nll.sum())
        out.count += nll.numel()
        out.windows += x.shape[0]
        if x.shape[1] == length:
            out.full += x.shape[0]
            out.by_position += nll.sum(0).cpu().numpy()
    return out


def position_buckets(length: int, buckets: int) -> list[tuple[int, int]]:
    """At most `buckets` contiguous position ranges [start, end) covering a window of `length`,
    log-spaced (the first [0, 1), then edges at round(geomspace(1, length, buckets))): the
    first tokens, where the context grows, are seen one by one, the far ones in wide ranges."""
    edges = np.unique(np.round(np.geomspace(1, length, max(buckets, 2))).astype(int))
    edges = [0, *(int(e) for e in edges)]
    return list(zip(edges[:-1], edges[1:], strict=True))


def eval_records(
    cfg: LMConfig, row: RowConfig, seed: int, model: nn.Module, data: LMData, device: Any
) -> dict[str, list[dict[str, Any]]]:
    """Every measurement of one trained model in the row's evaluation model (its
    `eval_options`; strict loading): "records", one per length {"row", "seed", "factor",
    "length", "loss" (nats per token), "ppl", "bpb", "tokens" (predicted), "windows"}, and
    "by_position", one per position bucket of the longest length {"row", "seed", "start",
    "end", "position" (the bucket's middle, counting from 1), "loss" (mean over its tokens of
    the full windows)}."""
    evaluator = evaluation_model(
        row,
        model.to(device),
        lambda: make_model(cfg, row, data.corpus.vocab_size, evaluation=True),
    )
    records, longest = [], None
    for factor, length in zip(cfg.eval.factors, cfg.lengths, strict=True):
        with seeded_evaluation(seed, device):  # the same draws whatever the lengths before
            got = window_loss(evaluator, data.test, length, cfg.eval.batch_tokens, device)
        records.append(
            {
                "row": row.name, "seed": seed, "factor": factor, "length": length,
                "loss": got.loss, "ppl": math.exp(got.loss),
                "bpb": data.corpus.bits_per_byte(got.loss, cfg.eval.split),
                "tokens": got.count, "windows": got.windows,
            }
        )  # fmt: skip
        longest = got
    by_position = []
    if longest is not None and longest.full:
        for a, b in position_buckets(cfg.lengths[-1], cfg.eval.buckets):
            loss = float(longest.by_position[a:b].sum() / ((b - a) * longest.full))
            by_position.append(
                {"row": row.name, "seed": seed, "start": a, "end": b,
                 "position": (a + 1 + b) / 2, "loss": loss}
            )  # fmt: skip
    return {"records": records, "by_position": by_position}


def format_records(records: dict[str, list[dict[str, Any]]]) -> str:
    """The evaluation records as a markdown table (what `cape eval lm` prints)."""
    lines = [
        "| length | factor | perplexity | bits/byte | loss | tokens | windows |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['length']} | {r['factor']}x | {r['ppl']:.3f} | {r['bpb']:.4f} | {r['loss']:.4f} "
        f"| {r['tokens']} | {r['windows']} |"
        for r in records["records"]
    ]
    return "\n".join(lines)
