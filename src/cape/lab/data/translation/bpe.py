"""Joint English+Spanish SentencePiece BPE for the translation corpus
(`cape.lab.data.translation.corpus`).

`train_bpe` trains one BPE model on the source and target sides of the train split and writes
`root/bpe<vocab>.model` and `.vocab`; `Tokenizer` wraps it with the ids the models use:
pad 0, unk 1, bos 2, eos 3. Needs the optional `sentencepiece` package (`pip install
cape[translation]`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from cape._checks import check_float, check_int
from cape.lab.data.cache import building, remove_leftovers
from cape.lab.data.sentencepiece_file import (
    SentencePieceFile,
    sentencepiece_module,
    train_model,
)
from cape.lab.io import atomic_write, write_text

__all__ = ["BOS_ID", "EOS_ID", "PAD_ID", "UNK_ID", "Tokenizer", "bpe_path", "train_bpe"]

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


def bpe_path(
    root: str | Path,
    vocab_size: int = 8000,
    splits: Sequence[str] = ("train",),
    character_coverage: float = 1.0,
) -> Path:
    """Where `train_bpe` puts the model: `root/bpe<vocab_size>.model`, with `_<split>+<split>`
    for other splits than ("train",) and `_cc<coverage>` for a coverage other than 1."""
    name = f"bpe{vocab_size}"
    if tuple(splits) != ("train",):
        name += "_" + "+".join(splits)
    if character_coverage != 1.0:
        name += f"_cc{character_coverage:g}"
    return Path(root) / f"{name}.model"


def train_bpe(
    root: str | Path,
    *,
    vocab_size: int = 8000,
    splits: Sequence[str] = ("train",),
    character_coverage: float = 1.0,
) -> Path:
    """Train (once) a joint BPE model of `vocab_size` pieces on both sides of `splits` of the
    corpus in `root`; returns the .model path (`bpe_path`), at once when it exists.

    Deterministic: every sentence is used in file order (no sampling, no shuffling) on one
    thread, trained in memory (no file names in the model), so two builds give byte-identical
    models. The .vocab (piece<TAB>score) and then the .model are written atomically: the
    .model's presence means complete. One process trains it at a time (a lock beside it).
    Raises FileNotFoundError naming a missing split file, ValueError when the text is too
    small for `vocab_size` (sentencepiece's message)."""

    check_int("vocab_size", vocab_size, minimum=8)
    check_float("character_coverage", character_coverage, minimum=0.9)
    if character_coverage > 1.0:
        raise ValueError(f"character_coverage must be in [0.9, 1], got {character_coverage}")
    if isinstance(splits, str) or not splits:
        raise ValueError(f"splits must be a non-empty sequence of split names, got {splits!r}")
    root = Path(root)
    path = bpe_path(root, vocab_size, splits, character_coverage)
    if path.is_file():
        return path
    with building(path):  # one trainer; another waits, then finds the model made
        if not path.is_file():
            remove_leftovers(path.parent, path.name)
            remove_leftovers(path.parent, path.with_suffix(".vocab").name)
            _train(root, path, vocab_size, splits, character_coverage)
    return path


def _train(
    root: Path, path: Path, vocab_size: int, splits: Sequence[str], character_coverage: float
) -> None:
    """Train the model and write its .vocab, then its .model (the lock held)."""
    from cape.lab.data.translation.corpus import load_pairs

    spm = sentencepiece_module(Tokenizer.user)  # its absence named before the corpus is read
    lines = [side for split in splits for pair in load_pairs(root, split) for side in pair]
    proto = train_model(
        Tokenizer.user,
        lines,
        vocab_size=vocab_size,
        character_coverage=character_coverage,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        max_sentence_length=1 << 16,
    )
    sp = spm.SentencePieceProcessor(model_proto=proto)
    vocab = "".join(
        f"{sp.id_to_piece(i)}\t{sp.get_score(i) + 0.0:g}\n" for i in range(sp.get_piece_size())
    )
    write_text(path.with_suffix(".vocab"), vocab)
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(proto))


class Tokenizer(SentencePieceFile):
    """A SentencePiece model with the translation ids (pad 0, unk 1, bos 2, eos 3).

    `encode(text) -> list[int]` (no bos/eos), `encode_batch(texts) -> list[list[int]]`,
    `decode(ids) -> str` (stops at the first eos, skips pad and bos). Picklable: only the path
    travels, each process loads the model again (DataLoader workers).
    """

    user = "the translation tokenizer"
    missing = (
        "model_path {path} does not exist: make it with cape.lab.data.translation.bpe.train_bpe"
    )

    def __init__(self, model_path: str | Path) -> None:
        super().__init__(model_path)
        self.pad_id: int = self._sp.pad_id()
        self.bos_id: int = self._sp.bos_id()
        self.eos_id: int = self._sp.eos_id()

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self._sp.encode(text, out_type=int)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        texts = list(texts)
        bad = [i for i, t in enumerate(texts) if not isinstance(t, str)]
        if bad:
            raise TypeError(f"texts[{bad[0]}] must be a str, got {type(texts[bad[0]]).__name__}")
        return self._sp.encode(texts, out_type=int)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids` (ints or a 1-D tensor) up to the first eos, pad and bos skipped."""
        kept = []
        for i in ids:
            i = int(i)
            if i == self.eos_id:
                break
            if i in (self.pad_id, self.bos_id):
                continue
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"ids holds {i}, outside the vocabulary [0, {self.vocab_size})")
            kept.append(i)
        return self._sp.decode(kept)

    def __len__(self) -> int:
        return self.vocab_size
