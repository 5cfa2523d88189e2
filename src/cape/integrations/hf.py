"""cape inside Hugging Face transformers models, by duck typing: transformers is never imported.

RoPE models (Llama, Mistral, Qwen2...: a `rotary_emb(x, position_ids) -> (cos, sin)` module):
`install_rotary(model, cape.Rotary(head_dim, base=rope_theta, ...))` serves cos/sin from a
`cape.Rotary` (PI, NTK, YaRN with its attention temperature; `rotary_from_config` maps a config's
rope parameters). `augment_position_ids(model, augmentation)` adds CAPE's augmentation to the
`position_ids` in train mode, padding-aware through `attention_mask`.

Position tables (BERT-style `embeddings.position_embeddings`): `install_positions(model,
cape.build("cape1d", hidden))` puts any cape absolute encoding in place of the table.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from ..augment import PositionAugmentation
from ..encodings.rotary import Rotary
from ..functional.rope_scaling import yarn_temperature

__all__ = [
    "RotaryEmbedding",
    "rotary_from_config",
    "install_rotary",
    "augmented_position_ids",
    "augment_position_ids",
    "PositionEmbedding",
    "install_positions",
]

# HF rope types that are one fixed frequency table (+ a constant magnitude): cape's names
_ROPE_TYPES = {"default": None, "linear": "pi", "yarn": "yarn"}


class RotaryEmbedding(nn.Module):
    """A Llama-style `rotary_emb`: forward(x, position_ids) -> (cos, sin), each [B, T, hd] in
    x's dtype, laid out as HF's `cat(freqs, freqs)` for its `rotate_half`, which is cape's
    half-split rotation ([x1 cos - x2 sin || x1 sin + x2 cos]).

    rotary: a 1-D `cape.Rotary` with head_dim = the model's head size. Its scaling (PI, NTK,
    YaRN) needs a fixed `factor`: HF serves one cos/sin per call, to new queries and to keys that
    a cache kept from earlier calls, so a factor drawn from each call's span would rotate them
    differently. YaRN's temperature 0.1 ln s + 1 multiplies cos and sin (`attention_scaling`,
    as HF does), which multiplies q and k by it.
    Refused: xPos (HF applies the same cos/sin to q and k; xPos scales q by zeta^n and k by
    zeta^-m, which one (cos, sin) pair cannot carry), and an augmentation on the rotary (HF
    gives `rotary_emb` no attention_mask: use `augment_position_ids` on the model instead).
    """

    def __init__(self, rotary: Rotary) -> None:
        super().__init__()
        _check_rotary(rotary)
        self.rotary = rotary
        factor = rotary.factor
        self.attention_scaling = (
            float(yarn_temperature(factor)) if rotary.scaling == "yarn" and factor else 1.0
        )

    def forward(
        self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [B, T, D] (its dtype and device only), position_ids: [B or 1, T] (integer or
        float, e.g. CAPE-augmented) -> (cos, sin): [B or 1, T, head_dim] in x's dtype."""
        if layer_type is not None:
            raise ValueError(
                f"layer_type: one cape.Rotary serves every layer here, got {layer_type!r} "
                "(a model with per-layer rope types needs one adapter per type)"
            )
        if not isinstance(position_ids, torch.Tensor) or position_ids.dim() != 2:
            shape = getattr(position_ids, "shape", type(position_ids).__name__)
            raise ValueError(f"position_ids must be a tensor [B, T], got {shape}")
        angles = self.rotary.angles(position_ids.to(device=x.device, dtype=torch.float32))
        emb = torch.cat([angles, angles], dim=-1)  # [B, T, hd]: HF's rotate_half layout
        cos, sin = emb.cos(), emb.sin()
        if self.attention_scaling != 1.0:
            cos, sin = cos * self.attention_scaling, sin * self.attention_scaling
        return cos.to(x.dtype), sin.to(x.dtype)


def _check_rotary(rotary: object) -> None:
    if not isinstance(rotary, Rotary):
        raise TypeError(f"rotary must be a cape.Rotary, got {type(rotary).__name__}")
    if rotary.pos_dim != 1:
        raise ValueError(f"rotary must be 1-D (pos_dim=1) for position_ids, got {rotary.pos_dim}")
    if rotary.xpos:
        raise ValueError(
            "rotary: xPos cannot be carried by HF's rotary_emb: HF multiplies q and k by the same "
            "(cos, sin), xPos needs q * zeta^n and k * zeta^-m; use xpos=False"
        )
    if rotary.augmentation is not None:
        raise ValueError(
            "rotary: HF calls rotary_emb without attention_mask, so its augmentation would count "
            "padding; give a Rotary without augmentation and add CAPE's augmentation with "
            "cape.integrations.hf.augment_position_ids(model, augmentation)"
        )
    if rotary.scaling is not None and rotary.factor is None:
        raise ValueError(
            f"rotary: scaling={rotary.scaling!r} needs a fixed factor= here: HF serves one "
            "cos/sin per call to new queries and cached keys alike, and a per-call factor "
            "would rotate them differently"
        )


