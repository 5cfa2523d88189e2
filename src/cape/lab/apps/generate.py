"""Continue a text prompt with a trained language model: what `cape generate` does.

A run folder of `cape experiment lm` (`<out>/<row>/seed<k>/`) holds `model.json` (the
`CausalLM` spec, the corpus entry, its tokenizer and the training context L), `bpe.model` for a
BPE corpus and its checkpoints. `load_lm` rebuilds the model and its tokenizer;
`generate_text` continues a prompt.

The prompt is read as the start of a document: `<eod>` (the corpus's document separator, which
precedes every document the model was trained on) then the prompt's tokens (`encode_prompt`);
an empty prompt starts a document from nothing. Generation stops at the next `<eod>`, the
document's end, unless `stop_at_eod=False`.

Length: `CausalLM` reads any length, and every encoding but a learned table gives each position
something (how well it extrapolates past L is what the lm report measures). A learned table
(abspos, N = `num_positions` rows) has no row past N (its `overflow` wraps or clamps the
index): the model is fed only its last N tokens (`readable_context`), so a longer prompt is cut
to its last N tokens, and past N tokens in all each new token comes from a full forward over
the last N (a sliding window, no cache). Otherwise `CausalLM.generate` runs (a key/value cache
where the encoding allows it: the same logits as full forwards).
"""

from __future__ import annotations

import inspect
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

from cape.encodings.learned import AbsPos1d
from cape.lab.apps.device import inference_device, run_spec
from cape.lab.arguments import ArgumentParser
from cape.lab.errors import DamagedFile
from cape.lab.io import read_json_object
from cape.lab.train.checkpoint import load_checkpoint, pick_checkpoint
from cape.models import CausalLM
from cape.models.causal_lm import MAX_TOKENS

__all__ = [
    "load_lm",
    "encode_prompt",
    "readable_context",
    "generate_ids",
    "generate_text",
    "generate_main",
]

_WHAT = "give a folder <out>/<row>/seed<k> of `cape experiment lm`"


def _not_a_run(run: Path) -> Exception:
    """Why folder `run` holds no trained lm model, naming the folder (and the row to use for a
    `train_as` row, whose folder keeps only its evaluation)."""
    if not run.is_dir():
        return FileNotFoundError(f"run {str(run)!r} does not exist: {_WHAT}")
    settings = run / "settings.json"
    if settings.is_file():
        reused = read_json_object(settings).get("row.train_as")
        if reused:
            return ValueError(
                f"run {str(run)!r} evaluates the weights of row {reused!r} (train_as) and holds "
                f"none of its own: give that row's folder <out>/<row>/seed<k>"
            )
    return FileNotFoundError(f"run {str(run)!r} has no model.json: {_WHAT}")


def _bpe(run: Path) -> Any:
    """The run's BPE tokenizer (run/bpe.model), or a FileNotFoundError saying where it is."""
    from cape.lab.data.text_corpus import BpeTokenizer

    if not (run / "bpe.model").is_file():
        raise FileNotFoundError(
            f"run {str(run)!r} has no bpe.model: copy the bpe.model of its corpus entry "
            "(data.root/<corpus>-bpe<vocab>-<hash>/) into it"
        )
    return BpeTokenizer(run / "bpe.model")


def load_lm(
    run: str | Path, *, device: str | torch.device = "cpu", checkpoint: str = "best"
) -> tuple[CausalLM, Any, dict[str, Any]]:
    """(model in eval mode on `device`, tokenizer, spec) of an lm run folder; `checkpoint`:
    "best" (the best validation loss; the newest step when best/ was never saved), "latest",
    or a folder name in RUN/checkpoints. The tokenizer: `encode(text)`, `decode(ids)`,
    `eod_id`. spec: model.json ({"model": CausalLM keywords, "experiment", "row", "tokenizer",
    "context", "corpus"})."""
    run = Path(run)
    source = run / "model.json"
    if not source.is_file():
        raise _not_a_run(run)
    try:
        spec = run_spec(run, "an lm", "CausalLM")
    except ValueError as e:
        raise ValueError(f"{e}: {_WHAT}") from None
    device = inference_device(device)
    from cape.lab.data.text_corpus import ByteTokenizer

    if spec.get("tokenizer", "bytes") not in ("bytes", "bpe"):
        raise ValueError(
            f'{source}: "tokenizer" must be "bytes" or "bpe", got {spec["tokenizer"]!r}'
        )
    tokenizer = ByteTokenizer() if spec.get("tokenizer", "bytes") == "bytes" else _bpe(run)
    model = _model_of(spec["model"], source)
    if tokenizer.vocab_size != model.vocab_size:
        raise ValueError(
            f"run {str(run)!r}: the tokenizer has {tokenizer.vocab_size} ids, the model "
            f"{model.vocab_size}"
        )
    path = pick_checkpoint(run / "checkpoints", checkpoint)
    try:
        load_checkpoint(path, model)
    except RuntimeError as e:  # names or shapes differ: model.json is not the checkpoint's model
        first = next((ln.strip() for ln in str(e).splitlines()[1:] if ln.strip()), str(e))
        raise DamagedFile(
            f"{source} does not describe the model of checkpoint {path}: {first.split(';')[0]}",
            source,
        ) from e
    return model.to(device).eval(), tokenizer, spec


