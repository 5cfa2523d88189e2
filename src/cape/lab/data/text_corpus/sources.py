"""The documents of each text corpus, read from what is on the machine (nothing downloaded).

- `kjv`: the King James Bible of Debian's `bible-kjv` (its text lives in `bible-kjv-text`'s
  compressed /usr/lib/bible.data, which the package's own `bible` program prints one verse a
  line): one document per chapter (1189), id `<book><chapter>` as `bible` spells it (`Ge1`,
  `1Cor13`), text the chapter's verses one a line, without their references.
- `jargon`: the Jargon File 4.4.7 of Debian's `dict-jargon` (a dictd database: a gzip-compatible
  /usr/share/dictd/jargon.dict.dz and an index of `headword<TAB>offset<TAB>length`, numbers in
  dictd's base 64): one document per entry, id its first headword; the `00-database-*` entries
  (licence, URL) are left out.
- `fortunes`: the fortune files of Debian's `fortunes-min` / `fortunes` (/usr/share/games/fortunes,
  `%` lines between fortunes): one document per fortune, id `<file>:<index>`; the `off/` folder
  (the offensive ones) and the `.u8` links are not read.
- `stdlib`: the Python standard library's own source (`sysconfig.get_paths()["stdlib"]`, the
  running interpreter's; it differs between versions, which the statistics record): one document
  per `.py` file, id its path under the library; the test suites (any folder named `test`,
  `tests` or `idle_test`) and installed packages (`site-packages`, `dist-packages`) are left
  out, idlelib and the rest kept; a file that is not UTF-8 is skipped (counted).
- a folder: its `.txt` files (searched recursively), one document per file, id its relative path;
  every file must be UTF-8 (one that is not is named), empty files are skipped (counted).

`read_documents(corpus)` returns a `Source`: the documents in a fixed order, `info` (package
versions, Python version, paths: recorded in the statistics) and `key` (what identifies the
input, part of the cache key: a changed package or folder gives a new cache entry).
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cape.lab.errors import RunError, UsageError

__all__ = ["CORPORA", "Source", "package_version", "read_documents"]

_log = logging.getLogger(__name__)

CORPORA = ("kjv", "jargon", "fortunes", "stdlib")
"""The corpora known by name; anything else given as `--corpus` is a folder of .txt files."""

BIBLE_DATA = Path("/usr/lib/bible.data")
JARGON_DICT = Path("/usr/share/dictd/jargon.dict.dz")
JARGON_INDEX = Path("/usr/share/dictd/jargon.index")
FORTUNES_DIR = Path("/usr/share/games/fortunes")
STDLIB_SKIP = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages"})
_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_VERSE = re.compile(r"^([1-3]?[A-Za-z]+)([0-9]+):([0-9]+) (.*)$")


@dataclass
class Source:
    """The documents of a corpus: `docs` (id, text) in a fixed order, `info` for the
    statistics, `key` for the cache key, `skipped` files left out with the reason."""

    name: str
    docs: list[tuple[str, str]]
    info: dict[str, Any]
    key: dict[str, Any]
    skipped: dict[str, str] = field(default_factory=dict)


def package_version(package: str) -> str | None:
    """The installed version of Debian package `package` (`dpkg-query -W`), None if absent."""
    if shutil.which("dpkg-query") is None:
        return None
    run = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", package],
        capture_output=True,
        text=True,
        check=False,
    )
    return (run.stdout.strip() or None) if run.returncode == 0 else None


def _missing(path: Path, package: str) -> FileNotFoundError:
    return FileNotFoundError(
        f"{path} does not exist: install the Debian package {package} (scripts/setup.sh does), "
        "or give --corpus a folder of .txt files"
    )


def _packages(*names: str) -> dict[str, str | None]:
    return {name: package_version(name) for name in names}


def kjv_documents() -> Source:
    """The King James Bible, one document per chapter (see the module's note)."""
    bible = shutil.which("bible")
    if bible is None or not BIBLE_DATA.is_file():
        raise _missing(BIBLE_DATA if bible else Path("bible"), "bible-kjv")
    run = subprocess.run(
        [bible, "-f", "-p", str(BIBLE_DATA.parent), "gen1:1-rev22:21"],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    if run.returncode != 0:
        raise RunError(f"{bible} failed (exit {run.returncode}): {run.stderr[-300:]!r}")
    chapters: dict[str, list[str]] = {}
    for n, line in enumerate(run.stdout.decode("utf-8").splitlines(), 1):
        m = _VERSE.match(line)
        if m is None:
            raise RunError(f"line {n} of `bible`'s output is not `<ref> <verse>`: {line[:80]!r}")
        chapters.setdefault(m[1] + m[2], []).append(m[4])
    docs = [(ref, "\n".join(verses) + "\n") for ref, verses in chapters.items()]
    packages = _packages("bible-kjv", "bible-kjv-text")
    info = {"packages": packages, "files": [str(BIBLE_DATA)], "documents_are": "chapters"}
    return Source("kjv", docs, info, {"packages": packages})


def _b64(text: str) -> int:
    value = 0
    for ch in text:
        value = value * 64 + _B64.index(ch)
    return value


def jargon_documents() -> Source:
    """The Jargon File, one document per entry (see the module's note)."""
    for path in (JARGON_DICT, JARGON_INDEX):
        if not path.is_file():
            raise _missing(path, "dict-jargon")
    with gzip.open(JARGON_DICT, "rb") as f:  # dictzip is gzip with random-access extras
        data = f.read()
    seen: set[tuple[int, int]] = set()
    heads: dict[str, int] = {}
    docs = []
    for line in JARGON_INDEX.read_text(encoding="utf-8").splitlines():
        head, offset, length = line.split("\t")
        where = (_b64(offset), _b64(length))
        if head.startswith("00-database-") or where in seen:
            continue
        seen.add(where)
        heads[head] = heads.get(head, 0) + 1  # a headword twice (two entries): `word#2`
        head = head if heads[head] == 1 else f"{head}#{heads[head]}"
        text = data[where[0] : where[0] + where[1]].decode("utf-8").strip("\n") + "\n"
        docs.append((head, text))
    packages = _packages("dict-jargon")
    info = {"packages": packages, "files": [str(JARGON_DICT)], "documents_are": "entries"}
    return Source("jargon", docs, info, {"packages": packages})


def fortune_documents() -> Source:
    """The fortunes, one document per fortune (see the module's note)."""
    if not FORTUNES_DIR.is_dir():
        raise _missing(FORTUNES_DIR, "fortunes-min")
    files = sorted(
        p
        for p in FORTUNES_DIR.iterdir()
        if p.is_file() and not p.is_symlink() and p.suffix not in (".dat", ".u8")
    )
    docs = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise RunError(
                f"fortune file {path} is not UTF-8 ({e.reason} at byte {e.start})"
            ) from None
        pieces = (p.strip("\n") for p in re.split(r"^%[ \t]*$", text, flags=re.MULTILINE))
        docs += [(f"{path.name}:{i}", p + "\n") for i, p in enumerate(pieces) if p.strip()]
    packages = _packages("fortunes-min", "fortunes")
    sizes = {p.name: p.stat().st_size for p in files}
    info = {"packages": packages, "files": [str(FORTUNES_DIR)], "documents_are": "fortunes"}
    return Source("fortunes", docs, info, {"packages": packages, "sizes": sizes})


def stdlib_documents() -> Source:
    """The standard library's .py files (see the module's note)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p
        for p in root.rglob("*.py")
        if not STDLIB_SKIP.intersection(p.relative_to(root).parts) and p.is_file()
    )
    docs, skipped = [], {}
    for path in files:
        rel = path.relative_to(root).as_posix()
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            skipped[rel] = f"not UTF-8 ({e.reason} at byte {e.start})"
            continue
        if text.strip():
            docs.append((rel, text))
        else:
            skipped[rel] = "empty"
    version = ".".join(map(str, sys.version_info[:3]))
    info = {
        "python": version,
        "implementation": sys.implementation.name,
        "files": [str(root)],
        "documents_are": "files",
        "left_out": sorted(STDLIB_SKIP),
    }
    key = {"python": version, "implementation": sys.implementation.name, "root": str(root)}
    return Source("stdlib", docs, info, key, skipped)


def _utf8_path(path: Path, what: str) -> str:
    """`path` as text, or a UsageError naming it when its name is not UTF-8: names are
    document ids and are recorded in the statistics (JSON, UTF-8)."""
    text = str(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(
            f"{what} {text.encode('utf-8', 'surrogateescape')!r} has a name that is not UTF-8; "
            "rename it (--corpus folders must hold UTF-8 names and text)"
        ) from None
    return text


def _not_a_file(path: Path) -> str:
    """Why a `.txt` entry that is not a regular file (to a resolved link) is not read."""
    if path.is_symlink():
        try:
            path.stat()
        except OSError as e:
            if e.errno == errno.ELOOP:
                return "a symlink loop"
            return "a dangling symlink"
    if path.is_dir():
        return "a folder, not a file"
    return "not a regular file (a pipe, socket or device)"


def _left_out(root: Path) -> dict[str, str]:
    """What a folder corpus does not read, with the reason: `.txt` entries that are not files
    (links in a loop or to nothing, folders, pipes) and links to folders (not followed, as
    `rglob` does not), by their path under `root`."""
    skipped = {}
    for top, dirs, names in os.walk(root, followlinks=False):
        for name in (*dirs, *names):
            path = Path(top) / name
            rel = path.relative_to(root).as_posix()
            if name.endswith(".txt") and not path.is_file():
                skipped[rel] = _not_a_file(path)
            elif path.is_symlink() and path.is_dir():
                skipped[rel] = "a link to a folder (not followed)"
    return skipped


def folder_documents(folder: str | Path) -> Source:
    """The .txt files under `folder`, one document each; UsageError naming the folder when it
    is missing, empty or holds no .txt file, or naming a file that is not UTF-8 (its text or
    its name). What is not read (empty files, `.txt` entries that are not files, links to
    folders) is listed in `skipped` with the reason."""
    root = Path(folder)
    if not root.is_dir():
        raise UsageError(
            f"--corpus {str(root)!r} is neither a folder nor one of {', '.join(CORPORA)}"
        )
    _utf8_path(root.resolve(), "--corpus folder")
    if not any(root.iterdir()):
        raise UsageError(f"--corpus folder {str(root)!r} is empty; it must hold .txt files")
    files = sorted(p for p in root.rglob("*.txt") if p.is_file())
    if not files:
        raise UsageError(f"--corpus folder {str(root)!r} holds no .txt file")
    docs, skipped, stamp = [], dict(sorted(_left_out(root).items())), hashlib.sha256()
    for rel, why in skipped.items():  # part of the key: stats.json lists them
        _utf8_path(root / rel, "file")
        stamp.update(f"{rel}\0skipped\0{why}\0".encode())
    for path in files:
        _utf8_path(path, "file")
        rel = path.relative_to(root).as_posix()
        raw = path.read_bytes()
        stamp.update(f"{rel}\0{len(raw)}\0".encode() + hashlib.sha256(raw).digest())
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UsageError(
                f"{path} is not UTF-8 text ({e.reason} at byte {e.start}); "
                "--corpus folders must hold UTF-8 .txt files"
            ) from None
        if text.strip():
            docs.append((rel, text))
        else:
            skipped[rel] = "empty"
    if not docs:
        raise UsageError(f"every .txt file in --corpus folder {str(root)!r} is empty")
    info = {"files": [str(root.resolve())], "documents_are": "files"}
    key = {"folder": str(root.resolve()), "content": stamp.hexdigest()}
    return Source(root.resolve().name or "folder", docs, info, key, skipped)


_READERS = {
    "kjv": kjv_documents,
    "jargon": jargon_documents,
    "fortunes": fortune_documents,
    "stdlib": stdlib_documents,
}


def read_documents(corpus: str | Path) -> Source:
    """The documents of `corpus`: one of `CORPORA`, or a folder of .txt files."""
    reader = _READERS.get(str(corpus))
    return reader() if reader is not None else folder_documents(corpus)
