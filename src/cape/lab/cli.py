"""The `cape` command line.

Exit codes, the same in every subcommand: 0 ok; 2 the user's mistake (an argument, a config, a
path, an input file), one line naming it and what is allowed; 1 a failure at run time, one line
naming what failed; 130 interrupted (Ctrl-C); 75 training stopped by SIGTERM or SIGUSR1 (a
cluster's preemption) after saving a checkpoint of its current step, one line naming it (rerun
the same command to resume). A traceback only with `cape --debug ...` (also
accepted after the subcommand) or CAPE_DEBUG=1.
"""

from __future__ import annotations

import argparse
import ast
import signal
import sys
import traceback
from pathlib import Path

import cape
from cape.lab.arguments import (
    ArgumentParser,
    check_out_folder,
    debug_wanted,
    debugging,
    report_error,
)
from cape.lab.errors import Preempted, UsageError

__all__ = ["main"]


_BENCHES = ("encodings", "slowdown", "throughput", "train", "gpu", "rotary", "deploy", "decode")

# the data sets `cape data` makes, and one line on each (`cape data --help`)
_DATA_SETS = {
    "chars": "rendered character images at several sizes and fonts (vision, cape.lab.data.images)",
    "speech": "WordNet text and digit strings spoken by espeak-ng (asr, cape.lab.data.speech)",
    "translation": "English-Spanish pairs: WordNet + fortunes through Apertium (translation)",
    "text": "real text for language models: KJV Bible, Jargon File, fortunes, stdlib, a folder",
}

_EPILOG = (
    "exit codes: 0 ok, 2 a mistake in the command (an argument, a config, a path, an input "
    "file), 1 a failure at run time, 130 interrupted, 75 training stopped by SIGTERM or "
    "SIGUSR1 (preemption) with its current step saved: rerun the same command to resume; "
    "each error is one line on stderr. "
    "--debug (before or after the subcommand) or the environment variable CAPE_DEBUG=1 also "
    "prints the traceback."
)

# the commands that hand their arguments to an app (cape.lab.apps): name -> (module, its entry
# point, the command's line in `cape --help`), in the order `cape --help` lists them
_APPS = {
    "transcribe": (  # WAVs -> text, or WER
        "transcribe_cli",
        "main",
        "transcribe WAV files with a trained speech model; with --transcripts, WER per duration "
        "bin",
    ),
    "translate": (
        "translate",
        "translate_main",
        "translate English sentences into Spanish with a trained translation model",
    ),
    "generate": (  # a prompt -> its continuation
        "generate",
        "generate_main",
        "continue a text prompt with a trained language model (`cape experiment lm`)",
    ),
    "extend": (  # a RoPE model's context, extended
        "extend",
        "main",
        "extend a transformers RoPE model's context through cape (PI, YaRN, CAPE) and score it "
        "from 1x to 16x its training length",
    ),
    "demo": ("demo", "main", "build every encoding, check its properties, plot similarities"),
}


def _summary(bench: str) -> str:
    """The first paragraph of a benchmark module's docstring in one line (read, not imported: a
    benchmark may need an extra that is not installed), less its "`cape bench NAME`: "."""
    path = Path(__file__).with_name("bench") / f"{bench}.py"
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) if path.is_file() else ""
    first = " ".join(doc.split("\n\n")[0].split())
    if first.startswith("`cape bench") and "`: " in first:
        first = first.split("`: ", 1)[1]
    return first[:1].upper() + first[1:]


def _choices_help(what: str, lines: dict[str, str]) -> str:
    """`cape bench --help` / `cape data --help`: each choice of WHAT with its line."""
    width = max(map(len, lines)) + 2
    return "\n".join([f"{what}:", *(f"  {name:{width}s}{text}" for name, text in lines.items())])


def _what(args: argparse.Namespace, rest: list[str]) -> bool:
    """False when `cape bench` / `cape data` was given no WHAT: its help when asked for
    (exit 0), else the usage error (exit 2)."""
    if args.what is not None:
        return True
    if {"-h", "--help"} & set(rest[: rest.index("--") if "--" in rest else len(rest)]):
        args.parser.print_help()
        return False
    args.parser.error(f"the following arguments are required: {args.what_name}")
    return False


def _bench(args: argparse.Namespace, rest: list[str]) -> int:
    import importlib

    from cape.lab.bench.allocator import set_allocator

    if not _what(args, rest):
        return 0
    set_allocator(args.allocator)  # before anything is measured; every table names the state
    module = importlib.import_module(f".bench.{args.what}", __package__)  # one module per benchmark
    return module.main(rest)


