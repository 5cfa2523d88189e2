"""Evaluation of the speech experiment: transcripts at batch size 1 (the paper's), WER/CER per
duration bin on every test split and hop, and with the absolute encoding taken out at test time
(does the model use its positions?)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from cape.lab.apps.transcribe import transcribe
from cape.lab.data.speech.features import frame_hop_seconds, log_mel
from cape.lab.data.speech.synth import DURATION_BINS, SAMPLE_RATE
from cape.lab.data.speech.tokens import ctc_beam_decode, ctc_greedy_decode
from cape.lab.experiments.asr.config import AsrConfig, FeatureConfig, RowConfig
from cape.lab.experiments.asr.data import AsrData, Utterance
from cape.lab.experiments.asr.report import NO_POSITIONS
from cape.lab.metrics import error_counts, wer_by_bin
from cape.lab.train import distributed as D
from cape.models.asr import CTCModel

__all__ = [
    "feature_spec",
    "decode",
    "eval_records",
    "removed_records",
    "format_records",
    "val_fn",
]


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
    return records


def removed_records(
    cfg: AsrConfig, row: RowConfig, seed: int, model: CTCModel, data: AsrData
) -> list[dict[str, Any]]:
    """WER/CER per bin on `test` of `model` as given (the caller, `Experiment.measure_removed`,
    has taken every position it holds out: the input encoding and each attention's rotation and
    biases), split `NO_POSITIONS`: if they barely change, the model does not use its positions,
    and no duration effect of the encoding can show."""
    utts = data.test("test")
    hyps, _ = decode(model, utts, cfg.features, beam=cfg.eval.beam)
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


def val_fn(cfg: AsrConfig, data: AsrData):
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
