"""Build a text corpus: documents -> train/val/test by document -> token arrays + statistics.

`build_text_corpus(corpus, out, tokenizer=..., vocab=..., fractions=...)` makes (once) the cache
entry `out/<name>-<tokenizer>[<vocab>]-<key>`, where `key` hashes the settings and what
identifies the input (package versions, Python version, a folder's contents), and returns its
path. The entry holds:

- `documents.json`: the document ids of each split, in corpus order;
- `<split>.npy`: the split's token ids (uint8/uint16 by vocabulary size), each document's ids
  followed by `<eod>`, documents in corpus order; `<split>.starts.npy`: where each document
  starts (int64);
- `bpe.model` (BPE only): the SentencePiece model, trained on the train split alone;
- `stats.json` and `stats.md`: documents, bytes, tokens and bytes per token per split, the
  vocabulary, the sources (Debian package versions, the Python version), the settings and the
  build time. `stats.json` is written last: its presence means the entry is complete.

A document's split is a hash of its id alone (`split_of`): no document is in two splits, the
same document lands in the same split in every build whatever else the corpus holds. Exact
duplicate documents are dropped (the first kept, counted) so that no text is in two splits
under two ids. Every file is written atomically; an interrupted build keeps the files it wrote
and finishes the rest. One process builds an entry at a time (`.lock` in it,
`cape.lab.data.cache.building`); another started meanwhile waits, then reads what it made.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cape.lab.data.cache import building, remove_leftovers
from cape.lab.data.text_corpus.sources import Source, read_documents
from cape.lab.data.text_corpus.tokenizers import (
    MIN_BPE_VOCAB,
    BpeTokenizer,
    ByteTokenizer,
    dtype_for,
    train_bpe_model,
)
from cape.lab.errors import UsageError
from cape.lab.io import atomic_write, write_json, write_text

__all__ = [
    "DEFAULT_FRACTIONS",
    "SPLITS",
    "TOKENIZERS",
    "build_text_corpus",
    "check_fractions",
    "split_of",
]

_log = logging.getLogger(__name__)
_VERSION = 1
SPLITS = ("train", "val", "test")
TOKENIZERS = ("bytes", "bpe")
DEFAULT_FRACTIONS = (0.9, 0.05, 0.05)
DEFAULT_BPE_VOCAB = 2048
MAX_BPE_VOCAB = 2**31 - 1  # SentencePiece's vocab_size is an int32


def check_fractions(fractions: Sequence[float]) -> tuple[float, float, float]:
    """The train/val/test fractions as a tuple; UsageError naming --split unless they are
    three numbers >= 0 summing to 1, train > 0."""
    values = tuple(float(f) for f in fractions)
    finite = all(math.isfinite(v) for v in values)  # NaN passes every comparison below
    if (
        len(values) != 3
        or not finite
        or min(values) < 0
        or values[0] <= 0
        or abs(sum(values) - 1) > 1e-6
    ):
        raise UsageError(
            f"--split must be three fractions train,val,test >= 0 summing to 1 (train > 0), "
            f"got {','.join(map(str, fractions))}"
        )
    return values  # type: ignore[return-value]


def split_of(doc_id: str, fractions: Sequence[float] = DEFAULT_FRACTIONS) -> str:
    """The split of document `doc_id`: the first 64 bits of SHA-256(id) as a number u in
    [0, 1): train when u < train, val when u < train + val, else test."""
    u = int.from_bytes(hashlib.sha256(doc_id.encode("utf-8")).digest()[:8], "big") / 2.0**64
    if u < fractions[0]:
        return "train"
    return "val" if u < fractions[0] + fractions[1] else "test"


def _dedupe(docs: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], int]:
    """`docs` without exact duplicates of an earlier text (and of an earlier id); how many
    were dropped."""
    seen_text: set[bytes] = set()
    seen_id: set[str] = set()
    kept = []
    for doc_id, text in docs:
        digest = hashlib.sha256(text.encode("utf-8")).digest()
        if digest in seen_text or doc_id in seen_id:
            continue
        seen_text.add(digest)
        seen_id.add(doc_id)
        kept.append((doc_id, text))
    return kept, len(docs) - len(kept)


def _settings(source: Source, tokenizer: str, vocab: int, fractions: tuple) -> dict[str, Any]:
    return {
        "version": _VERSION,
        "corpus": source.name,
        "source": source.key,
        "tokenizer": tokenizer,
        "vocab": vocab,
        "fractions": list(fractions),
    }


def _entry_name(settings: dict[str, Any]) -> str:
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    vocab = "" if settings["tokenizer"] == "bytes" else str(settings["vocab"])
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in settings["corpus"])
    return f"{name}-{settings['tokenizer']}{vocab}-{key}"


def _save_npy(path: Path, array: np.ndarray) -> None:
    atomic_write(path, lambda tmp: np.save(tmp, array), size=array.nbytes)


def _encode_split(
    entry: Path, split: str, docs: list[tuple[str, str]], tok: Any
) -> tuple[np.ndarray, np.ndarray]:
    """The split's tokens and document starts: read back when both files exist, else encoded
    and written (the starts first, the tokens last)."""
    tokens_path, starts_path = entry / f"{split}.npy", entry / f"{split}.starts.npy"
    if tokens_path.is_file() and starts_path.is_file():
        return np.load(tokens_path, mmap_mode="r"), np.load(starts_path)
    dtype = dtype_for(tok.vocab_size)
    pieces, starts, at = [], [], 0
    eod = np.array([tok.eod_id], dtype=dtype)
    for _, text in docs:
        ids = tok.encode(text).astype(dtype, copy=False)
        starts.append(at)
        pieces += [ids, eod]
        at += len(ids) + 1
    tokens = np.concatenate(pieces) if pieces else np.zeros(0, dtype)
    starts_array = np.asarray(starts, dtype=np.int64)
    _save_npy(starts_path, starts_array)
    _save_npy(tokens_path, tokens)
    return tokens, starts_array


def _tokenizer(entry: Path, name: str, vocab: int, train: list[tuple[str, str]]) -> Any:
    if name == "bytes":
        return ByteTokenizer()
    path = entry / "bpe.model"
    if not path.is_file():
        if not train:
            raise UsageError("the train split holds no document: no BPE can be trained")
        proto = train_bpe_model([text for _, text in train], vocab)
        atomic_write(path, lambda tmp: Path(tmp).write_bytes(proto))
    return BpeTokenizer(path)


def _split_stats(docs: list[tuple[str, str]], tokens: np.ndarray) -> dict[str, Any]:
    n_bytes = sum(len(text.encode("utf-8")) for _, text in docs)
    return {
        "documents": len(docs),
        "bytes": n_bytes,
        "tokens": int(len(tokens)),
        "bytes_per_token": n_bytes / len(tokens) if len(tokens) else None,
    }


def _markdown(stats: dict[str, Any]) -> str:
    lines = [
        f"# Text corpus `{stats['corpus']}` ({stats['vocabulary']['tokenizer']}, "
        f"{stats['vocabulary']['size']} ids)",
        "",
        "| split | documents | bytes | tokens | bytes/token |",
        "|---|---:|---:|---:|---:|",
    ]
    for split, s in stats["splits"].items():
        bpt = "-" if s["bytes_per_token"] is None else f"{s['bytes_per_token']:.3f}"
        lines.append(f"| {split} | {s['documents']} | {s['bytes']} | {s['tokens']} | {bpt} |")
    lines += ["", f"Sources: `{json.dumps(stats['source'], ensure_ascii=False)}`"]
    lines += [
        f"Duplicates dropped: {stats['duplicates_dropped']}; files skipped: "
        f"{len(stats['skipped'])}; built in {stats['build_seconds']:.1f} s.",
        "",
    ]
    return "\n".join(lines)


def _build(entry: Path, source: Source, settings: dict[str, Any], start: float) -> None:
    """Make every missing file of `entry` (the lock held); `start`: when reading began."""
    docs, dropped = _dedupe(source.docs)
    fractions = settings["fractions"]
    by_split: dict[str, list[tuple[str, str]]] = {s: [] for s in SPLITS}
    for doc in docs:
        by_split[split_of(doc[0], fractions)].append(doc)
    ids = {s: [d[0] for d in by_split[s]] for s in SPLITS}
    if not (entry / "documents.json").is_file():
        write_json(entry / "documents.json", ids)
    tok = _tokenizer(entry, settings["tokenizer"], settings["vocab"], by_split["train"])
    splits = {}
    for split in SPLITS:
        tokens, _ = _encode_split(entry, split, by_split[split], tok)
        splits[split] = _split_stats(by_split[split], tokens)
    stats = {
        "corpus": source.name,
        "splits": splits,
        "vocabulary": {
            "tokenizer": tok.name,
            "size": tok.vocab_size,
            "eod_id": tok.eod_id,
            "specials": list(tok.specials),
            "dtype": dtype_for(tok.vocab_size).name,
            "trained_on": "train" if tok.name == "bpe" else None,
        },
        "source": source.info,
        "settings": settings,
        "duplicates_dropped": dropped,
        "skipped": source.skipped,
        "build_seconds": time.perf_counter() - start,
    }
    write_text(entry / "stats.md", _markdown(stats))
    write_json(entry / "stats.json", stats)  # last: the entry is complete


def build_text_corpus(
    corpus: str | Path,
    out: str | Path = "data/text",
    *,
    tokenizer: str = "bytes",
    vocab: int | None = None,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
) -> Path:
    """Make (once) the cache entry of `corpus` (a name of `sources.CORPORA` or a folder of .txt
    files) under `out` with `tokenizer` ("bytes" or "bpe" of `vocab` pieces, default 2048) and
    the train/val/test `fractions`; returns the entry's folder, at once when it is complete."""
    if tokenizer not in TOKENIZERS:
        raise UsageError(f"--tokenizer must be one of {', '.join(TOKENIZERS)}, got {tokenizer!r}")
    if tokenizer == "bytes" and vocab not in (None, ByteTokenizer.vocab_size):
        raise UsageError(f"--vocab is for --tokenizer bpe (bytes has 257 ids), got {vocab}")
    size = ByteTokenizer.vocab_size if tokenizer == "bytes" else vocab or DEFAULT_BPE_VOCAB
    if tokenizer == "bpe" and not MIN_BPE_VOCAB <= size <= MAX_BPE_VOCAB:
        raise UsageError(
            f"--vocab must be an int in [{MIN_BPE_VOCAB}, {MAX_BPE_VOCAB}] for bpe, got {size}"
        )
    fractions = check_fractions(fractions)
    start = time.perf_counter()
    source = read_documents(corpus)
    settings = _settings(source, tokenizer, size, fractions)
    entry = Path(out) / _entry_name(settings)
    if (entry / "stats.json").is_file():
        return entry
    entry.mkdir(parents=True, exist_ok=True)
    with building(entry, folder=True):
        if not (entry / "stats.json").is_file():  # another process may have made it meanwhile
            remove_leftovers(entry)
            _build(entry, source, settings, start)
    return entry
