"""Real text for causal language models: English from Debian packages (the King James Bible,
the Jargon File, the fortunes), code (the Python standard library's source), or a folder of
.txt files; split by document, tokenized as bytes or a small BPE, cached as token arrays.

`build_text_corpus` makes a corpus (`cape data text`), `TextCorpus` reads it, `eval_windows`
and `random_windows` cut its arrays into windows, `TextCorpus.bits_per_byte` converts a loss.
"""

from cape.lab.data.text_corpus.build import (
    DEFAULT_FRACTIONS,
    SPLITS,
    TOKENIZERS,
    build_text_corpus,
    split_of,
)
from cape.lab.data.text_corpus.corpus import (
    TextCorpus,
    eval_windows,
    random_windows,
    window_count,
)
from cape.lab.data.text_corpus.sources import CORPORA, read_documents
from cape.lab.data.text_corpus.tokenizers import BpeTokenizer, ByteTokenizer

__all__ = [
    "CORPORA",
    "DEFAULT_FRACTIONS",
    "SPLITS",
    "TOKENIZERS",
    "BpeTokenizer",
    "ByteTokenizer",
    "TextCorpus",
    "build_text_corpus",
    "eval_windows",
    "random_windows",
    "read_documents",
    "split_of",
    "window_count",
]