def _data(args: argparse.Namespace, rest: list[str]) -> int:
    if not _what(args, rest):
        return 0
    if args.what == "speech":  # WordNet text spoken by espeak-ng (cape.lab.data.speech.corpus)
        from cape.lab.data.speech.corpus import speech_main

        return speech_main(rest)
    if args.what == "translation":  # WordNet + fortunes through Apertium (data.translation)
        from cape.lab.data.translation.command import translation_main

        return translation_main(rest)
    if args.what == "text":  # corpora for causal LMs (cape.lab.data.text_corpus)
        from cape.lab.data.text_corpus.command import text_main

        return text_main(rest)
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


def _app(args: argparse.Namespace, rest: list[str]) -> int:
    """A command of `_APPS`: the function of its module in cape.lab.apps, given the rest of the
    command line (imported only when run: an app may need an extra that is not installed)."""
    import importlib

    module, function, _ = _APPS[args.command]
    return getattr(importlib.import_module(f".apps.{module}", __package__), function)(rest)


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
    parser.add_argument("--version", action="version", version=f"cape {cape.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # add_help=False: `cape bench NAME --help` is the benchmark's own help; `_what` answers a
    # --help without a NAME
    p = sub.add_parser(
        "bench",
        help="benchmarks of the cost of the encodings",
        add_help=False,
        usage="cape bench [-h] [--allocator {warm,cold}] BENCHMARK [OPTIONS]  (`cape bench "
        "BENCHMARK --help`: its options)",
        epilog=_choices_help("benchmarks", {b: _summary(b) for b in _BENCHES}),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--allocator", choices=("warm", "cold"), default="warm",
        help="the host allocator while measuring: warm (default: freed memory is reused, as a "
        "caching allocator does) or cold (glibc's defaults: large blocks mapped on every call)",
    )  # fmt: skip
    p.add_argument("what", nargs="?", choices=_BENCHES, metavar="BENCHMARK", help="which benchmark")
    p.set_defaults(run=_bench, parser=p, what_name="BENCHMARK")
    p = sub.add_parser(
        "data",
        help="make the offline data sets (cached, resumable)",
        add_help=False,
        usage="cape data [-h] DATASET [OPTIONS]  (`cape data DATASET --help`: its options)",
        epilog=_choices_help("data sets", _DATA_SETS),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "what", nargs="?", choices=list(_DATA_SETS), metavar="DATASET", help="which data set"
    )
    p.set_defaults(run=_data, parser=p, what_name="DATASET")
    for name, text in (
        (
            "experiment",
            "train + evaluate + report a paper experiment (`cape experiment NAME --help`: its "
            "presets and rows)",
        ),
        ("train", "train one model (row and seed) of an experiment, resumable"),
        ("eval", "evaluate one trained model of an experiment"),
        ("plot", "redraw an experiment's report and plots from its results.json"),
    ):
        p = sub.add_parser(name, help=text, add_help=False)
        p.set_defaults(run=_experiments)
    for name, (_, _, text) in _APPS.items():
        sub.add_parser(name, help=text, add_help=False).set_defaults(run=_app)
    p = sub.add_parser("encodings", help="list the encodings `cape.build` knows and their options")
    p.set_defaults(run=_encodings)
    return parser


def main(argv: list[str] | None = None) -> int:
    args, rest = _parser().parse_known_args(argv)
    # --debug after the subcommand lands in `rest`: the global flag there too (not after "--")
    cut = rest.index("--") if "--" in rest else len(rest)
    debug = args.debug or "--debug" in rest[:cut]
    rest = [a for a in rest[:cut] if a != "--debug"] + rest[cut:]
    prog = " ".join(["cape", args.command, *([args.what] if getattr(args, "what", None) else [])])
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `cape ... | head` ends quietly
    with debugging(debug):
        try:
            return args.run(args, rest)
        except KeyboardInterrupt:
            if debug_wanted():
                traceback.print_exc()
            return 130
        except Preempted as err:  # a checkpoint of the step it stopped at: not an error
            if err.rank == 0:  # under torchrun every rank stops, one says so
                print(f"{prog}: {err}", file=sys.stderr)
            return err.exit_code  # 75
        except Exception as err:  # one line, its code by class (see arguments._classify)
            return report_error(prog, err)


if __name__ == "__main__":
    raise SystemExit(main())
