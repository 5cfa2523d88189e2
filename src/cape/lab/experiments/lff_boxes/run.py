"""The LFF boxes experiment: encodings of 4-D box positions on sparse spatial structures.

LFF paper sec. 4.4 (Tables 3-4) on data made here: a Transformer reads a screen of boxes
(`cape.lab.data.boxes`) as tokens [question, box_1, ..., box_N], each box token = widget-type
embedding + query-flag embedding + the row's encoding of its (top, left, bottom, right) in
[0, 1]; it classifies the answer (a widget type or "none") from the question token's output.
Each row is trained on screens with even coordinates and tested on new screens with even
(seen) and odd (unseen) coordinates.

`run_experiment(cfg, mapping, out)`: for every row and seed, train (`train_run`, resumable),
evaluate (`eval_records`, cached in the run folder's `eval.json`), then write `results.json`,
`report.md` and the plot (`lff_boxes_report`). Layout of `out`: `config.yaml`,
`<row>/seed<k>/` (engine run folder: metrics, checkpoints, eval.json), `results.json`,
`report.md`, `seen_vs_unseen.png`.
"""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cape.augment import Augmentation
from cape.lab.data.boxes import (
    NONE,
    QUESTIONS,
    WIDGETS,
    BoxDataset,
    Screens,
    content_only_accuracy,
    majority_accuracy,
    make_splits,
)
from cape.lab.experiments.lff_boxes.config import (
    ROTARY,
    LffBoxesConfig,
    RowConfig,
    position_options,
)
from cape.lab.experiments.lff_boxes.report import redraw, write_report
from cape.lab.experiments.runs import begin, collect, finish, parameter_counts
from cape.lab.experiments.template import run_dir, summed_accuracy
from cape.lab.train import Trainer, seed_everything
from cape.lab.train import distributed as D
from cape.lab.train.checkpoint import latest_checkpoint, load_checkpoint
from cape.lab.train.lock import holds_out
from cape.models.plan import PositionPlan, position_plan
from cape.models.transformer import TransformerEncoder

__all__ = [
    "BoxQA",
    "augment_boxes",
    "make_model",
    "make_data",
    "answer_loss",
    "predict",
    "train_run",
    "load_run",
    "eval_records",
    "format_records",
    "run_dir",
    "run_experiment",
    "redraw",
]

EVAL_SETS = ("test_seen", "test_unseen")


def augment_boxes(
    positions: torch.Tensor, mask: torch.Tensor | None, augmentation: Augmentation
) -> torch.Tensor:
    """CAPE's augmentation of boxes [B, N, 4] (top, left, bottom, right) -> [B, N, 4].

    The boxes are seen as 2N corner points (y, x): `augmentation` draws one global shift per
    axis and one scale per screen, shared by every corner, so that the relations between boxes
    (order, alignment, containment, nearest) survive; a local shift moves each corner."""
    b, n, _ = positions.shape
    corners = positions.reshape(b, 2 * n, 2)
    cmask = None if mask is None else mask.repeat_interleave(2, dim=1)
    return augmentation(corners, cmask, training=True).reshape(b, n, 4)


class BoxQA(nn.Module):
    """Question answering over a screen of boxes.

    plan: the position plan (`cape.models.plan`) of 4-D positions: an absolute encoding added
    to the box tokens, or one in-attention encoding per layer (RoPE-ViT's 4-D rotations) fed the
    edges times `unit` (cells), the question token taking the query box's; "nopos": content
    only. augmentation: applied to the box corners in training (`augment_boxes`), the model's
    own draw. forward(batch) with batch
    {"positions": [B, N, 4], "types": [B, N], "mask": [B, N] bool, "query": [B],
    "question": [B]} -> answer logits [B, len(WIDGETS) + 1].
    """

    def __init__(
        self,
        plan: PositionPlan,
        *,
        dim: int,
        depth: int,
        heads: int,
        ffn_dim: int,
        dropout: float = 0.0,
        augmentation: Augmentation | None = None,
        unit: float = 1.0,
    ) -> None:
        super().__init__()
        self.position, self.augmentation = plan.absolute, augmentation
        self.in_attention, self.unit = plan.in_attention, unit
        self.content = nn.Embedding(len(WIDGETS), dim)
        self.flag = nn.Embedding(2, dim)  # 1 at the query box
        self.question = nn.Embedding(len(QUESTIONS), dim)
        self.encoder = TransformerEncoder(
            depth, dim, heads, ffn_dim, dropout=dropout, position=plan.without_absolute()
        )
        self.head = nn.Linear(dim, NONE + 1)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        pos, mask, query = batch["positions"], batch["mask"], batch["query"]
        n = pos.shape[1]
        is_query = (torch.arange(n, device=pos.device)[None] == query[:, None]).long()
        x = self.content(batch["types"]) + self.flag(is_query)  # [B, N, D]
        if self.training and self.augmentation is not None:
            pos = augment_boxes(pos, mask, self.augmentation)
        if self.position is not None:
            x = x + self.position(x, positions=pos, mask=mask)
        tokens = torch.cat([self.question(batch["question"])[:, None], x], 1)  # [B, 1 + N, D]
        full = torch.cat([torch.ones_like(mask[:, :1]), mask], 1)
        if not self.in_attention:
            return self.head(self.encoder(tokens, mask=full)[:, 0])
        asked = pos.gather(1, query[:, None, None].expand(-1, 1, pos.shape[-1]))  # [B, 1, 4]
        where = torch.cat([asked, pos], 1) * self.unit  # [B, 1 + N, 4] in cells
        return self.head(self.encoder(tokens, mask=full, positions=where)[:, 0])


