"""`cape data text`: build (or find) a text corpus for causal language models and print its
statistics (`cape.lab.data.text_corpus.build`)."""

from __future__ import annotations

from cape.lab.arguments import ArgumentParser, check_out_folder
from cape.lab.data.text_corpus.build import DEFAULT_BPE_VOCAB, TOKENIZERS, build_text_corpus
from cape.lab.data.text_corpus.corpus import TextCorpus
from cape.lab.data.text_corpus.sources import CORPORA
from cape.lab.errors import UsageError

__all__ = ["text_main"]


def _fractions(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise UsageError(
            f"--split must be three fractions train,val,test such as 0.9,0.05,0.05, got {text!r}"
        ) from None


def text_main(argv: list[str]) -> int:
    """`cape data text`: build the corpus (cached), print where it is and its counts."""
    parser = ArgumentParser(
        prog="cape data text",
        description=(
            "Real text for causal language models: the King James Bible (bible-kjv), the Jargon "
            "File (dict-jargon), the fortunes, the Python standard library's source, or a folder "
            "of .txt files; split by document, tokenized as bytes or a BPE trained on train."
        ),
    )
    parser.add_argument(
        "--corpus",
        required=True,
        metavar="|".join(CORPORA) + "|DIR",
        help="a corpus by name, or a folder of UTF-8 .txt files (one document each)",
    )
    parser.add_argument("--tokenizer", choices=TOKENIZERS, default="bytes")
    parser.add_argument(
        "--vocab", type=int, default=None, help=f"BPE vocabulary size (default {DEFAULT_BPE_VOCAB})"
    )
    parser.add_argument(
        "--split", default="0.9,0.05,0.05", help="train,val,test fractions of the documents"
    )
    parser.add_argument("--out", default="data/text", help="cache folder (default data/text)")
    args = parser.parse_args(argv)
    check_out_folder(args.out, "--out")
    try:  # SentencePiece opens its model by a UTF-8 path, the statistics record paths as text
        args.out.encode("utf-8")
    except UnicodeEncodeError:
        raw = args.out.encode("utf-8", "surrogateescape")
        raise UsageError(
            f"--out {raw!r} is not a UTF-8 path; give a folder name in UTF-8"
        ) from None
    entry = build_text_corpus(
        args.corpus,
        args.out,
        tokenizer=args.tokenizer,
        vocab=args.vocab,
        fractions=_fractions(args.split),
    )
    corpus = TextCorpus(entry)
    for split, s in corpus.stats["splits"].items():
        print(
            f"{split:5s} {s['documents']:6d} documents {s['bytes']:10d} bytes "
            f"{s['tokens']:10d} tokens"
        )
    skipped = corpus.stats.get("skipped") or {}
    if skipped:  # what the folder holds that is not a document, said on every build
        some = ", ".join(f"{name} ({why})" for name, why in list(skipped.items())[:3])
        more = f" and {len(skipped) - 3} more" if len(skipped) > 3 else ""
        print(f"skipped {len(skipped)} files (stats.json lists each): {some}{more}")
    vocab = corpus.stats["vocabulary"]
    print(f"{vocab['tokenizer']} vocabulary of {vocab['size']} ids ({vocab['dtype']}) -> {entry}")
    return 0
