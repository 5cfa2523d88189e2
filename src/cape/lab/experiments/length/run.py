"""The length experiment: trained on short sequences, tested on 2x, 4x, 8x longer ones.

A bidirectional Transformer encoder reads uniform random tokens (`cape.lab.data.text.lookup`) and
predicts at every position the token `data.offset` places back: the answer is a relative
position, so a model without positions stays near chance. Each row is one `cape.build` encoding
(absolute ones added to the token embeddings, the others inside every layer's attention), trained
on lengths [min_len, max_len] and evaluated at every `eval.lengths`; a row with `eval_options`
is evaluated with them (RoPE's PI, NTK, YaRN chosen at inference) and a row with `train_as`
evaluates another row's weights.

`run_experiment(cfg, mapping, out)`: for every row and seed, train (`train_run`, resumable),
evaluate (`eval_records`, cached in the run folder's `eval.json`), then write `results.json`,
`report.md` and the plot (`write_report`). Layout of `out`: `config.yaml`, `<row>/seed<k>/`
(engine run folder: metrics, checkpoints, eval.json; a `train_as` row's holds eval.json and
settings.json only), `results.json`, `report.md`, `accuracy_vs_length.png`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cape.lab.data.text.lookup import (
    IGNORE,
    LookupDataset,
    LookupSet,
    Splits,
    chance_level,
    make_splits,
    position_blind_accuracy,
)
from cape.lab.experiments.length.config import (
    LengthConfig,
    RowConfig,
    position_options,
)
from cape.lab.experiments.length.report import redraw, write_report
from cape.lab.experiments.runs import begin, collect, finish, parameter_counts
from cape.lab.experiments.template import run_dir, summed_accuracy
from cape.lab.experiments.train_as import evaluation_model, trained_row
from cape.lab.train import Trainer, seed_everything
from cape.lab.train import distributed as D
from cape.lab.train.checkpoint import latest_checkpoint, load_checkpoint
from cape.lab.train.lock import holds_out
from cape.models.plan import position_plan
from cape.models.transformer import TransformerEncoder
from cape.positions import token_positions

__all__ = [
    "LookupModel",
    "make_model",
    "make_data",
    "token_loss",
    "accuracy",
    "train_run",
    "load_run",
    "eval_records",
    "format_records",
    "run_dir",
    "run_experiment",
    "redraw",
]


class LookupModel(nn.Module):
    """Token embeddings (+ an absolute encoding) -> bidirectional Transformer encoder (+ an
    in-attention encoding per layer) -> linear head to the V symbols at every position.

    position, options: a 1-D `cape.build` name and its options (`cape.models.plan`). The
    positions are the token indices [B, T, 1], augmented in training once per sample (CAPE;
    mean-normalised in eval too when the augmentation asks) and given to every layer alike.
    forward(batch {"tokens": [B, T] int64, "mask": [B, T] bool}) -> logits [B, T, V].
    """

    def __init__(
        self,
        vocab: int,
        position: str,
        options: dict[str, Any],
        *,
        dim: int,
        heads: int,
        layers: int,
        ffn_dim: int,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        # the plan first: its modules are initialised before the embedding, as the seeds expect
        plan = position_plan(position, dim=dim, heads=heads, options=options)
        self.embed = nn.Embedding(vocab, dim)
        self.encoder = TransformerEncoder(
            layers, dim, heads, ffn_dim, position=plan, dropout=dropout
        )
        self.head = nn.Linear(dim, vocab)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        tokens, mask = batch["tokens"], batch["mask"]
        pos = token_positions(*tokens.shape, mask=mask)  # [B, T, 1], 0 at padding
        return self.head(self.encoder(self.embed(tokens), mask=mask, positions=pos))


def make_model(cfg: LengthConfig, row: RowConfig, *, evaluation: bool = False) -> LookupModel:
    """The row's model; with `evaluation`, its encoding takes the row's `eval_options` too."""
    m = cfg.model
    return LookupModel(
        cfg.data.vocab,
        row.position,
        position_options(row, cfg, evaluation=evaluation),
        dim=m.dim,
        heads=m.heads,
        layers=m.layers,
        ffn_dim=m.ffn_dim,
        dropout=m.dropout,
    )


def make_data(cfg: LengthConfig) -> Splits:
    """The sequences of every split (`cape.lab.data.text.lookup.make_splits`; made, not cached:
    a second or so)."""
    d = cfg.data
    return make_splits(
        d.train,
        d.val,
        cfg.eval.test,
        cfg.eval.lengths,
        vocab=d.vocab,
        offset=d.offset,
        min_len=d.min_len,
        max_len=d.max_len,
        seed=d.seed,
    )


def token_loss(
    model: nn.Module, batch: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, dict[str, Any]]:
    """(cross-entropy over the scored positions, {"acc": % of them right}) for the engine."""
    logits, targets = model(batch), batch["targets"]
    loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE)
    scored = targets != IGNORE
    acc = (logits.argmax(-1) == targets)[scored].float().mean() * 100
    return loss, {"acc": acc.detach()}


def _shard(n: int) -> range:
    return range(D.get_rank(), n, D.get_world_size())


@torch.no_grad()
def accuracy(
    model: nn.Module, data: LookupSet, batch_size: int, device: torch.device
) -> tuple[float, int]:
    """(% of the scored positions right, their number) of `data`, over all ranks (each rank
    predicts its shard of the sequences)."""
    model.eval()
    ds, shard = LookupDataset(data), _shard(len(data))
    correct, count = 0, 0
    for i in range(0, len(shard), batch_size):
        batch = {k: v.to(device) for k, v in ds.collate(shard[i : i + batch_size]).items()}
        scored = batch["targets"] != IGNORE
        correct += int((model(batch).argmax(-1) == batch["targets"])[scored].sum())
        count += int(scored.sum())
    return summed_accuracy(correct, count), data.scored


def train_run(
    cfg: LengthConfig, row: RowConfig, seed: int, out: str | Path, data: Splits
) -> tuple[LookupModel, dict[str, float]]:
    """Train one (row, seed), resuming from its checkpoints; returns (final model, summary).
    A `train_as` row trains (or resumes) the row it names."""
    if row.train_as is not None:
        return train_run(cfg, trained_row(cfg.rows, row), seed, out, data)
    seed_everything(seed)
    model = make_model(cfg, row)
    train_set = LookupDataset(data.train)

    def eval_fn(m: nn.Module) -> dict[str, float]:
        device = next(m.parameters()).device
        return {"acc": accuracy(m, data.val, cfg.eval.batch_size, device)[0]}

    record = {"experiment": "length", "row": row.name, "seed": seed}
    trainer = Trainer(
        model,
        token_loss,
        train_set,
        eval_fn,
        dataclasses.replace(cfg.train, seed=seed),
        run_dir(out, row, seed),
        train_set.collate,
        experiment={**record, "config": dataclasses.asdict(cfg)},
    )
    summary = trainer.fit(resume=True)
    return trainer.model, summary  # type: ignore[return-value]


def load_run(
    cfg: LengthConfig, row: RowConfig, seed: int, out: str | Path, data: Any = None
) -> LookupModel:
    """The final weights of a trained run, those of the row named by `train_as` if any (`data`
    is not needed: the interface's slot). `eval_records` evaluates them with `eval_options`."""
    source = trained_row(cfg.rows, row)
    folder = run_dir(out, source, seed)
    path = latest_checkpoint(folder / "checkpoints")
    if path is None:
        raise FileNotFoundError(
            f"no checkpoint in {folder}; train it first (cape train length --row {source.name!r})"
        )
    model = make_model(cfg, source)
    load_checkpoint(path, model)
    return model


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
        acc, n = accuracy(evaluator, test, cfg.eval.batch_size, device)
        out.append({"row": row.name, "seed": seed, "length": length, "acc": acc, "n": n})
    return out


def format_records(records: list[dict[str, Any]]) -> str:
    """The evaluation records as a markdown table (what `cape eval length` prints)."""
    lines = ["| length | acc % | scored tokens |", "|---|---|---|"]
    lines += [f"| {r['length']} | {r['acc']:.2f} | {r['n']} |" for r in records]
    return "\n".join(lines)


def _baselines(cfg: LengthConfig, data: Splits) -> dict[str, Any]:
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


@holds_out
def run_experiment(
    cfg: LengthConfig, mapping: dict[str, Any], out: str | Path, *, train: bool = True
) -> dict[str, Any]:
    """Train and evaluate every (row, seed), then write the report; returns the results. With
    `train=False`, report only the runs that have finished (`cape experiment --finished`)."""
    out, dist = begin(cfg, mapping, out)
    data = make_data(cfg)

    def compute(row: RowConfig, seed: int, folder: Path) -> dict[str, Any]:
        if row.train_as is not None:  # trained above (an earlier row): its weights, evaluated
            model: nn.Module = load_run(cfg, row, seed, out)
            summary: dict[str, Any] = {"train_as": row.train_as}
        else:
            model, summary = train_run(cfg, row, seed, out, data)
        model.to(dist.device).eval()
        return {
            "records": eval_records(cfg, row, seed, model, data, dist.device),
            "summary": summary,
            "params": parameter_counts(model),
        }

    records, summaries, params = collect(cfg, out, compute, train=train)
    results = {
        "experiment": "length",
        "name": cfg.name,
        "config": mapping,
        "records": records,
        "train": summaries,
        "params": params,
        "baselines": _baselines(cfg, data),
    }
    finish(dist, lambda: write_report(out, results))
    return results
