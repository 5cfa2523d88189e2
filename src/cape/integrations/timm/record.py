"""What cape installed in a timm ViT, recorded so that saving and loading keep it.

`model.cape_record` (a JSON-able dict) says what the installs did: `pos_embed` "kept",
"removed" (the learned table taken out) or "absent" (timm built none), `encoding` the spec of
the 2-D encoding added to the patch tokens (`cape.build`'s name, dim and options) and `rotary`
the spec of the rotary in attention, each None when not installed.

`model.state_dict()` then holds two entries a stock model lacks or reads otherwise:

- `CAPE_KEY` (a uint8 tensor of the record's JSON): a stock timm model refuses it by name under
  its default strict load (`load_state_dict`, `timm.create_model(checkpoint_path=...)`,
  `pretrained_cfg_overlay=dict(file=...)`), and that name says which loader makes it again;
- `pos_embed` [1, P + H*W, D], where cape removed it: the table a stock model needs to compute
  what the eval-mode model computes at the training grid (H, W) = `patch_embed.grid_size`:
  zeros at the P prefix rows (their rows are folded into the tokens), the encoding at the
  patch rows (zeros without one). A stock load with strict=False thus never keeps a random table.

What a stock load with strict=False loses (the rotary, the encoding of other grids and its
augmentation) is named by a warning each time such a state is made. Loading a state into a
model that cape changed compares the two records: a difference is an unexpected key naming
both (a strict load fails on it) and a warning.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ...augment import PositionAugmentation

__all__ = ["CAPE_KEY", "FORMAT", "cape_record", "note", "spec", "encode", "decode"]

CAPE_KEY = "cape (load with cape.integrations.timm.load_state_dict or create_model)"
FORMAT = 1


def _jsonable(value: Any, name: str) -> Any:
    """An option's value as JSON holds it: tuples as lists, augmentations as their mapping."""
    if isinstance(value, PositionAugmentation):
        value = value.as_mapping()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return [_jsonable(v, name) for v in value]
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {k: _jsonable(v, f"{name}[{k!r}]") for k, v in value.items()}
    raise TypeError(f"{name}: a {type(value).__name__} cannot be saved in cape's record")


def spec(name: str, options: Mapping[str, Any], **fields: Any) -> dict[str, Any]:
    """{"name", "options", **fields}, JSON-able; an option JSON cannot hold gives
    {"name", "unsaved": why} (a stock load and cape's loader then say it is lost)."""
    try:
        return {"name": name, "options": _jsonable(dict(options), "options"), **fields}
    except TypeError as error:
        return {"name": name, "unsaved": str(error)}


def encode(record: Mapping[str, Any]) -> torch.Tensor:
    """The record as a uint8 tensor [N] of its JSON (what a state_dict and safetensors hold)."""
    data = json.dumps(record, sort_keys=True).encode()
    return torch.tensor(list(data), dtype=torch.uint8)