def _model_of(keywords: dict[str, Any], source: Path) -> CausalLM:
    """The CausalLM of `keywords` (the "model" object of `source`); ValueError naming the file
    for a key CausalLM does not take or a value it refuses."""
    allowed = [k for k in inspect.signature(CausalLM).parameters]
    unknown = sorted(set(keywords) - set(allowed))
    if unknown:
        raise ValueError(f'{source}: "model" has unknown keys {unknown}; CausalLM takes {allowed}')
    try:
        return CausalLM(**keywords)
    except (TypeError, ValueError) as e:
        raise ValueError(f'{source}: "model": {e}') from None


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """The ids the model reads for `prompt`: `<eod>` (a document starts) then its tokens."""
    return [int(tokenizer.eod_id), *(int(i) for i in tokenizer.encode(prompt))]


def readable_context(model: CausalLM) -> int | None:
    """How many positions the model can read: a learned table's `num_positions` (abspos);
    None when every position gets something (the other encodings)."""
    sizes = [m.num_positions for m in model.modules() if isinstance(m, AbsPos1d)]
    return min(sizes) if sizes else None


def generate_ids(
    model: CausalLM,
    ids: torch.Tensor,
    max_new: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    eos: int | None = None,
) -> torch.Tensor:
    """Continue ids [B, T0] (on the model's device) by max_new tokens -> [B, T0 + max_new]:
    `CausalLM.generate` (same arguments), with a sliding window of `readable_context` tokens
    when the text would grow past it (module docstring). With eos, a finished row repeats it."""
    window = readable_context(model)
    if window is not None and ids.shape[1] + max_new <= window:
        window = None  # it all fits: the cache where the model allows one
    return model.generate(
        ids, max_new, temperature=temperature, top_k=top_k, generator=generator, eos=eos,
        window=window,
    )  # fmt: skip


def generate_text(
    model: CausalLM,
    tokenizer: Any,
    prompt: str,
    max_new: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int = 0,
    *,
    stop_at_eod: bool = True,
) -> tuple[str, int, float]:
    """(prompt + its continuation, tokens generated, seconds the generation took) for `prompt`
    read as a document's start (`encode_prompt`). temperature 0 = greedy; > 0 samples from
    softmax(logits / temperature) over the top_k largest logits (None = all) with a generator
    seeded with `seed`. stop_at_eod: stop at the document's end (`<eod>`, not counted)."""
    device = next(model.parameters()).device
    ids = torch.tensor([encode_prompt(tokenizer, prompt)], dtype=torch.long, device=device)
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    eos = int(tokenizer.eod_id) if stop_at_eod else None
    start = time.perf_counter()
    out = generate_ids(
        model, ids, max_new, temperature=temperature, top_k=top_k, generator=generator, eos=eos
    )
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    new = [int(i) for i in out[0, ids.shape[1] :]]
    if eos is not None and eos in new:
        new = new[: new.index(eos)]
    return prompt + tokenizer.decode(new), len(new), seconds


def _parser() -> ArgumentParser:
    p = ArgumentParser(
        prog="cape generate",
        description="Continue a text prompt with a trained `cape experiment lm` run. The "
        "prompt and its continuation go to stdout; then one line on stderr says how many "
        "tokens were generated and how many per second (model loading not counted).",
    )
    p.add_argument("run", help="run folder <out>/<row>/seed<k> (holds model.json, checkpoints)")
    p.add_argument(
        "--prompt",
        default="",
        help="the text to continue, read as the start of a document; '-' reads stdin (less "
        "one final newline); default empty: a document from its start",
    )
    p.add_argument(
        "--max-new", type=int, default=100, help="tokens to generate at most (default 100)"
    )
    p.add_argument(
        "--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples"
    )
    p.add_argument("--top-k", type=int, default=None, help="sample among the K likeliest tokens")
    p.add_argument("--seed", type=int, default=0, help="the sampling generator's seed (default 0)")
    p.add_argument(
        "--ignore-eod",
        action="store_true",
        help="go on past the end of the document (<eod>) rather than stop there",
    )
    p.add_argument(
        "--checkpoint",
        default="best",
        help="best (default: the best validation loss), latest, or a folder name in "
        "RUN/checkpoints",
    )
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1, ...")
    return p


