"""The two tokenizers of the text corpora: bytes, and a small SentencePiece BPE.

- `ByteTokenizer`: ids 0-255 are the UTF-8 bytes, 256 is `<eod>` (end of document): 257 ids.
- `BpeTokenizer`: a SentencePiece BPE model trained on the train split only
  (`train_bpe_model`): id 0 `<unk>` (never produced: unknown characters fall back to their
  bytes), 1 `<eod>`, 2-257 the bytes `<0x00>`-`<0xFF>`, then the pieces. No normalisation, no
  whitespace folding and no dummy prefix, so `decode(encode(text)) == text` for any text, code
  included.

`encode(text)` gives the ids of one document without `<eod>` (the corpus builder appends it);
`decode(ids)` skips `<eod>`. `dtype_for(vocab_size)` is the smallest unsigned NumPy type that
holds the ids (uint8 up to 256, uint16 up to 65536). Needs `sentencepiece` for BPE only
(`pip install 'cape[translation]'`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from cape.lab.data.sentencepiece_file import SentencePieceFile, train_model
from cape.lab.errors import UsageError

__all__ = ["BpeTokenizer", "ByteTokenizer", "MIN_BPE_VOCAB", "dtype_for", "train_bpe_model"]

MIN_BPE_VOCAB = 300  # <unk>, <eod>, 256 bytes, and some pieces
EOD = "<eod>"


def dtype_for(vocab_size: int) -> np.dtype:
    """The smallest unsigned integer type that holds ids [0, vocab_size)."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab_size <= np.iinfo(dtype).max + 1:
            return np.dtype(dtype)
    raise ValueError(f"vocab_size must be at most 2**32, got {vocab_size}")


class ByteTokenizer:
    """UTF-8 bytes (ids 0-255) and `<eod>` (256)."""

    name = "bytes"
    vocab_size = 257
    eod_id = 256
    specials = (EOD,)

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(dtype_for(257))

    def decode(self, ids: Iterable[int]) -> str:
        data = bytes(int(i) for i in np.asarray(list(ids), dtype=np.int64) if 0 <= i < 256)
        return data.decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return "ByteTokenizer()"


def train_bpe_model(texts: Sequence[str], vocab_size: int) -> bytes:
    """A SentencePiece BPE model (its serialized bytes) of `vocab_size` pieces trained on
    `texts` (one document each, in order; pass the train split only), deterministically
    (`train_model`). UsageError naming --vocab when it is below `MIN_BPE_VOCAB` or more than
    the text allows."""
    if vocab_size < MIN_BPE_VOCAB:
        raise UsageError(f"--vocab must be at least {MIN_BPE_VOCAB} for bpe, got {vocab_size}")
    try:
        return train_model(
            BpeTokenizer.user,
            texts,
            vocab_size=vocab_size,
            character_coverage=1.0,
            byte_fallback=True,
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            add_dummy_prefix=False,
            allow_whitespace_only_pieces=True,
            unk_id=0,
            eos_id=1,
            eos_piece=EOD,
            bos_id=-1,
            pad_id=-1,
            max_sentence_length=max((len(t.encode("utf-8")) for t in texts), default=0) + 1,
        )
    except RuntimeError as e:  # "Vocabulary size is too large ..." and the like
        raise UsageError(f"--vocab {vocab_size} does not fit this train split: {e}") from None


class BpeTokenizer(SentencePieceFile):
    """A BPE model made by `train_bpe_model`, from its file (`model_path`)."""

    name = "bpe"
    specials = ("<unk>", EOD)
    user = "--tokenizer bpe"
    missing = "BPE model {path} does not exist"

    def __init__(self, model_path: str | Path) -> None:
        super().__init__(model_path)
        self.eod_id: int = self._sp.eos_id()

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._sp.encode(text, out_type=int), dtype=dtype_for(self.vocab_size))

    def decode(self, ids: Iterable[int]) -> str:
        kept = [int(i) for i in ids if int(i) != self.eod_id]
        return self._sp.decode(kept)

    def pieces(self) -> list[str]:
        """Every piece of the vocabulary, by id."""
        return [self._sp.id_to_piece(i) for i in range(self.vocab_size)]
