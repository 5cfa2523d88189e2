"""The speech experiment: CTC models with each encoding trained on <= 6 s, tested up to 45 s.

`run_experiment(cfg, mapping, out)`: for every row and seed, train (`train_run`, resumable),
evaluate (`eval_records` of `cape.lab.experiments.asr.evaluate`, cached in the run folder's
`eval.json`), then write `results.json`, `report.md` and the plots (`asr_report`). Layout of
`out`: `config.yaml`, `<row>/seed<k>/` (engine run folder: metrics, checkpoints, `model.json`
for `cape transcribe`, eval.json), `results.json`, `report.md`, `*.png`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from cape.lab.data.speech.specaugment import SpecAugment
from cape.lab.data.speech.tokens import VOCAB_SIZE
from cape.lab.experiments.asr.config import AsrConfig, FeatureConfig, RowConfig
from cape.lab.experiments.asr.data import AsrData, collate_fn
from cape.lab.experiments.asr.evaluate import (
    decode,
    eval_records,
    feature_spec,
    format_records,
    without_positions,
)
from cape.lab.experiments.asr.report import NO_POSITIONS, redraw, write_report
from cape.lab.experiments.runs import begin, finish, parameter_counts
from cape.lab.experiments.template import cached_runs, fit_best, run_dir
from cape.lab.experiments.train_as import evaluation_model, trained_row
from cape.lab.io import write_json
from cape.lab.metrics import error_counts
from cape.lab.train import Trainer, seed_everything
from cape.lab.train import distributed as D
from cape.lab.train.checkpoint import load_checkpoint, pick_checkpoint
from cape.lab.train.lock import holds_out
from cape.models.asr import CTCModel

__all__ = [
    "make_model",
    "make_data",
    "ctc_loss_fn",
    "decode",
    "feature_spec",
    "train_run",
    "load_run",
    "eval_records",
    "run_experiment",
    "run_dir",
    "redraw",
    "format_records",
]


def make_data(cfg: AsrConfig) -> AsrData:
    """The corpus the config names (synthesised on first use), in memory."""
    return AsrData(cfg)


def make_model(cfg: AsrConfig, row: RowConfig, *, evaluation: bool = False) -> CTCModel:
    """The row's model (that of the row named by its `train_as`); with `evaluation`, its
    encoding takes the row's `eval_options` too."""
    m, trained = cfg.model, trained_row(cfg.rows, row)
    options = {**trained.options, **row.eval_options} if evaluation else dict(trained.options)
    return CTCModel(
        VOCAB_SIZE,
        n_mels=cfg.features.n_mels,
        dim=m.dim,
        depth=m.depth,
        heads=m.heads,
        ffn_dim=m.ffn_dim,
        kernel=m.kernel,
        stride=m.stride,
        position=row.position,
        position_options=options,
        conv_dropout=m.conv_dropout,
        dropout=m.dropout,
        layer_drop=m.layer_drop,
        relative_layers=row.relative_layers,
    )


def ctc_loss_fn(features: FeatureConfig, row: RowConfig):
    """loss_fn(model, batch) -> (CTC loss, {}) for the engine. SpecAugment (when the row has
    it) draws from the global torch RNG; padding-free batches feed each kept frame's original
    time (`frame_times`), padded ones the 10 ms hop."""
    augment = (
        SpecAugment(
            features.freq_masks,
            features.freq_width,
            features.time_masks,
            features.time_ratio,
            features.time_width,
        )
        if row.specaugment
        else None
    )
    free = row.batching == "padding-free"

    def loss_fn(model: torch.nn.Module, batch: dict[str, torch.Tensor]):
        feats, lengths = batch["features"], batch["lengths"]
        if augment is not None:
            feats = augment(feats, lengths)
        if free:
            log_probs, out_lengths = model(feats, lengths, frame_times=batch["frame_times"])
        else:
            log_probs, out_lengths = model(feats, lengths, hop=batch["hop"])
        loss = F.ctc_loss(
            log_probs.transpose(0, 1),
            batch["targets"],
            out_lengths,
            batch["target_lengths"],
            blank=0,
            reduction="mean",
            zero_infinity=True,
        )
        return loss, {}

    return loss_fn


def _val_fn(cfg: AsrConfig, data: AsrData):
    """eval_fn(model) -> {"wer", "cer"}: corpus WER and CER (%) on val, counts summed over ranks
    (each rank decodes its shard)."""

    def eval_fn(model: torch.nn.Module) -> dict[str, float]:
        utts = data.val[D.get_rank() :: D.get_world_size()]
        hyps, _ = decode(model, utts, cfg.features, batch_size=16)  # type: ignore[arg-type]
        counts = [error_counts(u.text, h) for u, h in zip(utts, hyps, strict=True)]
        m = D.all_reduce_mean(
            {
                k: float(sum(c[k] for c in counts))
                for k in ("word_edits", "words", "char_edits", "chars")
            }
        )
        return {
            "wer": 100.0 * m["word_edits"] / max(m["words"], 1.0),
            "cer": 100.0 * m["char_edits"] / max(m["chars"], 1.0),
        }

    return eval_fn