def make_model(cfg: LffBoxesConfig, row: RowConfig) -> BoxQA:
    m = cfg.model
    options = position_options(row, m, cfg.data.canvas)
    # the archived rows drew no probe of the in-attention encodings (RoPE-Mixed's frequencies
    # are random): the plan's probe must not move their seeds
    fork = torch.random.fork_rng(devices=[]) if row.position in ROTARY else nullcontext()
    with fork:
        plan = position_plan(row.position, dim=m.dim, heads=m.heads, options=options)
    return BoxQA(
        plan,
        dim=m.dim,
        depth=m.depth,
        heads=m.heads,
        ffn_dim=m.ffn_dim,
        dropout=m.dropout,
        augmentation=row.augmentation(),
        unit=float(cfg.data.canvas - 1),
    )


def make_data(cfg: LffBoxesConfig) -> dict[str, Screens]:
    """The screens of every split (`cape.lab.data.boxes.make_splits`; generated, not cached)."""
    d = cfg.data
    return make_splits(
        d.train,
        d.val,
        d.test,
        seed=d.seed,
        canvas=d.canvas,
        min_boxes=d.min_boxes,
        max_boxes=d.max_boxes,
        max_size=d.max_size,
        plant=d.plant,
    )


def answer_loss(
    model: nn.Module, batch: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, dict[str, Any]]:
    """(cross-entropy of the answer, {"acc": % correct}) for the engine."""
    logits = model(batch)
    loss = F.cross_entropy(logits.float(), batch["answer"])
    acc = (logits.argmax(-1) == batch["answer"]).float().mean() * 100
    return loss, {"acc": acc.detach()}


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


def _shard(n: int) -> range:
    return range(D.get_rank(), n, D.get_world_size())


def train_run(
    cfg: LffBoxesConfig, row: RowConfig, seed: int, out: str | Path, data: dict[str, Screens]
) -> tuple[BoxQA, dict[str, float]]:
    """Train one (row, seed), resuming from its checkpoints; returns (final model, summary)."""
    seed_everything(seed)
    model = make_model(cfg, row)
    train_set, val_set = BoxDataset(data["train"]), BoxDataset(data["val"])
    shard = _shard(len(val_set))
    truth = val_set.tensors["answer"][list(shard)]

    def eval_fn(m: nn.Module) -> dict[str, float]:
        pred = predict(m, val_set, cfg.eval.batch_size, next(m.parameters()).device, shard)
        return {"acc": summed_accuracy(float((pred == truth).sum()), len(shard))}

    record = {
        "experiment": "lff-boxes",
        "row": row.name,
        "seed": seed,
        "config": dataclasses.asdict(cfg),
    }
    trainer = Trainer(
        model,
        answer_loss,
        train_set,
        eval_fn,
        dataclasses.replace(cfg.train, seed=seed),
        run_dir(out, row, seed),
        train_set.collate,
        experiment=record,
    )
    summary = trainer.fit(resume=True)
    return trainer.model, summary  # type: ignore[return-value]


def load_run(
    cfg: LffBoxesConfig, row: RowConfig, seed: int, out: str | Path, data: Any = None
) -> BoxQA:
    """The final weights of a trained run (`data` is not needed: the interface's slot)."""
    folder = run_dir(out, row, seed)
    path = latest_checkpoint(folder / "checkpoints")
    if path is None:
        raise FileNotFoundError(f"no checkpoint in {folder}; train it first (cape train lff-boxes)")
    model = make_model(cfg, row)
    load_checkpoint(path, model)
    return model


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
        shard = _shard(len(ds))
        correct = (
            predict(model, ds, cfg.eval.batch_size, device, shard)
            == ds.tensors["answer"][list(shard)]
        )
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


def _baselines(data: dict[str, Screens]) -> dict[str, dict[str, float]]:
    """Accuracy without training: majority answer per question, Bayes content-only."""
    return {
        name: {s: fn(data["train"], data[s]) for s in EVAL_SETS}
        for name, fn in (("majority", majority_accuracy), ("content_only", content_only_accuracy))
    }


@holds_out
def run_experiment(
    cfg: LffBoxesConfig, mapping: dict[str, Any], out: str | Path, *, train: bool = True
) -> dict[str, Any]:
    """Train and evaluate every (row, seed), then write the report; returns the results. With
    `train=False`, report only the runs that have finished (`cape experiment --finished`)."""
    out, dist = begin(cfg, mapping, out)
    data = make_data(cfg)

    def compute(row: RowConfig, seed: int, folder: Path) -> dict[str, Any]:
        model, summary = train_run(cfg, row, seed, out, data)
        model.to(dist.device).eval()
        return {
            "records": eval_records(cfg, row, seed, model, data, dist.device),
            "summary": summary,
            "params": parameter_counts(model),
        }

    records, summaries, params = collect(cfg, out, compute, train=train)
    results = {
        "experiment": "lff-boxes",
        "name": cfg.name,
        "config": mapping,
        "records": records,
        "train": summaries,
        "params": params,
        "baselines": _baselines(data),
    }
    finish(dist, lambda: write_report(out, results))
    return results
