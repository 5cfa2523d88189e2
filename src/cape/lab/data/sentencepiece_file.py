"""What the lab's two SentencePiece tokenizers share (`cape.lab.data.translation.bpe.Tokenizer`,
`cape.lab.data.text_corpus.tokenizers.BpeTokenizer`): the optional import, the model loaded
from its file, pickling by path (each DataLoader worker loads the model again), and the
deterministic training both use (`train_model`)."""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

__all__ = ["sentencepiece_module", "SentencePieceFile", "train_model"]


def sentencepiece_module(user: str) -> Any:
    """The `sentencepiece` module; ImportError saying that `user` needs it otherwise."""
    try:
        import sentencepiece
    except ImportError as e:
        raise ImportError(f"{user} needs sentencepiece: pip install 'cape[translation]'") from e
    return sentencepiece


def train_model(user: str, sentences: Iterable[str], **options: Any) -> bytes:
    """A SentencePiece BPE model (its serialized bytes) trained on `sentences` with `options`
    (vocab_size, the ids, ...). Deterministic: every sentence used in order (no sampling, no
    shuffling) on one thread, from memory to memory, so no file name ends up in the model."""
    model = io.BytesIO()
    sentencepiece_module(user).SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model,
        model_type="bpe",
        input_sentence_size=0,
        shuffle_input_sentence=False,
        num_threads=1,
        minloglevel=2,
        **options,
    )
    return model.getvalue()


class SentencePieceFile:
    """A SentencePiece model read from `model_path`: `path`, `vocab_size`, `unk_id` and the
    processor `_sp`. Subclasses say who needs the package (`user`) and what the error of a
    missing file says (`missing`, formatted with `path`)."""

    user: ClassVar[str]
    missing: ClassVar[str]

    def __init__(self, model_path: str | Path) -> None:
        self.path = Path(model_path)
        if not self.path.is_file():
            raise FileNotFoundError(self.missing.format(path=self.path))
        spm = sentencepiece_module(self.user)
        self._sp = spm.SentencePieceProcessor(model_file=str(self.path))
        self.vocab_size: int = self._sp.get_piece_size()
        self.unk_id: int = self._sp.unk_id()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r}, vocab_size={self.vocab_size})"

    def __getstate__(self) -> dict[str, str]:
        return {"path": str(self.path)}

    def __setstate__(self, state: dict[str, str]) -> None:
        self.__init__(state["path"])  # type: ignore[misc]
