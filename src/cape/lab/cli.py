"""The `cape` command line.

Exit codes, the same in every subcommand: 0 ok; 2 the user's mistake (an argument, a config, a
path, an input file), one line naming it and what is allowed; 1 a failure at run time, one line
naming what failed; 130 interrupted (Ctrl-C). A traceback only with `cape --debug ...` (also
accepted after the subcommand) or CAPE_DEBUG=1.
"""

from __future__ import annotations

import argparse
import signal
import traceback

from cape.lab.arguments import (
    ArgumentParser,
    check_out_folder,
    debug_wanted,
    debugging,
    report_error,
)
from cape.lab.errors import UsageError

__all__ = ["main"]


_BENCHES = ("encodings", "slowdown", "throughput", "train", "gpu", "rotary", "deploy")

_EPILOG = (
    "exit codes: 0 ok, 2 a mistake in the command (an argument, a config, a path, an input "
    "file), 1 a failure at run time, 130 interrupted; each error is one line on stderr. "
    "--debug (before or after the subcommand) or the environment variable CAPE_DEBUG=1 also "
    "prints the traceback."
)


def _bench(args: argparse.Namespace, rest: list[str]) -> int:
    import importlib

    module = importlib.import_module(f".bench.{args.what}", __package__)  # one module per benchmark
    return module.main(rest)


def _data(args: argparse.Namespace, rest: list[str]) -> int:
    if args.what == "speech":  # WordNet text spoken by espeak-ng (cape.lab.data.speech.corpus)
        from cape.lab.data.speech.corpus import speech_main

        return speech_main(rest)
    if args.what == "translation":  # WordNet + fortunes through Apertium (data.translation)
        from cape.lab.data.translation.command import translation_main

        return translation_main(rest)
    from cape.lab.data.images.render import make_native_sizes, make_split

    p = ArgumentParser(prog=f"cape data {args.what}")
    p.add_argument("--root", default="data/chars", help="cache folder (default data/chars)")
    p.add_argument("--sizes", default="24,32,56,96", help="comma-separated image sizes in px")
    p.add_argument("--train", type=int, default=10000, help="training images")
    p.add_argument("--val", type=int, default=2000, help="validation images")
    p.add_argument(
        "--test", type=int, default=2000, help="test images (train fonts and held-out fonts)"
    )
    p.add_argument("--native", type=int, default=1000, help="test images at native sizes 12-128 px")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=None, help="render processes (default: 2)")
    opts = p.parse_args(rest)
    try:
        sizes = [int(v) for v in opts.sizes.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"--sizes must be comma-separated integers, got {opts.sizes!r}") from None
    check_out_folder(opts.root, "--root")
    counts = {"train": opts.train, "val": opts.val, "test": opts.test, "test_fonts": opts.test}
    for size in sizes:
        for split, count in counts.items():
            if count > 0:
                path = make_split(opts.root, split, count, size, opts.seed, workers=opts.workers)
                print(f"{split:10s} {size:3d}px {count:6d} images -> {path}")
    if opts.native > 0:
        path = make_native_sizes(opts.root, opts.native, opts.seed, workers=opts.workers)
        print(f"native     12-128px {opts.native:6d} images -> {path}")
    return 0


def _demo(args: argparse.Namespace, rest: list[str]) -> int:
    from cape.lab.apps.demo import main as demo

    return demo(rest)


def _encodings(args: argparse.Namespace, rest: list[str]) -> int:
    from cape.build import ENCODINGS

    if rest:
        raise UsageError(f"unexpected arguments {rest}; `cape encodings` takes none")
    for name, entry in ENCODINGS.items():
        print(f"{name:10s} {entry.cls.kind:9s} options: {', '.join(entry.options())}")
    return 0


def _experiments(args: argparse.Namespace, rest: list[str]) -> int:
    from cape.lab.experiments import cli

    return getattr(cli, f"{args.command}_main")(rest)


def _translate(args: argparse.Namespace, rest: list[str]) -> int:
    from cape.lab.apps.translate import translate_main

    return translate_main(rest)


def _transcribe(args: argparse.Namespace, rest: list[str]) -> int:
    from cape.lab.apps.transcribe_cli import main as transcribe  # WAVs -> text, or WER

    return transcribe(rest)


def _parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="cape",
        description=(
            "Continuous augmented positional embeddings: encodings, experiments, benchmarks."
        ),
        epilog=_EPILOG,
    )
    parser.add_argument(
        "--debug", action="store_true", help="print the traceback of an error (or CAPE_DEBUG=1)"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("bench", help="benchmarks of the cost of the encodings", add_help=False)
    p.add_argument("what", choices=_BENCHES, help="which benchmark")
    p.set_defaults(run=_bench)
    p = sub.add_parser(
        "data", help="make the offline data sets (cached, resumable)", add_help=False
    )
    p.add_argument("what", choices=["chars", "speech", "translation"], help="which data set")
    p.set_defaults(run=_data)
    for name, text in (
        (
            "experiment",
            "train + evaluate + report a paper experiment (presets quick, cpu-full, paper)",
        ),
        ("train", "train one model (row and seed) of an experiment, resumable"),
        ("eval", "evaluate one trained model of an experiment"),
        ("plot", "redraw an experiment's report and plots from its results.json"),
    ):
        p = sub.add_parser(name, help=text, add_help=False)
        p.set_defaults(run=_experiments)
    p = sub.add_parser(
        "transcribe",
        help="transcribe WAV files with a trained speech model; "
        "with --transcripts, WER per duration bin",
        add_help=False,
    )
    p.set_defaults(run=_transcribe)
    p = sub.add_parser(
        "translate",
        help="translate English sentences into Spanish with a trained translation model",
        add_help=False,
    )
    p.set_defaults(run=_translate)
    p = sub.add_parser(
        "demo", help="build every encoding, check its properties, plot similarities", add_help=False
    )
    p.set_defaults(run=_demo)
    p = sub.add_parser("encodings", help="list the encodings `cape.build` knows and their options")
    p.set_defaults(run=_encodings)
    return parser


def main(argv: list[str] | None = None) -> int:
    args, rest = _parser().parse_known_args(argv)
    # --debug after the subcommand lands in `rest`: the global flag there too (not after "--")
    cut = rest.index("--") if "--" in rest else len(rest)
    debug = args.debug or "--debug" in rest[:cut]
    rest = [a for a in rest[:cut] if a != "--debug"] + rest[cut:]
    prog = " ".join(["cape", args.command, *([args.what] if "what" in args else [])])
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `cape ... | head` ends quietly
    with debugging(debug):
        try:
            return args.run(args, rest)
        except KeyboardInterrupt:
            if debug_wanted():
                traceback.print_exc()
            return 130
        except Exception as err:  # one line, its code by class (see arguments._classify)
            return report_error(prog, err)


if __name__ == "__main__":
    raise SystemExit(main())