def _rope_parameters(config: Any) -> dict:
    """transformers 5's `config.rope_parameters`, or 4.x's rope_theta + rope_scaling."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        return dict(params)
    scaling = dict(getattr(config, "rope_scaling", None) or {})
    scaling.setdefault("rope_type", scaling.pop("type", "default"))
    return {"rope_theta": getattr(config, "rope_theta", 10000.0), **scaling}


def _yarn_options(params: dict) -> dict:
    factor = float(params["factor"])
    given = params.get("attention_factor")
    if given is not None and not math.isclose(given, 0.1 * math.log(factor) + 1.0):
        raise ValueError(
            f"config: YaRN attention_factor={given} is not 0.1 ln(factor) + 1, the only "
            "temperature cape.Rotary has"
        )
    if params.get("mscale") and params.get("mscale_all_dim"):
        raise ValueError("config: YaRN's mscale / mscale_all_dim (DeepSeek) are not in cape")
    return dict(
        train_length=float(params["original_max_position_embeddings"]),
        yarn_alpha=float(params.get("beta_slow") or 1.0),
        yarn_beta=float(params.get("beta_fast") or 32.0),
    )


def rotary_from_config(config: Any) -> Rotary:
    """A HF config (head_dim or hidden_size / num_attention_heads; rope_theta and the rope
    type) -> the `cape.Rotary` with the same frequencies, for `install_rotary`.

    rope types: "default"; "linear" -> scaling="pi"; "yarn" -> scaling="yarn" with train_length
    = original_max_position_embeddings, yarn_alpha = beta_slow, yarn_beta = beta_fast. Other
    types (dynamic, longrope, llama3...) are refused. YaRN's ramp differs: cape's is the paper's,
    linear in r = L / wavelength; HF's is linear in the channel index (and truncated), so the
    channels with 1 < r < 32 (alpha < r < beta) get other frequencies. Partial rotary refused.
    """
    params = _rope_parameters(config)
    rope_type = params.get("rope_type", "default")
    if rope_type not in _ROPE_TYPES:
        allowed = sorted(_ROPE_TYPES)
        raise ValueError(f"config: rope_type must be one of {allowed}, got {rope_type!r}")
    if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError("config: partial_rotary_factor != 1 (partial rotary) is not supported")
    head_dim = getattr(config, "head_dim", None) or (
        config.hidden_size // config.num_attention_heads
    )
    scaling = _ROPE_TYPES[rope_type]
    options: dict[str, Any] = {}
    if scaling is not None:
        options = dict(scaling=scaling, factor=float(params["factor"]))
    if scaling == "yarn":
        options.update(_yarn_options(params))
    return Rotary(int(head_dim), base=float(params["rope_theta"]), **options)


def _find_children(model: nn.Module, attribute: str) -> list[tuple[nn.Module, nn.Module]]:
    """(parent, child) for every submodule held as `parent.<attribute>`."""
    found = []
    for module in model.modules():
        child = module._modules.get(attribute)
        if isinstance(child, nn.Module):
            found.append((module, child))
    return found


def install_rotary(model: nn.Module, rotary: Rotary | RotaryEmbedding) -> nn.Module:
    """Replace every `rotary_emb` submodule of a HF RoPE model (Llama: `model.model.rotary_emb`)
    by `RotaryEmbedding(rotary)`; returns the model. The old module's head size (its `inv_freq`
    [hd/2]) must equal rotary.head_dim. Train and eval alike; the model's config is unchanged."""
    adapter = rotary if isinstance(rotary, RotaryEmbedding) else RotaryEmbedding(rotary)
    found = _find_children(model, "rotary_emb")
    if not found:
        raise ValueError(
            f"model: {type(model).__name__} has no `rotary_emb` submodule (a RoPE model such as "
            "LlamaForCausalLM has model.model.rotary_emb); for a position table (BERT) use "
            "install_positions"
        )
    for parent, old in found:
        inv_freq = getattr(old, "inv_freq", None)
        if isinstance(inv_freq, torch.Tensor) and 2 * inv_freq.shape[-1] != adapter.rotary.head_dim:
            raise ValueError(
                f"rotary: head_dim={adapter.rotary.head_dim}, but the model's rotary serves "
                f"head_dim={2 * inv_freq.shape[-1]}"
            )
        parent._modules["rotary_emb"] = adapter
    return model


