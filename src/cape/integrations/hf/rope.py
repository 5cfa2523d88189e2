"""transformers' rope parameters and `cape.Rotary`, both ways, and the `rotary_emb` adapter.

Every rope type of transformers 5.x maps onto an entry of cape's rope-scaling registry
(`cape.functional.rope_registry`): "default" (none), "linear" -> "pi", "dynamic", "yarn" ->
"yarn-hf" (transformers' ramp, attention_factor, mscale / mscale_all_dim, truncate),
"longrope", "llama3"; `partial_rotary_factor` makes the rotary narrower than the head (GPT-NeoX,
Phi); a config whose `rope_parameters` are keyed by layer type (Gemma 3's sliding and full
attention) gives one rotary per type. The reverse, `rope_parameters`, writes what transformers
can express: cape's own forms (the paper's YaRN, a fixed NTK factor, freq_scale, xPos) it
cannot, and they are refused by name.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...encodings.in_attention import PositionContext
from ...encodings.rotary import Rotary

__all__ = ["RotaryEmbedding", "rotary_from_config", "rope_parameters", "check_config", "ALL"]

ALL = "*"  # the key of an adapter's one rotary, served to every layer

# transformers' rope type -> cape's registry name (None: no scaling)
_TYPES = {"default": None, "linear": "pi", "dynamic": "dynamic", "yarn": "yarn-hf",
          "longrope": "longrope", "llama3": "llama3"}  # fmt: skip
_BACK = {v: k for k, v in _TYPES.items() if v is not None}
# transformers' names of a type's own options -> cape's (scaling_options)
_OPTIONS = {
    "yarn-hf": ("beta_fast", "beta_slow", "truncate", "mscale", "mscale_all_dim",
                "attention_factor"),
    "longrope": ("short_factor", "long_factor", "attention_factor"),
    "llama3": ("low_freq_factor", "high_freq_factor"),
}  # fmt: skip
# the types whose frequencies follow each call (transformers recomputes them from the call's
# largest position): their keys are rotated with the frequencies of the call that made them
_PER_CALL = ("dynamic", "longrope")


def check_config(config: object, name: str = "config") -> Any:
    """A transformers config (`model.config`): refused by name otherwise (a model, a state_dict,
    a dict, a string...)."""
    if isinstance(config, nn.Module):
        raise TypeError(
            f"{name} must be a transformers config (model.config), got the model "
            f"{type(config).__name__}: pass model.config"
        )
    if not hasattr(config, "to_dict") or not hasattr(config, "num_attention_heads"):
        raise TypeError(
            f"{name} must be a transformers PretrainedConfig (model.config, e.g. LlamaConfig), "
            f"got {type(config).__name__}"
        )
    return config


def _parameters(config: Any) -> dict:
    """transformers 5's `rope_parameters` (per layer type or not), or 4.x's rope_theta and
    rope_scaling as one dict; {} when the config has no rotary."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and params:
        return dict(params)
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        return {}
    scaling = dict(getattr(config, "rope_scaling", None) or {})
    scaling.setdefault("rope_type", scaling.pop("type", "default"))
    partial = getattr(config, "partial_rotary_factor", None) or getattr(config, "rotary_pct", None)
    out = {"rope_theta": theta, **scaling}
    if partial is not None:
        out.setdefault("partial_rotary_factor", partial)
    return out


