"""Putting cape into a transformers model: the rotary and the position tables, and what each
writes into the model's config so that saving and loading keep it.

`install_rotary` rewrites `config.rope_parameters` to transformers' own form of the installed
rotary where transformers can express it (then a stock `from_pretrained` reproduces it);
otherwise it records the rotary under `config.cape` and sets the rope type to one that a stock
load refuses by name. `install_positions` records its encoding under `config.cape` too, and
so does the position hook (`cape.integrations.hf.hook`); `cape.integrations.hf.from_pretrained`
reads that record and installs them again. Every install checks everything before it changes
the model: a refused call leaves the model as it was.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from ...augment import PositionAugmentation
from ...encodings.rotary import Rotary
from .rope import ALL, RotaryEmbedding, rope_parameters
from .tables import TABLES, OPTPositionEmbedding, PositionEmbedding, check_encoding

__all__ = [
    "install_rotary",
    "install_positions",
    "CAPE_ROPE_TYPE",
    "check_model",
    "record",
    "rotary_spec",
]

# the rope type of a saved config whose rotary only cape can make: transformers' rotary
# classes look it up in their registry and fail naming it
CAPE_ROPE_TYPE = "cape (load with cape.integrations.hf.from_pretrained)"


def check_model(model: object, what: str) -> nn.Module:
    """A transformers model (an nn.Module): refused by name otherwise (a state_dict, a config,
    a model name...)."""
    if isinstance(model, nn.Module):
        return model
    hint = ""
    if isinstance(model, dict):
        hint = " (a state_dict? load it into the model first)"
    elif isinstance(model, str):
        hint = " (a name? load the model with transformers first)"
    elif hasattr(model, "to_dict"):
        hint = " (a config? build the model from it first)"
    raise TypeError(f"model must be {what} (an nn.Module), got {type(model).__name__}{hint}")


def record(model: nn.Module, key: str, value: Any) -> None:
    """Write `value` under `config.cape[key]` (None: remove it), where a model has a config."""
    config = getattr(model, "config", None)
    if config is None:
        return
    record = dict(getattr(config, "cape", None) or {})
    if value is None:
        record.pop(key, None)
    else:
        record[key] = value
    config.cape = record or None


def _children(model: nn.Module, attribute: str) -> list[tuple[nn.Module, nn.Module]]:
    """(parent, child) for every submodule held as `parent.<attribute>`."""
    found = []
    for module in model.modules():
        child = module._modules.get(attribute)
        if isinstance(child, nn.Module):
            found.append((module, child))
    return found


# -- the rotary ------------------------------------------------------------------------------
def _served_widths(old: nn.Module) -> dict[str, int]:
    """{layer type or "": rotary width} of a stock rotary_emb, from its inv_freq buffers."""
    widths = {}
    for name, buf in old.named_buffers(recurse=False):
        if name.endswith("inv_freq") and "original" not in name and "long" not in name:
            widths[name[: -len("_inv_freq")] if name != "inv_freq" else ALL] = 2 * buf.shape[-1]
    return widths


def install_rotary(
    model: nn.Module, rotary: Rotary | dict[str, Rotary] | RotaryEmbedding
) -> nn.Module:
    """Replace every `rotary_emb` of a transformers RoPE model (Llama: `model.model.rotary_emb`)
    by `RotaryEmbedding(rotary)`; returns the model. rotary: a `cape.Rotary` (e.g.
    `rotary_from_config(model.config)` changed), a dict {layer type: Rotary} for a model with a
    rope per layer type, or a ready adapter. Its width must equal the rotary width the model
    serves (its inv_freq's). The model's config then describes the installed rotary (module
    docstring), so that saving and loading keep it. Train and eval alike."""
    check_model(model, "a transformers RoPE model")
    adapter = rotary if isinstance(rotary, RotaryEmbedding) else RotaryEmbedding(rotary)
    found = _children(model, "rotary_emb")
    if not found:
        raise ValueError(
            f"model: {type(model).__name__} has no `rotary_emb` submodule (a RoPE model such as "
            "LlamaForCausalLM has model.model.rotary_emb); for a position table (BERT, GPT-2, "
            "OPT) use install_positions"
        )
    for _, old in found:
        _check_widths(adapter, _served_widths(old))
    for parent, _ in found:
        parent._modules["rotary_emb"] = adapter
    _describe_rotary(model, adapter)
    return model


def _check_widths(adapter: RotaryEmbedding, served: dict[str, int]) -> None:
    if not served:
        return
    mine = {k: int(r.head_dim) for k, r in adapter.rotaries.items()}  # type: ignore[union-attr]
    if set(mine) != set(served):
        have = sorted(k for k in served)
        raise ValueError(
            f"rotary: the model has rotaries for {have}, the adapter for {sorted(mine)}"
        )
    for key, width in served.items():
        if mine[key] != width:
            where = "" if key == ALL else f" ({key})"
            raise ValueError(
                f"rotary{where}: head_dim={mine[key]}, but the model's rotary serves "
                f"head_dim={width} (partial rotary: the channels it turns)"
            )


def _describe_rotary(model: nn.Module, adapter: RotaryEmbedding) -> None:
    """The config's rope parameters for the installed rotary (module docstring)."""
    config = getattr(model, "config", None)
    if config is None:
        return
    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rotaries = dict(adapter.rotaries)
    try:
        params = {
            k: _expressed(config, rot, int(head)) for k, rot in rotaries.items()
        }  # fmt: skip
    except ValueError:
        stock = copy.deepcopy(getattr(config, "rope_parameters", None))
        record(model, "rotary", {k: rotary_spec(r) for k, r in rotaries.items()})
        record(model, "stock_rope_parameters", stock)
        config.rope_parameters = _marked(stock)
        return
    config.rope_parameters = params[ALL] if ALL in params else params
    record(model, "rotary", None)
    record(model, "stock_rope_parameters", None)


def _expressed(config: Any, rotary: Rotary, head: int) -> dict[str, Any]:
    params = rope_parameters(rotary, head_dim=head)
    if rotary.scaling == "dynamic" and rotary.train_length != config.max_position_embeddings:
        raise ValueError("dynamic scaling from another length than max_position_embeddings")
    return params


def _marked(params: Any) -> Any:
    """Rope parameters whose type(s) a stock load refuses by name (`CAPE_ROPE_TYPE`)."""
    if not isinstance(params, dict):
        return {"rope_type": CAPE_ROPE_TYPE}
    if params and all(isinstance(v, dict) for v in params.values()):
        return {k: {**v, "rope_type": CAPE_ROPE_TYPE} for k, v in params.items()}
    return {**params, "rope_type": CAPE_ROPE_TYPE}


def rotary_spec(rotary: Rotary) -> dict[str, Any]:
    """The keywords that make `rotary` again (`Rotary(**spec)`), JSON-able."""
    ext = rotary.extension
    spec: dict[str, Any] = {"head_dim": rotary.head_dim, "base": rotary.base,
                            "freq_scale": rotary.freq_scale}  # fmt: skip
    if ext.rule is not None:
        own = {k: ext.options[k] for k in ext.rule.options if k in ext.options}
        spec.update(scaling=rotary.scaling, factor=ext.options.get("factor"),
                    train_length=ext.options.get("train_length"),
                    scaling_options={k: list(v) if isinstance(v, tuple) else v
                                     for k, v in own.items()})  # fmt: skip
    return spec


# -- position tables -------------------------------------------------------------------------
def _table_layout(model: nn.Module) -> tuple[str, list[tuple[nn.Module, nn.Module]]]:
    for attribute, layout in TABLES.items():
        found = _children(model, attribute)
        if found:
            return layout, found
    raise ValueError(
        f"model: {type(model).__name__} has no position table (`position_embeddings` of "
        "BERT-style models, GPT-2's `wpe`, OPT's `embed_positions`); for a RoPE model use "
        "install_rotary"
    )


def _check_max_length(max_length: object) -> int | None:
    if max_length is None:
        return None
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length must be None or a positive int, got {max_length!r}")
    return max_length


def install_positions(
    model: nn.Module, encoding: nn.Module, *, max_length: int | None = None
) -> nn.Module:
    """Replace the learned position table of a transformers model by a cape 1-D absolute
    encoding (BERT-style `embeddings.position_embeddings`, GPT-2's `wpe`, OPT's
    `embed_positions`: `cape.integrations.hf.tables`); returns the model. D must equal
    encoding.dim.

    max_length: BERT reads position ids from a buffer `position_ids` [1, P] (and token types
    from `token_type_ids`), so longer inputs fail there before reaching the table; max_length > P
    extends both buffers and `config.max_position_embeddings`. In train mode BERT's default
    position_ids become [B, T] so that CAPE draws per sample. What is installed is recorded in
    the config (`from_pretrained` makes it again); the saved state holds the stock table of the
    same eval outputs.
    """
    check_model(model, "a transformers model with a position table")
    check_encoding(encoding)
    max_length = _check_max_length(max_length)
    layout, found = _table_layout(model)
    for _, old in found:
        width = getattr(old, "embedding_dim", encoding.dim)
        if width != encoding.dim:
            raise ValueError(f"encoding: dim={encoding.dim}, but the table has D={width}")
    for parent, old in found:
        rows = int(getattr(old, "num_embeddings", 0))
        rows = max(
            rows, (max_length or 0) + (OPTPositionEmbedding.offset if layout == "opt" else 0)
        )
        cls = OPTPositionEmbedding if layout == "opt" else PositionEmbedding
        table = cls(encoding, rows)
        weight = getattr(old, "weight", None)
        parent._modules[_attribute(parent, old)] = (
            table if weight is None else table.to(weight.device, weight.dtype)
        )
        if layout == "bert":
            if max_length is not None:
                _extend_buffers(parent, max_length)
            if not getattr(parent, "_cape_per_sample", False):  # once, however many installs
                parent.register_forward_pre_hook(_per_sample_hook, with_kwargs=True)
                parent._cape_per_sample = True
    config = getattr(model, "config", None)
    if max_length is not None and config is not None:
        config.max_position_embeddings = max(config.max_position_embeddings, max_length)
    record(model, "positions", _encoding_spec(encoding, layout))
    return model


def _attribute(parent: nn.Module, child: nn.Module) -> str:
    return next(name for name, m in parent._modules.items() if m is child)


def _encoding_spec(encoding: nn.Module, layout: str) -> dict[str, Any] | None:
    spec = getattr(encoding, "build_spec", None)
    if spec is None:
        return None
    options = {k: v.as_mapping() if isinstance(v, PositionAugmentation) else v
               for k, v in spec["options"].items()}  # fmt: skip
    return {"name": spec["name"], "dim": spec["dim"], "options": options, "layout": layout}


def _per_sample_hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """BERT's default position_ids are [1, T]: expand them to [B, T] in train mode, so that the
    encoding's augmentation draws per sample (integers still, for the token-type lookup)."""
    if not module.training or kwargs.get("position_ids") is not None or args:
        return None
    ref = kwargs.get("input_ids")
    ref = kwargs.get("inputs_embeds") if ref is None else ref
    buffer = getattr(module, "position_ids", None)
    if ref is None or not isinstance(buffer, torch.Tensor):
        return None
    start, (batch, length) = int(kwargs.get("cache_length") or 0), ref.shape[:2]
    if start + length > buffer.shape[-1]:
        raise ValueError(
            f"inputs of {start + length} positions: the model's position_ids buffer holds "
            f"{buffer.shape[-1]}; install_positions(..., max_length={start + length}) or more "
            "extends it"
        )
    kwargs["position_ids"] = buffer[:, start : start + length].expand(batch, length)
    return args, kwargs


def _extend_buffers(module: nn.Module, max_length: int) -> None:
    ids, types = getattr(module, "position_ids", None), getattr(module, "token_type_ids", None)
    if isinstance(ids, torch.Tensor) and ids.shape[-1] < max_length:
        longer = torch.arange(max_length, device=ids.device)[None]
        module.register_buffer("position_ids", longer, persistent=False)
    if isinstance(types, torch.Tensor) and types.shape[-1] < max_length:
        zeros = types.new_zeros(1, max_length)
        module.register_buffer("token_type_ids", zeros, persistent=False)
