"""What every `cape` command shares: its argument parser, its one-line errors and their exit
codes, and the checks of output paths made before any work starts. The data and bench modules
use it without importing the `cape` command itself (`cape.lab.cli`)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path

from cape.lab.errors import RunError, UsageError, is_disk_full

__all__ = [
    "ArgumentParser",
    "report_error",
    "debugging",
    "check_out_folder",
    "check_out_file",
    "out_folder",
]


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
    "rotary_embedding_torch": "test",  # `cape bench rotary`: the references
    "x_transformers": "test",
    "onnxruntime": "test",  # `cape bench deploy`: the ONNX check (a cell says when it is missing)
    "transformers": "test",  # `cape bench decode`: the reference model
    "torchvision": "test",  # imported by transformers and timm (`cape.lab.torchvision_ops`)
    "timm": "test",  # `cape bench deploy`: the timm cases (their cells say when it is missing)
    "pycocotools": "lab",  # the detection study's COCO metrics
}

_debug = False  # set by `debugging` for the duration of one command (report_error reads it)


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one line (the usage folded into it), still exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        usage = " ".join(self.format_usage().split())
        print(f"{self.prog}: error: {message} ({usage})", file=sys.stderr)
        self.exit(2)

    def names(self, flag: str, text: str, allowed: Sequence[str]) -> list[str]:
        """The names of the comma list `text` given to `flag` (spaces around each dropped; each
        once, in the order first given: a name twice would run its case twice); an error naming
        `allowed` unless there is one and all are allowed."""
        names = [n.strip() for n in text.split(",") if n.strip()]
        if not names or any(n not in allowed for n in names):
            self.error(f"{flag} must be a comma list of {', '.join(allowed)}; got {text!r}")
        return list(dict.fromkeys(names))

    def positive_ints(self, flag: str, text: str) -> list[int]:
        """The integers of the comma list `text` given to `flag` (each once, in the order first
        given); an error unless there is one and each is >= 1."""
        try:
            values = [int(v) for v in text.split(",") if v.strip()]
        except ValueError:
            values = []
        if not values or min(values) < 1:
            self.error(f"{flag} must be a comma list of integers >= 1, got {text!r}")
        return list(dict.fromkeys(values))

    def at_least(self, *checks: tuple[str, float, float]) -> None:
        """An error for the first (flag, value, low) of `checks` whose value is below low."""
        for flag, value, low in checks:
            if value < low:
                self.error(f"{flag} must be >= {low}, got {value}")


def debug_wanted() -> bool:
    """True when tracebacks are wanted: --debug given to the running command, or CAPE_DEBUG=1."""
    return _debug or os.environ.get("CAPE_DEBUG", "") not in ("", "0")


@contextlib.contextmanager
def debugging(on: bool) -> Iterator[None]:
    """--debug for the duration of one command."""
    global _debug
    saved, _debug = _debug, on
    try:
        yield
    finally:
        _debug = saved


def _one_line(text: str) -> str:
    """A multi-line message (a YAML error, a list of problems) folded into one line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    out = lines[0] if lines else ""
    for line in lines[1:]:
        out += (" " if out.endswith(":") else "; ") + line
    return out


def _classify(err: BaseException) -> tuple[int, str]:
    """(exit code, message) of an exception that ended a command."""
    text = _one_line(str(err)) or type(err).__name__
    if isinstance(err, ModuleNotFoundError):
        extra = _EXTRA_OF_MODULE.get((err.name or "").partition(".")[0])
        if extra is not None:
            return 1, (
                f"the module {err.name!r} is not installed; "
                f'install it with: pip install "cape[{extra}]"'
            )
    elif isinstance(err, RunError):
        return 1, text
    elif isinstance(err, (OSError, RuntimeError)) and is_disk_full(err):
        return 1, _disk_full_line(err, text)
    elif isinstance(err, (ValueError, TypeError, FileNotFoundError)):  # UsageError included
        return 2, text
    elif isinstance(err, KeyError):
        key = err.args[0] if err.args else None
        if isinstance(key, str) and " " in key:  # a sentence for the user; a bare key is a bug
            return 2, _one_line(key)
    elif isinstance(err, (OSError, ImportError)):  # disk full, permissions, a broken install
        return 1, text
    # not raised on purpose: say so, so that a bug is not mistaken for a failed run
    return 1, (
        f"unexpected {type(err).__name__}: {text} "
        "(rerun with --debug or CAPE_DEBUG=1 to see the traceback)"
    )


def _disk_full_line(err: OSError | RuntimeError, text: str) -> str:
    """One line for a full disk met outside the lab's own writers (which raise DiskFull)."""
    name = getattr(err, "filename", None)
    where = f" writing {str(name)!r}" if name else f" ({text})"
    return f"no space left on the disk{where}; free some space and run the command again"


def report_error(prog: str, err: BaseException, code: int | None = None) -> int:
    """Print `err` as one line `PROG: error: MESSAGE` (after its traceback when debugging) and
    return its exit code; `code` overrides the class's code (a main that knows what failed)."""
    if debug_wanted():
        traceback.print_exception(err)
    if code is None:
        code, message = _classify(err)
    else:  # the caller knows this failure: its message alone
        message = _one_line(str(err)) or type(err).__name__
    print(f"{prog}: error: {message}", file=sys.stderr)
    return code


def _writable_above(target: Path, folder: Path, what: str) -> None:
    """UsageError unless `folder` (existing or to be made) can be written into; `target` is the
    folder itself or a file to write in it, `what` names it ("--out 'runs/x'")."""
    existing = folder
    while not existing.is_dir():  # the nearest existing folder above, or a file in the way
        if existing.exists() or existing.is_symlink() or existing.parent == existing:
            where = "" if existing == target else f": {str(existing)!r}"
            raise UsageError(f"{what}{where} is a file, not a folder; give a folder path")
        existing = existing.parent
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "" if existing == target else f": {str(existing)!r}"
        raise UsageError(f"{what}{where} is not writable; give a writable folder")


def check_out_folder(path: str | Path, flag: str) -> Path:
    """`path` as a Path when it is a folder that can be written into (or made): else UsageError
    naming `flag` (e.g. "--out") before any work is done."""
    path = Path(path)
    _writable_above(path, path, f"{flag} {str(path)!r}")
    return path


def out_folder(text: str) -> Path:
    """argparse `type=` of an output folder flag: `check_out_folder` at parse time."""
    try:
        return check_out_folder(text, "")
    except UsageError as e:  # argparse prefixes "argument --out: "
        raise argparse.ArgumentTypeError(str(e).lstrip()) from e


def check_out_file(path: str | Path, flag: str) -> Path:
    """`path` as a Path when it names a file that can be written (its folder made if needed)."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{flag} {str(path)!r} is a folder; give a file path")
    _writable_above(path, path.parent, f"{flag} {str(path)!r}")
    return path
