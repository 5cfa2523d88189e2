"""One writer per run folder: an exclusive lock (filelock, an OS lock on `<folder>/.lock`).

The holder writes who it is (PID, host, start time, command) to `<folder>/.lock.owner`, so a
second process fails at once with one line naming the folder and the holder
(`RunFolderBusy`, exit 2). The OS releases the lock when its process dies, however it dies: a
lock found free while the owner file is still there was left by a killed process; it is taken
over with a warning naming that process. Under torchrun only rank 0 locks, and every rank
learns whether it could (one collective), so no rank waits on a rank that gave up.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cape.lab.errors import RunFolderBusy, UsageError
from cape.lab.io import write_json
from cape.lab.train import distributed as D

__all__ = ["LOCK_FILE", "OWNER_FILE", "FolderLock", "locked_folder", "holds_out", "make_folder"]

LOCK_FILE = ".lock"
OWNER_FILE = ".lock.owner"
_log = logging.getLogger(__name__)


def _holder(owner: dict[str, Any]) -> str:
    return (
        f"PID {owner.get('pid', '?')} on host {owner.get('host', '?')} "
        f"since {owner.get('started', '?')}"
    )


def _read_owner(path: Path) -> dict[str, Any] | None:
    try:
        owner = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # absent, or the holder is writing it this instant
        return None
    return owner if isinstance(owner, dict) else None


def _gone(owner: dict[str, Any]) -> bool:
    """Whether `owner` names a process of this host that has ended (a stale owner file)."""
    if owner.get("host") != socket.gethostname():
        return False
    try:
        os.kill(int(owner["pid"]), 0)
    except ProcessLookupError:
        return True
    except (OSError, ValueError, TypeError, KeyError):  # alive under another user, or garbled
        return False
    return False


def _unwritable(folder: Path, err: OSError) -> UsageError:
    return UsageError(
        f"{folder} cannot be used as a run folder ({err.strerror or err}): "
        "it must be a writable folder (or a path where one can be made)"
    )


def make_folder(folder: str | Path) -> Path:
    """`mkdir -p folder` for a run folder; UsageError naming the file that stands in its way,
    or the folder when it cannot be made or written."""
    folder = Path(folder)
    for path in (folder, *folder.parents):
        if path.is_dir():
            break
        if path.exists() or path.is_symlink():
            where = "" if path == folder else f"; the run folder {folder} cannot be made inside it"
            raise UsageError(f"{path} is a file: a run folder must be a folder{where}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _unwritable(folder, e) from None
    return folder


class FolderLock:
    """The exclusive lock of run folder `folder` (made when missing). `acquire()` raises
    `RunFolderBusy` naming the holder when another process has it, and `UsageError` when
    `folder` is a file or cannot be written; `release()` gives it back."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.lock_path = self.folder / LOCK_FILE
        self.owner_path = self.folder / OWNER_FILE
        self._lock: Any = None

    def acquire(self) -> None:
        import filelock

        make_folder(self.folder)
        try:
            # made here first: filelock reports some failures to create it as a busy lock
            os.close(os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644))
            lock = filelock.FileLock(self.lock_path, timeout=0)
            lock.acquire()
        except filelock.Timeout:
            raise self._busy() from None
        except OSError as e:  # read-only, no permission, ...
            raise _unwritable(self.folder, e) from None
        stale = _read_owner(self.owner_path)
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "argv": list(sys.argv),
        }
        try:
            write_json(self.owner_path, me)
        except OSError as e:
            lock.release()
            raise _unwritable(self.folder, e) from None
        self._lock = lock
        if stale is not None:  # the OS lock was free: its holder ended without releasing it
            _log.warning(
                "%s: took over the lock %s left by %s (that process is gone)",
                self.folder,
                self.lock_path,
                _holder(stale),
            )

    def _busy(self) -> RunFolderBusy:
        owner = _read_owner(self.owner_path)
        if owner is None or _gone(owner):  # the holder has the lock, not yet its owner file
            time.sleep(0.2)
            owner = _read_owner(self.owner_path)
        if owner is None or _gone(owner):
            who = "another process (it has not written its name yet)"
        else:
            who = _holder(owner)
        return RunFolderBusy(f"{self.folder} is in use by {who} (lock {self.lock_path})")

    def release(self) -> None:
        if self._lock is None:
            return
        # the owner file goes first: left behind, it would mark a kill, not a clean exit
        with contextlib.suppress(OSError):
            self.owner_path.unlink()
        self._lock.release()
        self._lock = None

    def __enter__(self) -> FolderLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextlib.contextmanager
def locked_folder(folder: str | Path) -> Iterator[None]:
    """Hold `folder`'s lock for the block: in one process, or on rank 0 under torchrun (a
    collective: every rank must enter). Every rank raises the error rank 0 met."""
    lock = FolderLock(folder)
    error: Exception | None = None
    if D.get_rank() == 0:
        try:
            lock.acquire()
        except UsageError as e:
            error = e
    if D.is_distributed():  # the other ranks learn rank 0's outcome instead of waiting on it
        error = D.all_gather_object(error)[0]
    if error is not None:
        raise error
    try:
        yield
    finally:
        lock.release()


def holds_out(run_experiment: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate an experiment's `run_experiment(cfg, mapping, out, *, train)`: its experiment
    folder `out` is locked for the whole call (config, runs, report), so a second process on
    it stops at once with `RunFolderBusy` naming the holder."""

    @functools.wraps(run_experiment)
    def locked(cfg: Any, mapping: dict[str, Any], out: str | Path, **kw: Any) -> Any:
        D.init_distributed(cfg.train.device)  # under torchrun: rank 0 locks, every rank learns
        with locked_folder(out):
            return run_experiment(cfg, mapping, out, **kw)

    return locked
