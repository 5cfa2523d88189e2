"""Incremental decoding (key/value caches) of `Seq2Seq` and its use by greedy and beam search:
equal, to float rounding, to re-running the decoder over the full prefix."""

from __future__ import annotations

import pytest
import torch

from cape.augment import Augmentation
from cape.encodings.relative import RelPos
from cape.encodings.rotary import Rotary
from cape.models import MultiheadAttention, Seq2Seq, TransformerDecoder
from cape.models.decode_cache import AttentionCache, DecoderCache
from cape.models.search import beam_search, can_cache, greedy_decode

MT_POSITIONS = ("nopos", "sinpos", "abspos", "relpos", "cape1d", "rotary")  # translation rows

VOCAB, PAD, BOS, EOS = 13, 0, 1, 2
TINY = dict(dim=32, encoder_layers=2, decoder_layers=2, heads=2, ffn_dim=64)
ATOL = 1e-5


def _model(position: str, seed: int = 0, **kw) -> Seq2Seq:
    torch.manual_seed(seed)
    # max_distance 4 < the target lengths: relpos's clipped buckets are exercised
    opts = {"max_distance": 4.0} if position == "relpos" else None
    return Seq2Seq(VOCAB, position=position, position_options=opts, **{**TINY, **kw}).eval()


def _mask(lengths: list[int], width: int) -> torch.Tensor:
    return torch.arange(width)[None] < torch.tensor(lengths)[:, None]


def _tokens(batch: int, length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, length), generator=g)


def _steps(model: Seq2Seq, state: DecoderCache, tokens: torch.Tensor) -> torch.Tensor:
    """Feed tokens [B, T] one by one -> logits [B, T, V]."""
    return torch.stack(
        [model.decode_step(tokens[:, t : t + 1], state)[0] for t in range(tokens.shape[1])], 1
    )


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("position", MT_POSITIONS)
def test_steps_equal_teacher_forced_decode(position: str, tied: bool) -> None:
    model = _model(position, tie_embeddings=tied)
    src, src_mask = _tokens(4, 10, 1), _mask([10, 6, 3, 1], 10)
    tgt = _tokens(4, 12, 2)
    with torch.inference_mode():
        memory = model.encode(src, src_mask)
        full = model.decode(tgt, memory, src_mask)
        state = model.start_decoding(memory, src_mask)
        steps = _steps(model, state, tgt)
    assert state.length == 12
    assert steps.shape == full.shape and steps.dtype == torch.float32
    torch.testing.assert_close(steps, full, rtol=0, atol=ATOL)


@pytest.mark.parametrize("position", MT_POSITIONS)
def test_reorder_then_step_equals_reordered_batch(position: str) -> None:
    model = _model(position, tie_embeddings=False)
    src, src_mask = _tokens(3, 8, 3), _mask([8, 5, 2], 8)
    tgt = _tokens(3, 7, 4)
    index = torch.tensor([2, 0, 0, 1, 2])  # repeats, a permutation and a changed batch size
    with torch.inference_mode():
        memory = model.encode(src, src_mask)
        state = model.start_decoding(memory, src_mask)
        _steps(model, state, tgt[:, :4])
        state.reorder(index)
        after = _steps(model, state, tgt[index, 4:])
        fresh = model.start_decoding(memory[index], src_mask[index])
        expected = _steps(model, fresh, tgt[index])[:, 4:]
    torch.testing.assert_close(after, expected, rtol=0, atol=ATOL)


def _biased(position: str) -> Seq2Seq:
    """A random model whose EOS is unlikely early: outputs run for many steps."""
    model = _model(position, tie_embeddings=False)
    with torch.no_grad():
        assert model.out_proj is not None
        model.out_proj.weight[EOS] -= 0.3 * model.out_proj.weight[EOS].abs().mean()
    return model


@pytest.mark.parametrize("position", MT_POSITIONS)
def test_greedy_matches_full_recompute(position: str) -> None:
    model = _biased(position)
    src, src_mask = _tokens(5, 9, 5), _mask([9, 7, 4, 2, 9], 9)
    limits = torch.tensor([20, 3, 0, 15, 25])
    got = greedy_decode(model, src, src_mask, bos_id=BOS, eos_id=EOS, max_len=limits)
    ref = greedy_decode(model, src, src_mask, bos_id=BOS, eos_id=EOS, max_len=limits, cache=False)
    assert got == ref
    assert max(len(r) for r in ref) > 10


