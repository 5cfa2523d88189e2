"""The lab's error classes; the `cape` command maps them to exit codes (see `cape.lab.cli`)."""

from __future__ import annotations

__all__ = ["UsageError", "RunError", "RunFolderBusy"]


class UsageError(ValueError):
    """The user's mistake (an argument, a config, a path, an input file): exit 2."""


class RunError(RuntimeError):
    """A failure at run time that is not the user's mistake: exit 1."""


class RunFolderBusy(UsageError):
    """A run folder is locked by another process."""
