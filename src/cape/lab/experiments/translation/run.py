"""The translation experiment: encoder-decoder models with each encoding, trained on sentences
of <= 20 words, tested on longer ones and on stacked sentences (CAPE sec. 5.3, appendix D).

`run_experiment(cfg, mapping, out)`: for every row and seed, train (`train_run`, resumable;
the checkpoint with the best validation BLEU is kept), evaluate (`eval_records`, cached in the
run folder's `eval.json`): sacreBLEU on `test` overall and per target-length tercile, on each
long bucket, and the NLL per output position on stacked pairs with teacher forcing; then write
`results.json`, `report.md` and the plots (`translation_report`). Layout of `out`:
`config.yaml`, `<row>/seed<k>/` (engine run folder, `model.json` + `bpe.model` for
`cape translate`, eval.json), `results.json`, `report.md`, `*.png`.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from cape.lab.apps.translate import translate_ids
from cape.lab.experiments.runs import begin, finish, parameter_counts
from cape.lab.experiments.template import cached_runs, fit_best, run_dir
from cape.lab.experiments.train_as import evaluation_model, trained_row
from cape.lab.experiments.translation.config import RowConfig, TranslationConfig
from cape.lab.experiments.translation.data import LONG_SPLITS, Example, TranslationData, collate_fn
from cape.lab.experiments.translation.report import redraw, write_report
from cape.lab.io import atomic_write, write_json
from cape.lab.train import Trainer, seed_everything
from cape.lab.train import distributed as D
from cape.lab.train.lock import holds_out
from cape.models.search import sequence_nll
from cape.models.seq2seq import Seq2Seq

__all__ = [
    "make_data",
    "make_model",
    "loss_fn",
    "decode",
    "bleu",
    "train_run",
    "load_run",
    "eval_records",
    "nll_by_position",
    "format_records",
    "run_experiment",
    "run_dir",
    "redraw",
    "NLL_BANDS",
]

NLL_BANDS = (0, 32, 64, 128, 192, 256, 100_000)
"""Output-position bands (tokens) of the stacked-sequence NLL table."""


def make_data(cfg: TranslationConfig) -> TranslationData:
    """The corpus the config names (translated and BPE-trained on first use), in memory."""
    return TranslationData(cfg.data, cfg.eval)


def make_model(
    cfg: TranslationConfig, row: RowConfig, alpha: float, vocab_size: int, pad_id: int = 0
) -> Seq2Seq:
    """The row's model; `alpha: auto` becomes the training set's ratio (used by augmented
    encodings: Seq2Seq scales the source positions by it)."""
    m = cfg.model
    options = dict(row.options)
    given = options.pop("alpha", "auto")
    return Seq2Seq(
        vocab_size,
        dim=m.dim,
        encoder_layers=m.encoder_layers,
        decoder_layers=m.decoder_layers,
        heads=m.heads,
        ffn_dim=m.ffn_dim,
        dropout=m.dropout,
        position=row.position,
        position_options=options,
        alpha=float(alpha if given == "auto" else given),
        pad_id=pad_id,
    )


def loss_fn(label_smoothing: float, pad_id: int):
    """loss_fn(model, batch) -> (label-smoothed cross-entropy per target token, {"nll"}): the
    engine's loss; positions are drawn (CAPE) from the global torch RNG."""

    def fn(model: torch.nn.Module, batch: dict[str, torch.Tensor]):
        logits = model(batch["src"], batch["src_mask"], batch["tgt_in"], batch["tgt_mask"])
        flat, target = logits.flatten(0, 1), batch["tgt_out"].flatten()
        loss = F.cross_entropy(flat, target, ignore_index=pad_id, label_smoothing=label_smoothing)
        with torch.no_grad():
            nll = F.cross_entropy(flat, target, ignore_index=pad_id)
        return loss, {"nll": nll}

    return fn


def decode(
    model: Seq2Seq,
    data: TranslationData,
    examples: Sequence[Example],
    *,
    beam: int,
    length_penalty: float,
    batch_size: int,
) -> list[str]:
    """Translations of `examples` (in order); each rank decodes a shard, all ranks get all."""
    rank, world = D.get_rank(), D.get_world_size()
    mine = list(range(rank, len(examples), world))
    device = next(model.parameters()).device
    hyps = translate_ids(
        model,
        data.tokenizer,
        [examples[i].src_ids for i in mine],
        beam=beam,
        length_penalty=length_penalty,
        batch_size=batch_size,
        device=device,
    )
    out = [""] * len(examples)
    for shard in D.all_gather_object(list(zip(mine, hyps, strict=True))):
        for i, h in shard:
            out[i] = h
    return out


