"""Memory a computation adds to training: tensors autograd keeps for the backward, CUDA peak.

`saved_bytes` counts the storages that autograd saves for the backward pass while `fn` runs
(through `torch.autograd.graph.saved_tensors_hooks`), each storage once, leaving out the ones
given in `exclude` (parameters, the input): what an encoding adds to the activation memory of a
training step, on any device and deterministic. `cuda_peak_bytes` is the allocator's peak
above the memory in use before `fn`, on CUDA only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

__all__ = ["saved_bytes", "cuda_peak_bytes"]


def _storage_key(t: torch.Tensor) -> tuple[str, int]:
    storage = t.untyped_storage()
    return (str(t.device), storage.data_ptr())


def saved_bytes(fn: Callable[[], object], exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of the distinct storages autograd saves for backward during `fn()`.

    exclude: tensors whose storages do not count (e.g. the module's parameters and the input,
    which exist whatever the encoding). Run `fn` without its backward, or with it: only the
    forward's saves are seen.
    """
    skip = {_storage_key(t) for t in exclude}
    seen: dict[tuple[str, int], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key not in skip:
            seen[key] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def cuda_peak_bytes(fn: Callable[[], object], device: torch.device) -> int | None:
    """Peak allocated bytes during `fn()` above what was allocated before; None off CUDA."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before
