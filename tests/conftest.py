"""Test-session setup for every test directory: torchvision's PyPI wheel on a CPU-only torch.

timm imports torchvision at import time. torchvision's PyPI wheels are CUDA builds: beside
the CPU torch that scripts/setup.sh installs, its C ops cannot load, and
`torchvision/_meta_registrations.py` then fails on import with `RuntimeError: operator
torchvision::nms does not exist` (it registers fake kernels for nms and qnms whatever
happened). Declaring those two op schemas first lets torchvision (without its C ops: no nms,
roi_align...) and timm import. Runs only in that case: torchvision installed, its C extension
not loadable, and the import failing with that message; a working install is left alone.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

_SCHEMA = "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"


def _extension_loads(package: Path) -> bool:
    """Whether torchvision's C extension (`_C.so` / `_C.pyd`) loads (None found: say True)."""
    for lib in sorted(package.glob("_C.*")):
        if lib.suffix in (".so", ".pyd"):
            try:
                torch.ops.load_library(str(lib))
            except OSError:
                return False
            return True
    return True


def declare_missing_torchvision_ops() -> None:
    """Declare torchvision::nms and ::qnms when torchvision's import fails without them."""
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
            return  # another failure: `import timm` will report it where it is needed
        for op in ("nms", "qnms"):
            torch.library.define(f"torchvision::{op}", _SCHEMA)


declare_missing_torchvision_ops()