def _write_spec(folder: Path, cfg: AsrConfig, model: CTCModel, row: RowConfig) -> None:
    """model.json: what `cape transcribe` needs to rebuild the model and its features."""
    spec = {
        "model": model.spec,
        "experiment": "asr",
        "row": row.name,
        "features": feature_spec(cfg.features),
    }
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "model.json", spec)


def train_run(
    cfg: AsrConfig, row: RowConfig, seed: int, out: str | Path, data: AsrData
) -> tuple[CTCModel, dict[str, float]]:
    """Train one (row, seed), resuming from its checkpoints; returns the model with the best
    validation WER and the training summary. A `train_as` row trains the row it names."""
    if row.train_as is not None:
        return train_run(cfg, trained_row(cfg.rows, row), seed, out, data)
    folder = run_dir(out, row, seed)
    seed_everything(seed)
    model = make_model(cfg, row)
    if D.get_rank() == 0:
        _write_spec(folder, cfg, model, row)
    tcfg = dataclasses.replace(cfg.train, seed=seed)
    record = {"experiment": "asr", "row": row.name, "seed": seed, "config": dataclasses.asdict(cfg)}
    trainer = Trainer(
        model,
        ctc_loss_fn(cfg.features, row),
        data.train,
        _val_fn(cfg, data),
        tcfg,
        folder,
        collate_fn(cfg.features, row.batching),
        experiment=record,
        batches=data.batches(seed),
    )
    return fit_best(trainer)  # type: ignore[return-value]


def load_run(
    cfg: AsrConfig, row: RowConfig, seed: int, out: str | Path, data: Any = None
) -> CTCModel:
    """The weights of a trained run with the best validation WER (else the latest), those of
    the row named by `train_as` if any, in the row's evaluation model (its `eval_options`)."""
    folder = run_dir(out, trained_row(cfg.rows, row), seed) / "checkpoints"
    path = pick_checkpoint(folder, "best")
    model = make_model(cfg, row, evaluation=True)
    load_checkpoint(path, model)
    return model


@holds_out
def run_experiment(
    cfg: AsrConfig, mapping: dict[str, Any], out: str | Path, *, train: bool = True
) -> dict[str, Any]:
    """Train and evaluate every (row, seed), then write the report; returns the results. With
    `train=False`, report only the runs that have finished (`cape experiment --finished`)."""
    out, dist = begin(cfg, mapping, out)
    data = make_data(cfg)
    records: list[dict[str, Any]] = []
    summaries: dict[str, dict[str, Any]] = {}
    shapes: dict[str, CTCModel] = {}  # untrained, one per row: parameter count, has positions?

    def compute(row: RowConfig, seed: int, folder: Path) -> dict[str, Any]:
        if row.train_as is not None:  # trained above (an earlier row): its weights, evaluated
            model: torch.nn.Module = load_run(cfg, row, seed, out).to(dist.device)
            summary: dict[str, Any] = {"train_as": row.train_as}
        else:
            trained, summary = train_run(cfg, row, seed, out, data)
            model = evaluation_model(row, trained, lambda: make_model(cfg, row, evaluation=True))
        return {
            "records": eval_records(cfg, row, seed, model, data, dist.device),
            "summary": summary,
        }

    for row, seed, done in cached_runs(cfg.rows, cfg.seeds, out, compute, cfg, train=train):
        if row.name not in shapes:
            shapes[row.name] = make_model(cfg, row)
        if shapes[row.name].encoder.position is not None and not any(
            r["split"] == NO_POSITIONS for r in done["records"]
        ):
            # an evaluation cached before this measurement existed: add it, keep the rest
            extra = without_positions(
                cfg, row, seed, load_run(cfg, row, seed, out).to(dist.device), data
            )
            if extra:
                done["records"] += extra
                if dist.rank == 0:
                    write_json(run_dir(out, row, seed) / "eval.json", done)
        records += done["records"]
        summaries[f"{row.name}/seed{seed}"] = done["summary"]
    results = {
        "experiment": "asr",
        "name": cfg.name,
        "config": mapping,
        "records": records,
        "train": summaries,
        "params": {name: parameter_counts(m)["total"] for name, m in shapes.items()},
        "data": data.summary(),
    }
    finish(dist, lambda: write_report(out, results))
    return results