def augmented_position_ids(
    augmentation: PositionAugmentation,
    attention_mask: torch.Tensor | None = None,
    *,
    position_ids: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """CAPE-augmented `position_ids` [B, T] float32 for one training batch (a collator's step).

    attention_mask: [B, T] (1 at real tokens, 0 at padding, HF's form). position_ids: [B, T]
    given positions; default: real tokens counted from 0 (cumsum(mask) - 1, as HF's generate
    counts left-padded prompts), so padding, left or right, moves no real token. The draws
    (global shift and scaling per sample, local shift per token) ignore padding; padded
    tokens get 0. Give at least one of attention_mask and position_ids.
    normalize=True is refused: the mean over a sequence reads a causal LM's future tokens, and
    a common shift changes nothing for rotary.
    """
    if not isinstance(augmentation, PositionAugmentation):
        kinds = "cape.Augmentation, RandomizedPositions, PoSE or RandomFloatPositions"
        raise TypeError(f"augmentation must be a {kinds}, got {augmentation!r}")
    if augmentation.normalize:
        raise ValueError(
            "augmentation: normalize=True subtracts the mean over the whole sequence, which reads "
            "a causal LM's future tokens (and rotary ignores a common shift): use normalize=False"
        )
    mask = _bool_mask(attention_mask, position_ids)
    if position_ids is None:
        position_ids = (mask.long().cumsum(dim=1) - 1).clamp(min=0)
    elif tuple(position_ids.shape) != tuple(mask.shape):
        raise ValueError(
            f"position_ids must be [B, T] = {tuple(mask.shape)} like attention_mask, "
            f"got {tuple(position_ids.shape)}"
        )
    pos = torch.where(mask, position_ids.to(torch.float32), 0.0)[..., None]  # [B, T, 1]
    return augmentation(pos, mask, training=True, generator=generator)[..., 0]


def _bool_mask(attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None):
    """[B, T] bool, True at real tokens, from HF's 0/1 attention_mask (all True without one)."""
    if attention_mask is None:
        if position_ids is None:
            raise ValueError("give attention_mask [B, T] or position_ids [B, T] (or both)")
        if position_ids.dim() != 2:
            raise ValueError(f"position_ids must be [B, T], got {tuple(position_ids.shape)}")
        return torch.ones(position_ids.shape, dtype=torch.bool, device=position_ids.device)
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2:
        shape = getattr(attention_mask, "shape", type(attention_mask).__name__)
        raise ValueError(
            f"attention_mask must be [B, T] with 1 at real tokens and 0 at padding, got {shape} "
            "(a 4-D or packed mask is not supported)"
        )
    return attention_mask != 0


def _cache_length(kwargs: dict) -> int:
    for name in ("cache", "past_key_values"):  # transformers 5.24+, before
        cache = kwargs.get(name)
        if cache is not None and hasattr(cache, "get_seq_length"):
            return int(cache.get_seq_length())
    return 0


def augment_position_ids(
    model: nn.Module,
    augmentation: PositionAugmentation,
    *,
    generator: torch.Generator | None = None,
) -> RemovableHandle:
    """Install CAPE's augmentation of `position_ids` on a HF model (a forward pre-hook): in train
    mode each call's `position_ids` (given, or real tokens counted from 0) become
    `augmented_position_ids(augmentation, attention_mask, ...)`; in eval mode it does nothing,
    so evaluation and `generate()` see the model's own positions. Returns the hook's handle
    (`.remove()`). Call the model with keywords (input_ids, attention_mask, position_ids); train
    mode with a non-empty KV cache is refused (one draw must cover the whole sequence)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    augmented_position_ids(augmentation, torch.ones(1, 1))  # the checks, once, here

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        if not module.training:
            return None
        if len(args) > 1:
            raise ValueError(
                "augment_position_ids: pass attention_mask and position_ids by keyword "
                f"(got {len(args)} positional arguments)"
            )
        if _cache_length(kwargs):
            raise ValueError(
                "augment_position_ids: train mode with a non-empty KV cache; call model.eval() "
                "to decode (the augmentation is a training-time one)"
            )
        mask, ids = kwargs.get("attention_mask"), kwargs.get("position_ids")
        if mask is None and ids is None:
            tokens = args[0] if args else kwargs.get("input_ids")
            if tokens is None:
                tokens = kwargs["inputs_embeds"][..., 0]
            mask = torch.ones(tokens.shape[:2], dtype=torch.long, device=tokens.device)
        kwargs["position_ids"] = augmented_position_ids(
            augmentation, mask, position_ids=ids, generator=generator
        )
        return args, kwargs

    return model.register_forward_pre_hook(hook, with_kwargs=True)


class PositionEmbedding(nn.Module):
    """A BERT-style position table's replacement: forward(position_ids [B or 1, T]) ->
    [B or 1, T, D], from a 1-D cape absolute encoding (`cape.build("sinpos" or "cape1d" ...,
    D)`), in the dtype the module was moved to (float32 by default).

    Continuous encodings read any position, so inputs longer than the table work (see
    `install_positions` for BERT's position_ids buffer). In train mode the encoding's own
    augmentation draws per row of position_ids; normalize=True is refused (HF gives the table
    no attention_mask, so the mean would count padding).
    """

    def __init__(self, encoding: nn.Module) -> None:
        super().__init__()
        if getattr(encoding, "kind", None) != "absolute" or getattr(encoding, "pos_dim", 0) != 1:
            raise ValueError(
                "encoding must be a 1-D cape absolute encoding (cape.build('sinpos' | 'cape1d' | "
                f"'abspos' | 'lff', dim)), got {type(encoding).__name__}"
            )
        aug = getattr(encoding, "augmentation", None)
        if aug is not None and aug.normalize:
            raise ValueError(
                "encoding: normalize=True would count padding (HF gives the position table no "
                "attention_mask); use an augmentation with normalize=False"
            )
        self.encoding = encoding
        self.embedding_dim = int(encoding.dim)
        self.register_buffer("_dtype", torch.empty(0), persistent=False)  # follows .to()

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        """position_ids: [B or 1, T] integer or float -> [B or 1, T, D]."""
        if not isinstance(position_ids, torch.Tensor) or position_ids.dim() != 2:
            shape = getattr(position_ids, "shape", type(position_ids).__name__)
            raise ValueError(f"position_ids must be a tensor [B, T], got {shape}")
        pos = position_ids.to(torch.float32)[..., None]  # [B, T, 1]
        return self.encoding(positions=pos).to(self._dtype.dtype)


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
    kwargs["position_ids"] = buffer[:, start : start + length].expand(batch, length)
    return args, kwargs


def install_positions(
    model: nn.Module, encoding: nn.Module, *, max_length: int | None = None
) -> nn.Module:
    """Replace the position table of a BERT-style HF model (`embeddings.position_embeddings`,
    an nn.Embedding [max_position_embeddings, D]) by `PositionEmbedding(encoding)`; returns
    the model. D must equal encoding.dim.

    max_length: BERT reads position ids from a buffer `position_ids` [1, max_position_embeddings]
    (and token types from `token_type_ids` of the same length), so longer inputs fail there
    before reaching the table; max_length > that extends both buffers (arange, zeros).
    In train mode the default position_ids become [B, T] so that CAPE draws per sample.
    """
    table = PositionEmbedding(encoding)
    found = _find_children(model, "position_embeddings")
    if not found:
        raise ValueError(
            f"model: {type(model).__name__} has no `position_embeddings` submodule (BERT-style "
            "models hold it in model.embeddings); for a RoPE model use install_rotary"
        )
    for parent, old in found:
        width = getattr(old, "embedding_dim", table.embedding_dim)
        if width != table.embedding_dim:
            raise ValueError(f"encoding: dim={table.embedding_dim}, but the table has D={width}")
        weight = getattr(old, "weight", None)
        parent._modules["position_embeddings"] = (
            table if weight is None else table.to(weight.device, weight.dtype)
        )
        if max_length is not None:
            _extend_buffers(parent, max_length)
        if not getattr(parent, "_cape_per_sample", False):  # once, however many installs
            parent.register_forward_pre_hook(_per_sample_hook, with_kwargs=True)
            parent._cape_per_sample = True
    return model


def _extend_buffers(module: nn.Module, max_length: int) -> None:
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length must be a positive int, got {max_length!r}")
    ids, types = getattr(module, "position_ids", None), getattr(module, "token_type_ids", None)
    if isinstance(ids, torch.Tensor) and ids.shape[-1] < max_length:
        longer = torch.arange(max_length, device=ids.device)[None]
        module.register_buffer("position_ids", longer, persistent=False)
    if isinstance(types, torch.Tensor) and types.shape[-1] < max_length:
        zeros = types.new_zeros(1, max_length)
        module.register_buffer("token_type_ids", zeros, persistent=False)
