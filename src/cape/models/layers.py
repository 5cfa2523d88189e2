"""The Transformer layers: self-attention (+ cross-attention) + FFN, pre- or post-norm.

Layer drop follows CAPE's ASR models (appendix C.2, "dropping entire layers at the FFN level"):
in training, with probability `layer_drop` per layer and per forward (one draw for the whole
batch) the layer's FFN residual branch is skipped: its contribution is zero and it is not
computed (pre-norm: x stays x; post-norm: the norm is still applied). Nothing is rescaled, as
in LayerDrop. The draw decides Python control flow, so it is made on the host: from
`generator` when that is a CPU generator, else from torch's default CPU generator (seeded by
`torch.manual_seed`). A CUDA generator is not used for it: reading a device draw would force a
host sync per layer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from .._checks import (
    check_choice,
    check_content,
    check_int,
    check_mask,
    check_rate,
    check_real,
)
from ..encodings.in_attention import AttentionBias, PositionContext, QKTransform
from .attention import MultiheadAttention
from .decode_cache import AttentionCache

__all__ = ["TransformerEncoderLayer", "TransformerDecoderLayer"]

_ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {"gelu": nn.GELU, "relu": nn.ReLU}


def _drop_layer(p: float, training: bool, generator: torch.Generator | None) -> bool:
    """One host-side Bernoulli(p) draw (see the module docstring for why on the host)."""
    if not training or p <= 0.0:
        return False
    if p >= 1.0:
        return True
    gen = generator if generator is not None and generator.device.type == "cpu" else None
    return bool(torch.rand((), generator=gen) < p)


def _causal(causal: object, decoder: bool) -> bool:
    """A layer's `causal`: a bool, or None (an encoder layer's default False); a decoder layer's
    self-attention is always causal."""
    if causal is None:
        return decoder
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if decoder and not causal:
        raise ValueError("causal=False: a decoder layer's self-attention is causal")
    return causal


class _Block(nn.Module):
    """What both layer kinds share: options, the FFN sub-block and the residual wiring.

    dim: D (divisible by heads). ffn_dim: FFN hidden size. dropout: on attention
    probabilities, the FFN hidden layer and both residual branches. layer_drop: probability of
    skipping the FFN branch in training (module docstring). activation: "gelu" or "relu".
    rotary / biases: the self-attention's in-attention encodings (`MultiheadAttention`; head_dim
    = D / heads). causal: token i attends to tokens j <= i only (None: False for an encoder
    layer; a decoder layer is causal).
    """

    decoder = False  # a decoder layer: causal, with cross-attention over a memory

    def __init__(
        self,
        dim: int,
        heads: int,
        ffn_dim: int,
        *,
        dropout: float = 0.1,
        layer_drop: float = 0.0,
        norm_first: bool = True,
        activation: str = "gelu",
        rotary: QKTransform | None = None,
        biases: Sequence[AttentionBias] = (),
        causal: bool | None = None,
    ) -> None:
        super().__init__()
        check_int("ffn_dim", ffn_dim)
        dropout = check_rate("dropout", dropout, one=True)
        self.layer_drop = check_rate("layer_drop", layer_drop, one=True)
        check_choice("activation", activation, tuple(_ACTIVATIONS))
        if not isinstance(norm_first, bool):
            raise TypeError(f"norm_first must be a bool, got {type(norm_first).__name__}")
        self.causal = _causal(causal, self.decoder)
        self.norm_first = norm_first
        self.self_attn = MultiheadAttention(
            dim, heads, dropout=dropout, rotary=rotary, biases=biases
        )
        self.self_norm = nn.LayerNorm(dim)
        self.ffn = nn.Sequential(
            nn.Linear(dim, ffn_dim),
            _ACTIVATIONS[activation](),
            nn.Dropout(dropout),
            nn.Linear(ffn_dim, dim),
        )
        self.ffn_norm = nn.LayerNorm(dim)
        self.dropout = nn.Dropout(dropout)
        # made last: a decoder layer draws the encoder layer's parameters first, so one seed
        # initialises both kinds alike where they share parts
        if self.decoder:
            self.cross_attn = MultiheadAttention(dim, heads, dropout=dropout)
            self.cross_norm = nn.LayerNorm(dim)

    def _residual(
        self,
        x: torch.Tensor,
        norm: nn.Module,
        branch: Callable[[torch.Tensor], torch.Tensor] | None,
    ) -> torch.Tensor:
        """Pre-norm: x + f(norm(x)); post-norm: norm(x + f(x)). branch None = skipped (f = 0)."""
        if self.norm_first:
            return x if branch is None else x + self.dropout(branch(norm(x)))
        return norm(x if branch is None else x + self.dropout(branch(x)))

    def check_inputs(
        self,
        x: object,
        mask: object,
        positions: object,
        causal: bool,
        cache: AttentionCache | None = None,
    ) -> None:
        """x: [B, T, D] content in the parameters' dtype; mask: None or bool [B, T];
        positions: None or [B, T(, M)]: what the self-attention checks (its `check_inputs`)."""
        check_content("x", x, self.self_attn.dim, self.self_attn.q_proj.weight.dtype)
        assert isinstance(x, torch.Tensor)
        if mask is not None:
            check_mask("mask", mask, x.shape[:2])
        if positions is not None:
            check_real("positions", positions, ndims=(2, 3))
        names = ("positions", "k_positions")
        self.self_attn.check_inputs(x, None, mask, causal, (positions, None), None, cache, names)

    def _ffn(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        skip = _drop_layer(self.layer_drop, self.training, generator)
        return self._residual(x, self.ffn_norm, None if skip else self.ffn)


class TransformerEncoderLayer(_Block):
    """Self-attention + FFN, pre-norm (`norm_first=True`) or post-norm; the options are
    `_Block`'s. causal=True: a decoder-only model (e.g. autoregressive pixels)."""

    def forward(
        self,
        x: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        cache: AttentionCache | None = None,
        context: PositionContext | None = None,
    ) -> torch.Tensor:
        """x: [B, T, D], mask: [B, T] bool (True = real), positions: [B, T(, M)] -> [B, T, D].

        cache: the self-attention's key/value cache (a causal layer decoding: x holds the new
        tokens, `MultiheadAttention`). context: the positions a stack prepared for every layer
        (instead of positions and generator); its inputs are then taken as checked."""
        if context is None:
            self.check_inputs(x, mask, positions, self.causal, cache)
            context = self.self_attn.context(x, None, mask, positions, generator=generator,
                                             cache=cache)  # fmt: skip

        def attend(h: torch.Tensor) -> torch.Tensor:
            return self.self_attn(
                h, key_mask=mask, causal=self.causal, cache=cache, context=context
            )

        x = self._residual(x, self.self_norm, attend)
        return self._ffn(x, generator)


