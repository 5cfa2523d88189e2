"""The LFF boxes experiment's evaluation: accuracy on seen and unseen coordinates, overall and
per question, and the baselines without training."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from cape.lab.data.boxes import (
    QUESTIONS,
    BoxDataset,
    Screens,
    content_only_accuracy,
    majority_accuracy,
)
from cape.lab.experiments.base import rank_slice
from cape.lab.experiments.lff_boxes.config import LffBoxesConfig, RowConfig
from cape.lab.experiments.run_folders import summed_accuracy

__all__ = ["EVAL_SETS", "predict", "answered", "eval_records", "format_records", "baselines"]

EVAL_SETS = ("test_seen", "test_unseen")


@torch.no_grad()
def predict(
    model: nn.Module,
    data: BoxDataset,
    batch_size: int,
    device: torch.device,
    indices: range | None = None,
) -> torch.Tensor:
    """The predicted answers [len(indices)] (CPU) of `data`'s screens at `indices` (all)."""
    model.eval()
    indices = range(len(data)) if indices is None else indices
    out = []
    for i in range(0, len(indices), batch_size):
        batch = data.collate(list(indices[i : i + batch_size]))
        out.append(model({k: v.to(device) for k, v in batch.items()}).argmax(-1).cpu())
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)


def answered(
    model: nn.Module, ds: BoxDataset, batch_size: int, device: torch.device
) -> tuple[torch.Tensor, range]:
    """Whether each screen of this rank's share of `ds` is answered right (bool [len(share)]),
    and that share's indices."""
    shard = range(len(ds))[rank_slice()]
    return predict(model, ds, batch_size, device, shard) == ds.tensors["answer"][list(shard)], shard


def eval_records(
    cfg: LffBoxesConfig,
    row: RowConfig,
    seed: int,
    model: nn.Module,
    data: dict[str, Screens],
    device: torch.device,
) -> list[dict[str, Any]]:
    """Accuracy (%) on test_seen and test_unseen, overall ("all") and per question type:
    records {"row", "seed", "set", "question", "acc", "n"}."""
    out = []
    for split in EVAL_SETS:
        ds = BoxDataset(data[split])
        correct, shard = answered(model, ds, cfg.eval.batch_size, device)
        question = ds.tensors["question"][list(shard)]
        for q, name in [(-1, "all"), *enumerate(QUESTIONS)]:
            sel = torch.ones_like(correct) if q < 0 else question == q
            n = len(ds) if q < 0 else int((data[split].question == q).sum())
            acc = summed_accuracy(float(correct[sel].sum()), int(sel.sum()))
            out.append(
                {"row": row.name, "seed": seed, "set": split, "question": name, "acc": acc, "n": n}
            )
    return out


def format_records(records: list[dict[str, Any]]) -> str:
    """The evaluation records as a markdown table (what `cape eval lff-boxes` prints)."""
    lines = ["| set | question | acc % | screens |", "|---|---|---|---|"]
    lines += [f"| {r['set']} | {r['question']} | {r['acc']:.2f} | {r['n']} |" for r in records]
    return "\n".join(lines)


def baselines(data: dict[str, Screens]) -> dict[str, dict[str, float]]:
    """Accuracy without training: majority answer per question, Bayes content-only."""
    return {
        name: {s: fn(data["train"], data[s]) for s in EVAL_SETS}
        for name, fn in (("majority", majority_accuracy), ("content_only", content_only_accuracy))
    }
