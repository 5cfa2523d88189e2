"""The length experiment's evaluation: accuracy at every test length, and the baselines."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from cape.lab.data.text.lookup import (
    IGNORE,
    LookupDataset,
    LookupSet,
    Splits,
    chance_level,
    position_blind_accuracy,
)
from cape.lab.experiments.base import rank_slice
from cape.lab.experiments.length.config import LengthConfig, RowConfig
from cape.lab.experiments.length.model import make_model
from cape.lab.experiments.run_folders import summed_accuracy
from cape.lab.experiments.train_as import evaluation_model, seeded_evaluation

__all__ = ["accuracy", "eval_records", "format_records", "baselines"]


@torch.no_grad()
def accuracy(
    model: nn.Module, data: LookupSet, batch_size: int, device: torch.device
) -> tuple[float, int]:
    """(% of the scored positions right, their number) of `data`, over all ranks (each rank
    predicts its shard of the sequences)."""
    model.eval()
    ds, shard = LookupDataset(data), range(len(data))[rank_slice()]
    correct, count = 0, 0
    for i in range(0, len(shard), batch_size):
        batch = {k: v.to(device) for k, v in ds.collate(shard[i : i + batch_size]).items()}
        scored = batch["targets"] != IGNORE
        correct += int((model(batch).argmax(-1) == batch["targets"])[scored].sum())
        count += int(scored.sum())
    return summed_accuracy(correct, count), data.scored


def eval_records(
    cfg: LengthConfig,
    row: RowConfig,
    seed: int,
    model: nn.Module,
    data: Splits,
    device: torch.device,
) -> list[dict[str, Any]]:
    """Accuracy (%) at every test length of `model`'s weights in the row's evaluation model
    (its `eval_options`; strict loading: the encodings must hold the same parameters):
    records {"row", "seed", "length", "acc", "n" (scored positions)}."""
    evaluator = evaluation_model(
        row, model.to(device), lambda: make_model(cfg, row, evaluation=True)
    )
    out = []
    for length, test in data.test.items():
        with seeded_evaluation(seed, device):  # the same draws whatever the lengths before
            acc, n = accuracy(evaluator, test, cfg.eval.batch_size, device)
        out.append({"row": row.name, "seed": seed, "length": length, "acc": acc, "n": n})
    return out


def format_records(records: list[dict[str, Any]]) -> str:
    """The evaluation records as a markdown table (what `cape eval length` prints)."""
    lines = ["| length | acc % | scored tokens |", "|---|---|---|"]
    lines += [f"| {r['length']} | {r['acc']:.2f} | {r['n']} |" for r in records]
    return "\n".join(lines)


def baselines(cfg: LengthConfig, data: Splits) -> dict[str, Any]:
    """Accuracy (%) without positions: chance (1/V) and the best position-blind guess per
    test length (`position_blind_accuracy`)."""
    v = cfg.data.vocab
    return {
        "chance": 100.0 * chance_level(v),
        "position_blind": {
            str(length): 100.0 * position_blind_accuracy(test, v)
            for length, test in data.test.items()
        },
    }
