"""Preemption: SIGTERM or SIGUSR1 during `Trainer.fit` stops the run at the end of its current
step, with a checkpoint of that step, and `cape` exits with `EXIT_PREEMPTED` (75).

Clusters send SIGTERM (SLURM, Kubernetes) or SIGUSR1 (SLURM's `--signal`) before they take a
machine back. The handler only records the signal; the training loop reads it at each step's
end, where the model, optimiser, sampler and RNGs agree, so the checkpoint resumes bit-exactly.
Under torchrun the signal may reach one rank only: the ranks agree on it with one all-reduce per
step (`agreed`), so every rank stops after the same step. A second signal changes nothing (a
process may get one from the cluster and one forwarded by torchrun); SIGINT (Ctrl-C) and
SIGKILL are left alone and stop at once: the run resumes from its last checkpoint.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

import torch
import torch.distributed as dist

from cape.lab.errors import Preempted
from cape.lab.train import distributed as D

__all__ = [
    "EXIT_PREEMPTED",
    "STOP_SIGNALS",
    "catching_stop_signals",
    "requested",
    "agreed",
    "signal_name",
]

EXIT_PREEMPTED = Preempted.exit_code  # 75, EX_TEMPFAIL (sysexits.h): a rerun resumes
STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGUSR1") if hasattr(signal, name)
)

_caught = 0  # the signal number caught while the handlers were installed, 0 for none


def _handler(signum: int, frame: FrameType | None) -> None:
    global _caught
    _caught = _caught or signum


@contextlib.contextmanager
def catching_stop_signals() -> Iterator[None]:
    """SIGTERM and SIGUSR1 recorded (`requested`) instead of ending the process, for the block.
    Only the main thread can install handlers; elsewhere, and inside an outer block, no-op."""
    global _caught
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is _handler
    ):
        yield
        return
    saved = {s: signal.signal(s, _handler) for s in STOP_SIGNALS}
    _caught = 0
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
        _caught = 0


def requested() -> int:
    """The stop signal this process caught (its number), 0 when none."""
    return _caught


def agreed() -> int:
    """The stop signal any rank caught, 0 when none: the same on every rank (under torchrun a
    collective: every rank calls it at the same step; on the CPU, through gloo even under nccl,
    so it never waits for the GPU). In one process, `requested()`."""
    if not D.is_distributed():
        return _caught
    flag = torch.tensor([_caught], dtype=torch.int64)  # on the CPU: no wait for the GPU
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=D.cpu_group())
    return int(flag.item())


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
