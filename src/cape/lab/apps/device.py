"""The device an inference command (`cape generate`, `translate`, `transcribe`) runs on."""

from __future__ import annotations

import torch

__all__ = ["inference_device"]


def inference_device(device: str | torch.device) -> torch.device:
    """`device` as a torch device; ValueError naming it when it is not one, or when it is CUDA
    on a machine without CUDA (exit 2: the command line asked for what is not there)."""
    try:
        out = torch.device(device)
    except RuntimeError as e:
        raise ValueError(
            f"device must be a torch device such as 'cpu' or 'cuda:0', got {device!r}: {e}"
        ) from e
    if out.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(out)!r}: CUDA is not available on this machine")
    return out
