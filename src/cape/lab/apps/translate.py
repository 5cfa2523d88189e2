"""Translate English text with a trained translation run: what `cape translate` does.

A run folder of `cape experiment translation` (`<out>/<row>/seed<k>/`) holds `model.json`
(the `Seq2Seq` spec), `bpe.model` (the joint SentencePiece model) and its checkpoints;
`load_translation_model` rebuilds the model with the best validation BLEU, and `translate`
turns sentences into Spanish (lower-cased, as the corpus is) with beam search.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from cape._checks import check_int
from cape.lab.apps.device import inference_device, run_spec
from cape.lab.arguments import ArgumentParser
from cape.lab.data.translation.bpe import Tokenizer
from cape.lab.train.checkpoint import load_checkpoint, pick_checkpoint
from cape.models.search import beam_search, greedy_decode, max_lengths
from cape.models.seq2seq import Seq2Seq

__all__ = [
    "load_translation_model",
    "translate",
    "translate_ids",
    "normalize_source",
    "pad_batch",
    "source_ids",
    "translate_main",
]

_SPACES = re.compile(r"\s+")


def normalize_source(text: str) -> str:
    """What the corpus's sources look like: lower case, single spaces, no ends."""
    return _SPACES.sub(" ", text).strip().lower()


def load_translation_model(
    run: str | Path, *, device: str | torch.device = "cpu", checkpoint: str = "best"
) -> tuple[Seq2Seq, Tokenizer, dict[str, Any]]:
    """(model in eval mode, tokenizer, model.json) of a run folder; `checkpoint`: "best" (the
    newest step when best/ was never saved), "latest", or a folder name in RUN/checkpoints."""
    run = Path(run)
    if not (run / "model.json").is_file():
        raise FileNotFoundError(
            f"run {str(run)!r} has no model.json: give a folder "
            "<out>/<row>/seed<k> of `cape experiment translation`"
        )
    spec = run_spec(run, "a translation", "Seq2Seq")
    device = inference_device(device)
    path = pick_checkpoint(run / "checkpoints", checkpoint)
    model = Seq2Seq(**spec["model"])
    load_checkpoint(path, model)
    return model.to(device).eval(), Tokenizer(run / "bpe.model"), spec


def translate(
    model: Seq2Seq,
    tokenizer: Tokenizer,
    texts: Sequence[str],
    *,
    beam: int = 4,
    length_penalty: float = 1.0,
    batch_size: int = 64,
    max_tokens: int | None = None,
) -> list[str]:
    """Translations of `texts` (in order). beam 0 = greedy. Sentences are decoded in batches
    of similar length (padding never changes an output; tested). max_tokens: longer sources
    are cut to that many BPE tokens (None: no cut)."""
    check_int("beam", beam, minimum=0)
    check_int("batch_size", batch_size)
    if isinstance(texts, str):
        raise TypeError("texts must be a sequence of sentences, not one string")
    device = next(model.parameters()).device
    ids = tokenizer.encode_batch([normalize_source(t) for t in texts])
    if max_tokens is not None:
        ids = [s[:max_tokens] for s in ids]
    return translate_ids(
        model,
        tokenizer,
        ids,
        beam=beam,
        length_penalty=length_penalty,
        batch_size=batch_size,
        device=device,
    )


def translate_ids(
    model: Seq2Seq,
    tokenizer: Tokenizer,
    ids: Sequence[Sequence[int]],
    *,
    beam: int,
    length_penalty: float,
    batch_size: int,
    device: torch.device,
) -> list[str]:
    """`translate` from BPE ids (no BOS/EOS) to texts; what the experiment calls."""
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out = [""] * len(ids)
    for k in range(0, len(order), batch_size):
        idx = order[k : k + batch_size]
        src, mask = pad_batch([source_ids(ids[i], tokenizer) for i in idx], tokenizer.pad_id)
        src, mask = src.to(device), mask.to(device)
        ends = {"bos_id": tokenizer.bos_id, "eos_id": tokenizer.eos_id}
        if beam:
            hyps = beam_search(model, src, mask, beam=beam, length_penalty=length_penalty, **ends)
        else:
            hyps = greedy_decode(model, src, mask, max_len=max_lengths(mask, 1.5, 10), **ends)
        for i, h in zip(idx, hyps, strict=True):
            out[i] = tokenizer.decode(h)
    return out


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded [B, L] long ids and their [B, L] bool mask (True = real)."""
    length = max(1, max(len(s) for s in seqs))
    ids = torch.full((len(seqs), length), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.as_tensor(list(s), dtype=torch.long)
    mask = torch.arange(length)[None, :] < torch.tensor([len(s) for s in seqs])[:, None]
    return ids, mask


def source_ids(ids: Sequence[int], tokenizer: Tokenizer) -> list[int]:
    """`[BOS] ids [EOS]`: the encoder's input (appendix D.1: the BOS marks the first position)."""
    return [tokenizer.bos_id, *ids, tokenizer.eos_id]


def translate_main(argv: list[str]) -> int:
    """`cape translate RUN [TEXT ...]`: translate each TEXT, or each line of stdin."""
    p = ArgumentParser(
        prog="cape translate",
        description="Translate English sentences into Spanish with a "
        "trained `cape experiment translation` run.",
    )
    p.add_argument("run", help="run folder <out>/<row>/seed<k> (holds model.json, bpe.model)")
    p.add_argument("text", nargs="*", help="sentences; none: read one sentence per stdin line")
    p.add_argument("--beam", type=int, default=4, help="beam width; 0 = greedy (default 4)")
    p.add_argument("--length-penalty", type=float, default=1.0)
    p.add_argument(
        "--checkpoint",
        default="best",
        help="best (default), latest, or a folder name in RUN/checkpoints",
    )
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    if args.beam < 0:
        raise ValueError(f"--beam must be >= 0 (0 = greedy), got {args.beam}")
    # a missing or foreign run is a FileNotFoundError or ValueError: `cape` exits 2 with its line
    model, tok, _ = load_translation_model(args.run, device=args.device, checkpoint=args.checkpoint)
    texts = args.text or [line.rstrip("\n") for line in sys.stdin]
    keep = [t for t in texts if t.strip()]
    hyps = iter(translate(model, tok, keep, beam=args.beam, length_penalty=args.length_penalty))
    for t in texts:
        print(next(hyps) if t.strip() else "")
    return 0
