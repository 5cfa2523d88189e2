"""Atomic file writes: a reader never sees a half-written report, plot or checkpoint."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["atomic_write"]


def _read_umask() -> int:
    mask = os.umask(0)  # the only way to read it; done once, at import, before any thread
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def atomic_write(path: str | Path, write: Callable[[str], None]) -> Path:
    """Call `write(tmp_path)`, then rename the temporary file onto `path` (same directory)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
