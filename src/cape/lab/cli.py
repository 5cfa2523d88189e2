"""The `cape` command line. Exit codes: 0 ok, 1 failure at run time, 2 bad usage."""

from __future__ import annotations

import argparse
import signal
import sys

__all__ = ["main"]


_BENCHES = ("encodings", "slowdown", "throughput", "train", "gpu")

# The lab's third-party modules and the extra of pyproject.toml that installs each: a user who
# installed only the library gets one line that names what to install instead of a traceback.
_EXTRA_OF_MODULE = {
    **dict.fromkeys(("numpy", "yaml", "PIL", "tqdm", "safetensors", "scipy", "filelock"), "lab"),
    "tomli": "lab",  # TOML configs before Python 3.11
    "jiwer": "speech",
    "soundfile": "speech",
    "sentencepiece": "translation",
    "sacrebleu": "translation",
    "matplotlib": "plot",
}


def _bench(args: argparse.Namespace, rest: list[str]) -> int:
    import importlib

    module = importlib.import_module(f".bench.{args.what}", __package__)  # one module per benchmark
    return module.main(rest)


def _data(args: argparse.Namespace, rest: list[str]) -> int:
    if args.what == "speech":  # WordNet text spoken by espeak-ng (cape.lab.data.speech.corpus)
        from cape.lab.data.speech.corpus import speech_main

        return speech_main(rest)
    if (
        args.what == "translation"
    ):  # WordNet + fortunes through Apertium (cape.lab.data.translation.corpus)
        from cape.lab.data.translation.corpus import translation_main

        return translation_main(rest)
    from cape.lab.data.images.render import make_native_sizes, make_split

    p = argparse.ArgumentParser(prog=f"cape data {args.what}")
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
        raise ValueError(f"--sizes must be comma-separated integers, got {opts.sizes!r}") from None
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
        print(f"cape encodings: unexpected arguments {rest}", file=sys.stderr)
        return 2
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
    from cape.lab.apps.transcribe import (
        transcribe_main,  # WAV files + a trained CTC run -> text, or WER
    )

    return transcribe_main(rest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="cape",
        description=(
            "Continuous augmented positional embeddings: encodings, experiments, benchmarks."
        ),
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
    args, rest = parser.parse_known_args(argv)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `cape ... | head` ends quietly
    try:
        return args.run(args, rest)
    except ModuleNotFoundError as err:
        extra = _EXTRA_OF_MODULE.get((err.name or "").partition(".")[0])
        if extra is None:  # not a dependency of an extra: a real bug, keep its traceback
            raise
        print(
            f"cape {args.command}: error: the module {err.name!r} is not installed; "
            f'install it with: pip install "cape[{extra}]"',
            file=sys.stderr,
        )
        return 1
    except (ValueError, TypeError) as err:  # bad arguments or config
        print(f"cape {args.command}: error: {err}", file=sys.stderr)
        return 2
    except (FileNotFoundError, KeyError) as err:  # e.g. evaluating a run never trained
        print(f"cape {args.command}: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
