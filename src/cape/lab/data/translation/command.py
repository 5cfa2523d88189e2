"""`cape data translation`: make (or finish) the English->Spanish corpus and verify it
(`cape.lab.data.translation.corpus`)."""

from __future__ import annotations

from cape.lab.arguments import ArgumentParser, check_out_folder, report_error
from cape.lab.data.translation.apertium import CorpusError
from cape.lab.data.translation.corpus import make_translation_corpus, verify_translation_corpus

__all__ = ["translation_main"]


def translation_main(argv: list[str]) -> int:
    """`cape data translation`: make (or finish) the corpus, verify it and print its counts.
    Returns the exit status (0 ok, 1 corpus problems, 2 bad settings)."""
    parser = ArgumentParser(
        prog="cape data translation",
        description="Make the offline English->Spanish corpus (WordNet + fortunes, Apertium).",
    )
    parser.add_argument("--root", default="data/translation", help="corpus folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--val", type=int, default=1000, help="validation pairs")
    parser.add_argument("--test", type=int, default=2000, help="test pairs (short sentences)")
    parser.add_argument("--long-per-bucket", type=int, default=500, help="pairs per long bucket")
    parser.add_argument("--stacked", type=int, default=300, help="stacked long sequences")
    parser.add_argument("--max-train-words", type=int, default=20, help="longest train source")
    parser.add_argument("--limit", type=int, default=None, help="only the first N sentences")
    parser.add_argument("--no-fortunes", action="store_true", help="WordNet sentences only")
    parser.add_argument("--workers", type=int, default=2, help="apertium processes")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    try:
        check_out_folder(args.root, "--root")
        manifest = make_translation_corpus(
            args.root,
            seed=args.seed,
            val=args.val,
            test=args.test,
            long_per_bucket=args.long_per_bucket,
            stacked=args.stacked,
            max_train_words=args.max_train_words,
            limit=args.limit,
            fortunes=not args.no_fortunes,
            workers=args.workers,
            progress=not args.no_progress,
        )
        verify_translation_corpus(args.root)
    except CorpusError as e:  # missing or damaged files: a failure, not a mistake
        return report_error(parser.prog, e, code=1)
    except (ValueError, TypeError, FileNotFoundError) as e:
        return report_error(parser.prog, e)
    for split, n in manifest["counts"].items():
        print(f"{split}: {n} pairs")
    d = manifest["dropped"]
    print(
        f"{manifest['english_sentences']} English sentences -> {manifest['pairs']} pairs "
        f"({d['duplicate']} duplicates, {d['ratio']} outside the 0.5-2 word ratio dropped); "
        f"train tgt/src word ratio {manifest['train_ratio']:.3f}; in {args.root}"
    )
    return 0
