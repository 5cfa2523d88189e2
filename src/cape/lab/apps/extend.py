"""`cape extend`: extend a transformers RoPE model's context through cape, end to end.

Takes a causal LM trained at context L in transformers' own format (`--base`, a
`save_pretrained` folder; without it a tiny Llama is trained here on the King James Bible at L
first), then for each method fine-tunes a copy at 4L with cape installed (`--steps` steps,
byte tokens), saves it with `save_pretrained`, loads it again (with stock transformers where
transformers can express it, else with `cape.integrations.hf.from_pretrained`, and checks the
reloaded logits against the fine-tuned model's) and scores perplexity at 1x to 16x L on the
validation split (non-overlapping windows). Methods:

- "none": the base model as it is (no fine-tune): the reference;
- "pi": position interpolation, factor 4 (transformers' "linear": a stock load reproduces it);
- "yarn": YaRN, factor 4, as transformers computes it ("yarn-hf": a stock load reproduces it);
- "cape": rotary as trained, fine-tuned with CAPE's augmentation of position_ids (global
  scaling up to 4, local shift 0.5 tokens: `augment_position_ids`, training batches only).

Writes `report.md`, `extend.json` and `perplexity_vs_length.png` to `--out`.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

import cape
from cape.integrations import hf
from cape.lab.arguments import ArgumentParser, out_folder
from cape.lab.data.text_corpus import TextCorpus, build_text_corpus
from cape.lab.data.text_corpus.corpus import eval_windows, random_windows
from cape.lab.io import write_json, write_text
from cape.lab.torchvision_ops import declare_missing_torchvision_ops
from cape.lab.train.lock import locked_folder

__all__ = ["METHODS", "run", "main"]

METHODS = ("none", "pi", "yarn", "cape")
FACTORS = (1, 2, 4, 8, 16)
SIZE = dict(hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4)  # fmt: skip


def _transformers() -> Any:
    declare_missing_torchvision_ops()
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


def _base_model(t: Any, vocab: int, context: int) -> Any:
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    config = t.LlamaConfig(vocab_size=vocab, max_position_embeddings=context,
                           tie_word_embeddings=True, rope_parameters=rope,
                           **SIZE)  # fmt: skip
    return t.LlamaForCausalLM(config)


def _train(model: Any, tokens: np.ndarray, length: int, steps: int, seed: int, what: str) -> None:
    """`steps` AdamW steps (lr 3e-3, warm-up then cosine to 0, batch 16) on random windows of
    `length`."""
    torch.manual_seed(seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    warm = max(1, steps // 10)

    def scale(step: int) -> float:  # linear warm-up, then cosine to 0
        if step < warm:
            return (step + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, scale)
    batches = random_windows(tokens, length, 16, seed)
    start = time.perf_counter()
    for step in range(1, steps + 1):
        x, y = next(batches)
        logits = model(input_ids=torch.from_numpy(x)).logits
        loss = F.cross_entropy(logits.flatten(0, 1), torch.from_numpy(y).flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == steps:
            rate = step / (time.perf_counter() - start)
            print(f"{what}: step {step}/{steps} loss {loss.item():.3f} "
                  f"({rate:.1f} steps/s)", flush=True)  # fmt: skip
    model.eval()


@torch.no_grad()
def perplexity(model: Any, tokens: np.ndarray, length: int, max_tokens: int) -> float:
    """exp(mean next-token NLL) over non-overlapping windows of `length` of the first
    `max_tokens` tokens (every window scored whole)."""
    model.eval()
    total, count = 0.0, 0
    for x, y in eval_windows(tokens[: max_tokens + 1], length, 4, drop_last=True):
        logits = model(input_ids=torch.from_numpy(x)).logits
        nll = F.cross_entropy(logits.flatten(0, 1), torch.from_numpy(y).flatten(), reduction="sum")
        total, count = total + float(nll), count + y.size
    return math.exp(total / count)


def _install(model: Any, method: str, context: int, factor: int) -> None:
    """cape installed for `method` (module docstring)."""
    if method in ("pi", "yarn"):
        head = model.config.hidden_size // model.config.num_attention_heads
        scaling = {"pi": "pi", "yarn": "yarn-hf"}[method]
        extra = {} if method == "pi" else {"train_length": float(context)}
        rotary = cape.Rotary(head, base=10000.0, scaling=scaling, factor=float(factor), **extra)
        hf.install_rotary(model, rotary)
    elif method == "cape":
        aug = cape.Augmentation(max_local_shift=0.5, max_global_scaling=float(factor))
        hf.augment_position_ids(model, aug)  # stays on the model: its handle is not needed


def _extend(t: Any, base: Path, method: str, data: dict, args: argparse.Namespace) -> dict:
    """Fine-tune, save, reload and score one method -> its results record."""
    out = Path(args.out) / method
    model = t.LlamaForCausalLM.from_pretrained(str(base))
    context = int(model.config.max_position_embeddings)
    if method != "none":
        _install(model, method, context, 4)
        _train(model, data["train"], 4 * context, args.steps, args.seed, f"{method} at 4L")
    model.save_pretrained(str(out))
    stock_load = method in ("none", "pi", "yarn")
    loader = "stock transformers" if stock_load else "cape.integrations.hf.from_pretrained"
    again = (t.LlamaForCausalLM.from_pretrained(str(out)) if stock_load
             else hf.from_pretrained(t.LlamaForCausalLM, out))  # fmt: skip
    again.eval()
    probe = torch.from_numpy(np.asarray(data["val"][: 2 * context], dtype=np.int64))[None]
    with torch.no_grad():
        diff = float((model.eval()(input_ids=probe).logits - again(input_ids=probe).logits)
                     .abs().max())  # fmt: skip
    ppl = {f: perplexity(again, data["val"], f * context, args.eval_tokens) for f in FACTORS}
    print(f"{method}: reloaded with {loader} (max |logit difference| {diff:.1e}); " +
          ", ".join(f"{f}x {p:.2f}" for f, p in ppl.items()), flush=True)  # fmt: skip
    return {"method": method, "loader": loader, "reload_max_abs_diff": diff,
            "perplexity": {str(f): p for f, p in ppl.items()}, "context": context}  # fmt: skip


def _report(records: list[dict], args: argparse.Namespace, seconds: float) -> str:
    context = records[0]["context"]
    head = "| method | reloaded with | " + " | ".join(f"{f}x ({f * context})" for f in FACTORS)
    lines = [head + " |", "|---|---|" + "---|" * len(FACTORS)]
    for r in records:
        cells = " | ".join(f"{r['perplexity'][str(f)]:.2f}" for f in FACTORS)
        lines.append(f"| {r['method']} | {r['loader']} | {cells} |")
    best = min(records, key=lambda r: r["perplexity"][str(16)])
    first = min(records, key=lambda r: r["perplexity"]["1"])
    growth = ", ".join(
        f"{r['method']} {r['perplexity']['16'] / r['perplexity']['1']:.2f}x" for r in records
    )
    return "\n".join([
        "# Extending a RoPE model's context through cape", "", "## Verdict", "",
        f"Lowest at 1x L: {first['method']} ({first['perplexity']['1']:.2f}); lowest at 16x L: "
        f"{best['method']} ({best['perplexity'][str(16)]:.2f}). Perplexity at 16x over 1x: "
        f"{growth}. One seed: the spread between seeds is not measured here.", "",
        "## Setting", "",
        f"A tiny Llama (width {SIZE['hidden_size']}, {SIZE['num_hidden_layers']} layers) trained "
        f"at L = {context} byte tokens on the King James Bible, fine-tuned {args.steps} steps at "
        f"4L per method; perplexity on the validation split (first {args.eval_tokens} tokens, "
        f"windows of 1x to 16x L). Every saved model was loaded again and its logits checked "
        f"(largest difference {max(r['reload_max_abs_diff'] for r in records):.1e}). Took "
        f"{seconds / 60:.1f} min.", "",
        *lines, "", "![perplexity against length](perplexity_vs_length.png)",
    ]) + "\n"  # fmt: skip


def run(args: argparse.Namespace) -> list[dict]:
    """The workflow of the module docstring; returns one record per method."""
    t, start = _transformers(), time.perf_counter()
    corpus = TextCorpus(build_text_corpus(args.corpus, args.data_root))
    data = {"train": corpus.tokens("train"), "val": corpus.tokens("val")}
    out = Path(args.out)
    base = Path(args.base) if args.base else out / "base"
    if not args.base:
        torch.manual_seed(args.seed)
        model = _base_model(t, corpus.vocab_size, args.context)
        _train(model, data["train"], args.context, args.base_steps, args.seed, "base at L")
        model.save_pretrained(str(base))
    records = [_extend(t, base, m, data, args) for m in args.methods]
    write_json(out / "extend.json", {"records": records, "settings": vars(args)})
    _plot(records, out)
    write_text(out / "report.md", _report(records, args, time.perf_counter() - start))
    return records


def _plot(records: list[dict], out: Path) -> None:
    from cape.lab.viz.plots import plot_curves

    context = records[0]["context"]
    cells = [{"method": r["method"], "length": f * context, "mean": r["perplexity"][str(f)]}
             for r in records for f in FACTORS]  # fmt: skip
    plot_curves(cells, out / "perplexity_vs_length.png", x="length", series="method",
                y_label="perplexity", x_label="evaluation length (tokens)", vline=context,
                vline_label="L", logx=True, logy=True,
                title="Context extension through cape (fine-tuned at 4L)")  # fmt: skip


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="cape extend", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--out", type=out_folder, default=Path("runs/extend"), help="report folder")
    p.add_argument("--base", default=None, help="a save_pretrained folder of a RoPE causal LM")
    p.add_argument("--context", type=int, default=64, help="L of the base trained here")
    p.add_argument("--base-steps", type=int, default=600, help="steps of the base trained here")
    p.add_argument("--steps", type=int, default=150, help="fine-tuning steps per method")
    p.add_argument(
        "--methods", default=",".join(METHODS), help="comma list of " + ", ".join(METHODS)
    )
    p.add_argument("--eval-tokens", type=int, default=32768, help="validation tokens scored")
    p.add_argument("--corpus", default="kjv", help="a text corpus name or a folder of .txt files")
    p.add_argument("--data-root", default="data/text", help="the text corpora's cache folder")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    args.methods = p.names("--methods", args.methods, list(METHODS))
    p.at_least(("--context", args.context, 8), ("--base-steps", args.base_steps, 1),
               ("--steps", args.steps, 1), ("--eval-tokens", args.eval_tokens, 1),
               ("--seed", args.seed, 0))  # fmt: skip
    if args.base and not (Path(args.base) / "config.json").is_file():
        p.error(f"--base must be a save_pretrained folder (with config.json), got {args.base!r}")
    if args.eval_tokens < 16 * args.context:
        p.error(f"--eval-tokens must cover one window of 16x --context ({16 * args.context})")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    with locked_folder(args.out):
        run(args)
    print(f"wrote {Path(args.out) / 'report.md'}")
    return 0