@pytest.mark.parametrize("beam,penalty", [(1, 1.0), (4, 1.0), (3, 0.5)])
@pytest.mark.parametrize("position", MT_POSITIONS)
def test_beam_search_matches_full_recompute(position: str, beam: int, penalty: float) -> None:
    model = _biased(position)
    src, src_mask = _tokens(6, 9, 6), _mask([9, 7, 4, 2, 9, 1], 9)
    kw = dict(bos_id=BOS, eos_id=EOS, beam=beam, max_len_a=1.5, max_len_b=4, length_penalty=penalty)
    got = beam_search(model, src, src_mask, **kw)
    ref = beam_search(model, src, src_mask, **kw, cache=False)
    assert got == ref
    assert len({len(r) for r in ref}) > 1  # sentences finish at different steps (batch shrinks)


def test_search_restores_training_mode_and_empty_batch() -> None:
    model = _model("relpos").train()
    src, src_mask = _tokens(2, 5, 7), _mask([5, 3], 5)
    beam_search(model, src, src_mask, bos_id=BOS, eos_id=EOS, beam=2)
    assert model.training
    empty = torch.zeros(0, 4, dtype=torch.long)
    assert beam_search(model, empty, empty.bool(), bos_id=BOS, eos_id=EOS) == []
    assert greedy_decode(model, src, src_mask, bos_id=BOS, eos_id=EOS, max_len=0) == [[], []]


@pytest.mark.parametrize("kind", ["plain", "relpos", "rotary"])
def test_decoder_chunks_with_padding_equal_full_pass(kind: str) -> None:
    """TransformerDecoder with a cache fed in chunks (padding in the last one)."""
    torch.manual_seed(1)

    def factory() -> torch.nn.Module:
        return RelPos(8, max_distance=3.0) if kind == "relpos" else Rotary(8)

    dec = TransformerDecoder(
        2, 16, 2, 32, relative_factory=None if kind == "plain" else factory
    ).eval()
    x, memory = torch.randn(3, 9, 16), torch.randn(3, 5, 16)
    mask, memory_mask = _mask([9, 9, 6], 9), _mask([5, 2, 4], 5)
    with torch.inference_mode():
        full = dec(x, memory, mask=mask, memory_mask=memory_mask)
        cache = dec.start_cache(memory, memory_mask)
        parts = [
            dec(x[:, a:b], None, mask=mask[:, a:b], cache=cache)
            for a, b in ((0, 4), (4, 5), (5, 9))
        ]
    assert cache.length == 9
    got = torch.cat(parts, dim=1)
    torch.testing.assert_close(got[mask], full[mask], rtol=0, atol=ATOL)


def test_attention_without_cache_is_unchanged_and_cache_checks() -> None:
    torch.manual_seed(2)
    attn = MultiheadAttention(
        16, 2, rotary=Rotary(8, augmentation=Augmentation(normalize=True))
    ).eval()
    x = torch.randn(2, 3, 16)
    with pytest.raises(ValueError, match="augmentation"):
        attn(x, causal=True, cache=AttentionCache())
    plain = MultiheadAttention(16, 2).eval()
    with pytest.raises(ValueError, match="key_value"):
        plain(x, x, cache=AttentionCache())
    with pytest.raises(ValueError, match="needs key_value"):
        plain(x, cache=AttentionCache(static=True))
    model = _model("cape1d")
    state = model.start_decoding(torch.randn(2, 4, 32), _mask([4, 2], 4))
    with pytest.raises(ValueError, match=r"\[B, 1\]"):
        model.decode_step(_tokens(2, 2, 0), state)


# rotary options whose key rotation reads each call's positions (xPos's centre, a per-call
# scaling factor) cannot be cached; a fixed factor can, and the searches centre an xPos once
_PER_CALL = {
    "xpos": dict(xpos=True, xpos_scale_base=8.0),
    "yarn-per-call": dict(scaling="yarn", train_length=4.0),
}


def _per_call_model(kind: str) -> Seq2Seq:
    """A random rotary model with a per-call option of `_PER_CALL` whose EOS is unlikely early."""
    torch.manual_seed(0)
    options = {"augmentation": None, **_PER_CALL[kind]}
    model = Seq2Seq(
        VOCAB, position="rotary", position_options=options, tie_embeddings=False, **TINY
    ).eval()
    with torch.no_grad():
        assert model.out_proj is not None
        model.out_proj.weight[EOS] -= 0.3 * model.out_proj.weight[EOS].abs().mean()
    return model


