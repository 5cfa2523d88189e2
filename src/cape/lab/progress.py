"""The lab's one progress bar: tqdm on a terminal, on rank 0 only, silent everywhere else.

Off a terminal (CI, log files, `nohup`) a bar would fill the log with carriage-return lines, and
under torchrun every rank would draw its own; so `progress` draws only where someone watches.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any, TypeVar

from tqdm.auto import tqdm

__all__ = ["progress"]

T = TypeVar("T")


def _rank() -> int:
    """This process's rank: the process group's when one is set up, else torchrun's RANK."""
    dist = sys.modules.get("torch.distributed")  # not imported: no process group can exist
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def progress(
    iterable: Iterable[T] | None = None,
    total: int | None = None,
    desc: str | None = None,
    *,
    enabled: bool = True,
    **kwargs: Any,
) -> tqdm:
    """A tqdm bar over `iterable` (or, with iterable=None, one advanced by `.update(n)`), drawn
    only when `enabled`, on rank 0 and with stderr a terminal; otherwise a disabled bar that
    iterates and updates silently. `kwargs` go to tqdm (e.g. unit="img"). Use it as an iterator
    or as a context manager."""
    shown = bool(enabled) and _rank() == 0 and sys.stderr.isatty()
    return tqdm(iterable, total=total, desc=desc, disable=not shown, dynamic_ncols=True, **kwargs)
