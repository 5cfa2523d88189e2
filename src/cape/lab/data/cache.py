"""One builder per cache entry, any number of readers: the lock every data cache builds under.

A cache entry (a rendered split's `.npz`, a corpus folder, a BPE model) is built by one process
at a time: `building(entry)` holds a file lock next to it (`<entry>.lock`, or `.lock` inside a
folder entry), so a second process started at the same time waits for the first, then finds the
entry made and reads it. Every file of an entry is written under a temporary name and renamed
into place (`cape.lab.io.atomic_write`), so a reader sees it whole or not at all; the builder
that holds the lock removes what a builder killed midway left behind (`remove_leftovers`) before
it builds again. The lock is the operating system's (`filelock`): a killed builder's lock is
released with its process, never left stale.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
from collections.abc import Iterator
from pathlib import Path

from cape.lab.io import leftover_temporaries, set_aside, zip_problem

__all__ = ["building", "fork_context", "remove_leftovers", "whole_npz"]

_log = logging.getLogger(__name__)


@contextlib.contextmanager
def building(entry: str | Path, *, folder: bool = False) -> Iterator[None]:
    """Hold the build lock of cache `entry` for the duration (waiting, with one log line, while
    another process builds it). Re-check the entry inside: the other process may have made it.
    The lock is `<entry>.lock` beside a file, `<entry>/.lock` inside a folder entry."""
    from filelock import FileLock, Timeout

    entry = Path(entry)
    path = entry / ".lock" if folder else entry.with_name(entry.name + ".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        _log.warning("waiting for another process that builds %s (lock %s)", entry, path)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def remove_leftovers(
    folder: str | Path, name: str | None = None, *, recursive: bool = False
) -> int:
    """Remove the temporaries a killed writer left in `folder` (of file `name` only, when given;
    in every sub-folder too with `recursive`); call it only while holding the entry's lock.
    Returns how many were removed (each logged by name)."""
    folder = Path(folder)
    folders = [folder]
    if recursive and folder.is_dir():
        folders += sorted(p for p in folder.rglob("*") if p.is_dir())
    removed = 0
    for where in folders:
        for tmp in leftover_temporaries(where, name):
            _log.warning("removing %s, left by a build that did not finish", tmp)
            tmp.unlink(missing_ok=True)
            removed += 1
    return removed


def whole_npz(path: Path) -> bool:
    """Whether `path` holds a whole .npz; a damaged one (cut short, garbled) is set aside with
    a warning naming it, to be rendered again (call it only while holding the entry's lock)."""
    if not path.exists():
        return False
    problem = zip_problem(path)
    if problem is not None:
        set_aside(path, f"{path} is damaged ({problem}); it is rendered again")
    return problem is None


def fork_context() -> multiprocessing.context.BaseContext:
    """The start method of the builders' worker pools: fork where the platform has it (workers
    start at once, scripts need no `if __name__ == "__main__"` guard), else spawn."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")
