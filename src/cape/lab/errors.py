"""The lab's error classes; the `cape` command maps them to exit codes (see `cape.lab.cli`)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["UsageError", "RunError", "RunFolderBusy", "DamagedFile", "Preempted"]


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
