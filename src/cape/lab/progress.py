"""The lab's one progress bar: tqdm on a terminal, on rank 0 only, silent everywhere else; and
`StepLines`, the training loop's progress off a terminal.

Off a terminal (CI, log files, `nohup`) a bar would fill the log with carriage-return lines, and
under torchrun every rank would draw its own; so `progress` draws only where someone watches.
There, `StepLines` prints one plain line (step, loss, steps/s, ETA) every so many seconds
instead, so that a log shows the run is alive and how far it has come.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, TextIO, TypeVar

from tqdm.auto import tqdm

__all__ = ["progress", "StepLines", "duration"]

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


def duration(seconds: float) -> str:
    """`seconds` for a person: "45s", "12m05s", "3h07m"."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class StepLines:
    """Training progress as plain lines, where `progress` draws no bar: off a terminal (stderr
    not a TTY), at rank 0, when `enabled` and `every` > 0 seconds. `update(step, loss)` after
    each optimiser step prints, at most once every `every` seconds and at the last step,

        train step 1200/5000 loss 2.3457 steps/s 3.21 ETA 19m42s

    to `stream` (default stderr, where the bar would be): the loss is the mean of the steps
    since the previous line (on this rank; a tensor is summed on its device and read only when
    a line is printed: no host sync per step), steps/s and the ETA count the steps of this
    session (from `start`, a resumed run's first step). Elsewhere every method is a no-op.
    `clock` (seconds, default `time.monotonic`) is for tests."""

    def __init__(
        self,
        total: int,
        start: int = 0,
        desc: str = "train",
        *,
        every: float = 30.0,
        enabled: bool = True,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.active = bool(enabled) and every > 0 and _rank() == 0 and not self.stream.isatty()
        self.total, self.start, self.desc, self.every, self.clock = total, start, desc, every, clock
        self.t0 = self.last = clock()
        self._sum: Any = 0.0
        self._count = 0

    def update(self, step: int, loss: Any = None) -> str | None:
        """Step `step` (steps done) has ended with `loss` (a float or a tensor, or None): the
        line printed, if one was due, else None."""
        if not self.active:
            return None
        if loss is not None:
            self._sum = self._sum + (loss.detach() if hasattr(loss, "detach") else float(loss))
            self._count += 1
        now = self.clock()
        if now - self.last < self.every and step < self.total:
            return None
        self.last = now
        done, elapsed = step - self.start, now - self.t0
        rate = done / elapsed if elapsed > 0 else float("nan")
        parts = [f"{self.desc} step {step}/{self.total}"]
        if self._count:
            parts.append(f"loss {float(self._sum) / self._count:.4g}")
            self._sum, self._count = 0.0, 0
        parts.append(f"steps/s {rate:.3g}")
        if step >= self.total:
            parts.append(f"done in {duration(elapsed)}")
        elif rate > 0:
            parts.append(f"ETA {duration((self.total - step) / rate)}")
        line = " ".join(parts)
        print(line, file=self.stream, flush=True)
        return line
