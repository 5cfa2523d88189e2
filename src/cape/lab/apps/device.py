"""What the inference commands (`cape generate`, `translate`, `transcribe`) share: the device
they run on, and the model.json of the run folder they load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from cape.lab.io import read_json_object

__all__ = ["inference_device", "run_spec"]


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


def run_spec(run: Path, experiment: str, takes: str) -> dict[str, Any]:
    """The model.json of run folder `run` (the caller has checked that it is there): ValueError
    naming the run when it is not an `experiment` run ("an lm", "a translation"), naming the
    file when its "model" is not an object (of `takes` keywords: "CausalLM")."""
    source = run / "model.json"
    spec = read_json_object(source)
    if spec.get("experiment") != experiment.split()[-1]:
        raise ValueError(
            f"run {str(run)!r} is a {spec.get('experiment')!r} run, not {experiment} one"
        )
    if not isinstance(spec.get("model"), dict):
        raise ValueError(f'{source} must hold a "model" object ({takes} keywords)')
    return spec
