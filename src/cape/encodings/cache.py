"""A small cache of deterministic embedding tables for eval mode (and augmentation-free training).

Cached tables are handed out as broadcast views `table.expand(B, ...)`. A caller that writes into
such a view bumps the shared version counter of the cached tensor; the entry is then rebuilt,
so a cached table is never returned after a caller has modified it. Bypassed under torch.compile
(a dict lookup would break the graph, and the compiled graph fuses the computation anyway).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable

import torch

__all__ = ["TableCache"]


class TableCache:
    """LRU map key -> (tensor, version at insertion)."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._entries: OrderedDict[Hashable, tuple[torch.Tensor, int]] = OrderedDict()

    def get(self, key: Hashable, build: Callable[[], torch.Tensor]) -> torch.Tensor:
        if torch.compiler.is_compiling() or self.size == 0:
            return build()
        hit = self._entries.get(key)
        if hit is not None and hit[0]._version == hit[1] and not hit[0].requires_grad:
            self._entries.move_to_end(key)
            return hit[0]
        # Built outside inference mode: inference tensors have no version counter to watch.
        with torch.inference_mode(False), torch.no_grad():
            table = build()
        self._entries[key] = (table, table._version)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return table

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
