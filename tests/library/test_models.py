"""cape.models: attention with masks, Transformer stacks with every kind of position."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

import cape
from cape.models import (
    MultiheadAttention,
    TransformerDecoder,
    TransformerEncoder,
    TransformerEncoderLayer,
)

D, H, B, T = 32, 4, 3, 8
HD = D // H


def _mask(lengths: list[int], length: int = T) -> torch.Tensor:
    return cape.lengths_to_mask(torch.tensor(lengths), length)


def _factory(kind: str):
    if kind == "relpos":
        return lambda: cape.build("relpos", HD, max_distance=4, values=True)
    if kind == "rotary":
        return lambda: cape.build("rotary", HD)
    return None


def _encoder(kind: str, **options) -> TransformerEncoder:
    position = cape.build(kind, D) if kind in ("nopos", "sinpos", "cape1d") else None
    if kind == "cape1d":
        position = cape.build("cape1d", D, max_global_shift=3.0, max_local_shift=0.4)
    options.setdefault("dropout", 0.0)
    return TransformerEncoder(
        2, D, H, 2 * D, position=position, relative_factory=_factory(kind), **options
    )


# -- attention ------------------------------------------------------------------------------
def _naive(att: MultiheadAttention, q_in, kv_in, key_mask, causal):
    def split(x):
        return x.view(x.shape[0], x.shape[1], H, HD).transpose(1, 2)

    q, k, v = split(att.q_proj(q_in)), split(att.k_proj(kv_in)), split(att.v_proj(kv_in))
    logits = q @ k.transpose(-1, -2) / math.sqrt(HD)
    allowed = torch.ones(logits.shape, dtype=torch.bool)
    if key_mask is not None:
        allowed = allowed & key_mask[:, None, None, :]
    if causal:
        allowed = allowed & torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril()
    probs = torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1).nan_to_num(0.0)
    out = (probs @ v).transpose(1, 2).reshape(q_in.shape)
    return att.out_proj(out)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_attention_matches_naive_softmax(causal, masked):
    torch.manual_seed(0)
    att = MultiheadAttention(D, H)
    x = torch.randn(B, T, D)
    key_mask = _mask([8, 5, 2]) if masked else None
    out = att(x, key_mask=key_mask, causal=causal)
    assert out.shape == (B, T, D)
    torch.testing.assert_close(out, _naive(att, x, x, key_mask, causal), atol=1e-5, rtol=1e-5)
    mem = torch.randn(B, 5, D)  # cross-attention, Tq != Tk
    mem_mask = _mask([5, 1, 3], 5) if masked else None
    torch.testing.assert_close(
        att(x, mem, key_mask=mem_mask), _naive(att, x, mem, mem_mask, False), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("kind", ["plain", "relpos", "rotary"])
def test_rows_without_keys_give_zero(kind):
    torch.manual_seed(0)
    rel = _factory(kind)
    opts = {"biases": [rel()]} if kind == "relpos" else {"rotary": rel()} if rel else {}
    att = MultiheadAttention(D, H, bias=False, **opts)
    x = torch.randn(B, T, D, requires_grad=True)
    key_mask = _mask([8, 0, 3])
    out = att(x, key_mask=key_mask, causal=True)
    assert torch.isfinite(out).all()
    assert out[1].abs().max() == 0  # sample 1 has no real key at all
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_attention_rotary_cross_attention_defaults_to_token_positions():
    att = MultiheadAttention(D, H, rotary=cape.Rotary(HD))
    out = att(torch.randn(B, T, D), torch.randn(B, 5, D), key_mask=_mask([5, 4, 1], 5))
    assert out.shape == (B, T, D) and torch.isfinite(out).all()


# -- stacks ---------------------------------------------------------------------------------
def test_shapes_encoder_decoder():
    enc = _encoder("relpos")
    dec = TransformerDecoder(2, D, H, 2 * D, position=cape.build("sinpos", D), dropout=0.0)
    x, y = torch.randn(B, T, D), torch.randn(B, 5, D)
    mem = enc(x, mask=_mask([8, 6, 4]))
    assert mem.shape == (B, T, D)
    assert dec(y, mem, mask=_mask([5, 5, 2], 5), memory_mask=_mask([8, 6, 4])).shape == (B, 5, D)


@pytest.mark.parametrize("norm_first", [True, False])
def test_pre_and_post_norm_train_on_reverse_task(norm_first):
    torch.manual_seed(0)
    vocab = 10
    model = nn.ModuleDict(
        {
            "emb": nn.Embedding(vocab, D),
            "enc": _encoder("sinpos", norm_first=norm_first),
            "head": nn.Linear(D, vocab),
        }
    )
    assert (model["enc"].norm is not None) == norm_first  # final norm only for pre-norm
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        tokens = torch.randint(0, vocab, (32, T))
        logits = model["head"](model["enc"](model["emb"](tokens)))
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flip(1).flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5


@pytest.mark.parametrize(
    "kind,layers",
    [
        ("nopos", "all"),
        ("cape1d", "all"),
        ("relpos", "all"),
        ("relpos", "first"),
        ("rotary", "all"),
    ],
)
@pytest.mark.parametrize("train", [False, True])
def test_padding_does_not_influence_real_tokens(kind, layers, train):
    torch.manual_seed(0)
    enc = _encoder(kind, relative_layers=layers).train(train)
    if kind == "relpos":
        n_rel = sum(isinstance(m, cape.RelPos) for m in enc.modules())
        assert n_rel == (1 if layers == "first" else 2)
        assert isinstance(enc.layers[0].self_attn.biases[0], cape.RelPos)
    mask = _mask([8, 5, 3])
    x = torch.randn(B, T, D)
    noisy = torch.where(mask[..., None], x, 100 * torch.randn(B, T, D))
    out = enc(x, mask=mask, generator=torch.Generator().manual_seed(1))
    out2 = enc(noisy, mask=mask, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(out[mask], out2[mask], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["nopos", "sinpos", "relpos", "rotary"])
def test_decoder_is_causal(kind):
    torch.manual_seed(0)
    position = cape.build(kind, D) if kind in ("nopos", "sinpos") else None
    dec = TransformerDecoder(
        2, D, H, 2 * D, position=position, relative_factory=_factory(kind), dropout=0.0
    ).eval()
    mem, y = torch.randn(B, 6, D), torch.randn(B, T, D)
    out = dec(y, mem, memory_mask=_mask([6, 4, 2], 6))
    for t in range(T - 1):
        changed = y.clone()
        changed[:, t + 1 :] = torch.randn(B, T - t - 1, D)
        out2 = dec(changed, mem, memory_mask=_mask([6, 4, 2], 6))
        torch.testing.assert_close(out[:, : t + 1], out2[:, : t + 1], atol=1e-5, rtol=1e-5)
        assert not torch.allclose(out[:, t + 1 :], out2[:, t + 1 :])


@pytest.mark.parametrize("causal", [True, False])
def test_encoder_causal_flag_hides_the_future_only_when_set(causal):
    torch.manual_seed(0)
    enc = TransformerEncoder(
        2, D, H, 2 * D, position=cape.build("sinpos", D), dropout=0.0, causal=causal
    ).eval()
    mask = _mask([8, 5, 3])
    x = torch.randn(B, T, D)
    out = enc(x, mask=mask)
    t = 2
    changed = x.clone()
    changed[:, t + 1 :] = torch.randn(B, T - t - 1, D)
    out2 = enc(changed, mask=mask)
    # causal: outputs up to t see only inputs up to t; otherwise every output sees the change
    assert torch.allclose(out[:, : t + 1], out2[:, : t + 1], atol=1e-5) == causal
    with pytest.raises(TypeError, match="causal must be a bool"):
        TransformerEncoder(1, D, H, 2 * D, causal=1)


@pytest.mark.parametrize("norm_first", [True, False])
def test_layer_drop_skips_ffn_in_training_only(norm_first):
    torch.manual_seed(0)
    enc = _encoder("sinpos", layer_drop=1.0, norm_first=norm_first)
    zeroed = copy.deepcopy(enc)
    for layer in zeroed.layers:  # an FFN whose output is 0
        nn.init.zeros_(layer.ffn[-1].weight)
        nn.init.zeros_(layer.ffn[-1].bias)
    calls = []
    enc.layers[0].ffn.register_forward_hook(lambda *_: calls.append(1))
    x, mask = torch.randn(B, T, D), _mask([8, 7, 2])
    out = enc.train()(x, mask=mask)
    assert not calls  # dropped branches are not computed
    torch.testing.assert_close(out, zeroed.train()(x, mask=mask))
    kept = enc.eval()(x, mask=mask)
    assert calls
    full = copy.deepcopy(enc)
    for layer in full.layers:
        layer.layer_drop = 0.0
    torch.testing.assert_close(kept, full.eval()(x, mask=mask))
    assert not torch.allclose(kept, zeroed.eval()(x, mask=mask))


def test_layer_drop_draws_from_cpu_generator():
    torch.manual_seed(0)
    layer = TransformerEncoderLayer(D, H, 2 * D, dropout=0.0, layer_drop=0.5).train()
    x = torch.randn(B, T, D)
    outs = [layer(x, generator=torch.Generator().manual_seed(s)) for s in range(8)]
    again = [layer(x, generator=torch.Generator().manual_seed(s)) for s in range(8)]
    layer.layer_drop = 1.0
    dropped = layer(x)
    layer.layer_drop = 0.0
    kept = layer(x)
    for a, b in zip(outs, again, strict=True):
        assert torch.equal(a, b)  # the same seed makes the same decision
        assert torch.equal(a, dropped) or torch.equal(a, kept)  # one draw for the whole batch
    assert any(torch.equal(o, dropped) for o in outs) and any(torch.equal(o, kept) for o in outs)


@pytest.mark.parametrize("kind", ["cape1d", "relpos", "rotary"])
def test_bf16_autocast_forward_is_finite(kind):
    torch.manual_seed(0)
    enc = _encoder(kind).train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = enc(torch.randn(B, T, D), mask=_mask([8, 4, 0]))
    assert torch.isfinite(out).all()


def test_position_kwargs_reach_the_absolute_encoding():
    enc = TransformerEncoder(1, D, H, 2 * D, position=cape.build("cape1d", D, freq_scale=30.0))
    enc.eval()
    x = torch.randn(B, T, D)
    a = enc(x, position_kwargs={"hop": 0.01})
    b = enc(x, positions=cape.timestamps(B, T, 0.01))
    torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="mask"):
        enc(x, mask=_mask([8, 8, 8]), position_kwargs={"mask": _mask([8, 8, 8])})
    vit = TransformerEncoder(1, D, H, 2 * D, position=cape.build("cape2d", D)).eval()
    assert vit(torch.randn(2, 12, D), position_kwargs={"grid": (3, 4)}).shape == (2, 12, D)


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="dim"):
        MultiheadAttention(30, 4)
    with pytest.raises(ValueError, match="dim"):
        TransformerEncoder(2, 30, 4, 64)
    with pytest.raises(ValueError, match="layer_drop"):
        TransformerEncoderLayer(D, H, 64, layer_drop=1.5)
    with pytest.raises(ValueError, match="layer_drop"):
        TransformerEncoder(2, D, H, 64, layer_drop=-0.1)
    with pytest.raises(ValueError, match="relative_layers"):
        TransformerEncoder(2, D, H, 64, relative_layers="last")
    with pytest.raises(ValueError, match="head_dim"):
        MultiheadAttention(D, H, biases=[cape.RelPos(HD * 2)])
    with pytest.raises(TypeError, match="relative_factory"):
        TransformerEncoder(2, D, H, 64, relative_factory=lambda: nn.Identity())
