"""Test-session setup for every test directory: torchvision's PyPI wheel on a CPU-only torch.

timm (and transformers' image utilities) import torchvision, whose PyPI wheels are CUDA builds:
beside the CPU torch that scripts/setup.sh installs its C ops cannot load and its import fails
with `RuntimeError: operator torchvision::nms does not exist`. The lab's
`declare_missing_torchvision_ops` declares those two op schemas first, only in that case.
"""

from __future__ import annotations

from cape.lab.torchvision_ops import declare_missing_torchvision_ops

declare_missing_torchvision_ops()
