"""Encoder-decoder Transformer for CAPE's machine-translation experiment (sec. 5.3, appendix D.1).

tokens -> Embedding * sqrt(D) (+ absolute position) -> dropout -> pre-norm Transformer stack
(ReLU FFN, as the fairseq/ADMIN recipes the paper follows) -> final LayerNorm. The decoder's
output projection is the token embedding transposed when `tie_embeddings` (a joint BPE
vocabulary: one table for encoder input, decoder input and output), else separate tables and a
bias-free Linear. Logits are float32.

Positions are *computed* by `Seq2Seq.positions` (token indices 0..L-1, float32 [B, L, 1], 0 at
padding) separately from how they are *applied*: any 1-D encoding of `cape.build`, by name, with
these defaults for translation (`position_options` override them):

- "nopos": nothing.
- "sinpos": the fixed sinusoid of the token index (`CAPE1d(D)`) added to the encoder and
  decoder inputs.
- "abspos": learned tables (`AbsPos1d`), one for the encoder and one for the decoder;
  `num_positions` 256, `overflow` "clamp" (indices past the table reuse its last row), `init_std`
  0.02.
- "relpos": Shaw relative positions (`RelPos`, keys only unless `values=True`) in every
  self-attention layer of both stacks, `max_distance` 16 tokens (farther pairs share the edge
  buckets); cross-attention is content-only; no absolute encoding.
- "cape1d": the sinusoid of CAPE-augmented positions, `preset="text"` (Dmax 5 tokens, emax 0.5,
  no global scaling, no mean-normalisation).
- "rotary": rotary embeddings (head_dim = D / heads) in every self-attention layer, augmented as
  cape1d (`preset="text"`); no absolute encoding. Our row, beyond the paper.
- "alibi" / "fire": ALiBi's linear (Press et al. 2022) / FIRE's learned (Li et al. 2024) bias in
  every self-attention layer, not augmented unless its options ask; no absolute encoding.

An encoding with CAPE's augmentation is not augmented by itself: the model takes it over and
synchronises source and target as in the paper (`cape.augment.augment_pair`): source positions
are `alpha * index`, target ones `index`; in training one global shift U(-Dmax, Dmax) (and scale)
per sample for both sides, independent local shifts U(-emax, emax) per token. Mean-normalisation
is refused: it would make a target position depend on later tokens (the decoder is causal).

`encode`/`decode` called without positions use the deterministic eval-mode positions (what
`positions()` gives in eval mode), whatever the module's mode; `forward` draws them with
`positions()`, so training goes through `forward`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .._checks import _may_inspect_values, check_float, check_int, check_rate, check_tensor
from ..build import encoding_class
from ..positions import token_positions
from .decode_cache import DecoderCache
from .plan import add_position, position_plan, resolve_options
from .transformer import TransformerDecoder, TransformerEncoder

__all__ = ["Seq2Seq"]

_TOKENS = "tokens need 1-D"

# translation's defaults per `cape.build` name (module docstring)
_DEFAULTS: dict[str, dict[str, Any]] = {
    "abspos": dict(num_positions=256, overflow="clamp", init_std=0.02),
    "relpos": dict(max_distance=16.0, values=False),
    "cape1d": dict(preset="text"),
    "rotary": dict(preset="text"),
}


def _check_mask(
    name: str, mask: torch.Tensor, shape: tuple[int, ...] | None = None
) -> torch.Tensor:
    check_tensor(name, mask, ndims=(2,))
    if mask.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool tensor (True at real tokens), got {mask.dtype}")
    if shape is not None and tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(mask.shape)}")
    return mask


def _check_tokens(name: str, tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """tokens [B, L] of any integer dtype with ids in [0, vocab_size) -> the same ids int64
    (what `nn.Embedding` and the loss read; small dtypes such as uint8 / uint16 arrays of a
    corpus have no min/max kernel of their own)."""
    check_tensor(name, tokens, ndims=(2,))
    if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor of token ids [B, L], got {tokens.dtype}")
    tokens = tokens.long()  # a uint64 id past 2**63 wraps below 0: refused as out of range
    if _may_inspect_values(tokens) and tokens.numel():
        if not 0 <= int(tokens.min()) <= int(tokens.max()) < vocab_size:
            raise ValueError(f"{name} must hold token ids in [0, vocab_size={vocab_size})")
    return tokens


class Seq2Seq(nn.Module):
    """Encoder-decoder Transformer: `Seq2Seq(vocab, position="cape1d", position_options={...})`.

    vocab_size: tokens of the (joint) vocabulary. dim, heads, ffn_dim: width D, attention heads
    (D divisible by heads), FFN hidden size. encoder_layers / decoder_layers: depths. dropout: on
    the embeddings (after positions are added), attention probabilities, FFN and residuals.
    position: a 1-D `cape.build` name; position_options: its options over the translation
    defaults (module docstring). alpha: target/source token ratio of the training corpus: the
    source positions are scaled by it when the encoding is augmented (synchronised, as CAPE).
    pad_id: the padding token (its embedding row starts at 0 and gets no gradient from lookups).
    tie_embeddings: one table for both sides and the output projection.
    `spec`: the constructor's keywords, JSON-able: `Seq2Seq(**model.spec)` rebuilds the model.
    """

    def __init__(
        self,
        vocab_size: int,
        *,
        dim: int = 256,
        encoder_layers: int = 3,
        decoder_layers: int = 3,
        heads: int = 4,
        ffn_dim: int = 1024,
        dropout: float = 0.1,
        position: str = "cape1d",
        position_options: dict[str, Any] | None = None,
        alpha: float = 1.0,
        pad_id: int = 0,
        tie_embeddings: bool = True,
    ) -> None:
        super().__init__()
        self.vocab_size = check_int("vocab_size", vocab_size, minimum=2)
        self.dim = check_int("dim", dim)
        check_int("encoder_layers", encoder_layers)
        check_int("decoder_layers", decoder_layers)
        check_int("heads", heads)
        check_int("ffn_dim", ffn_dim)
        if dim % heads:
            raise ValueError(f"dim ({dim}) must be divisible by heads ({heads})")
        dropout = check_rate("dropout", dropout)
        self.pad_id = check_int("pad_id", pad_id, minimum=0)
        if pad_id >= vocab_size:
            raise ValueError(f"pad_id must lie in [0, vocab_size={vocab_size}), got {pad_id}")
        if not isinstance(tie_embeddings, bool):
            raise TypeError(f"tie_embeddings must be a bool, got {tie_embeddings!r}")
        encoding_class(position, key="position")  # a `cape.build` name, or a ValueError
        self.position = position.lower()
        self.position_options = resolve_options(self.position, position_options, _DEFAULTS)
        self.alpha = check_float("alpha", alpha, strict=True)
        self._spec: dict[str, Any] = dict(
            vocab_size=vocab_size,
            dim=dim,
            encoder_layers=encoder_layers,
            decoder_layers=decoder_layers,
            heads=heads,
            ffn_dim=ffn_dim,
            dropout=dropout,
            position=self.position,
            position_options=dict(self.position_options),
            alpha=alpha,
            pad_id=pad_id,
            tie_embeddings=tie_embeddings,
        )

        self.embed_scale = math.sqrt(dim)
        self.embed = self._embedding()
        self.tgt_embed = None if tie_embeddings else self._embedding()
        self.out_proj = None if tie_embeddings else nn.Linear(dim, vocab_size, bias=False)
        if self.out_proj is not None:
            nn.init.normal_(self.out_proj.weight, std=dim**-0.5)
        self.drop = nn.Dropout(dropout)

        # the model draws the augmentation (synchronised source and target, `positions`);
        # absolute encodings are added here, before the embedding dropout
        self.plan = position_plan(
            self.position,
            dim=dim,
            heads=heads,
            options=self.position_options,
            sync=True,
            causal=True,
            pos_dim=1,
            what=_TOKENS,
        )
        self.augmentation = self.plan.augmentation
        self.src_position = self.plan.absolute
        self.tgt_position = self.plan.another_absolute()
        self._in_attention = self.plan.in_attention
        stack = dict(
            position=self.plan.without_absolute(),
            dropout=dropout,
            norm_first=True,
            activation="relu",
            final_norm=True,
        )
        self.encoder = TransformerEncoder(encoder_layers, dim, heads, ffn_dim, **stack)
        self.decoder = TransformerDecoder(decoder_layers, dim, heads, ffn_dim, **stack)

    def _embedding(self) -> nn.Embedding:
        emb = nn.Embedding(self.vocab_size, self.dim, padding_idx=self.pad_id)
        nn.init.normal_(emb.weight, std=self.dim**-0.5)  # x sqrt(D): unit-variance inputs
        with torch.no_grad():
            emb.weight[self.pad_id].zero_()
        return emb

    @property
    def spec(self) -> dict[str, Any]:
        """The constructor's keywords (position_options with defaults filled in)."""
        return {**self._spec, "position_options": dict(self._spec["position_options"])}

    # -- positions -------------------------------------------------------------------------
    def _positions(
        self,
        src_mask: torch.Tensor,
        tgt_mask: torch.Tensor | None,
        training: bool,
        generator: torch.Generator | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        _check_mask("src_mask", src_mask)
        batch, src_len = src_mask.shape
        if tgt_mask is not None:
            _check_mask("tgt_mask", tgt_mask)
            if tgt_mask.shape[0] != batch:
                raise ValueError(
                    f"tgt_mask must have {batch} rows like src_mask, got {tgt_mask.shape[0]}"
                )
        device = src_mask.device
        src = token_positions(batch, src_len, mask=src_mask, device=device)
        tgt = (
            None
            if tgt_mask is None
            else token_positions(batch, tgt_mask.shape[1], mask=tgt_mask, device=device)
        )
        aug = self.augmentation
        if aug is None:
            return src, tgt
        # no target: augment the source alone (the same draws a zero-length target would get)
        tgt_in = src.new_zeros(batch, 0, 1) if tgt is None else tgt
        tgt_m = src_mask.new_zeros(batch, 0) if tgt_mask is None else tgt_mask
        src, tgt_out = aug.pair(
            src, tgt_in, src_mask, tgt_m, alpha=self.alpha, training=training, generator=generator
        )
        return src, (None if tgt is None else tgt_out)

    def positions(
        self,
        src_mask: torch.Tensor,
        tgt_mask: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """src_mask [B, S], tgt_mask [B, T] | None (bool, True = real) ->
        (src_pos [B, S, 1], tgt_pos [B, T, 1] | None), float32, 0 at padding.

        Token indices; with an augmented encoding scaled (source by alpha) and, in training mode,
        augmented (`augment_pair`: draws from `generator`, on the masks' device, in the order
        global shift [B, 1], source local [S, B, 1], target local [T, B, 1]).
        """
        return self._positions(src_mask, tgt_mask, self.training, generator)

    # -- encoder / decoder -----------------------------------------------------------------
    def _check_pos(self, name: str, pos: torch.Tensor, batch: int, length: int) -> torch.Tensor:
        check_tensor(name, pos, ndims=(2, 3), floating=True)
        if tuple(pos.shape[:2]) != (batch, length) or (pos.dim() == 3 and pos.shape[2] != 1):
            raise ValueError(
                f"{name} must have shape [{batch}, {length}, 1], got {list(pos.shape)}"
            )
        return pos if pos.dim() == 3 else pos[..., None]

    def _embed(
        self,
        table: nn.Embedding,
        tokens: torch.Tensor,
        position: nn.Module | None,
        pos: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        x = table(tokens) * self.embed_scale
        if position is not None:
            x = add_position(position, x, positions=pos, mask=mask)
        return self.drop(x)

    def encode(
        self, src: torch.Tensor, src_mask: torch.Tensor, src_pos: torch.Tensor | None = None
    ) -> torch.Tensor:
        """src [B, S] token ids, src_mask [B, S] bool, src_pos [B, S, 1] (None = eval-mode
        positions) -> memory [B, S, D]. Rows at padding are unspecified."""
        src = _check_tokens("src", src, self.vocab_size)
        _check_mask("src_mask", src_mask, tuple(src.shape))
        if src_pos is None:
            src_pos, _ = self._positions(src_mask, None, False, None)
        src_pos = self._check_pos("src_pos", src_pos, *src.shape)
        x = self._embed(self.embed, src, self.src_position, src_pos, src_mask)
        return self.encoder(x, mask=src_mask, positions=src_pos if self._in_attention else None)

    def decode(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        memory_mask: torch.Tensor,
        tgt_mask: torch.Tensor | None = None,
        tgt_pos: torch.Tensor | None = None,
        *,
        last_only: bool = False,
    ) -> torch.Tensor:
        """tgt [B, T] decoder input ids, memory [B, S, D], memory_mask [B, S] bool,
        tgt_mask [B, T] bool (None = all real), tgt_pos [B, T, 1] (None = token indices, the
        eval-mode positions) -> logits [B, T, V] float32 (causal: position t sees tgt[:, :t+1]).

        last_only: project only the last position -> [B, 1, V] (for step-wise search).
        """
        tgt = _check_tokens("tgt", tgt, self.vocab_size)
        batch, length = tgt.shape
        check_tensor("memory", memory, ndims=(3,), floating=True)
        if memory.shape[0] != batch or memory.shape[2] != self.dim:
            raise ValueError(
                f"memory must have shape [{batch}, S, {self.dim}], got {list(memory.shape)}"
            )
        _check_mask("memory_mask", memory_mask, tuple(memory.shape[:2]))
        if tgt_mask is not None:
            _check_mask("tgt_mask", tgt_mask, (batch, length))
        if tgt_pos is None:
            tgt_pos = token_positions(batch, length, mask=tgt_mask, device=tgt.device)
        tgt_pos = self._check_pos("tgt_pos", tgt_pos, batch, length)
        table = self.embed if self.tgt_embed is None else self.tgt_embed
        x = self._embed(table, tgt, self.tgt_position, tgt_pos, tgt_mask)
        h = self.decoder(
            x,
            memory,
            mask=tgt_mask,
            memory_mask=memory_mask,
            positions=tgt_pos if self._in_attention else None,
        )
        if last_only:
            h = h[:, -1:]
        weight = self.embed.weight if self.out_proj is None else self.out_proj.weight
        return nn.functional.linear(h, weight).float()

    def start_decoding(self, memory: torch.Tensor, memory_mask: torch.Tensor) -> DecoderCache:
        """Incremental decoding state for memory [B, S, D], memory_mask [B, S] bool: the
        cross-attention keys/values of every decoder layer, projected once, and empty
        self-attention caches. Use with `decode_step` in eval mode; `state.reorder(index)`
        selects batch rows (beam search)."""
        check_tensor("memory", memory, ndims=(3,), floating=True)
        if memory.shape[2] != self.dim:
            raise ValueError(f"memory must have shape [B, S, {self.dim}], got {list(memory.shape)}")
        _check_mask("memory_mask", memory_mask, tuple(memory.shape[:2]))
        return self.decoder.start_cache(memory, memory_mask)

    def decode_step(
        self, tokens: torch.Tensor, state: DecoderCache
    ) -> tuple[torch.Tensor, DecoderCache]:
        """The next decoder inputs tokens [B, 1] (target index t = `state.length`, eval-mode
        positions) -> (logits [B, V] float32 for the token after them, state updated in place).
        Equal to `decode(prefix)[:, -1]` over all the tokens fed so far."""
        tokens = _check_tokens("tokens", tokens, self.vocab_size)
        if tokens.shape[1] != 1:
            raise ValueError(f"tokens must have shape [B, 1], got {list(tokens.shape)}")
        if not isinstance(state, DecoderCache):
            raise TypeError(f"state must come from start_decoding, got {type(state).__name__}")
        batch = tokens.shape[0]
        pos = torch.full((batch, 1, 1), float(state.length), device=tokens.device)
        table = self.embed if self.tgt_embed is None else self.tgt_embed
        x = self._embed(table, tokens, self.tgt_position, pos, None)
        h = self.decoder(x, None, positions=pos if self._in_attention else None, cache=state)
        weight = self.embed.weight if self.out_proj is None else self.out_proj.weight
        return nn.functional.linear(h[:, 0], weight).float(), state

    def forward(
        self,
        src: torch.Tensor,
        src_mask: torch.Tensor,
        tgt: torch.Tensor,
        tgt_mask: torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Teacher forcing: src [B, S], src_mask [B, S], tgt [B, T] (decoder inputs),
        tgt_mask [B, T] -> logits [B, T, V] float32. Positions from `positions()` (augmented
        in training for cape/rotary, drawn from `generator`)."""
        src = _check_tokens("src", src, self.vocab_size)
        tgt = _check_tokens("tgt", tgt, self.vocab_size)
        _check_mask("src_mask", src_mask, tuple(src.shape))
        _check_mask("tgt_mask", tgt_mask, tuple(tgt.shape))
        src_pos, tgt_pos = self.positions(src_mask, tgt_mask, generator)
        memory = self.encode(src, src_mask, src_pos)
        return self.decode(tgt, memory, src_mask, tgt_mask, tgt_pos)

    def extra_repr(self) -> str:
        return (
            f"vocab_size={self.vocab_size}, dim={self.dim}, position={self.position!r}, "
            f"position_options={self.position_options}, alpha={self.alpha}, "
            f"augmentation={self.augmentation}, tied={self.out_proj is None}"
        )