class TransformerDecoderLayer(_Block):
    """Causal self-attention + cross-attention over the memory + FFN.

    Same options as `TransformerEncoderLayer`; the in-attention encodings act in the
    self-attention only (the cross-attention is content-only, as in the paper's seq2seq decoder).
    """

    decoder = True

    def check_decoder_inputs(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None,
        mask: torch.Tensor | None,
        memory_mask: torch.Tensor | None,
        positions: torch.Tensor | None,
        self_cache: AttentionCache | None,
        cross_cache: AttentionCache | None,
    ) -> None:
        """The decoder layer's inputs (`forward`), checked once."""
        if memory is None and (cross_cache is None or cross_cache.k is None):
            raise ValueError("memory is required unless a filled cross-attention cache is given")
        self.check_inputs(x, mask, positions, True, self_cache)
        if memory is not None:
            check_content("memory", memory, self.self_attn.dim, self.self_attn.q_proj.weight.dtype)
            if memory_mask is not None:
                check_mask("memory_mask", memory_mask, memory.shape[:2])
            if memory.shape[0] != x.shape[0]:
                raise ValueError(
                    f"memory must have shape [B={x.shape[0]}, S, D], got {tuple(memory.shape)}"
                )
            self.cross_attn.check_inputs(x, memory, memory_mask, False, (None, None), None,
                                         cross_cache)  # fmt: skip

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None,
        *,
        mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        cache: tuple[AttentionCache, AttentionCache] | None = None,
        context: PositionContext | None = None,
    ) -> torch.Tensor:
        """x: [B, T, D] targets, memory: [B, S, D]; mask [B, T], memory_mask [B, S] -> [B, T, D].

        cache: (self-attention, cross-attention) caches for incremental decoding: x holds the
        new tokens only (mask and positions theirs); memory may be None once the
        cross-attention cache is filled (see `TransformerDecoder.start_cache`). context: the
        positions a stack prepared for every layer; its inputs are then taken as checked.
        """
        self_cache, cross_cache = (None, None) if cache is None else cache
        if context is None:
            self.check_decoder_inputs(
                x, memory, mask, memory_mask, positions, self_cache, cross_cache
            )
            context = self.self_attn.context(x, None, mask, positions, generator=generator,
                                             cache=self_cache)  # fmt: skip

        def attend(h: torch.Tensor) -> torch.Tensor:
            return self.self_attn(h, key_mask=mask, causal=True, cache=self_cache, context=context)

        def cross(h: torch.Tensor) -> torch.Tensor:
            # content-only: no encoding reads the context, which marks the inputs as checked
            return self.cross_attn(
                h, memory, key_mask=memory_mask, cache=cross_cache, context=context
            )

        x = self._residual(x, self.self_norm, attend)
        x = self._residual(x, self.cross_norm, cross)
        return self._ffn(x, generator)