@pytest.mark.parametrize("kind", sorted(_PER_CALL))
def test_per_call_rotary_refuses_the_cache_and_searches_match_prefix_runs(kind: str) -> None:
    model = _per_call_model(kind)
    assert not can_cache(model)
    src, src_mask = _tokens(3, 9, 5), _mask([9, 4, 7], 9)
    with torch.inference_mode():
        memory = model.encode(src, src_mask)
        state = model.start_decoding(memory, src_mask)
        with pytest.raises(ValueError, match="no xPos"):  # the attention refuses, naming why
            model.decode_step(_tokens(3, 1, 0), state)
        got = greedy_decode(model, src, src_mask, bos_id=BOS, eos_id=EOS, max_len=12)
        # greedy by hand: the argmax of the teacher-forced logits of the prefix, step by step
        tokens = torch.full((3, 1), BOS)
        for _ in range(12):
            nxt = model.decode(tokens, memory, src_mask)[:, -1].argmax(-1)
            tokens = torch.cat([tokens, nxt[:, None]], 1)
    for row, out in zip(tokens[:, 1:].tolist(), got, strict=True):
        expected = row[: row.index(EOS)] if EOS in row else row
        assert out == expected
    assert max(len(g) for g in got) > 5
    beams = beam_search(model, src, src_mask, bos_id=BOS, eos_id=EOS, beam=3, max_len_b=10)
    ref = beam_search(
        model, src, src_mask, bos_id=BOS, eos_id=EOS, beam=3, max_len_b=10, cache=False
    )
    assert beams == ref


def test_search_centres_an_xpos_for_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy and beam search centre an xPos without xpos_center once for the whole search:
    they decode with the cache (decode_step, not a decoder run per prefix), give the
    reference's outputs, and leave the model uncentred."""
    model = _per_call_model("xpos")
    src, src_mask = _tokens(3, 9, 5), _mask([9, 4, 7], 9)
    ref_greedy = greedy_decode(
        model, src, src_mask, bos_id=BOS, eos_id=EOS, max_len=12, cache=False
    )
    kw = dict(bos_id=BOS, eos_id=EOS, beam=3, max_len_b=10)
    ref_beams = beam_search(model, src, src_mask, **kw, cache=False)
    calls = {"step": 0}
    step = Seq2Seq.decode_step

    def counted(self, tokens, state):
        calls["step"] += 1
        return step(self, tokens, state)

    monkeypatch.setattr(Seq2Seq, "decode_step", counted)
    assert greedy_decode(model, src, src_mask, bos_id=BOS, eos_id=EOS, max_len=12) == ref_greedy
    assert calls["step"] > 5
    calls["step"] = 0
    assert beam_search(model, src, src_mask, **kw) == ref_beams
    assert calls["step"] > 5
    assert max(len(g) for g in ref_greedy) > 5
    xpos = [m for m in model.modules() if isinstance(m, Rotary) and m.xpos]
    assert xpos and all(m.xpos_center is None for m in xpos)


def _cached_steps_match(options: dict) -> None:
    """A rotary decoder with `options` can cache, and its steps equal the teacher-forced pass."""
    torch.manual_seed(0)
    model = Seq2Seq(VOCAB, position="rotary", position_options=options, **TINY).eval()
    assert can_cache(model)
    src, src_mask = _tokens(2, 6, 1), _mask([6, 3], 6)
    tgt = _tokens(2, 9, 2)
    with torch.inference_mode():
        memory = model.encode(src, src_mask)
        full = model.decode(tgt, memory, src_mask)
        steps = _steps(model, model.start_decoding(memory, src_mask), tgt)
    torch.testing.assert_close(steps, full, rtol=0, atol=ATOL)


def test_fixed_factor_rotary_caches() -> None:
    _cached_steps_match(
        {"augmentation": None, "scaling": "yarn", "train_length": 4.0, "factor": 3.0}
    )


def test_xpos_with_a_fixed_center_caches_and_keeps_the_logits() -> None:
    """xpos_center fixes xPos's common offset: the cache then holds valid keys, and the logits
    equal those of the per-call midpoint (the offset cancels in q.k)."""
    _cached_steps_match(
        {"augmentation": None, "xpos": True, "xpos_scale_base": 64.0, "xpos_center": 0.0}
    )
    rot = Rotary(8, xpos=True, xpos_scale_base=16.0, xpos_center=5.0)
    mid = Rotary(8, xpos=True, xpos_scale_base=16.0)
    q, k = torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 8)
    pos = torch.arange(7.0)[None] * 3
    a, b = rot(q, k, positions=pos), mid(q, k, positions=pos)
    assert not torch.allclose(a[0], b[0])  # other scales on q ...
    torch.testing.assert_close(a[0] @ a[1].transpose(-1, -2), b[0] @ b[1].transpose(-1, -2))
