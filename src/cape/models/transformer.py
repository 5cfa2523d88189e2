"""Transformer encoder/decoder stacks with any `cape` encoding: the "combination" step.

The stack asks its position plan (`cape.models.plan`) where the encoding goes. Absolute
encodings are added once, to the input of the stack. Relative ones (`RelPos`, `Rotary`,
`ALiBi`, `FIRE`) live inside every layer's self-attention, or only the first
(`relative_layers="first"`: CAPE appendix C.4, *relpos first layer*); their positions, with
CAPE's augmentation drawn once per forward, are computed here and handed to every layer. The
layers themselves (and layer drop) are in `cape.models.layers`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .._checks import check_choice, check_int
from ..encodings.in_attention import AttentionBias, PositionContext, QKTransform
from ..positions import column_positions, token_positions
from .decode_cache import DecoderCache
from .layers import TransformerDecoderLayer, TransformerEncoderLayer, _Block
from .plan import PositionPlan, add_position, plan_of_modules, position_plan

__all__ = [
    "TransformerEncoderLayer",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerDecoder",
]


def _slots(made: object) -> dict[str, Any]:
    """A layer's in-attention module(s), by protocol -> the attention's slots (`rotary`, the
    q/k transform; `biases`, the additive biases). A factory may return several (a rotary and
    an ALiBi, say) as a list or tuple."""
    mods = [] if made is None else list(made) if isinstance(made, (list, tuple)) else [made]
    rotary = [m for m in mods if isinstance(m, QKTransform)]
    biases = [m for m in mods if isinstance(m, AttentionBias)]
    other = [m for m in mods if not isinstance(m, (QKTransform, AttentionBias))]
    if other or len(rotary) > 1:
        got = type(other[0]).__name__ if other else "two q/k transforms"
        raise TypeError(
            "relative_factory must return in-attention encodings (a Rotary or RoPE2d, and/or "
            f"RelPos, ALiBi, FIRE biases), at most one q/k transform; got {got}"
        )
    return {"rotary": rotary[0] if rotary else None, "biases": biases}


class _Stack(nn.Module):
    """The position plan's input encoding, a list of layers (`layer_cls`), an optional final
    norm. The options are `TransformerEncoder`'s."""

    layer_cls: type[_Block] = TransformerEncoderLayer

    def __init__(
        self,
        layers: int,
        dim: int,
        heads: int,
        ffn_dim: int,
        *,
        position: str | nn.Module | PositionPlan | None = None,
        position_options: dict[str, Any] | None = None,
        relative_factory: Callable[[], nn.Module] | None = None,
        relative_layers: str = "all",
        final_norm: bool | None = None,
        dropout: float = 0.1,
        layer_drop: float = 0.0,
        norm_first: bool = True,
        activation: str = "gelu",
        causal: bool | None = None,
    ) -> None:
        super().__init__()
        check_int("layers", layers)
        check_choice("relative_layers", relative_layers, ("all", "first"))
        if isinstance(position, (str, PositionPlan)):
            if relative_factory is not None:
                raise ValueError(
                    "give position (a name or a plan) or relative_factory, not both: the plan "
                    "builds the layers' encodings"
                )
            plan = position_plan(
                position,
                dim=dim,
                heads=heads,
                options=position_options,
                causal=self.layer_cls.decoder or bool(causal),
            )
        else:
            if position_options:
                raise ValueError("position_options apply to a position name, not to a module")
            plan = plan_of_modules(position, relative_factory)
        if plan.absolute is not None and getattr(plan.absolute, "dim", dim) != dim:
            raise ValueError(f"position.dim must equal dim ({dim}), got {plan.absolute.dim}")
        self.plan = plan
        self.position = plan.absolute
        # inspect once which keywords the encoding's forward takes (they differ per class)
        params = inspect.signature(plan.absolute.forward).parameters if plan.absolute else {}
        any_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        self._pos_kw = {k for k in ("mask", "generator") if any_kw or k in params}
        options = dict(dropout=dropout, layer_drop=layer_drop, norm_first=norm_first,
                       activation=activation, causal=causal)  # fmt: skip
        blocks = []
        for i in range(layers):
            made = plan.layer() if relative_layers == "all" or i == 0 else None
            blocks.append(self.layer_cls(dim, heads, ffn_dim, **_slots(made), **options))
        self.layers = nn.ModuleList(blocks)
        final_norm = norm_first if final_norm is None else final_norm
        self.norm = nn.LayerNorm(dim) if final_norm else None

    def _context(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        positions: torch.Tensor | None,
        generator: torch.Generator | None,
    ) -> PositionContext:
        """The positions every layer reads, made once per forward: the plan's shared draw (or
        the positions as given), in the context the layers' encodings prepare from."""
        (b, t), device = x.shape[:2], x.device
        pos = self.plan.layer_positions(positions, mask, (b, t), device, self.training, generator)
        q = None if pos is None else column_positions(pos, mask)
        return PositionContext(
            b, t, t, device, q, mask=mask, generator=generator, dtype=x.dtype,
            augmented=self.plan.augmented_by_stack,
        )  # fmt: skip

    def _cache_positions(
        self, x: torch.Tensor, mask: torch.Tensor | None, positions, cache: DecoderCache | None
    ) -> torch.Tensor | None:
        """The positions of the new tokens when decoding with `cache` (None = token indices
        from `cache.length`, 0 at padding), given to the input encoding and the layers."""
        if cache is None:
            return positions
        if len(cache.self_attn) != len(self.layers):
            raise ValueError(
                f"cache has {len(cache.self_attn)} layers, the stack {len(self.layers)}"
            )
        if positions is not None:
            return positions
        b, t = x.shape[:2]
        return token_positions(b, t, mask=mask, device=x.device, start=cache.length)

    def _add_position(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        positions: torch.Tensor | None,
        position_kwargs: dict[str, Any] | None,
        generator: torch.Generator | None,
    ) -> torch.Tensor:
        if self.position is None:
            return x
        kwargs = dict(position_kwargs or {})
        given = {"mask": mask, "positions": positions, "generator": generator}
        for name, value in given.items():
            if value is None or (name != "positions" and name not in self._pos_kw):
                continue
            if name in kwargs:
                raise ValueError(f"position_kwargs must not repeat {name!r}: pass it to forward")
            kwargs[name] = value
        return add_position(self.position, x, **kwargs)

    def _finish(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.norm is None else self.norm(x)


class TransformerEncoder(_Stack):
    """A stack of `TransformerEncoderLayer`s.

    layers: number of layers. position: where the positions go (`cape.models.plan`): a
    `cape.build` name with `position_options` (e.g. "rotary": one module for every layer, CAPE's
    augmentation drawn once per forward for all of them), a `PositionPlan`, or an absolute
    encoding module (e.g. `cape.build("cape1d", D)`) added to the input; NoPos/None = nothing.
    relative_factory: (modules made by the caller) one `RelPos`, `Rotary`, `ALiBi` or `FIRE`
    per layer that has one, each drawing its own augmentation. relative_layers: "all" or
    "first" (CAPE C.4 *relpos first layer*). final_norm: LayerNorm after the stack; None = only
    for pre-norm. options: dropout, layer_drop, norm_first, activation, causal (see the layer).
    """

    layer_cls = TransformerEncoderLayer

    def forward(
        self,
        x: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        position_kwargs: dict[str, Any] | None = None,
        generator: torch.Generator | None = None,
        cache: DecoderCache | None = None,
    ) -> torch.Tensor:
        """x: [B, T, D], mask: [B, T] bool (True = real) -> [B, T, D].

        positions: [B, T(, M)], given to the absolute encoding and to relpos/rotary (None =
        their defaults, token indices). position_kwargs: extra keywords for the absolute
        encoding (CAPE1d `hop`, CAPE2d `grid`, ...). Outputs at padded tokens are unspecified
        but never influence real ones.
        cache: incremental decoding of a causal stack (eval mode, `start_cache`): x, mask and
        positions are the next T tokens' (positions None = indices from `cache.length`),
        appended to the cache; the outputs equal the full prefix's last T rows.
        """
        first = self.layers[0]
        self_cache = None if cache is None else cache.self_attn[0]
        first.check_inputs(x, mask, positions, first.causal, self_cache)  # once, for every layer
        positions = self._cache_positions(x, mask, positions, cache)
        x = self._add_position(x, mask, positions, position_kwargs, generator)
        context = self._context(x, mask, positions, generator)
        caches = [None] * len(self.layers) if cache is None else cache.self_attn
        for layer, layer_cache in zip(self.layers, caches, strict=True):
            x = layer(x, mask=mask, generator=generator, cache=layer_cache, context=context)
        if cache is not None:
            cache.length += x.shape[1]
        return self._finish(x)

    def start_cache(self) -> DecoderCache:
        """An empty key/value cache of every layer, for causal decoding with `forward(cache=)`
        (eval mode)."""
        return DecoderCache(len(self.layers))


class TransformerDecoder(_Stack):
    """A stack of `TransformerDecoderLayer`s (causal self-attention, cross-attention, FFN).

    Options as `TransformerEncoder`. Causality holds only if the positions of token t do not
    depend on later tokens: use encodings without mean-normalisation (`normalize=False`; CAPE's
    MT setting) for the targets.
    """

    layer_cls = TransformerDecoderLayer

    def start_cache(
        self, memory: torch.Tensor, memory_mask: torch.Tensor | None = None
    ) -> DecoderCache:
        """A `DecoderCache` for incremental decoding, with every layer's cross-attention
        keys/values of memory [B, S, D] (memory_mask [B, S]) projected once."""
        cross = [layer.cross_attn.memory_cache(memory, memory_mask) for layer in self.layers]
        return DecoderCache(len(self.layers), cross_attn=cross)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None,
        *,
        mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        position_kwargs: dict[str, Any] | None = None,
        generator: torch.Generator | None = None,
        cache: DecoderCache | None = None,
    ) -> torch.Tensor:
        """x: [B, T, D] targets, memory: [B, S, D] encoder output -> [B, T, D].

        mask: [B, T], memory_mask: [B, S] (bool, True = real). positions, position_kwargs:
        for the targets, as in `TransformerEncoder.forward`.
        cache: incremental decoding (eval mode): x, mask and positions are the next T tokens'
        (positions None = indices from `cache.length`), appended to the cache; memory may be
        None with a cache from `start_cache`. Outputs equal the full prefix's last T rows.
        """
        positions = self._cache_positions(x, mask, positions, cache)
        caches: list = [None] * len(self.layers)
        if cache is not None:
            caches = list(zip(cache.self_attn, cache.cross_attn, strict=True))
        first = caches[0] or (None, None)
        self.layers[0].check_decoder_inputs(x, memory, mask, memory_mask, positions, *first)
        x = self._add_position(x, mask, positions, position_kwargs, generator)
        context = self._context(x, mask, positions, generator)
        for layer, layer_cache in zip(self.layers, caches, strict=True):
            x = layer(x, memory, mask=mask, memory_mask=memory_mask, generator=generator,
                      cache=layer_cache, context=context)  # fmt: skip
        if cache is not None:
            cache.length += x.shape[1]
        return self._finish(x)
