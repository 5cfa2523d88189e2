"""A decoder-only Transformer language model with any 1-D `cape` encoding.

tokens -> Embedding * sqrt(D) -> dropout -> a causal pre-norm `TransformerEncoder` (GELU FFN,
final LayerNorm; the position plan puts the encoding at its input or in every layer's
self-attention) -> logits with the embedding table transposed (tied) or a bias-free Linear.

Positions are token indices 0..T-1 by the names of `cape.build`, as the other models take
them, with these defaults (`position_options` override them): "cape1d" the `text` preset
(Dmax 5 tokens, emax 0.5, no mean-normalisation); "alibi" / "fire" their causal forms (the
papers' language models). CAPE's augmentation of an in-attention encoding is drawn once per
forward by the stack, from shapes only: the draws of token t never read later tokens.
Mean-normalisation is refused: token t's position would read the positions of later tokens.

Incremental decoding (`start_cache`, `step`, `generate`) keeps every layer's keys and values
(`DecoderCache`): the logits equal the full forward's. It needs keys that stay valid as the
text grows: a scaled rotary with a fixed `factor` (factor=None rescales by each call's span)
and xPos with `xpos_center` (else centred on each call). `generate(cache=None)` centres such an
xPos once for its loop and falls back to full forwards for the others; `start_cache` refuses
them by name.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_generator, check_int, check_rate
from ..build import encoding_class, encoding_entry
from ..encodings.in_attention import InAttentionEncoding
from .decode_cache import DecoderCache
from .plan import position_plan, resolve_options
from .sampling import check_sampling, next_token
from .search import _eval_mode, centred_xpos
from .seq2seq import _check_mask, _check_tokens
from .transformer import TransformerEncoder

__all__ = ["CausalLM"]

# a language model's defaults per `cape.build` name (module docstring)
_DEFAULTS: dict[str, dict[str, Any]] = {
    "cape1d": dict(preset="text"),
    "alibi": dict(causal=True),
    "fire": dict(causal=True),
}
_TOKENS = "a language model reads 1-D token positions"
MAX_TOKENS = 2**24  # float32 holds every integer up to 2**24: token positions stay exact


def _check_1d(position: str, options: object) -> None:
    """A `cape.build` name whose module reads 2-D (or more) positions by default is refused
    before its options are read: the options of a 2-D encoding (rope-mixed's heads) would
    otherwise be asked for first."""
    if isinstance(options, dict) and "pos_dim" in options:
        return  # the plan checks the M the options give
    try:
        m = encoding_entry(position).pos_dim({})
    except TypeError:  # no M of its own (nopos; an input encoding's M follows its input)
        return
    if m != 1:
        raise ValueError(f"position {position!r} reads {m}-D positions; {_TOKENS}")


def _check_eos(eos: object, vocab_size: int) -> None:
    """eos: None or an int token id in [0, vocab_size) (a bool is not a token id)."""
    if eos is None:
        return
    if isinstance(eos, bool) or not isinstance(eos, int):
        raise TypeError(
            f"eos must be None or an int token id in [0, {vocab_size}), got "
            f"{type(eos).__name__} {eos!r}"
        )
    if not 0 <= eos < vocab_size:
        raise ValueError(f"eos must be None or a token id in [0, {vocab_size}), got {eos}")


def _cache_refusal(enc: InAttentionEncoding) -> str:
    """Why `enc`'s keys cannot be cached, naming the option to change."""
    if getattr(enc, "scaling", None) is not None and getattr(enc, "factor", 0) is None:
        return (
            f"position_options['factor']: scaling={enc.scaling!r} with factor=None rescales by "  # type: ignore[attr-defined]
            "each call's span (max(1, L / train_length)), so cached keys would change as the "
            "text grows; give a fixed factor to decode with a cache, or generate(cache=False)"
        )
    if getattr(enc, "xpos", False) and getattr(enc, "xpos_center", 0) is None:
        return (
            "position_options['xpos_center']: xPos without xpos_center centres q and k on each "
            "call's positions, so cached keys would be scaled for another centre; give "
            "xpos_center (e.g. 0.0), or generate(cache=False)"
        )
    return f"a key/value cache needs {getattr(enc, 'cacheable_rule', 'no active augmentation')}"


class CausalLM(nn.Module):
    """Decoder-only Transformer LM: `CausalLM(vocab, position="rotary", position_options={...})`.

    vocab_size: V tokens. dim, heads, ffn_dim: width D (divisible by heads), attention heads,
    FFN hidden size. layers: depth. dropout: on the embeddings, attention probabilities, FFN
    and residuals. position: a 1-D `cape.build` name (nopos, sinpos, cape1d, abspos, relpos,
    rotary, alibi, fire); position_options: its options over the defaults (module docstring),
    e.g. {"augmentation": cape.Augmentation(...)}, {"scaling": "yarn", "factor": 4.0,
    "train_length": 512}, {"xpos": True, "xpos_center": 0.0}, {"draw": "per_layer"}.
    tie_embeddings: the output projection is the embedding table. `spec`: the constructor's
    keywords, JSON-able when the options are (`CausalLM(**model.spec)` rebuilds the model).
    """

    def __init__(
        self,
        vocab_size: int,
        *,
        dim: int = 256,
        layers: int = 4,
        heads: int = 4,
        ffn_dim: int = 1024,
        dropout: float = 0.1,
        position: str = "rotary",
        position_options: dict[str, Any] | None = None,
        tie_embeddings: bool = True,
    ) -> None:
        super().__init__()
        self.vocab_size = check_int("vocab_size", vocab_size, minimum=2)
        self.dim = check_int("dim", dim)
        for name, value in (("layers", layers), ("heads", heads), ("ffn_dim", ffn_dim)):
            check_int(name, value)
        if dim % heads:
            raise ValueError(f"dim ({dim}) must be divisible by heads ({heads})")
        dropout = check_rate("dropout", dropout)
        if not isinstance(tie_embeddings, bool):
            raise TypeError(f"tie_embeddings must be a bool, got {tie_embeddings!r}")
        encoding_class(position, key="position")  # a `cape.build` name, or a ValueError
        _check_1d(position, position_options)
        self.position = position.lower()
        self.position_options = resolve_options(self.position, position_options, _DEFAULTS)
        self._spec: dict[str, Any] = dict(
            vocab_size=vocab_size, dim=dim, layers=layers, heads=heads, ffn_dim=ffn_dim,
            dropout=dropout, position=self.position, tie_embeddings=tie_embeddings,
        )  # fmt: skip
        # the one plan: the stack adds an input encoding or builds one per layer, and draws
        # CAPE's augmentation once per forward (from shapes only: causal)
        self.plan = position_plan(
            self.position,
            dim=dim,
            heads=heads,
            options=self.position_options,
            causal=True,
            pos_dim=1,
            what=_TOKENS,
        )
        self.embed_scale = math.sqrt(dim)
        self.embed = nn.Embedding(vocab_size, dim)
        nn.init.normal_(self.embed.weight, std=dim**-0.5)  # x sqrt(D): unit-variance inputs
        self.drop = nn.Dropout(dropout)
        self.stack = TransformerEncoder(
            layers, dim, heads, ffn_dim, position=self.plan, dropout=dropout, norm_first=True,
            activation="gelu", final_norm=True, causal=True,
        )  # fmt: skip
        self.out_proj = None if tie_embeddings else nn.Linear(dim, vocab_size, bias=False)
        if self.out_proj is not None:
            nn.init.normal_(self.out_proj.weight, std=dim**-0.5)

    @property
    def spec(self) -> dict[str, Any]:
        """The constructor's keywords (position_options with the defaults filled in)."""
        return {**self._spec, "position_options": dict(self.position_options)}

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """h: [B, T, D] -> logits [B, T, V] float32 (the tied table, or the output Linear)."""
        weight = self.embed.weight if self.out_proj is None else self.out_proj.weight
        return F.linear(h, weight).float()

    def forward(
        self,
        tokens: torch.Tensor,
        mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """tokens: [B, T] ids (any integer dtype), mask: [B, T] bool (True = real; None = all
        real) -> logits [B, T, V] float32; row t predicts token t + 1 from tokens[:, : t + 1].

        positions: [B, T(, 1)] float (None = token indices, 0 at padding). generator: CAPE's
        draws in training (and layer drop's). Rows at padding are unspecified.
        """
        tokens = _check_tokens("tokens", tokens, self.vocab_size)  # int64 ids
        if mask is not None:
            _check_mask("mask", mask, tuple(tokens.shape))
        check_generator("generator", generator)  # refused even when nothing is drawn
        x = self.drop(self.embed(tokens) * self.embed_scale)
        h = self.stack(x, mask=mask, positions=positions, generator=generator)
        return self._logits(h)

    def loss(
        self,
        tokens: torch.Tensor,
        mask: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Next-token cross-entropy: tokens [B, T] ids, mask [B, T] bool (None = all real) ->
        a scalar, the mean over the predicted real tokens (token t + 1 from tokens[:, : t + 1];
        a target at padding is ignored). 0 when no token has a real predecessor."""
        logits = self(tokens, mask, generator=generator)[:, :-1]
        targets = tokens[:, 1:].long()  # any integer dtype (forward checked the ids)
        nll = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # [B, T-1]
        if mask is None:
            return nll.mean() if nll.numel() else nll.sum()
        keep = (mask[:, 1:] & mask[:, :-1]).to(nll.dtype)
        return (nll * keep).sum() / keep.sum().clamp_min(1.0)

    # -- incremental decoding --------------------------------------------------------------
    def start_cache(self) -> DecoderCache:
        """An empty key/value cache of every layer, for `step` (eval mode). Refused, naming the
        option to change, where a cached key would not stay valid (module docstring)."""
        if self.training:
            raise ValueError(
                "a key/value cache decodes in eval mode: call model.eval() first (a training "
                "forward draws dropout and CAPE's augmentation anew at every call)"
            )
        if self._samples_at_eval():
            raise ValueError(
                "a key/value cache needs positions that stay put: the augmentation samples at "
                "evaluation too (sample_at_eval=True), so every key moves at each call; use "
                "generate(cache=False)"
            )
        for enc in self.stack.modules():
            if isinstance(enc, InAttentionEncoding) and not enc.cacheable:
                raise ValueError(_cache_refusal(enc))
        return self.stack.start_cache()

    def _samples_at_eval(self) -> bool:
        augs = [self.plan.augmentation, *(getattr(m, "augmentation", None) for m in self.modules())]
        return any(a is not None and a.draws(False) for a in augs)

    @property
    def can_cache(self) -> bool:
        """Whether every in-attention encoding's keys stay valid in a cache (eval mode) and no
        augmentation samples at evaluation."""
        mods = self.stack.modules()
        cacheable = all(m.cacheable for m in mods if isinstance(m, InAttentionEncoding))
        return cacheable and not self._samples_at_eval()

    def step(self, tokens: torch.Tensor, cache: DecoderCache) -> torch.Tensor:
        """The next tokens [B, t] (t >= 1: a prompt, then one at a time), at positions
        cache.length .. cache.length + t - 1 -> logits [B, t, V] float32, equal to the full
        forward's last t rows over every token fed so far; the cache grows in place."""
        tokens = _check_tokens("tokens", tokens, self.vocab_size)  # int64 ids
        if not isinstance(cache, DecoderCache) or cache.layers != len(self.stack.layers):
            raise TypeError(f"cache must come from this model's start_cache, got {cache!r}")
        if self.training:
            raise ValueError("step decodes in eval mode: call model.eval() first")
        x = self.drop(self.embed(tokens) * self.embed_scale)
        return self._logits(self.stack(x, cache=cache))

    def generate(
        self,
        prompt: torch.Tensor,
        max_new: int,
        *,
        temperature: float = 0.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        eos: int | None = None,
        cache: bool | None = None,
        window: int | None = None,
    ) -> torch.Tensor:
        """Continue prompt [B, T0] ids (any integer dtype, T0 >= 1, no padding) by max_new
        tokens -> [B, T0 + max_new] long (int64 for max_new = 0 too), in eval mode (each
        module's mode is restored). T0 + max_new <= 2**24 without a window: token positions
        are float32, exact up to there.

        temperature: 0 = greedy (argmax); > 0 samples softmax(logits / temperature) over the
        top_k largest logits (None = all) from `generator`: a denormal temperature is the greedy
        limit, a huge one the uniform limit. eos: None or an int token id; once a row emits
        it, the row is filled with it. cache: True = the key/value cache (`start_cache`,
        refused by name where it cannot hold); False = a full forward per token (the
        reference); None = the cache where `can_cache`, else full forwards; an xPos centred on
        each call's positions (no `xpos_center`) is centred for the generation at the final
        sequence's midpoint, where it cancels in the logits, so it takes the cache too. window:
        each token from a full forward over the last `window` tokens only (a model that reads
        at most that many positions, such as a learned table's); no cache.
        """
        prompt = _check_tokens("prompt", prompt, self.vocab_size)  # int64 ids
        if prompt.shape[1] < 1:
            raise ValueError(f"prompt must hold at least one token per row, got {prompt.shape}")
        check_int("max_new", max_new, minimum=0)
        if window is None and prompt.shape[1] + max_new > MAX_TOKENS:
            raise ValueError(
                f"max_new: prompt + max_new tokens must be at most {MAX_TOKENS} (positions are "
                f"float32 token indices, exact up to 2**24), got {prompt.shape[1]} + {max_new}"
            )
        temp, top_k = check_sampling(temperature, top_k, generator, self.vocab_size)
        _check_eos(eos, self.vocab_size)
        if cache is not None and not isinstance(cache, bool):
            raise TypeError(f"cache must be True, False or None, got {cache!r}")
        if window is not None:
            check_int("window", window, minimum=1)
            if cache:
                raise ValueError("window reads the last tokens by full forwards: cache=True")
        # an xPos centred on each call's positions is centred once, on the final sequence's
        # midpoint, so that its keys stay valid in the cache (not for cache=False: the reference)
        centre = (prompt.shape[1] + max_new) // 2 if window is None and cache is not False else None
        with _eval_mode(self), centred_xpos(self, centre):
            use_cache = window is None and (self.can_cache if cache is None else cache)
            state = self.start_cache() if use_cache else None
            out = self._generate(prompt, max_new, temp, top_k, generator, eos, state, window)
        return out.clone()  # a normal tensor: an inference-mode one cannot enter autograd

    def _generate(
        self,
        prompt: torch.Tensor,
        max_new: int,
        temperature: float,
        top_k: int | None,
        generator: torch.Generator | None,
        eos: int | None,
        state: DecoderCache | None,
        window: int | None = None,
    ) -> torch.Tensor:
        """The loop of `generate` (checked arguments; state None = full forwards, over the last
        `window` tokens when given)."""
        out = prompt
        if max_new == 0:
            return out
        last = (lambda ids: ids) if window is None else (lambda ids: ids[:, -window:])
        logits = (self(last(prompt)) if state is None else self.step(prompt, state))[:, -1]
        done = torch.zeros(prompt.shape[0], dtype=torch.bool, device=prompt.device)
        for i in range(max_new):
            new = next_token(logits, temperature, top_k, generator)
            if eos is not None:  # a finished row repeats eos
                new = torch.where(done, eos, new)
                done = done | (new == eos)
            out = torch.cat([out, new[:, None]], dim=1)
            if i + 1 == max_new:
                break
            if eos is not None and bool(done.all()):  # every row ended: fill, no more forwards
                rest = out.new_full((out.shape[0], max_new - i - 1), eos)
                return torch.cat([out, rest], dim=1)
            logits = (self(last(out)) if state is None else self.step(new[:, None], state))[:, -1]
        return out

    def extra_repr(self) -> str:
        return (
            f"vocab_size={self.vocab_size}, dim={self.dim}, position={self.position!r}, "
            f"position_options={self.position_options}, tied={self.out_proj is None}"
        )
