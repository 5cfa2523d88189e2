"""transformers and timm beside a CPU-only torch: torchvision's PyPI wheel is a CUDA build whose
C ops do not load there, and its import fails with `RuntimeError: operator torchvision::nms does
not exist` (it registers fake kernels for nms and qnms whatever happened); transformers imports
torchvision through its image utilities, timm at once. Declaring the two op schemas first lets
torchvision import without its C ops (no nms, roi_align: nothing a language model or a ViT
uses). The guide's block (docs/guides/use-with-your-model.md) does the same for users."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

__all__ = ["declare_missing_torchvision_ops"]

_SCHEMA = "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"


def _extension_loads(package: Path) -> bool:
    """Whether torchvision's C extension (`_C.so` / `_C.pyd`) loads (none found: True)."""
    for lib in sorted(package.glob("_C.*")):
        if lib.suffix in (".so", ".pyd"):
            try:
                torch.ops.load_library(str(lib))
            except OSError:
                return False
            return True
    return True


def declare_missing_torchvision_ops() -> None:
    """Declare torchvision::nms and ::qnms when torchvision's import fails without them; a
    working install (or none) is left alone."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None or "torchvision" in sys.modules:
        return
    if _extension_loads(Path(spec.origin).parent):
        return
    try:
        import torchvision  # noqa: F401
    except RuntimeError as error:
        # a failed import leaves half-initialised modules behind: drop them, then retry
        for name in [m for m in sys.modules if m.split(".")[0] == "torchvision"]:
            del sys.modules[name]
        if "torchvision::nms" not in str(error):
            return  # another failure: the import that needs torchvision reports it
        for op in ("nms", "qnms"):
            torch.library.define(f"torchvision::{op}", _SCHEMA)
