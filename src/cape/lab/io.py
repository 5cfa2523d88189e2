"""Atomic file writes: a reader never sees a half-written report, plot or checkpoint.

A file is written under a temporary name, flushed to the disk (fsync), renamed into place and
the folder synced, so a crash or a power cut leaves the old file or the new one, never a mix.
A file found damaged anyway (by hand, a full disk, a copy cut short) is `set_aside` under a
`.damaged-<time>` name, never deleted; `read_json` names such a file in its error.

A full disk is reported as `DiskFull` (one line naming the folder, the bytes needed when known
and the bytes free), by `atomic_write` and by `disk_full_named` around writes made elsewhere
(torch's checkpoint writer). The temporaries of a writer killed midway (`.<name>.tmp-*`) are
found by `leftover_temporaries` and removed by whoever holds the lock of what they belong to.

`write_json` is the lab's one JSON writer (results, evaluations, run records, corpus manifests).
Its NaN rule: NaN and +-inf are written as `null`, so every file is standard JSON that any
reader (`json.load`, jq, a browser) accepts; the report code reads `null` back as NaN.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import numbers
import os
import shutil
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path, PurePath
from typing import Any

from cape.lab.errors import DamagedFile, DiskFull, is_disk_full

__all__ = [
    "atomic_write",
    "write_text",
    "write_json",
    "read_json",
    "fsync_file",
    "fsync_dir",
    "set_aside",
    "zip_problem",
    "crc32",
    "disk_full_named",
    "leftover_temporaries",
]

_log = logging.getLogger(__name__)


def _read_umask() -> int:
    mask = os.umask(0)  # the only way to read it; done once, at import, before any thread
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def fsync_file(path: str | Path) -> None:
    """Flush `path`'s data to the disk (a writer that closed it may leave it in the page cache)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | Path) -> None:
    """Make the renames and new entries of folder `path` durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot sync a folder; the rename is still atomic
        pass
    finally:
        os.close(fd)


def _free_bytes(folder: Path) -> int | None:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def _full(folder: Path, needed: int | None = None) -> DiskFull:
    """The DiskFull of a full-disk error met while writing into `folder`."""
    return DiskFull(folder, needed, _free_bytes(folder))


@contextlib.contextmanager
def disk_full_named(folder: str | Path) -> Iterator[None]:
    """Turn a full-disk error raised inside (OSError ENOSPC, torch's `inline_container`
    RuntimeError) into `DiskFull` naming `folder`; other errors pass unchanged."""
    try:
        yield
    except DiskFull:
        raise
    except (OSError, RuntimeError) as e:
        if not is_disk_full(e):
            raise
        raise _full(Path(folder)) from e


_TMP_MARK = ".tmp-"  # atomic_write's temporaries: .<name>.tmp-<random><suffix>


def leftover_temporaries(folder: str | Path, name: str | None = None) -> list[Path]:
    """`atomic_write`'s temporaries in `folder` (of the file `name` only, when given): what a
    writer killed midway leaves behind. Only whoever holds the lock of what they belong to may
    remove them (another writer's temporary looks the same while it is being written)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    prefix = "." if name is None else f".{name}{_TMP_MARK}"
    return sorted(
        p
        for p in folder.iterdir()
        if p.name.startswith(prefix) and _TMP_MARK in p.name and p.is_file()
    )


def atomic_write(
    path: str | Path, write: Callable[[str], None], *, size: int | None = None
) -> Path:
    """Call `write(tmp_path)`, sync it, then rename the temporary file onto `path` (same folder)
    and sync the folder. A full disk raises `DiskFull` naming the folder (and `size`, the bytes
    being written, when the caller knows it); nothing is left behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{path.name}{_TMP_MARK}", suffix=path.suffix, dir=path.parent
    )
    os.close(fd)
    try:
        write(tmp)
        fsync_file(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if (
            isinstance(e, (OSError, RuntimeError))
            and not isinstance(e, DiskFull)
            and is_disk_full(e)
        ):
            raise _full(path.parent, size) from e
        raise
    fsync_dir(path.parent)
    return path


def set_aside(path: str | Path, problem: str) -> Path:
    """Rename damaged file or folder `path` to `<name>.damaged-<time>` beside it (kept for
    inspection, out of every reader's way) and log one warning: `problem` (which names the
    damaged file and what is wrong), then the new name. Returns the new path."""
    path = Path(path)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    target = path.with_name(f"{path.name}.damaged-{stamp}")
    n = 1
    while target.exists() or target.is_symlink():
        n += 1
        target = path.with_name(f"{path.name}.damaged-{stamp}-{n}")
    os.replace(path, target)
    fsync_dir(path.parent)
    _log.warning("%s; set aside as %s", problem, target)
    return target


def zip_problem(path: str | Path) -> str | None:
    """What is wrong with zip archive `path` (an .npz), or None when every member reads back
    and matches its CRC-32."""
    import zipfile
    import zlib

    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (OSError, EOFError, ValueError, zipfile.BadZipFile, zlib.error) as e:
        return f"not a whole zip archive: {e}"
    return None if bad is None else f"its member {bad} fails its CRC check"


def crc32(path: Path) -> int:
    """The CRC-32 of file `path`'s bytes, as an unsigned int (what a manifest records)."""
    return zlib.crc32(path.read_bytes()) & 0xFFFFFFFF


def read_json(path: str | Path) -> Any:
    """The JSON value in `path`; DamagedFile naming the file when it is not JSON (cut short,
    garbled) or not UTF-8. FileNotFoundError as `open` raises it."""
    path = Path(path)
    text = path.read_bytes()
    try:
        return json.loads(text.decode("utf-8"))
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
        raise DamagedFile(f"{path} is damaged (not JSON: {e})", path) from e


def read_json_object(path: str | Path) -> dict[str, Any]:
    """A JSON object a user points a command at (a run's model.json): ValueError naming the
    file when it is not JSON, not UTF-8 or not an object (exit 2: the wrong file was given)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def write_text(path: str | Path, text: str) -> Path:
    """Write `text` to `path` atomically (UTF-8, "\\n" line ends), creating parent folders;
    returns the path."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    size = len(text.encode("utf-8"))
    return atomic_write(path, lambda tmp: _write_str(tmp, text), size=size)


def _write_str(tmp: str, text: str) -> None:
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


def _jsonable(obj: Any, where: str) -> Any:
    """`obj` with NaN / inf floats as None, tuples as lists, paths as str, numpy / torch values
    as Python ones. `where` names the value (e.g. `obj["records"][3]["acc"]`) in errors."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (str, bool, int)):
        return obj
    if isinstance(obj, Mapping):
        # json turns int / float / bool / None keys into strings itself; other keys would fail
        return {
            k if isinstance(k, (str, int, float, bool)) or k is None else str(k): _jsonable(
                v, f"{where}[{k!r}]"
            )
            for k, v in obj.items()
        }
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, PurePath):
        return str(obj)
    if hasattr(obj, "tolist"):  # numpy arrays and scalars, torch tensors
        value = obj.detach().cpu().tolist() if hasattr(obj, "detach") else obj.tolist()
        return _jsonable(value, where)
    if isinstance(obj, numbers.Real):
        return _jsonable(float(obj), where)
    raise ValueError(
        f"{where} must be a JSON value, list, dict, path, number or array; "
        f"got {type(obj).__name__} {obj!r}"
    )


def write_json(path: str | Path, obj: Any) -> Path:
    """Write `obj` as JSON atomically: indent 2, key order kept, UTF-8, NaN / inf as null (see
    the module's note), one "\\n" at the end. Raises ValueError naming the first value that is
    not JSON-like (e.g. `obj['config']['fn']`). Returns the path."""
    text = json.dumps(_jsonable(obj, "obj"), indent=2, allow_nan=False, ensure_ascii=False)
    return write_text(path, text + "\n")
