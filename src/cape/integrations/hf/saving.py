"""Loading a transformers model that cape changed: `from_pretrained` reads what the installs
recorded under `config.cape` (`cape.integrations.hf.install`) and makes it again.

transformers' own `save_pretrained` writes everything cape needs: the config (with the rope
parameters transformers can express, or cape's record of the rotary), the stock table of a
cape encoding (so a stock load gets the same eval outputs) and the encoding's own parameters.
A stock `from_pretrained` reproduces what transformers can express and refuses a rotary only
cape can make (its rope type names this function); `from_pretrained` here restores the rest.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...build import build
from ...encodings.rotary import Rotary
from ...position_sampling import augmentation_from_mapping
from .hook import augment_position_ids
from .install import install_positions, install_rotary
from .rope import ALL

__all__ = ["from_pretrained", "cape_record"]


def cape_record(config: Any) -> dict[str, Any]:
    """What cape installed in a model of this config ({} when nothing)."""
    return dict(getattr(config, "cape", None) or {})


def _saved_record(folder: Path) -> dict[str, Any]:
    """The `cape` record of the config.json a save_pretrained wrote in `folder` ({} when none)."""
    config = folder / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"{folder}: no config.json (a save_pretrained folder holds one)")
    return dict(json.loads(config.read_text(encoding="utf-8")).get("cape") or {})


def _checkpoint_state(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint folder saved by `save_pretrained` (safetensors, one file or
    shards, or a torch .bin)."""
    from safetensors.torch import load_file

    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        state: dict[str, torch.Tensor] = {}
        for name in files:
            state.update(load_file(str(path / name)))
        return state
    if (path / "model.safetensors").is_file():
        return load_file(str(path / "model.safetensors"))
    if (path / "pytorch_model.bin").is_file():
        return torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{path}: no model.safetensors(.index.json) or pytorch_model.bin")


def from_pretrained(model_class: Any, path: str | Path, **kwargs: Any) -> nn.Module:
    """`model_class.from_pretrained(path, **kwargs)` with what cape installed made again.

    model_class: a transformers model class (`LlamaForCausalLM`, `AutoModelForCausalLM`...).
    The rotary recorded in the config (one transformers cannot express) is installed again, a
    position table's cape encoding too (with its own parameters from the checkpoint), and the
    position hook of `augment_position_ids`. A model cape did not change loads as stock.
    """
    if not hasattr(model_class, "from_pretrained"):
        raise TypeError(
            f"model_class must be a transformers model class (e.g. LlamaForCausalLM), got "
            f"{model_class!r}"
        )
    folder = Path(path)
    config = kwargs.get("config")
    record = cape_record(config) if config is not None else _saved_record(folder)
    if "rotary" in record:  # built with the stock rope parameters, the rotary installed after
        if config is not None:
            config.rope_parameters = record["stock_rope_parameters"]
        else:  # a keyword of from_pretrained that names a config field overrides it
            kwargs["rope_parameters"] = record["stock_rope_parameters"]
    model = model_class.from_pretrained(str(folder), **kwargs)
    if "rotary" in record:
        rotaries = {k: Rotary(**spec) for k, spec in record["rotary"].items()}
        install_rotary(model, rotaries[ALL] if ALL in rotaries else rotaries)
    positions = record.get("positions")
    if positions is not None:
        encoding = build(positions["name"], positions["dim"], **positions["options"])
        install_positions(model, encoding)
        _load_encoding_state(model, folder)
    hook = record.get("augment_position_ids")
    if hook is not None:
        augment_position_ids(model, augmentation_from_mapping(hook))
    return model


def _load_encoding_state(model: nn.Module, folder: Path) -> None:
    """The cape encodings' own parameters and buffers (a learned table, LFF) from the
    checkpoint: a stock load leaves them out, as keys its model does not have."""
    with warnings.catch_warnings():  # the state's own save warning is for saving
        warnings.simplefilter("ignore")
        state = model.state_dict(keep_vars=True)
    own = {k: v for k, v in state.items() if ".encoding." in k}
    if not own:
        return
    saved = _checkpoint_state(folder)
    missing = [k for k in own if k not in saved]
    if missing:
        raise ValueError(f"{folder}: the checkpoint holds none of the cape encoding's {missing}")
    with torch.no_grad():
        for key, tensor in own.items():
            tensor.copy_(saved[key].to(tensor.dtype))
