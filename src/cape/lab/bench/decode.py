"""`cape bench decode`: cape's CausalLM against transformers' Llama at matched size, in one run.

Both models have width 256, 4 layers, 4 heads, a 256-token vocabulary (bytes) and tied
embeddings; Llama's SwiGLU feed-forward is sized for the FLOPs of cape's GELU one (3 D I = 2 D
F: I = 683 for F = 1024). Per row, cape and the reference are timed round-robin in one process
(`time_interleaved`), so the ratio cape / reference is measured in one run:

- greedy generation with the key/value cache (eval mode, no gradient): a 16-token prompt
  continued by `--new` tokens, at batch 1 and 8 -> tokens per second (new tokens x batch / s);
  cape's rotary and ALiBi against Llama's `generate(do_sample=False)`;
- a training step (forward + backward of the next-token loss, fp32) at B8 x T256 and
  B4 x T1024, cape's rotary against Llama.

transformers is a test-extra dependency: `pip install "cape[test]"`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from cape.lab.arguments import ArgumentParser, out_folder
from cape.lab.bench.results import machine, write_results
from cape.lab.timing import time_interleaved
from cape.models import CausalLM

__all__ = ["cape_model", "llama_model", "run", "main"]

SIZE = dict(dim=256, layers=4, heads=4, ffn_dim=1024, vocab=256)
PROMPT = 16


def cape_model(position: str = "rotary") -> CausalLM:
    """cape's CausalLM at the matched size (module docstring), no dropout."""
    s = SIZE
    return CausalLM(s["vocab"], dim=s["dim"], layers=s["layers"], heads=s["heads"],
                    ffn_dim=s["ffn_dim"], dropout=0.0, position=position)  # fmt: skip


def llama_model() -> torch.nn.Module:
    """transformers' LlamaForCausalLM at the matched size (module docstring)."""
    from cape.lab.torchvision_ops import declare_missing_torchvision_ops

    declare_missing_torchvision_ops()
    from transformers import LlamaConfig, LlamaForCausalLM

    s = SIZE
    config = LlamaConfig(
        vocab_size=s["vocab"], hidden_size=s["dim"], num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"], num_key_value_heads=s["heads"],
        intermediate_size=round(2 * s["ffn_dim"] / 3), max_position_embeddings=4096,
        tie_word_embeddings=True, attn_implementation="sdpa",
    )  # fmt: skip
    return LlamaForCausalLM(config)


def _generation(model: torch.nn.Module, prompt: torch.Tensor, new: int, hf: bool) -> Callable:
    model.eval()

    def cape_run() -> None:
        out = model.generate(prompt, new)
        assert out.shape[1] == prompt.shape[1] + new

    def hf_run() -> None:
        with torch.no_grad():
            out = model.generate(
                prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                use_cache=True, pad_token_id=0,
            )  # fmt: skip
        assert out.shape[1] == prompt.shape[1] + new

    return hf_run if hf else cape_run


def _train_step(model: torch.nn.Module, tokens: torch.Tensor, hf: bool) -> Callable:
    model.train()

    def step() -> None:
        model.zero_grad(set_to_none=True)
        if hf:
            logits = model(input_ids=tokens).logits
        else:
            logits = model(tokens)
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()

    return step


def _row(case: str, shape: str, tokens: int, fns: list[Callable], runs: int, warmup: int) -> dict:
    """cape's call and Llama's (`fns`) timed round-robin: one row, `tokens` per call."""
    t_ours, t_ref = time_interleaved(fns, runs=runs, warmup=warmup)
    return {
        "case": case, "shape": shape, "cape_ms": t_ours.median_ms, "llama_ms": t_ref.median_ms,
        "cape_tok_s": tokens / t_ours.median_ms * 1e3,
        "llama_tok_s": tokens / t_ref.median_ms * 1e3,
        "ratio": t_ours.median_ms / t_ref.median_ms,
    }  # fmt: skip


def run(
    *, new: int = 256, batches: tuple[int, ...] = (1, 8), warmup: int = 1, runs: int = 5
) -> list[dict[str, Any]]:
    """The rows of the module docstring: medians (ms), tokens/s and the ratio cape / Llama."""
    torch.manual_seed(0)
    llama, rows = llama_model(), []
    for position in ("rotary", "alibi"):
        ours = cape_model(position)
        for batch in batches:
            prompt = torch.randint(0, SIZE["vocab"], (batch, PROMPT))
            fns = [_generation(ours, prompt, new, False), _generation(llama, prompt, new, True)]
            case, shape = f"generate {position}", f"B{batch} +{new}"
            rows.append(_row(case, shape, new * batch, fns, runs, warmup))
    ours = cape_model("rotary")
    for batch, length in ((8, 256), (4, 1024)):
        tokens = torch.randint(0, SIZE["vocab"], (batch, length))
        fns = [_train_step(ours, tokens, False), _train_step(llama, tokens, True)]
        shape = f"B{batch} T{length}"
        rows.append(_row("train step rotary", shape, batch * length, fns, runs, warmup))
    return rows


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="cape bench decode", description=__doc__)
    p.add_argument("--new", type=int, default=256, help="tokens generated per call")
    p.add_argument("--batches", default="1,8", help="comma list of generation batch sizes")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--runs", type=int, default=5, help="timed calls of each")
    p.add_argument("--out", type=out_folder, default=None, help="folder for decode.md/.csv")
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    batches = tuple(p.positive_ints("--batches", args.batches))
    p.at_least(("--new", args.new, 1), ("--warmup", args.warmup, 0), ("--runs", args.runs, 1))
    rows = run(new=args.new, batches=batches, warmup=args.warmup, runs=args.runs)
    write_results(
        args.out,
        "decode",
        rows,
        title="cape's CausalLM against transformers' Llama at matched size",
        meta={**machine("cpu"), "runs": args.runs, "warmup": args.warmup, **SIZE},
        notes="ratio = cape median / Llama median, each row timed round-robin in one process, "
        "all rows in one run; below 1: cape is faster. Generation: greedy with the key/value "
        "cache, eval mode; tokens/s counts new tokens of every row of the batch. Train step: "
        "forward + backward of the next-token loss, fp32.",
        digits=3,
    )
    return 0
