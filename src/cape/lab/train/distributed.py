"""Process-group setup from torchrun's environment; every helper is a no-op in one process."""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "DistInfo",
    "init_distributed",
    "is_distributed",
    "get_rank",
    "get_world_size",
    "is_main",
    "barrier",
    "all_reduce_mean",
    "cpu_group",
    "all_gather_object",
    "cleanup",
]


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device


def _pick_device(device: str, local_rank: int) -> torch.device:
    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_distributed(device: str = "auto") -> DistInfo:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK): nccl on CUDA,
    gloo on CPU. Without those variables (plain `python`), returns rank 0 of 1 and does nothing."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = _pick_device(device, local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)  # nccl collectives and all_gather_object use this device
    if world > 1 and not dist.is_initialized():
        _join("nccl" if dev.type == "cuda" else "gloo", rank, world)
    return DistInfo(rank, world, local_rank, dev)


def _join(backend: str, rank: int, world: int) -> None:
    """`init_process_group` on torchrun's store (env://), its keys under this restart's prefix.

    torchrun's agent keeps one store (MASTER_PORT) for every restart of `--max-restarts`, and
    the process group's keys (each rank's gloo address, nccl's id) are not per restart: a rank
    of the restarted round that asks before rank 0 has published anew reads the dead round's
    address and fails ("Gloo connectFullMesh failed ... Connection refused" on its port)."""
    store, _, _ = next(dist.rendezvous("env://", rank=rank, world_size=world))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.PrefixStore(f"cape/attempt_{attempt}/", store)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world)
    # destroyed before the interpreter exits: left to teardown, gloo's threads can abort the
    # process after a finished run ("terminate called without an active exception", SIGABRT)
    atexit.register(cleanup)


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def get_rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def get_world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def is_main() -> bool:
    """Rank 0: the only process that writes logs and checkpoints."""
    return get_rank() == 0


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def _collective_device() -> torch.device:
    if is_distributed() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


_cpu_group: Any = None  # under nccl: a gloo group over the same ranks (`cpu_group`)


def cpu_group() -> Any:
    """The process group for small collectives on CPU tensors, which must not wait for the GPU
    (a host sync per step): None (the default group) under gloo; under nccl, a gloo group over
    the same ranks, made at the first call (a collective: every rank calls it in turn)."""
    global _cpu_group
    if dist.get_backend() != "nccl":
        return None
    if _cpu_group is None:
        _cpu_group = dist.new_group(backend="gloo")
    return _cpu_group


def all_reduce_mean(metrics: dict[str, float]) -> dict[str, float]:
    """Mean of each metric over ranks (one float64 all-reduce for the whole dict).

    Every rank must pass the same keys; they are sorted so the packing order agrees."""
    if not is_distributed() or not metrics:
        return {k: float(v) for k, v in metrics.items()}
    keys = sorted(metrics)
    buf = torch.tensor(
        [float(metrics[k]) for k in keys], dtype=torch.float64, device=_collective_device()
    )
    dist.all_reduce(buf, op=dist.ReduceOp.SUM)
    buf /= dist.get_world_size()
    return dict(zip(keys, buf.tolist(), strict=True))


def all_gather_object(obj: Any) -> list[Any]:
    """`[obj of rank 0, obj of rank 1, ...]`; `[obj]` in one process. Pickles in memory only."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def cleanup() -> None:
    global _cpu_group
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _cpu_group = None
