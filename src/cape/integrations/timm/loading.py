"""Loading a state that a timm ViT with cape inside saved: `load_state_dict(model, state)`
makes what the state's record says (`record`) in a stock model, then loads it;
`create_model(timm.create_model, name, checkpoint_path=...)` is `timm.create_model` with
that load.

Every recorded install is checked and built, and the state's keys and shapes are checked
against the model those installs make, before anything changes: a refused load leaves the
model as it was.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..._checks import check_bool
from ...build import build
from .checks import check_model
from .pos_embed import plan_encoding, plan_removal
from .record import CAPE_KEY, cape_record, describe, unsaved
from .rotary import plan_rotary

__all__ = ["load_state_dict", "create_model"]

_WEIGHTS = ("model.safetensors", "pytorch_model.bin")  # what timm's save_for_hf writes


def _plan(model: nn.Module, record: Mapping[str, Any]) -> tuple[list[Callable], dict[str, Any]]:
    """The recorded installs, checked and built -> (the changes, {state key: tensor} of the
    modules they add)."""
    cannot = unsaved(record)
    if cannot:
        raise ValueError(
            f"state_dict: cape cannot make {'; '.join(cannot)} again; install it on the model "
            "as it was installed, then call model.load_state_dict"
        )
    changes, added = [], {}
    encoding = record["encoding"]
    if encoding is not None:
        module = build(encoding["name"], encoding["dim"], **encoding["options"])
        _, change = plan_encoding(model, module, None, {})
        changes.append(change)
        added.update({f"cape_pos_embed.{k}": v for k, v in module.state_dict().items()})
    rotary = record["rotary"]
    if rotary is not None:
        _, rotaries, change = plan_rotary(model, rotary["name"], None, False, rotary["options"])
        changes.append(change)
        for i, module in enumerate(rotaries):
            prefix = f"blocks.{i}.attn.cape_rotary."
            added.update({prefix + k: v for k, v in module.state_dict().items()})
    if record["pos_embed"] == "removed":
        changes.append(plan_removal(model))
    return changes, added


def _check_keys(
    model: nn.Module, added: dict, state: Mapping, strict: bool, record: Mapping[str, Any]
) -> None:
    """The state's keys and shapes against the model the installs make (torch's own checks,
    made before anything changes). A removed pos_embed is optional: its loader drops it."""
    skip = {CAPE_KEY, "pos_embed"} if record["pos_embed"] == "removed" else {CAPE_KEY}
    expected = {k: v.shape for k, v in model.state_dict().items() if k not in skip}
    expected.update({k: v.shape for k, v in added.items()})
    given = {k: v for k, v in state.items() if k not in skip}
    errors = [
        f"size mismatch for {k}: the checkpoint has {tuple(v.shape)}, the model "
        f"{tuple(expected[k])}"
        for k, v in given.items()
        if k in expected and isinstance(v, torch.Tensor) and v.shape != expected[k]
    ]
    if strict:
        missing, unexpected = sorted(set(expected) - set(given)), sorted(set(given) - set(expected))
        errors += [f"missing keys {missing}"] * bool(missing)
        errors += [f"unexpected keys {unexpected}"] * bool(unexpected)
    if errors:
        raise RuntimeError(
            f"state_dict does not fit {type(model).__name__} with cape's {describe(record)}: "
            + "; ".join(errors)
        )


def load_state_dict(model: nn.Module, state_dict: Mapping[str, Any], *, strict: bool = True) -> Any:
    """Load a state saved by a timm ViT with cape inside, making what cape installed first.

    model: a stock timm `VisionTransformer` of the same architecture (`timm.create_model`), or
    one with the same cape installs already made. state_dict: `model.state_dict()` of the saved
    model (torch.load or safetensors' load_file of it). The record the state holds
    (`cape_record(state_dict)`) is made again on a stock model (`replace_pos_embed`,
    `add_rotary`, `remove_pos_embed` with the saved options), then `model.load_state_dict(state,
    strict)` loads it; a state without a record (a stock checkpoint) loads as torch does.
    Returns torch's result (missing and unexpected keys).
    """
    check_model(model, ("patch_embed", "blocks", "num_prefix_tokens", "pos_embed"))
    if not isinstance(state_dict, Mapping):
        hint = " (a path? use create_model(..., checkpoint_path=path))"
        hint = hint if isinstance(state_dict, (str, os.PathLike)) else ""
        raise TypeError(
            f"state_dict must be a mapping of names to tensors (model.state_dict()), got "
            f"{type(state_dict).__name__}{hint}"
        )
    check_bool("strict", strict)
    record = cape_record(state_dict)
    if record is not None and cape_record(model) is None:
        changes, added = _plan(model, record)
        _check_keys(model, added, state_dict, strict, record)
        for change in changes:
            change()
    return model.load_state_dict(state_dict, strict=strict)


def _weights(model_name: str, checkpoint_path: object) -> Path:
    """The checkpoint file: checkpoint_path, or the weights of a local-dir: folder."""
    if checkpoint_path is not None:
        if not isinstance(checkpoint_path, (str, os.PathLike)):
            raise TypeError(f"checkpoint_path must be a path, got {type(checkpoint_path).__name__}")
        path = Path(checkpoint_path)
        if not path.is_file():
            raise FileNotFoundError(f"checkpoint_path: no file {path}")
        return path
    if model_name.startswith("local-dir:"):
        folder = Path(model_name[len("local-dir:") :])
        for name in _WEIGHTS:
            if (folder / name).is_file():
                return folder / name
        raise FileNotFoundError(f"model_name: {folder} holds none of {list(_WEIGHTS)}")
    raise ValueError(
        "checkpoint_path must name the saved state (torch.save(model.state_dict(), path) or a "
        "safetensors file), or model_name a 'local-dir:' folder (timm's save_for_hf)"
    )


def _read(path: Path) -> dict[str, Any]:
    """The state held by a checkpoint file: safetensors, or a torch file of a state_dict."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, Mapping):
        raise ValueError(
            f"checkpoint_path: {path} holds a {type(state).__name__}, not a state_dict"
        )
    return dict(state)


def create_model(
    factory: Callable[..., nn.Module],
    model_name: str,
    *,
    checkpoint_path: str | os.PathLike | None = None,
    **kwargs: Any,
) -> nn.Module:
    """`factory(model_name, **kwargs)` (`timm.create_model`) with the checkpoint loaded by
    `load_state_dict`: what cape installed is made again.

    factory: `timm.create_model` (cape imports no timm). model_name: a timm model name, or
    "local-dir:FOLDER" (timm's `save_for_hf`: its config.json and model.safetensors or
    pytorch_model.bin). checkpoint_path: the saved state dict (`torch.save(model.state_dict(),
    path)` or a .safetensors file); needed unless model_name is a local-dir folder. kwargs:
    timm's (img_size, num_classes, dynamic_img_size...), as the saved model was created;
    pretrained is not taken (the weights are the checkpoint's).
    """
    if not callable(factory):
        raise TypeError(f"factory must be timm.create_model, got {type(factory).__name__}")
    if not isinstance(model_name, str):
        raise TypeError(
            f"model_name must be a timm model name (str), got {type(model_name).__name__}"
        )
    if "pretrained" in kwargs:
        raise ValueError("pretrained: the weights are the checkpoint's; leave pretrained out")
    state = _read(_weights(model_name, checkpoint_path))
    model = factory(model_name, pretrained=False, **kwargs)
    load_state_dict(model, state)
    return model
