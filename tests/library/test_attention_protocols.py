"""The two protocols inside attention: one q/k transform, a list of additive biases."""

from __future__ import annotations

import math

import pytest
import torch

import cape
from cape.encodings.in_attention import AttentionBias, QKTransform
from cape.functional.relative import relpos_attention
from cape.models import MultiheadAttention, TransformerEncoder
from cape.models.decode_cache import AttentionCache

D, H = 16, 2
HD = D // H


def _heads(att: MultiheadAttention, x: torch.Tensor):
    split = att._split
    return split(att.q_proj(x)), split(att.k_proj(x)), split(att.v_proj(x))


def _merge(att: MultiheadAttention, out: torch.Tensor) -> torch.Tensor:
    b, _, t, _ = out.shape
    return att.out_proj(out.transpose(1, 2).reshape(b, t, D))


def test_every_in_attention_encoding_declares_one_protocol() -> None:
    for name in ("rotary", "rotary2d", "rope-axial", "relpos", "alibi", "fire"):
        size = H if name in ("alibi", "fire") else HD
        enc = cape.build(name, size, **({"heads": H} if name == "rope-mixed" else {}))
        assert isinstance(enc, QKTransform) != isinstance(enc, AttentionBias), name
        assert enc.kind == "attention"


def test_rotary_and_alibi_add_up_as_a_manual_softmax() -> None:
    torch.manual_seed(0)
    rot, alibi = cape.Rotary(HD), cape.ALiBi(H)
    att = MultiheadAttention(D, H, rotary=rot, biases=[alibi]).eval()
    x = torch.randn(2, 7, D)
    mask = cape.lengths_to_mask(torch.tensor([7, 4]), 7)
    q, k, v = _heads(att, x)
    q, k = rot(q, k, mask=mask)
    pos = torch.arange(7.0)
    bias = -alibi.slopes[:, None, None] * (pos[:, None] - pos[None, :]).abs()  # [H, T, T]
    logits = q @ k.transpose(-2, -1) / math.sqrt(HD) + bias
    logits = logits.masked_fill(~mask[:, None, None, :], float("-inf"))
    want = _merge(att, logits.softmax(-1) @ v)
    torch.testing.assert_close(att(x, key_mask=mask), want, atol=1e-5, rtol=1e-5)


def test_two_biases_sum() -> None:
    torch.manual_seed(0)
    alibi, fire = cape.ALiBi(H), cape.FIRE(H)
    both = MultiheadAttention(D, H, biases=[alibi, fire]).eval()
    x = torch.randn(2, 6, D)
    q, k, v = _heads(both, x)
    pos = torch.arange(6.0)[None]
    bias = alibi(pos) + fire(pos)
    want = _merge(both, torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(HD) + bias, -1) @ v)
    torch.testing.assert_close(both(x), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_relpos_with_values_is_shaws_attention(causal: bool) -> None:
    torch.manual_seed(0)
    rel = cape.RelPos(HD, max_distance=3, values=True)
    torch.nn.init.normal_(rel.rel_value)
    att = MultiheadAttention(D, H, biases=[rel]).eval()
    x = torch.randn(2, 8, D)
    mask = cape.lengths_to_mask(torch.tensor([8, 5]), 8)
    q, k, v = _heads(att, x)
    index = rel.index(torch.arange(8.0)[None])
    ref = relpos_attention(
        q, k, v, rel.rel_key, index, rel.rel_value, key_padding_mask=mask, is_causal=causal
    )
    out = att(x, key_mask=mask, causal=causal)
    real = mask[..., None]
    torch.testing.assert_close(out * real, _merge(att, ref) * real, atol=1e-5, rtol=1e-5)


def test_a_full_call_equals_its_incremental_calls() -> None:
    """One path: the full causal call and token-by-token calls on a kept cache agree."""
    torch.manual_seed(0)
    att = MultiheadAttention(D, H, rotary=cape.Rotary(HD), biases=[cape.ALiBi(H)]).eval()
    x = torch.randn(2, 6, D)
    full = att(x, causal=True)
    cache = AttentionCache()
    steps = [att(x[:, t : t + 1], causal=True, cache=cache) for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    assert cache.length == 6


def test_stack_factory_may_return_a_rotary_and_a_bias() -> None:
    enc = TransformerEncoder(2, D, H, 32, relative_factory=lambda: [cape.Rotary(HD), cape.ALiBi(H)])
    for layer in enc.layers:
        assert isinstance(layer.self_attn.rotary, cape.Rotary)
        assert [type(b) for b in layer.self_attn.biases] == [cape.ALiBi]
    with pytest.raises(TypeError, match="at most one q/k transform"):
        TransformerEncoder(1, D, H, 32, relative_factory=lambda: [cape.Rotary(HD)] * 2)


def test_the_former_slots_are_gone() -> None:
    """`relative=` / `position_bias=` were deprecated before any release: `biases=` only."""
    with pytest.raises(TypeError, match="relative"):
        MultiheadAttention(D, H, relative=cape.RelPos(HD, 4))  # type: ignore[call-arg]


def test_slots_refuse_the_other_protocol() -> None:
    with pytest.raises(TypeError, match="rotary must be a q/k transform"):
        MultiheadAttention(D, H, rotary=cape.ALiBi(H))
    with pytest.raises(TypeError, match=r"biases\[0\] must be an attention bias"):
        MultiheadAttention(D, H, biases=[cape.Rotary(HD)])
    with pytest.raises(ValueError, match="at most one bias may add values"):
        MultiheadAttention(D, H, biases=[cape.RelPos(HD, values=True)] * 2)


def test_positions_with_the_wrong_number_of_coordinates_are_refused_by_name() -> None:
    """Checked once at the attention's (or the stack's) boundary: the encodings inside then
    skip their own checks, so the boundary names the argument."""
    att = MultiheadAttention(32, 4, rotary=cape.build("rotary2d", 8))
    with pytest.raises(ValueError, match=r"q_positions must have 2 coordinate"):
        att(torch.randn(1, 5, 32), q_positions=torch.randn(1, 5))
    enc = TransformerEncoder(1, 32, 4, 64, position="rotary2d")
    with pytest.raises(ValueError, match=r"^positions must have 2 coordinate"):
        enc(torch.randn(1, 5, 32), positions=torch.randn(1, 5, 1))
    alibi = MultiheadAttention(32, 4, biases=[cape.ALiBi(4)])
    with pytest.raises(ValueError, match=r"q_positions must have 1 coordinate"):
        alibi(torch.randn(1, 5, 32), q_positions=torch.randn(1, 5, 2))
