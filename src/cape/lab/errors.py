"""The lab's error classes; the `cape` command maps them to exit codes (see `cape.lab.cli`)."""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "UsageError", "RunError", "RunFolderBusy", "DamagedFile", "DiskFull", "Preempted",
    "is_disk_full",
]  # fmt: skip


class UsageError(ValueError):
    """The user's mistake (an argument, a config, a path, an input file): exit 2."""


class RunError(RuntimeError):
    """A failure at run time that is not the user's mistake: exit 1."""


class RunFolderBusy(UsageError):
    """A run folder is locked by another process; the message names the folder and the holder
    (PID, host, start time)."""


class DamagedFile(RunError):
    """A file on disk is truncated, unreadable or inconsistent (a checkpoint, a results file);
    the message names it and what is wrong, `path` is that file or folder."""

    def __init__(self, message: str, path: str | Path) -> None:
        super().__init__(message)
        self.path = Path(path)

    def __reduce__(self) -> tuple:  # pickled whole (across processes), not from args alone
        return (type(self), (str(self), self.path))


class DiskFull(RunError):
    """The disk filled while the lab wrote a file; the message names the folder and, when
    known, how many bytes the write needed. What was written before stays whole (every write is
    atomic): free space and run the command again to resume."""

    def __init__(self, folder: str | Path, needed: int | None = None, free: int | None = None):
        self.folder = Path(folder)
        self.needed, self.free = needed, free
        known = [] if needed is None else [f"{_size(needed)} needed"]
        known += [] if free is None else [f"{_size(free)} free"]
        detail = f" ({', '.join(known)})" if known else ""
        super().__init__(
            f"no space left on the disk of {str(folder)!r}{detail}; free some space and run "
            "the command again (the files already written are whole)"
        )

    def __reduce__(self) -> tuple:
        return (type(self), (self.folder, self.needed, self.free))


def _size(n: int) -> str:
    """Bytes as a short size: 512 B, 3.2 MB, 1.5 GB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


_FULL_TEXTS = ("no space left", "pytorchstreamwriter failed", "file write failed", "disk quota")


def is_disk_full(err: BaseException) -> bool:
    """Whether `err` says the disk (or the user's quota) is full: an OSError ENOSPC / EDQUOT,
    or torch's RuntimeError from its zip writer (`[enforce fail at inline_container.cc]`
    `file write failed`) or any error that says "No space left"."""
    import errno

    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if isinstance(err, (OSError, RuntimeError)):
        text = str(err).lower()
        return any(t in text for t in _FULL_TEXTS)
    return False


class Preempted(RunError):
    """A stop signal (SIGTERM, SIGUSR1) ended training at the end of a step, that step saved;
    the message says which step and how to resume. `cape` exits with 75 (EX_TEMPFAIL), and
    only `rank` 0 of a torchrun job prints the message."""

    exit_code = 75  # EX_TEMPFAIL (sysexits.h): stopped early, a rerun resumes

    def __init__(self, message: str, rank: int = 0) -> None:
        super().__init__(message)
        self.rank = rank

    def __reduce__(self) -> tuple:
        return (type(self), (str(self), self.rank))
