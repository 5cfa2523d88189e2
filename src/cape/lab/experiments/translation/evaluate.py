"""The translation experiment's evaluation: sacreBLEU on `test` overall and per target-length
tercile and on each long bucket, the NLL per output position on stacked pairs with teacher
forcing, and a few example translations."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from cape.lab.apps.translate import translate_ids
from cape.lab.experiments.translation.config import RowConfig, TranslationConfig
from cape.lab.experiments.translation.data import LONG_SPLITS, Example, TranslationData, collate_fn
from cape.lab.train import distributed as D
from cape.models.search import sequence_nll
from cape.models.seq2seq import Seq2Seq

__all__ = [
    "NLL_BANDS",
    "decode",
    "bleu",
    "val_fn",
    "nll_by_position",
    "eval_records",
    "format_records",
]

NLL_BANDS = (0, 32, 64, 128, 192, 256, 100_000)
"""Output-position bands (tokens) of the stacked-sequence NLL table."""


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


def val_fn(cfg: TranslationConfig, data: TranslationData):
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
