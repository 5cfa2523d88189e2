"""`cape bench slowdown`: CAPE's Table 9 (appendix D.2) for every encoding against nopos.

The paper times forward + backward of a Transformer layer, a 6-layer encoder and a 6-layer
decoder with learned relative positions (relpos, context 100 and 1000 tokens to each side)
against the same models without positions, for sequence lengths 10, 100 and 1000 in fp32 and
fp16 (batch 50, D 768, 8 heads; 10 warm-up and 100 timed updates). Here the same table is
measured for relpos, CAPE, sinpos, abspos, LFF and rotary, each against nopos.

- Models: `layer` = one pre-norm encoder layer (a 1-layer `TransformerEncoder` without final
  norm, so absolute encodings are added to its input as in a stack); `encoder` = `--layers`
  encoder layers; `decoder` = `--layers` decoder layers (causal self-attention, cross-attention
  over a random memory as long as the targets; positions only on the targets).
- Encodings: each row is a label for a `cape.build` name and its options, given to the stack
  as `position=name, position_options=options`; the stack's position plan
  (`cape.models.plan`) adds absolute ones to its input and builds the in-attention ones in
  every layer's self-attention (of the head size D/H; ALiBi and FIRE of the number of heads):
  - nopos = nopos (the reference);
  - relpos-100 = relpos(max_distance=100): learned relative keys (Shaw et al.), context 100;
  - relpos-1000 = relpos(max_distance=1000): the same, context 1000;
  - cape1d = cape1d(preset="text", max_global_scaling=1.1, normalize=True): train mode, all
    of the text augmentation on (global shift 5, local shift 0.5, global scaling 1.1,
    mean-normalisation); the decoder takes normalize=False (mean-normalisation would break
    causality), as CAPE's MT decoder;
  - sinpos = sinpos;
  - abspos = abspos(num_positions=<the cell's length>): one row per position;
  - lff = lff(pos_dim=1): reads token positions [B, T, 1] made once per cell;
  - rotary = rotary;
  and the peers, timed on request (`--encodings nopos,sinpos,alibi,fire,xpos`):
  - alibi = alibi, fire = fire: attention biases (one value per head);
  - xpos = rotary(xpos=True): rotary with xPos's per-position scale on q and k.
- One update = gradients set to None, forward (under `torch.autocast` for bf16 / fp16; the
  parameters stay fp32), loss = mean square of the output in fp32, backward. No optimizer step
  (the paper times forward and backward). Train mode, dropout 0.
- Per (model, dtype, length) cell, one model per encoding is built from seed 0 and all are
  timed round-robin (`time_interleaved`), so ratio = median / nopos median of the same cell.

Writes `slowdown.md/.csv` (every measurement) and `table9.md/.csv` (ratios, shaped as the
paper's table) with `--out`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import torch
from torch import nn

from cape.encodings.fourier import LearnableFourierFeatures
from cape.lab.arguments import ArgumentParser, out_folder
from cape.lab.bench.results import machine, write_results
from cape.lab.bench.slowdown_rows import (
    ENCODINGS,
    PEERS,
    ROWS,
    BenchRow,
    describe,
    row_position,
)
from cape.lab.bench.table9 import CAPE_TARGET, PAPER_TABLE9, table9_rows
from cape.lab.timing import time_interleaved
from cape.models import TransformerDecoder, TransformerEncoder
from cape.positions import token_positions

__all__ = [
    "SlowdownConfig",
    "PRESETS",
    "BenchRow",
    "ROWS",
    "ENCODINGS",
    "PEERS",
    "MODELS",
    "DTYPES",
    "CAPE_TARGET",
    "row_position",
    "describe",
    "build_model",
    "update_fn",
    "run_cell",
    "main",
]


MODELS = ("layer", "encoder", "decoder")
DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}


@dataclass(frozen=True)
class SlowdownConfig:
    """Sizes of one run. layers: of the encoder and decoder (the `layer` model has one)."""

    batch: int = 8
    dim: int = 256
    heads: int = 8
    ffn: int = 1024
    layers: int = 6
    warmup: int = 3
    runs: int = 20

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            low = 0 if f.name == "warmup" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{f.name} must be an int >= {low}, got {value!r}")
        if self.dim % self.heads or (self.dim // self.heads) % 2:
            raise ValueError(
                f"dim must be divisible by heads with an even head size (rotary), got "
                f"dim={self.dim}, heads={self.heads}"
            )

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


PRESETS: dict[str, SlowdownConfig] = {
    "cpu": SlowdownConfig(),
    "paper": SlowdownConfig(batch=50, dim=768, heads=8, ffn=3072, layers=6, warmup=10, runs=100),
}


def build_model(
    kind: str, encoding: str, cfg: SlowdownConfig, *, max_length: int = 1000
) -> nn.Module:
    """The `kind` model ("layer", "encoder", "decoder") with `encoding` (a label of `ROWS`:
    its `cape.build` name and options go to the stack as `position`, `position_options`),
    dropout 0, train mode.

    max_length: the longest input (abspos's table size).
    """
    if kind not in MODELS:
        raise ValueError(f"kind must be one of {list(MODELS)}, got {kind!r}")
    name, position_options = row_position(encoding, kind, max_length)  # checks the label
    if not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length must be an int >= 1, got {max_length!r}")
    # the stack's position plan decides: added at the input, or one module in every layer
    options: dict[str, Any] = dict(position=name, position_options=position_options, dropout=0.0)
    if kind == "decoder":
        model: nn.Module = TransformerDecoder(cfg.layers, cfg.dim, cfg.heads, cfg.ffn, **options)
    elif kind == "encoder":
        model = TransformerEncoder(cfg.layers, cfg.dim, cfg.heads, cfg.ffn, **options)
    else:  # one layer with its input encoding: a 1-layer stack, no final norm
        model = TransformerEncoder(1, cfg.dim, cfg.heads, cfg.ffn, final_norm=False, **options)
    return model.train()


def update_fn(
    model: nn.Module,
    x: torch.Tensor,
    memory: torch.Tensor | None,
    dtype: torch.dtype,
    device: str | torch.device,
) -> Callable[[], None]:
    """One timed update of `model`: zero grads, forward (autocast unless fp32), backward.

    x: [B, T, D] inputs; memory: [B, S, D] for a `TransformerDecoder`, None otherwise. No host
    sync happens inside (the caller's timer syncs).
    """
    dev = torch.device(device)
    is_decoder = isinstance(model, TransformerDecoder)
    if is_decoder != (memory is not None):
        raise ValueError("memory must be given for a TransformerDecoder and only for it")
    if dtype not in DTYPES.values():
        raise ValueError(f"dtype must be one of {list(DTYPES.values())}, got {dtype}")
    args = (x,) if memory is None else (x, memory)
    kwargs: dict[str, Any] = {}
    if isinstance(getattr(model, "position", None), LearnableFourierFeatures):
        kwargs["positions"] = token_positions(x.shape[0], x.shape[1], device=x.device)
    reduced = dtype != torch.float32

    def update() -> None:
        model.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=dtype, enabled=reduced):
            out = model(*args, **kwargs)
        out.float().square().mean().backward()

    return update


def run_cell(
    kind: str,
    length: int,
    dtype: str,
    encodings: Sequence[str],
    cfg: SlowdownConfig,
    device: str | torch.device = "cpu",
) -> list[dict[str, Any]]:
    """Time every encoding of one (model, dtype, length) cell round-robin; one row each.

    Rows: model, encoding, dtype, length, median_ms, iqr_ms, ratio (/ nopos median of this
    cell), target ("ok"/"MISSED" against `CAPE_TARGET` for cape1d, "" otherwise).
    """
    if "nopos" not in encodings:
        raise ValueError(f"encodings must include the reference 'nopos', got {list(encodings)}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")
    if not isinstance(length, int) or length < 1:
        raise ValueError(f"length must be an int >= 1, got {length!r}")
    dev = torch.device(device)
    torch.manual_seed(0)
    x = torch.randn(cfg.batch, length, cfg.dim, device=dev)
    memory = torch.randn(cfg.batch, length, cfg.dim, device=dev) if kind == "decoder" else None
    fns = []
    for name in encodings:
        torch.manual_seed(0)  # the same weights wherever the shapes match
        model = build_model(kind, name, cfg, max_length=length).to(dev)
        fns.append(update_fn(model, x, memory, DTYPES[dtype], dev))
    timings = time_interleaved(fns, runs=cfg.runs, warmup=cfg.warmup, device=dev)
    base = timings[list(encodings).index("nopos")].median_ms
    rows = []
    for name, t in zip(encodings, timings, strict=True):
        ratio = t.median_ms / base
        target = ("ok" if ratio <= CAPE_TARGET else "MISSED") if name == "cape1d" else ""
        rows.append(
            dict(
                model=kind,
                encoding=name,
                dtype=dtype,
                length=length,
                median_ms=t.median_ms,
                iqr_ms=t.iqr_ms,
                ratio=ratio,
                target=target,
            )
        )
    return rows


def _parser() -> ArgumentParser:
    p = ArgumentParser(
        prog="cape bench slowdown",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default=None,
        help="sizes: cpu (batch 8, D 256, FFN 1024, 3+20 updates) or paper (batch 50, "
        "D 768, FFN 3072, 10+100 updates); default cpu on a CPU, paper on CUDA",
    )
    for name, what in (
        ("batch", "batch size"),
        ("dim", "model width D"),
        ("heads", "attention heads"),
        ("ffn", "FFN hidden size"),
        ("layers", "encoder / decoder layers"),
        ("warmup", "warm-up updates"),
        ("runs", "timed updates"),
    ):
        p.add_argument(f"--{name}", type=int, default=None, help=f"{what} (overrides the preset)")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma list of {', '.join(MODELS)}")
    p.add_argument(
        "--encodings",
        default=",".join(ENCODINGS),
        help="comma list of labels, each a cape.build name and its options: "
        + "; ".join(describe(e) for e in ENCODINGS + PEERS)
        + f" (default: all but {', '.join(PEERS)}; nopos is always timed: the reference)",
    )
    p.add_argument("--lengths", default="10,100,1000", help="comma list of sequence lengths")
    p.add_argument(
        "--dtypes", default="fp32,bf16", help="comma list of fp32, bf16, fp16 (CUDA only)"
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument(
        "--out",
        type=out_folder,
        default=None,
        help="folder for slowdown.md/.csv and table9.md/.csv",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    try:
        device = torch.device(args.device)
    except RuntimeError:
        p.error(f"--device must be cpu or cuda[:N], got {args.device!r}")
    if device.type not in ("cpu", "cuda"):
        p.error(f"--device must be cpu or cuda[:N], got {args.device!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error(f"--device {args.device!r}: CUDA is not available here")
    models = p.names("--models", args.models, MODELS)
    encodings = p.names("--encodings", args.encodings, ENCODINGS + PEERS)
    encodings = ["nopos"] + [e for e in encodings if e != "nopos"]
    dtypes = p.names("--dtypes", args.dtypes, tuple(DTYPES))
    if "fp16" in dtypes and device.type != "cuda":
        p.error("--dtypes fp16 needs --device cuda (CPU autocast: fp32 or bf16)")
    lengths = p.positive_ints("--lengths", args.lengths)
    preset = args.preset or ("paper" if device.type == "cuda" else "cpu")
    given = {
        f.name: getattr(args, f.name)
        for f in fields(SlowdownConfig)
        if getattr(args, f.name) is not None
    }
    try:
        cfg = replace(PRESETS[preset], **given)
    except ValueError as err:
        p.error(f"bad sizes (--batch/--dim/--heads/--ffn/--layers/--warmup/--runs): {err}")

    rows: list[dict[str, Any]] = []
    for kind in models:
        for dtype in dtypes:
            for length in lengths:
                cell = run_cell(kind, length, dtype, encodings, cfg, device)
                rows += cell
                summary = ", ".join(f"{r['encoding']} {r['ratio']:.2f}" for r in cell[1:])
                print(
                    f"[slowdown] {kind} {dtype} len {length}: nopos {cell[0]['median_ms']:.1f} ms; "
                    f"{summary}",
                    file=sys.stderr,
                    flush=True,
                )
                if device.type == "cuda":
                    torch.cuda.empty_cache()  # the next cell may be much longer
    meta = {
        **machine(device),
        "preset": preset,
        **asdict(cfg),
        "ratio": "median fwd+bwd time / nopos median, same cell, interleaved",
        "precision": "bf16/fp16 = torch.autocast around the forward; fp32 params and loss",
    }
    notes = (
        "`layer`: one encoder layer (absolute encodings added to its input); `encoder` / "
        f"`decoder`: {cfg.layers} layers. relpos-K: learned relative keys, context K tokens to "
        "each side, in every self-attention; rotary: in every self-attention; cape1d: train "
        "mode, all augmentations (no mean-normalisation in the decoder). IQR = inter-quartile "
        f"range. target: cape1d within {CAPE_TARGET - 1:.0%} of nopos.\n\n{PAPER_TABLE9}"
    )
    write_results(
        args.out,
        "slowdown",
        rows,
        title="Slowdown of each encoding vs nopos (CAPE Table 9)",
        meta=meta,
        notes=notes,
        digits=3,
    )
    write_results(
        args.out,
        "table9",
        table9_rows(rows),
        title="Table 9: fwd+bwd time / nopos time",
        meta=meta,
        notes=notes,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
