"""The `cape` command line. Exit codes: 0 ok, 1 failure at run time, 2 bad usage."""

from __future__ import annotations

import argparse
import signal
import sys

__all__ = ["main"]


def _bench(args: argparse.Namespace, rest: list[str]) -> int:
    if args.what == "encodings":
        from .bench.encodings import main as bench_encodings

        return bench_encodings(rest)
    if args.what == "train":
        from .bench.train import main as bench_train

        return bench_train(rest)
    raise AssertionError(args.what)  # argparse restricts the choices


def _demo(args: argparse.Namespace, rest: list[str]) -> int:
    from .demo import main as demo

    return demo(rest)


def _encodings(args: argparse.Namespace, rest: list[str]) -> int:
    from .build import ENCODINGS, _options

    if rest:
        print(f"cape encodings: unexpected arguments {rest}", file=sys.stderr)
        return 2
    for name, factory in ENCODINGS.items():
        print(f"{name:10s} options: {', '.join(_options(factory))}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="cape",
        description="Continuous augmented positional embeddings: encodings, demo and benchmarks.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("bench", help="benchmarks of the cost of the encodings", add_help=False)
    p.add_argument("what", choices=["encodings", "train"], help="which benchmark")
    p.set_defaults(run=_bench)
    p = sub.add_parser("demo", help="build every encoding, check its properties, plot similarities", add_help=False)
    p.set_defaults(run=_demo)
    p = sub.add_parser("encodings", help="list the encodings `cape.build` knows and their options")
    p.set_defaults(run=_encodings)
    args, rest = parser.parse_known_args(argv)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `cape ... | head` ends quietly
    try:
        return args.run(args, rest)
    except (ValueError, TypeError) as err:
        print(f"cape {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
