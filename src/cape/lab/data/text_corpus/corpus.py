"""Read a built text corpus (`build_text_corpus`) and cut its token arrays into windows.

`TextCorpus(entry)` opens a cache entry: `tokens(split)` (memory-mapped, no copy), `documents
(split)` (ids), `stats`, `tokenizer` (`encode` / `decode`), `vocab_size`, `eod_id`, and the
conversion of a language model's loss to bits per byte: `bytes_per_token(split)` and
`bits_per_byte(loss, split)`.

Bits per byte: a split holds B bytes of text (UTF-8, `<eod>` not counted) in T tokens
(`<eod>` counted), so a mean loss of `loss` nats per predicted token is
`loss * T / B / ln 2` bits per byte; the cost of predicting each `<eod>` is charged to the text.
The same measure for every tokenizer, so byte and BPE models compare.

Windows, as numpy int64 arrays (`torch.from_numpy` them), inputs `x` and next-token targets `y`
(`y[i] = x[i + 1]` along the array):

- `eval_windows(tokens, length, batch_size)`: the ALiBi paper's evaluation protocol, the split
  cut into non-overlapping windows of `length` predictions each: window k predicts tokens
  `k*length + 1 ... (k+1)*length`, so every token after the first is predicted exactly once;
  the last, shorter window comes alone as a batch of one (or is dropped with `drop_last`).
- `random_windows(tokens, length, batch_size, seed)`: training batches, endless, each window
  starting at a uniform position (a window may cross a document boundary, marked by `<eod>`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from cape._checks import check_int
from cape.lab.data.text_corpus.build import SPLITS
from cape.lab.data.text_corpus.tokenizers import BpeTokenizer, ByteTokenizer
from cape.lab.errors import DamagedFile
from cape.lab.io import read_json

__all__ = ["TextCorpus", "eval_windows", "random_windows", "window_count"]

Batch = tuple[np.ndarray, np.ndarray]


class TextCorpus:
    """A built text corpus in folder `entry` (what `build_text_corpus` returned)."""

    def __init__(self, entry: str | Path) -> None:
        self.root = Path(entry)
        stats_path = self.root / "stats.json"
        if not stats_path.is_file():
            raise FileNotFoundError(
                f"{self.root} is not a built text corpus (no stats.json): build it with "
                "`cape data text` or cape.lab.data.text_corpus.build_text_corpus"
            )
        self.stats: dict[str, Any] = read_json(stats_path)
        vocab = self.stats["vocabulary"]
        if vocab["tokenizer"] == "bpe":
            self.tokenizer: Any = BpeTokenizer(self.root / "bpe.model")
        else:
            self.tokenizer = ByteTokenizer()
        self.vocab_size: int = int(vocab["size"])
        self.eod_id: int = int(vocab["eod_id"])
        self._ids: dict[str, list[str]] | None = None

    def _check(self, split: str) -> None:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")

    def tokens(self, split: str) -> np.ndarray:
        """The split's token ids (memory-mapped, read-only); DamagedFile naming the file when
        its length is not the one the statistics record."""
        self._check(split)
        path = self.root / f"{split}.npy"
        tokens = np.load(path, mmap_mode="r")
        expected = self.stats["splits"][split]["tokens"]
        if len(tokens) != expected:
            raise DamagedFile(
                f"{path} holds {len(tokens)} tokens, stats.json says {expected}", path
            )
        return tokens

    def starts(self, split: str) -> np.ndarray:
        """Where each document of the split starts in `tokens(split)`."""
        self._check(split)
        return np.load(self.root / f"{split}.starts.npy")

    def documents(self, split: str) -> list[str]:
        """The ids of the split's documents, in the order of their tokens."""
        self._check(split)
        if self._ids is None:
            self._ids = read_json(self.root / "documents.json")
        return list(self._ids[split])

    def bytes_per_token(self, split: str) -> float:
        """Text bytes per token of the split (see the module's note on bits per byte)."""
        self._check(split)
        s = self.stats["splits"][split]
        if not s["tokens"]:
            raise ValueError(f"split {split!r} of {self.root} is empty")
        return s["bytes"] / s["tokens"]

    def bits_per_byte(self, loss: float, split: str) -> float:
        """Mean loss `loss` (nats per predicted token) of a model over `split` in bits per
        byte of text."""
        return float(loss) / self.bytes_per_token(split) / math.log(2)

    def __repr__(self) -> str:
        counts = ", ".join(f"{s}={self.stats['splits'][s]['tokens']}" for s in SPLITS)
        return f"TextCorpus({str(self.root)!r}, {self.tokenizer!r}, tokens: {counts})"


def window_count(n_tokens: int, length: int, *, drop_last: bool = False) -> int:
    """How many windows `eval_windows` gives over `n_tokens` tokens."""
    length = check_int("length", length)
    predicted = max(int(n_tokens) - 1, 0)
    full, rest = divmod(predicted, length)
    return full + (1 if rest and not drop_last else 0)


def eval_windows(
    tokens: np.ndarray, length: int, batch_size: int = 1, *, drop_last: bool = False
) -> Iterator[Batch]:
    """Batches `(x, y)` of shape (b, length) covering `tokens` without overlap (see the
    module's note): every full window in order, `batch_size` at a time, then the shorter last
    one alone unless `drop_last`."""
    length = check_int("length", length)
    batch_size = check_int("batch_size", batch_size)
    n = len(tokens)
    full = max(n - 1, 0) // length
    for first in range(0, full, batch_size):
        count = min(batch_size, full - first)
        span = np.asarray(tokens[first * length : (first + count) * length + 1], dtype=np.int64)
        x = span[:-1].reshape(count, length)
        y = span[1:].reshape(count, length)
        yield x, y
    start = full * length
    if not drop_last and start < n - 1:
        span = np.asarray(tokens[start:n], dtype=np.int64)
        yield span[None, :-1], span[None, 1:]


def random_windows(
    tokens: np.ndarray, length: int, batch_size: int, seed: int = 0
) -> Iterator[Batch]:
    """Endless training batches `(x, y)` of shape (batch_size, length), each window at a
    uniform start drawn by `np.random.default_rng(seed)`; ValueError when the array is not
    longer than `length`."""
    length = check_int("length", length)
    batch_size = check_int("batch_size", batch_size)
    n = len(tokens)
    if n <= length:
        raise ValueError(f"length must be below the {n} tokens of the array, got {length}")
    rng = np.random.default_rng(seed)
    offsets = np.arange(length + 1)
    while True:
        starts = rng.integers(0, n - length, size=batch_size)
        span = np.asarray(tokens[starts[:, None] + offsets], dtype=np.int64)
        yield span[:, :-1], span[:, 1:]