def bleu(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """Corpus sacreBLEU (13a tokenisation, as sacrebleu's default)."""
    import sacrebleu

    return float(sacrebleu.corpus_bleu(list(hyps), [list(refs)]).score) if hyps else float("nan")


def _val_fn(cfg: TranslationConfig, data: TranslationData):
    def eval_fn(model: torch.nn.Module) -> dict[str, float]:
        hyps = decode(
            model,
            data,
            data.val,
            beam=cfg.eval.val_beam,  # type: ignore[arg-type]
            length_penalty=cfg.eval.length_penalty,
            batch_size=cfg.eval.batch_size,
        )
        return {"bleu": bleu(hyps, [e.tgt for e in data.val])}

    return eval_fn


def _write_run_files(folder: Path, model: Seq2Seq, row: RowConfig, data: TranslationData) -> None:
    """model.json and bpe.model: what `cape translate` needs to rebuild the model."""
    folder.mkdir(parents=True, exist_ok=True)
    spec = {"model": model.spec, "experiment": "translation", "row": row.name, "alpha": data.alpha}
    write_json(folder / "model.json", spec)
    atomic_write(folder / "bpe.model", lambda tmp: shutil.copyfile(data.bpe_path, tmp))


def train_run(
    cfg: TranslationConfig, row: RowConfig, seed: int, out: str | Path, data: TranslationData
) -> tuple[Seq2Seq, dict[str, float]]:
    """Train one (row, seed), resuming from its checkpoints; returns the model with the best
    validation BLEU and the training summary. A `train_as` row trains the row it names."""
    if row.train_as is not None:
        return train_run(cfg, trained_row(cfg.rows, row), seed, out, data)
    folder = run_dir(out, row, seed)
    seed_everything(seed)
    tok = data.tokenizer
    model = make_model(cfg, row, data.alpha, tok.vocab_size, tok.pad_id)
    if D.get_rank() == 0:
        _write_run_files(folder, model, row, data)
    tcfg = dataclasses.replace(cfg.train, seed=seed)
    record = {
        "experiment": "translation",
        "row": row.name,
        "seed": seed,
        "config": dataclasses.asdict(cfg),
    }
    trainer = Trainer(
        model,
        loss_fn(cfg.model.label_smoothing, tok.pad_id),
        data.train,
        _val_fn(cfg, data),
        tcfg,
        folder,
        collate_fn(tok),
        experiment=record,
        batches=data.batches(seed, cfg.train.batch_size),
    )
    return fit_best(trainer)  # type: ignore[return-value]


def load_run(
    cfg: TranslationConfig,
    row: RowConfig,
    seed: int,
    out: str | Path,
    data: TranslationData | None = None,
) -> Seq2Seq:
    """The trained run's model with the best validation BLEU (else the latest), rebuilt from
    its model.json: the alpha it was trained with, whatever today's data gives. The run is that
    of the row named by `train_as` if any; the model takes the row's `eval_options`."""
    from cape.lab.apps.translate import load_translation_model

    model = load_translation_model(run_dir(out, trained_row(cfg.rows, row), seed))[0]
    return with_eval_options(row, model)


def with_eval_options(row: RowConfig, model: Seq2Seq) -> Seq2Seq:
    """`model` with the row's `eval_options` over its encoding's options (the same weights)."""
    spec = model.spec

    def make() -> Seq2Seq:
        options = {**spec["position_options"], **row.eval_options}
        return Seq2Seq(**{**spec, "position_options": options})

    return evaluation_model(row, model, make)  # type: ignore[return-value]


def _terciles(examples: Sequence[Example]) -> tuple[float, float]:
    """The 33% and 66% percentiles of the reference lengths (words) of `examples`."""
    words = np.array([len(e.tgt.split()) for e in examples])
    return float(np.percentile(words, 100 / 3)), float(np.percentile(words, 200 / 3))


def _bleu_record(
    base: dict[str, Any], split: str, bucket: str, examples: Sequence[Example], hyps: Sequence[str]
) -> dict[str, Any]:
    """One BLEU record, with the bucket's size and mean source / reference length in words."""
    return {
        **base,
        "split": split,
        "bin": bucket,
        "sentences": len(examples),
        "src_words": float(np.mean([len(x.src.split()) for x in examples])),
        "ref_words": float(np.mean([len(x.tgt.split()) for x in examples])),
        "bleu": bleu(hyps, [x.tgt for x in examples]),
    }


def nll_by_position(
    model: Seq2Seq, data: TranslationData, examples: Sequence[Example], batch_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Summed teacher-forced NLL (nats) per output position and how many sequences reach each
    position: ([L], [L]) over `examples`, L = the longest target + EOS."""
    collate = collate_fn(data.tokenizer)
    device = next(model.parameters()).device
    length = max((len(e.tgt_ids) + 1 for e in examples), default=0)
    total, count = np.zeros(length), np.zeros(length)
    for k in range(0, len(examples), batch_size):
        b = {n: t.to(device) for n, t in collate(examples[k : k + batch_size]).items()}
        nll = sequence_nll(model, b["src"], b["src_mask"], b["tgt_in"], b["tgt_out"], b["tgt_mask"])
        t = nll.shape[1]
        total[:t] += nll.double().sum(0).cpu().numpy()
        count[:t] += b["tgt_mask"].double().sum(0).cpu().numpy()
    return total, count


def eval_records(
    cfg: TranslationConfig,
    row: RowConfig,
    seed: int,
    model: Seq2Seq,
    data: TranslationData,
    device: torch.device | None = None,
) -> dict[str, Any]:
    """BLEU records per split and bucket, NLL band records on `stacked`, the NLL curve, and a
    few example translations (on `device`, default: where the model is)."""
    if device is not None:
        model.to(device)
    model.eval()
    e = cfg.eval
    base = {"row": row.name, "seed": seed}
    records: list[dict[str, Any]] = []
    test = data.test("test")
    hyps = decode(
        model, data, test, beam=e.beam, length_penalty=e.length_penalty, batch_size=e.batch_size
    )
    lo, hi = _terciles(test)
    words = [len(x.tgt.split()) for x in test]
    groups = {
        "all": list(range(len(test))),
        "short": [i for i, w in enumerate(words) if w <= lo],
        "medium": [i for i, w in enumerate(words) if lo < w <= hi],
        "long": [i for i, w in enumerate(words) if w > hi],
    }
    for name, idx in groups.items():
        if idx:  # equal percentiles leave "medium" empty
            records.append(
                _bleu_record(base, "test", name, [test[i] for i in idx], [hyps[i] for i in idx])
            )
    examples = [
        {"src": x.src, "ref": x.tgt, "hyp": h} for x, h in zip(test[:3], hyps, strict=False)
    ]
    for split in LONG_SPLITS:
        exs = data.test(split)
        out = decode(
            model, data, exs, beam=e.beam, length_penalty=e.length_penalty, batch_size=e.batch_size
        )
        if exs:  # a small corpus may have no sentence this long
            records.append(_bleu_record(base, split, "all", exs, out))
            examples.append({"src": exs[0].src, "ref": exs[0].tgt, "hyp": out[0]})
    total, count = nll_by_position(model, data, data.test("stacked"), e.batch_size)
    for a, b in zip(NLL_BANDS[:-1], NLL_BANDS[1:], strict=True):
        n = count[a:b].sum()
        if n:
            records.append(
                {
                    **base,
                    "split": "stacked",
                    "bin": f"{a}-{min(b, len(count)) - 1}",
                    "tokens": int(n),
                    "nll": float(total[a:b].sum() / n),
                }
            )
    curve = {"total": total.tolist(), "count": count.tolist()}
    return {"records": records, "curve": curve, "terciles": [lo, hi], "examples": examples}


def format_records(result: dict[str, Any] | list[dict[str, Any]]) -> str:
    """The evaluation records (or `eval_records`' result) as a markdown table (`cape eval`)."""
    records = result["records"] if isinstance(result, dict) else result
    lines = ["| split | bucket | sentences / tokens | BLEU | NLL |", "|---|---|---|---|---|"]
    for r in records:
        size = r.get("sentences", r.get("tokens", ""))
        score = f"{r['bleu']:.2f}" if "bleu" in r else ""
        nll = f"{r['nll']:.3f}" if "nll" in r else ""
        lines.append(f"| {r['split']} | {r['bin']} | {size} | {score} | {nll} |")
    return "\n".join(lines)


@holds_out
def run_experiment(
    cfg: TranslationConfig, mapping: dict[str, Any], out: str | Path, *, train: bool = True
) -> dict[str, Any]:
    """Train and evaluate every (row, seed), then write the report; returns the results. With
    `train=False`, report only the runs that have finished (`cape experiment --finished`)."""
    out, dist = begin(cfg, mapping, out)
    data = make_data(cfg)
    records: list[dict[str, Any]] = []
    curves: dict[str, dict[str, list[float]]] = {}
    examples: dict[str, list[dict[str, str]]] = {}
    summaries: dict[str, dict[str, Any]] = {}
    params: dict[str, int] = {}
    terciles: list[float] = []

    def compute(row: RowConfig, seed: int, folder: Path) -> dict[str, Any]:
        if row.train_as is not None:  # trained above (an earlier row): its weights, evaluated
            model = load_run(cfg, row, seed, out).to(dist.device)
            summary: dict[str, Any] = {"train_as": row.train_as}
        else:
            trained, summary = train_run(cfg, row, seed, out, data)
            model = with_eval_options(row, trained)
        return {**eval_records(cfg, row, seed, model, data, dist.device), "summary": summary}

    for row, seed, done in cached_runs(cfg.rows, cfg.seeds, out, compute, cfg, train=train):
        records += done["records"]
        curves[f"{row.name}/seed{seed}"] = done["curve"]
        examples.setdefault(row.name, done["examples"])
        summaries[f"{row.name}/seed{seed}"] = done["summary"]
        terciles = done["terciles"]
        if row.name not in params:  # the same for every seed
            tok = data.tokenizer
            model = make_model(
                cfg, trained_row(cfg.rows, row), data.alpha, tok.vocab_size, tok.pad_id
            )
            params[row.name] = parameter_counts(model)["total"]
    results = {
        "experiment": "translation",
        "name": cfg.name,
        "config": mapping,
        "records": records,
        "curves": curves,
        "examples": examples,
        "terciles": terciles,
        "train_length": data.train_length(),
        "train": summaries,
        "params": params,
        "data": data.summary(),
    }
    finish(dist, lambda: write_report(out, results))
    return results