def _head_dim(config: Any) -> int:
    head = getattr(config, "head_dim", None)
    return int(head or config.hidden_size // config.num_attention_heads)


def _rotary(config: Any, params: dict) -> Rotary:
    """One `cape.Rotary` of these (flat) rope parameters."""
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in _TYPES:
        raise ValueError(
            f"config: rope_type must be one of {sorted(_TYPES)} (cape's registry holds them), "
            f"got {rope_type!r}"
        )
    partial = float(params.get("partial_rotary_factor", 1.0) or 1.0)
    head = int(_head_dim(config) * partial)
    scaling = _TYPES[rope_type]
    options: dict[str, Any] = {}
    if scaling is not None:
        options = _scaling_options(config, scaling, params)
    return Rotary(head, base=float(params["rope_theta"]), scaling=scaling, **options)


def _scaling_options(config: Any, scaling: str, params: dict) -> dict[str, Any]:
    factor = params.get("factor")
    original = params.get("original_max_position_embeddings")
    if scaling == "dynamic":  # transformers scales from the model's own maximum length
        original = config.max_position_embeddings
    if scaling == "longrope":
        if factor is None and original:
            factor = config.max_position_embeddings / original
        if factor is not None and factor <= 1.0:  # transformers' attention factor is then 1
            factor = None
    if scaling == "yarn-hf" and factor is None:
        factor = config.max_position_embeddings / original
    own = {k: params[k] for k in _OPTIONS.get(scaling, ()) if params.get(k) is not None}
    out: dict[str, Any] = {"factor": None if factor is None else float(factor)}
    if scaling != "pi":
        out["train_length"] = float(original or config.max_position_embeddings)
    if own:
        out["scaling_options"] = own
    return out


def rotary_from_config(config: Any) -> Rotary | dict[str, Rotary]:
    """A transformers config (`model.config`) -> the `cape.Rotary` with the same frequencies
    and attention factor (module docstring: the rope types), for `install_rotary`; a dict
    {layer type: Rotary} when the config has rope parameters per layer type (Gemma 3).

    Refused by name: a non-config (a model: pass model.config), a config without a rotary
    (BERT: use install_positions), a rope type outside the mapping.
    """
    check_config(config)
    params = _parameters(config)
    if not params:
        raise ValueError(
            f"config: {type(config).__name__} has no rotary embedding (no rope_parameters or "
            "rope_theta); a model with a position table takes install_positions"
        )
    if all(isinstance(v, dict) for v in params.values()):  # keyed by layer type
        return {layer: _rotary(config, p) for layer, p in params.items()}
    return _rotary(config, params)


def rope_parameters(rotary: Rotary, *, head_dim: int | None = None) -> dict[str, Any]:
    """A `cape.Rotary` -> transformers 5's `rope_parameters` that reproduce it (the reverse of
    `rotary_from_config`). head_dim: the model's head size, when the rotary turns fewer
    channels (partial rotary). ValueError naming what transformers cannot express."""
    why = _inexpressible(rotary)
    if why:
        raise ValueError(f"rotary: transformers cannot express {why}")
    out: dict[str, Any] = {"rope_type": "default", "rope_theta": rotary.base}
    if head_dim is not None and head_dim != rotary.head_dim:
        out["partial_rotary_factor"] = rotary.head_dim / head_dim
    if rotary.scaling is None:
        return out
    o = rotary.extension.options
    out["rope_type"] = _BACK[rotary.scaling]
    if o.get("factor") is not None:
        out["factor"] = float(o["factor"])
    if rotary.scaling in ("yarn-hf", "longrope", "llama3"):
        out["original_max_position_embeddings"] = int(o["train_length"])
    for key in _OPTIONS.get(rotary.scaling, ()):
        value = o.get(key)
        if value is not None:
            out[key] = list(value) if isinstance(value, tuple) else value
    return out


def _inexpressible(rotary: Rotary) -> str:
    """What of `rotary` transformers' rope parameters cannot carry ("" = nothing)."""
    if not isinstance(rotary, Rotary) or rotary.pos_dim != 1:
        return "a rotary other than a 1-D cape.Rotary"
    if rotary.freq_scale != 1.0:
        return f"freq_scale={rotary.freq_scale} (its frequencies are base^(-2c/hd) only)"
    if rotary.xpos:
        return "xPos (one cos/sin pair rotates q and k alike; xPos scales them apart)"
    if rotary.scaling is not None and rotary.scaling not in _BACK:
        hint = " (its YaRN is scaling='yarn-hf')" if rotary.scaling == "yarn" else ""
        return f"scaling={rotary.scaling!r}{hint}"
    if rotary.scaling == "pi" and rotary.factor is None:
        return "scaling='pi' without a fixed factor (a factor per call)"
    return ""


class RotaryEmbedding(nn.Module):
    """A `rotary_emb` of transformers: forward(x, position_ids, layer_type=None) -> (cos, sin),
    each [B, T, hd] in x's dtype, laid out as transformers' `cat(freqs, freqs)` for its
    `rotate_half`, which is cape's half-split rotation ([x1 cos - x2 sin || x1 sin + x2 cos]).

    rotary: a 1-D `cape.Rotary` of the model's rotary width (partial rotary: the channels it
    turns), or a dict {layer type: Rotary} for a model with one rope per layer type (Gemma 3).
    The attention factor (YaRN, LongRoPE) multiplies cos and sin, as transformers does.
    Refused: xPos (transformers applies one cos/sin to q and k; xPos scales them apart), an
    augmentation on the rotary (transformers calls rotary_emb without attention_mask: use
    `augment_position_ids` on the model), and cape's per-call factors (no fixed `factor`),
    whose cached keys would rotate differently from new queries; transformers' own per-call
    types ("dynamic", "longrope") keep transformers' semantics.
    """

    def __init__(self, rotary: Rotary | dict[str, Rotary]) -> None:
        super().__init__()
        if isinstance(rotary, dict):
            if not rotary:
                raise ValueError("rotary: a dict of rotaries per layer type must not be empty")
            for layer, rot in rotary.items():
                _check_rotary(rot, f"rotary[{layer!r}]")
            self.rotaries = nn.ModuleDict(rotary)
        else:
            _check_rotary(rotary, "rotary")
            self.rotaries = nn.ModuleDict({ALL: rotary})

    @property
    def rotary(self) -> Rotary:
        """The rotary (the first, with several layer types)."""
        return next(iter(self.rotaries.values()))  # type: ignore[return-value]

    @property
    def attention_scaling(self) -> float:
        """The factor on cos and sin when it is one number (transformers' attribute): a fixed
        scaling's attention factor, else 1."""
        return self.rotary._fixed_scale or 1.0

    @property
    def per_layer_type(self) -> bool:
        return ALL not in self.rotaries

    def forward(
        self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [B, T, D] (its dtype and device only), position_ids: [B or 1, T] (integer or
        float, e.g. CAPE-augmented) -> (cos, sin): [B or 1, T, hd] in x's dtype."""
        rotary = self._select(layer_type)
        if not isinstance(position_ids, torch.Tensor) or position_ids.dim() != 2:
            shape = getattr(position_ids, "shape", type(position_ids).__name__)
            raise ValueError(f"position_ids must be a tensor [B, T], got {shape}")
        pos = position_ids.to(device=x.device, dtype=torch.float32)[..., None]
        b, t = pos.shape[:2]
        rotation = rotary.prepare(PositionContext(b, t, t, x.device, pos))
        emb = torch.cat([rotation.q_angles, rotation.q_angles], dim=-1)  # [B, T, hd]
        cos, sin = emb.cos(), emb.sin()
        if rotation.q_scale is not None:  # an attention factor, the same on every channel
            scale = rotation.q_scale.reshape(rotation.q_scale.shape[0], 1, 1)
            cos, sin = cos * scale, sin * scale
        return cos.to(x.dtype), sin.to(x.dtype)

    def _select(self, layer_type: str | None) -> Rotary:
        if not self.per_layer_type:
            if layer_type is not None:
                raise ValueError(
                    f"layer_type: this adapter has one rotary for every layer, got "
                    f"{layer_type!r} (a model with a rope per layer type needs a dict of them)"
                )
            return self.rotaries[ALL]  # type: ignore[return-value]
        if layer_type not in self.rotaries:
            raise ValueError(
                f"layer_type must be one of {sorted(self.rotaries)}, got {layer_type!r}"
            )
        return self.rotaries[layer_type]  # type: ignore[return-value]


def _check_rotary(rotary: object, name: str) -> None:
    if not isinstance(rotary, Rotary):
        raise TypeError(f"{name} must be a cape.Rotary, got {type(rotary).__name__}")
    if rotary.pos_dim != 1:
        raise ValueError(f"{name} must be 1-D (pos_dim=1) for position_ids, got {rotary.pos_dim}")
    if rotary.xpos:
        raise ValueError(
            f"{name}: xPos cannot be carried by transformers' rotary_emb: it multiplies q and k "
            "by the same (cos, sin), xPos needs q * zeta^n and k * zeta^-m; use xpos=False"
        )
    if rotary.augmentation is not None:
        raise ValueError(
            f"{name}: transformers calls rotary_emb without attention_mask, so its augmentation "
            "would count padding; give a Rotary without augmentation and add the augmentation "
            "with cape.integrations.hf.augment_position_ids(model, augmentation)"
        )
    if rotary.extension.per_call and rotary.scaling not in _PER_CALL:
        raise ValueError(
            f"{name}: scaling={rotary.scaling!r} needs a fixed factor= here: transformers serves "
            "one cos/sin per call to new queries and cached keys alike, and a per-call factor "
            "would rotate them differently"
        )