def decode(tensor: object) -> dict[str, Any]:
    """The record held by a state's `CAPE_KEY` (a uint8 tensor [N])."""
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.uint8 or tensor.dim() != 1:
        raise ValueError(f"{CAPE_KEY!r} must be a uint8 tensor [N] of JSON, got {tensor!r:.80}")
    try:
        record = json.loads(bytes(tensor.cpu().tolist()).decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{CAPE_KEY!r} holds no JSON record: {error}") from None
    if not _well_formed(record):
        raise ValueError(f"{CAPE_KEY!r}: a record of format {FORMAT} was expected, got {record!r}")
    return record


def _well_formed(record: object) -> bool:
    """The fields `note` writes: format, pos_embed, and an encoding and a rotary (each None, a
    spec with its options, or what could not be saved)."""
    if not isinstance(record, dict) or set(record) != {"format", "pos_embed", "encoding", "rotary"}:
        return False
    if record["format"] != FORMAT or record["pos_embed"] not in ("kept", "removed", "absent"):
        return False
    encoding, rotary = record["encoding"], record["rotary"]
    if (
        isinstance(encoding, dict)
        and "options" in encoding
        and not isinstance(encoding.get("dim"), int)
    ):
        return False
    return _part(encoding) and _part(rotary)


def _part(part: object) -> bool:
    if part is None:
        return True
    if not isinstance(part, dict) or not isinstance(part.get("name"), str):
        return False
    return isinstance(part.get("options"), dict) or isinstance(part.get("unsaved"), str)


def cape_record(source: object) -> dict[str, Any] | None:
    """What cape installed: of a model (`model.cape_record`) or held by a state_dict (its
    `CAPE_KEY`); None when cape changed nothing there."""
    if isinstance(source, nn.Module):
        record = source.__dict__.get("cape_record")
        return None if record is None else json.loads(json.dumps(record))
    if isinstance(source, Mapping):
        return decode(source[CAPE_KEY]) if CAPE_KEY in source else None
    raise TypeError(f"source must be a model or a state_dict, got {type(source).__name__}")


def note(model: nn.Module, **changes: Any) -> None:
    """Record what an install did (`changes` of the record's fields); the first one registers
    the state_dict hooks (module docstring)."""
    record = model.__dict__.get("cape_record")
    if record is None:
        kept = "absent" if getattr(model, "pos_embed", None) is None else "kept"
        record = {"format": FORMAT, "pos_embed": kept, "encoding": None, "rotary": None}
        model.register_state_dict_post_hook(_save)
        model.register_load_state_dict_pre_hook(_check_loaded)
    record.update(changes)
    model.cape_record = record


# --- saving ------------------------------------------------------------------------------------


def stock_pos_embed(model: nn.Module) -> torch.Tensor:
    """The pos_embed [1, P + H*W, D] a stock model needs for the eval outputs at the training
    grid (module docstring), in the dtype and on the device of the model's tokens."""
    height, width = (int(n) for n in model.patch_embed.grid_size)
    prefix = 0 if model.no_embed_class else int(model.num_prefix_tokens)
    weight = model.patch_embed.proj.weight
    table = weight.new_zeros(1, prefix + height * width, int(model.embed_dim))
    encoding = getattr(model, "cape_pos_embed", None)
    if encoding is not None:
        was = encoding.training
        encoding.eval()
        try:
            with torch.no_grad():
                table[:, prefix:] = encoding(grid=(height, width)).to(table.dtype)
        finally:
            encoding.train(was)
    return table


def lost_on_a_stock_load(model: nn.Module, record: Mapping[str, Any]) -> list[str]:
    """What a stock timm model loading the state with strict=False does not compute."""
    lost = []
    encoding, rotary = record["encoding"], record["rotary"]
    if encoding is not None and record["pos_embed"] != "removed":  # timm built no table
        lost.append(f"the {encoding['name']} encoding (the model has no pos_embed to hold it)")
    elif encoding is not None:
        lost += _encoding_lost(model, encoding["name"])
    if rotary is not None:
        lost.append(f"the 2-D rotary {rotary['name']} of every attention block (timm's has none)")
    return lost


def _encoding_lost(model: nn.Module, name: str) -> list[str]:
    """What the saved table of the encoding `name` does not carry: the encoding of other grids
    (where timm's `dynamic_img_size` resamples the table; a fixed-size ViT takes no other
    size) and the training-time augmentation."""
    lost = []
    if getattr(model, "dynamic_img_size", True):
        grid = tuple(int(n) for n in model.patch_embed.grid_size)
        lost.append(
            f"the {name} encoding at image sizes other than the {grid} grid's (timm resamples "
            "the saved table bicubically)"
        )
    augmentation = getattr(getattr(model, "cape_pos_embed", None), "augmentation", None)
    if augmentation is not None:
        lost.append(f"the {name} encoding's training-time augmentation {augmentation}")
    return lost


def unsaved(record: Mapping[str, Any]) -> list[str]:
    """What cape itself cannot make again from the record (an encoding given as a module
    without a cape.build spec, options JSON cannot hold)."""
    return [
        f"{field} {part['name']} ({part['unsaved']})"
        for field in ("encoding", "rotary")
        if (part := record[field]) is not None and "unsaved" in part
    ]


def _save(module: nn.Module, state: dict, prefix: str, local: Any) -> None:
    """state_dict hook: the record and, where cape removed it, the stock pos_embed (module
    docstring); a warning names what a stock load would lose."""
    record = module.cape_record
    if record["pos_embed"] == "removed":
        state[prefix + "pos_embed"] = stock_pos_embed(module)
    state[prefix + CAPE_KEY] = encode(record)
    lost, cannot = lost_on_a_stock_load(module, record), unsaved(record)
    if lost or cannot:
        text = f"cape: a stock timm model refuses this state by its key {CAPE_KEY!r}"
        if lost:
            text += f"; loaded with strict=False it loses {'; '.join(lost)}"
        if cannot:
            text += f"; cape cannot make {'; '.join(cannot)} again: install it before loading"
        warnings.warn(text, stacklevel=3)


# --- loading into a model cape changed ---------------------------------------------------------


def describe(record: Mapping[str, Any] | None) -> str:
    """One line: what a record holds."""
    if record is None:
        return "nothing of cape's"
    parts = [f"pos_embed {record['pos_embed']}"]
    for field in ("encoding", "rotary"):
        part = record[field]
        if part is not None:
            parts.append(f"{field} {part['name']} {part.get('options', part.get('unsaved'))}")
    return ", ".join(parts)


def _check_loaded(module: nn.Module, state: dict, prefix: str, *args: Any) -> None:
    """load_state_dict pre-hook: a state saved with cape's record must hold this model's. A
    difference is reported as an unexpected key that names both records (a strict load fails
    on it, torch's result lists it otherwise) and warned of."""
    unexpected, error_msgs = args[-2], args[-1]
    raw = state.pop(prefix + CAPE_KEY, None)  # torch loads from a copy of the caller's dict
    if raw is None:  # a stock checkpoint: loads as the installs describe (pos_embed folded)
        return
    try:
        saved = decode(raw)
    except ValueError as error:
        error_msgs.append(str(error))
        return
    mine = module.cape_record
    if {k: saved.get(k) for k in mine} == mine:
        return
    text = (
        f"{prefix}{CAPE_KEY}: the state was saved from a model with {describe(saved)}; this "
        f"model has {describe(mine)} (cape.integrations.timm.load_state_dict makes a stock "
        "model's)"
    )
    unexpected.append(text)
    warnings.warn(f"cape: {text}", stacklevel=4)