SEEDS = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed takes


def _check_args(p: ArgumentParser, args: Any) -> None:
    """Usage errors (exit 2, one line naming the flag) before anything is loaded."""
    if not 1 <= args.max_new <= MAX_TOKENS:
        p.error(f"--max-new must be an int in [1, {MAX_TOKENS}], got {args.max_new}")
    if not 0 <= args.temperature < math.inf:  # NaN too
        p.error(f"--temperature must be a finite number >= 0 (0 = greedy), got {args.temperature}")
    if args.top_k is not None and args.top_k < 1:
        p.error(f"--top-k must be >= 1, got {args.top_k}")
    if not SEEDS[0] <= args.seed <= SEEDS[1]:
        p.error(f"--seed must be an int in [-2**63, 2**64 - 1] (a torch seed), got {args.seed}")
    try:
        _usable_device(args.device)
    except ValueError as e:
        p.error(str(e))


def _usable_device(text: str) -> torch.device:
    """--device as a device that holds values on this machine, else ValueError naming it."""
    try:
        device = torch.device(text)
    except RuntimeError as e:
        raise ValueError(f"--device {text!r} is not a torch device such as cpu or cuda:0") from e
    if device.type == "meta":
        raise ValueError("--device meta holds no values (shapes only); give cpu or cuda")
    try:
        torch.empty(1, device=device)
    except (RuntimeError, AssertionError) as e:  # not built in, no such index, no driver
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"--device {text!r} is not available on this machine: {reason}") from e
    return device


def _read_prompt(p: ArgumentParser, prompt: str) -> str:
    """--prompt's text, or standard input's for '-' (less one final newline): UTF-8 text, else
    a usage error naming --prompt or standard input and the first byte that is not."""
    if prompt != "-":
        try:
            prompt.encode("utf-8")  # the shell's bytes that are not UTF-8 arrive as surrogates
        except UnicodeEncodeError as e:
            byte = ord(prompt[e.start]) - 0xDC00
            p.error(f"--prompt must be UTF-8 text, got the byte 0x{byte & 0xFF:02x} at {e.start}")
        return prompt
    stream = getattr(sys.stdin, "buffer", None)
    raw = stream.read() if stream is not None else sys.stdin.read().encode("utf-8", "replace")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        p.error(f"--prompt -: standard input must be UTF-8 text ({e.reason} at byte {e.start})")
    return text[:-1] if text.endswith("\n") else text


def generate_main(argv: list[str]) -> int:
    """`cape generate RUN --prompt TEXT`: print the prompt and its continuation on stdout,
    then tokens generated and tokens per second on stderr."""
    p = _parser()
    args = p.parse_args(argv)
    _check_args(p, args)
    prompt = _read_prompt(p, args.prompt)
    # a missing or foreign run is a FileNotFoundError or ValueError: `cape` exits 2 with its line
    model, tok, _ = load_lm(args.run, device=args.device, checkpoint=args.checkpoint)
    if args.top_k is not None and args.top_k > model.vocab_size:
        p.error(f"--top-k must be at most the vocabulary's {model.vocab_size}, got {args.top_k}")
    window = readable_context(model)
    prompt_tokens = len(encode_prompt(tok, prompt))
    if window is None and prompt_tokens + args.max_new > MAX_TOKENS:
        p.error(
            f"--max-new: the prompt's {prompt_tokens} tokens (with <eod>) + --max-new must be at "
            f"most {MAX_TOKENS} (token positions stay exact in float32), got {args.max_new}"
        )
    if window is not None and prompt_tokens + args.max_new > window:
        print(
            f"note: {model.position} reads {window} positions: the model sees the "
            f"last {window} tokens only (the prompt has {prompt_tokens} with <eod>)",
            file=sys.stderr,
        )
    text, new, seconds = generate_text(
        model, tok, prompt, args.max_new, args.temperature, args.top_k, args.seed,
        stop_at_eod=not args.ignore_eod,
    )  # fmt: skip
    print(text, flush=True)
    mode = "greedy" if args.temperature == 0 else f"temperature {args.temperature:g}"
    if args.temperature and args.top_k:
        mode += f", top-k {args.top_k}"
    ended = ", stopped at <eod>" if new < args.max_new and not args.ignore_eod else ""
    rate = new / seconds if seconds > 0 else float("inf")
    print(
        f"{new} tokens generated in {seconds:.3f} s: {rate:.1f} tokens/s ({mode}, "
        f"{model.position}, {prompt_tokens} prompt tokens{ended})",
        file=sys.stderr,
    )
    return 0
