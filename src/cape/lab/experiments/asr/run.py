"""The speech experiment: CTC models with each encoding trained on <= 6 s, tested up to 45 s.

`run_experiment(cfg, mapping, out)`: for every row and seed, train (`train_run`, resumable),
evaluate (`eval_records`, cached in the run folder's `eval.json`), then write `results.json`,
`report.md` and the plots (`asr_report`). Layout of `out`: `config.yaml`,
`<row>/seed<k>/` (engine run folder: metrics, checkpoints, `model.json` for `cape transcribe`,
eval.json), `results.json`, `report.md`, `*.png`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from cape.lab.apps.transcribe import transcribe
from cape.lab.data.speech.features import frame_hop_seconds, log_mel
from cape.lab.data.speech.specaugment import SpecAugment
from cape.lab.data.speech.synth import DURATION_BINS, SAMPLE_RATE
from cape.lab.data.speech.tokens import VOCAB_SIZE, ctc_beam_decode, ctc_greedy_decode
from cape.lab.experiments.asr.config import AsrConfig, FeatureConfig, RowConfig
from cape.lab.experiments.asr.data import AsrData, Utterance, collate_fn
from cape.lab.experiments.asr.report import NO_POSITIONS, redraw, write_report
from cape.lab.experiments.template import cached_runs, fit_best, run_dir, save_config
from cape.lab.io import atomic_write
from cape.lab.metrics import error_counts, wer_by_bin
from cape.lab.report import write_json
from cape.lab.train import Trainer, seed_everything
from cape.lab.train import distributed as D
from cape.lab.train.checkpoint import load_checkpoint, pick_checkpoint
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


def make_model(cfg: AsrConfig, row: RowConfig) -> CTCModel:
    m = cfg.model
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
        position_options=dict(row.options),
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


def feature_spec(features: FeatureConfig) -> dict[str, Any]:
    """The front end as `model.json` and `cape.lab.apps.transcribe` read it."""
    return {
        "sample_rate": SAMPLE_RATE,
        "n_mels": features.n_mels,
        "win_ms": features.win_ms,
        "hop_ms": features.hop_ms,
    }


def decode(
    model: CTCModel,
    utts: Sequence[Utterance],
    features: FeatureConfig,
    *,
    hop_ms: float | None = None,
    batch_size: int = 1,
    beam: int = 0,
) -> tuple[list[str], float]:
    """Transcripts of `utts` (in order) and the seconds spent (features + model + decoding).

    batch_size 1 (the paper's evaluation): `cape.lab.apps.transcribe.transcribe`, what users run.
    batch_size > 1 pads utterances of similar length together, for a fast validation (masking
    makes every output the same as alone; tested). Log-mel at `hop_ms` (default: the training
    hop); the model gets the hop in seconds, so positions stay in seconds."""
    hop_ms = features.hop_ms if hop_ms is None else hop_ms
    start = time.perf_counter()
    if batch_size == 1:
        hyps = transcribe(
            model,
            {"features": feature_spec(features)},
            [u.float_wave() for u in utts],
            hop_ms=hop_ms,
            beam=beam,
        )
        return hyps, time.perf_counter() - start
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    order = sorted(range(len(utts)), key=lambda i: utts[i].duration)
    hyps = [""] * len(utts)
    with torch.inference_mode():
        for k in range(0, len(order), batch_size):
            idx = order[k : k + batch_size]
            feats = [
                log_mel(
                    utts[i].float_wave().to(device),
                    SAMPLE_RATE,
                    hop_ms=hop_ms,
                    win_ms=features.win_ms,
                    n_mels=features.n_mels,
                )
                for i in idx
            ]
            lengths = torch.tensor([f.shape[0] for f in feats], device=device)
            batch = torch.nn.utils.rnn.pad_sequence(feats, batch_first=True)
            log_probs, out_lengths = model(
                batch, lengths, hop=frame_hop_seconds(hop_ms, SAMPLE_RATE)
            )
            texts = (
                ctc_beam_decode(log_probs, out_lengths, beam_width=beam)
                if beam
                else ctc_greedy_decode(log_probs, out_lengths)
            )
            for i, text in zip(idx, texts, strict=True):
                hyps[i] = text
    model.train(was_training)
    return hyps, time.perf_counter() - start


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
    text = json.dumps(spec, indent=2, ensure_ascii=False)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / "model.json", lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def train_run(
    cfg: AsrConfig, row: RowConfig, seed: int, out: str | Path, data: AsrData
) -> tuple[CTCModel, dict[str, float]]:
    """Train one (row, seed), resuming from its checkpoints; returns the model with the best
    validation WER and the training summary."""
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
    """The weights of a trained run with the best validation WER (else the latest)."""
    folder = run_dir(out, row, seed) / "checkpoints"
    path = pick_checkpoint(folder, "best")
    model = make_model(cfg, row)
    load_checkpoint(path, model)
    return model


def _bin_records(
    utts: Sequence[Utterance], hyps: Sequence[str], base: dict[str, Any]
) -> list[dict]:
    # one pass over the edit distances: the duration bins plus one bin holding everything
    bins = wer_by_bin(
        [u.duration for u in utts],
        [u.text for u in utts],
        hyps,
        [*DURATION_BINS, (0.0, float("inf"))],
    )
    out = []
    for b in bins:
        label = "all" if b["high"] == float("inf") else f"{b['low']:02.0f}-{b['high']:02.0f}"
        out.append(
            {
                **base,
                "bin": label,
                "utterances": int(b["count"]),
                "words": int(b["words"]),
                "word_edits": int(b["word_edits"]),
                "wer": 100.0 * b["wer"],
                "cer": 100.0 * b["cer"],
            }
        )
    return out


def eval_records(
    cfg: AsrConfig, row: RowConfig, seed: int, model: CTCModel, data: AsrData, device: torch.device
) -> list[dict[str, Any]]:
    """WER/CER per duration bin on every test split at the training hop (batch size 1), and on
    `test` at each of `eval.hops_ms` with throughput for the rows in `eval.hop_rows`."""
    model.to(device).eval()
    records: list[dict[str, Any]] = []
    base = {"row": row.name, "seed": seed}
    for split in cfg.eval.splits:
        utts = data.test(split)
        hyps, seconds = decode(model, utts, cfg.features, beam=cfg.eval.beam)
        audio = sum(u.duration for u in utts)
        recs = _bin_records(utts, hyps, {**base, "split": split, "hop_ms": cfg.features.hop_ms})
        recs[-1]["audio_s_per_s"] = audio / seconds
        records += recs
        if split == cfg.eval.splits[0]:
            examples = [
                {"duration": u.duration, "ref": u.text, "hyp": h}
                for u, h in zip(utts, hyps, strict=True)
            ]
            records[-1]["examples"] = sorted(examples, key=lambda e: e["duration"])[
                :: max(1, len(utts) // 6)
            ]
    if row.name in cfg.eval.hop_rows:
        utts = data.test("test")
        audio = sum(u.duration for u in utts)
        for hop in cfg.eval.hops_ms:
            hyps, seconds = decode(model, utts, cfg.features, hop_ms=hop, beam=cfg.eval.beam)
            recs = _bin_records(utts, hyps, {**base, "split": "test@hop", "hop_ms": float(hop)})
            recs[-1]["audio_s_per_s"] = audio / seconds
            records += recs
    return records + without_positions(cfg, row, seed, model, data)


def without_positions(
    cfg: AsrConfig, row: RowConfig, seed: int, model: CTCModel, data: AsrData
) -> list[dict[str, Any]]:
    """WER/CER per bin on `test` with the model's absolute encoding taken out at test time
    (split `NO_POSITIONS`): if they barely change, the model does not use its positions, and
    no duration effect of the encoding can show. Rows without an absolute encoding: none."""
    if model.encoder.position is None:
        return []
    utts = data.test("test")
    saved, model.encoder.position = model.encoder.position, None
    try:
        hyps, _ = decode(model, utts, cfg.features, beam=cfg.eval.beam)
    finally:
        model.encoder.position = saved
    return _bin_records(
        utts,
        hyps,
        {"row": row.name, "seed": seed, "split": NO_POSITIONS, "hop_ms": cfg.features.hop_ms},
    )


def format_records(records: list[dict[str, Any]]) -> str:
    """The evaluation records as a markdown table (what `cape eval asr` prints)."""
    lines = [
        "| split | hop ms | bin | utterances | WER % | CER % | audio s/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in records:
        speed = f"{r['audio_s_per_s']:.0f}" if "audio_s_per_s" in r else ""
        lines.append(
            f"| {r['split']} | {r['hop_ms']:g} | {r['bin']} | {r['utterances']} | "
            f"{r['wer']:.1f} | {r['cer']:.1f} | {speed} |"
        )
    return "\n".join(lines)


def run_experiment(
    cfg: AsrConfig, mapping: dict[str, Any], out: str | Path, *, train: bool = True
) -> dict[str, Any]:
    """Train and evaluate every (row, seed), then write the report; returns the results. With
    `train=False`, report only the runs that have finished (`cape experiment --finished`)."""
    out = Path(out)
    dist = D.init_distributed(cfg.train.device)
    if dist.rank == 0:
        save_config(out / "config.yaml", mapping)
    data = make_data(cfg)
    records: list[dict[str, Any]] = []
    summaries: dict[str, dict[str, float]] = {}
    shapes: dict[str, CTCModel] = {}  # untrained, one per row: parameter count, has positions?

    def compute(row: RowConfig, seed: int, folder: Path) -> dict[str, Any]:
        model, summary = train_run(cfg, row, seed, out, data)
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
        "params": {name: sum(p.numel() for p in m.parameters()) for name, m in shapes.items()},
        "data": data.summary(),
    }
    if dist.rank == 0:
        write_report(out, results)
    D.barrier()
    return results
