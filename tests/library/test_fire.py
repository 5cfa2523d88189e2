"""FIRE (Li et al., ICLR 2024): normalised distances, bias, attention, models. Expected values
are computed here independently (float64 loops of the paper's formula and of our bidirectional
form, the module's MLP applied by hand)."""

from __future__ import annotations

import math

import pytest
import torch

import cape
from cape.functional import fire_bias, fire_distance
from cape.models import CTCModel, MultiheadAttention, Seq2Seq, TransformerEncoder, ViT
from cape.models.decode_cache import AttentionCache

EPS = 1e-6  # the paper's code's epsilon in the denominator


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def loop_distance(qp, kp, c, lim, causal=False, seen=None):
    """psi(d_ij) / (psi(max(L, max_{j seen} d_ij)) + eps) by a float64 loop -> [B, Tq, Tk].
    seen: None or bool [B, Tq, Tk], the keys each query sees."""
    b, tq, tk = max(qp.shape[0], kp.shape[0]), qp.shape[1], kp.shape[1]
    out = torch.zeros(b, tq, tk, dtype=torch.float64)
    for n in range(b):
        for i in range(tq):
            d = []
            for j in range(tk):
                x = float(qp[min(n, qp.shape[0] - 1), i]) - float(kp[min(n, kp.shape[0] - 1), j])
                d.append(max(x, 0.0) if causal else abs(x))
            far = max([d[j] for j in range(tk) if seen is None or seen[n, i, j]], default=0.0)
            norm = math.log(abs(c) * max(abs(lim), far) + 1.0) + EPS
            for j in range(tk):
                out[n, i, j] = math.log(abs(c) * d[j] + 1.0) / norm
    return out


def loop_mlp(fire, r):
    """The module's MLP applied by hand to every r_ij: [B, Tq, Tk] -> [B, H, Tq, Tk] float64."""
    w1, b1 = fire.mlp[0].weight.detach().double(), fire.mlp[0].bias.detach().double()
    w2, b2 = fire.mlp[2].weight.detach().double(), fire.mlp[2].bias.detach().double()
    b, tq, tk = r.shape
    out = torch.zeros(b, fire.heads, tq, tk, dtype=torch.float64)
    for n in range(b):
        for i in range(tq):
            for j in range(tk):
                hidden = torch.relu(w1[:, 0] * float(r[n, i, j]) + b1)
                out[n, :, i, j] = w2 @ hidden + b2
    return out


# -- normalised distance ----------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_distance_equals_the_float64_loop(causal: bool) -> None:
    qp, kp = rand(2, 4, seed=1) * 3, rand(2, 6, seed=2) * 3
    got = fire_distance(qp, kp, 0.7, 1.5, causal=causal)
    assert got.shape == (2, 4, 6) and got.dtype == torch.float32
    want = loop_distance(qp, kp, 0.7, 1.5, causal)
    torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=0)
    # a key mask leaves padded keys out of the normaliser; [B, T, 1] and batch-1 positions too
    k_mask = torch.tensor([[True] * 6, [True] * 3 + [False] * 3])
    got = fire_distance(qp[:1, :, None], kp[:1], 0.7, 0.2, causal, k_mask=k_mask)
    seen = k_mask[:, None, :].expand(2, 4, 6)
    want = loop_distance(qp[:1].expand(2, 4), kp[:1].expand(2, 6), 0.7, 0.2, causal, seen)
    torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=0)


def test_token_indices_give_the_papers_causal_formula() -> None:
    t, c, lim = 12, 0.3, 4.0
    idx = torch.arange(float(t))[None]
    got = fire_distance(idx, idx, c, lim, causal=True)[0]
    for i in range(t):
        for j in range(i + 1):  # psi(i - j) / psi(max(L, i)), psi(x) = log(c x + 1)
            want = math.log(c * (i - j) + 1) / (math.log(c * max(lim, i) + 1) + EPS)
            assert float(got[i, j]) == pytest.approx(want, abs=1e-6)
        assert bool((got[i, i + 1 :] == 0).all())  # keys ahead: distance 0 (masked anyway)


@pytest.mark.parametrize("causal", [False, True])
def test_distance_lies_in_the_unit_interval_and_absorbs_a_change_of_units(causal: bool) -> None:
    pos = torch.sort(rand(3, 9, seed=3).abs() * 20, dim=1).values
    r = fire_distance(pos, pos, 0.5, 2.0, causal)
    assert bool((r >= 0).all()) and bool((r <= 1).all())
    # the farthest key of a query whose reach exceeds L sits at r = psi(n) / (psi(n) + eps) ~ 1
    last = r[:, -1, 0]  # the last query's farthest key is the first one, in both forms
    far = (pos[:, -1] - pos[:, 0]).double()
    psi = torch.log1p(0.5 * far)
    torch.testing.assert_close(last.double(), psi / (psi + EPS), atol=1e-6, rtol=0)
    # positions x s with c / s and L x s: the same distances (seconds vs milliseconds)
    for s in (2.0, 1000.0):
        torch.testing.assert_close(fire_distance(pos * s, pos * s, 0.5 / s, 2.0 * s, causal), r)
    # a common shift changes nothing (relative positions only)
    torch.testing.assert_close(
        fire_distance(pos + 50, pos + 50, 0.5, 2.0, causal), r, atol=1e-5, rtol=0
    )


# -- bias and module --------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_bias_equals_a_loop_through_the_modules_mlp(causal: bool) -> None:
    torch.manual_seed(0)
    fire = cape.FIRE(3, hidden=8, causal=causal, c=0.4, threshold=1.0)
    qp, kp = rand(2, 5, seed=4) * 4, rand(2, 7, seed=5) * 4
    got = fire(qp, kp)
    assert got.shape == (2, 3, 5, 7) and got.dtype == torch.float32
    want = loop_mlp(fire, loop_distance(qp, kp, 0.4, 1.0, causal))
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)
    w = (fire.mlp[0].weight, fire.mlp[0].bias, fire.mlp[2].weight, fire.mlp[2].bias)
    torch.testing.assert_close(fire_bias(qp, kp, w, 0.4, 1.0, causal), got)
    # self-attention: the keys are the queries
    torch.testing.assert_close(fire(qp), fire(qp, qp))


def test_learnable_parameters_get_gradients() -> None:
    torch.manual_seed(1)
    fire = cape.FIRE(2, threshold=10.0)  # L = 10 > every reach (7): the threshold is active
    names = {n for n, _ in fire.named_parameters()}
    assert names == {"c", "threshold_scale", "mlp.0.weight", "mlp.0.bias", "mlp.2.weight",
                     "mlp.2.bias"}  # fmt: skip
    fire(torch.arange(8.0)[None]).square().sum().backward()
    for name, p in fire.named_parameters():
        assert p.grad is not None and bool(torch.isfinite(p.grad).all()), name
        assert float(p.grad.abs().sum()) > 0, name


def test_module_is_float32_and_augmented_in_training() -> None:
    enc = cape.build("fire", 4, max_global_shift=5.0, max_local_shift=0.3, max_global_scaling=1.5)
    assert isinstance(enc, cape.FIRE) and enc.heads == 4 and enc.kind == "attention"
    t = torch.arange(6.0)[None]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        shared = enc.eval()(t)
    assert shared.shape == (1, 4, 6, 6) and shared.dtype == torch.float32
    pos = t.expand(3, 6)
    drawn = enc.train()(pos, generator=torch.Generator().manual_seed(0))
    aug = enc.augmentation(pos[..., None], generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(drawn, enc.eval()(aug))  # the bias of the augmented positions
    assert not torch.allclose(drawn, shared.expand(3, -1, -1, -1))
    low = cape.FIRE(2).to(torch.bfloat16)  # bf16 weights: the bias is still computed in float32
    assert low(t).dtype == torch.float32


# -- attention --------------------------------------------------------------------------------


def manual_attention(mha, x, kv, bias, allowed):
    """softmax(QK^T / sqrt(d) + bias + mask) V in float64, then the output projection."""
    w = {n: p.detach().double() for n, p in mha.named_parameters()}
    b, tq, d = x.shape
    h, hd = mha.heads, mha.head_dim

    def proj(t, name):
        y = t.double() @ w[f"{name}.weight"].T + w[f"{name}.bias"]
        return y.view(b, -1, h, hd).transpose(1, 2)

    q, k, v = proj(x, "q_proj"), proj(kv, "k_proj"), proj(kv, "v_proj")
    logits = q @ k.transpose(-1, -2) / math.sqrt(hd) + bias.double()
    out = torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1) @ v
    return out.transpose(1, 2).reshape(b, tq, d) @ w["out_proj.weight"].T + w["out_proj.bias"]


@pytest.mark.parametrize("causal", [False, True])
def test_attention_equals_manual_softmax_with_bias_and_masks(causal: bool) -> None:
    torch.manual_seed(0)
    fire = cape.FIRE(4, hidden=8, c=0.5, threshold=1.0)
    mha = MultiheadAttention(16, 4, biases=[fire]).eval()
    x = rand(2, 5, 16, seed=6)
    key_mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    pos = torch.tensor([[0.0, 0.5, 1.0, 2.5, 3.0], [0.0, 1.0, 2.0, 3.0, 4.0]])
    got = mha(x, key_mask=key_mask, causal=causal, q_positions=pos)
    allowed = key_mask[:, None, None, :].expand(2, 1, 5, 5)
    if causal:
        allowed = allowed & torch.ones(5, 5, dtype=torch.bool).tril()
    bias = loop_mlp(fire, loop_distance(pos, pos, 0.5, 1.0, False, allowed[:, 0]))
    want = manual_attention(mha, x, x, bias, allowed)
    real = key_mask  # outputs at padded queries are unspecified
    torch.testing.assert_close(got[real].double(), want[real], atol=1e-5, rtol=0)
    # padded keys change nothing, neither their content nor their positions
    x2, pos2 = x.clone(), pos.clone()
    x2[1, 3:], pos2[1, 3:] = 100.0, 50.0
    out2 = mha(x2, key_mask=key_mask, causal=causal, q_positions=pos2)
    torch.testing.assert_close(out2[1, :3], got[1, :3])
    if causal:  # a bidirectional FIRE in causal attention never reads the keys ahead
        later = pos.clone()
        later[:, 4] = 40.0
        moved = mha(x, key_mask=key_mask, causal=True, q_positions=later)
        torch.testing.assert_close(moved[:, :4], got[:, :4])


def test_cross_attention_incremental_decoding_and_bf16_autocast() -> None:
    torch.manual_seed(2)
    mha = MultiheadAttention(8, 2, biases=[cape.FIRE(2, c=0.5, threshold=2.0)]).eval()
    x, kv = rand(2, 6, 8, seed=7), rand(2, 3, 8, seed=8)
    idx = torch.arange(6.0)[None].expand(2, 6)
    bias = loop_mlp(mha.biases[0], loop_distance(idx, idx[:, :3], 0.5, 2.0))
    want = manual_attention(mha, x, kv, bias, torch.ones(2, 1, 6, 3, dtype=torch.bool))
    torch.testing.assert_close(mha(x, kv).double(), want, atol=1e-5, rtol=0)
    full = mha(x, causal=True)
    cache = AttentionCache()
    steps = [mha(x[:, i : i + 1], causal=True, cache=cache) for i in range(6)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert mha.biases[0](idx).dtype == torch.float32
        low = mha(x)
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), mha(x), atol=0.05, rtol=0.05)


def test_models_train_a_step_with_fire() -> None:
    torch.manual_seed(3)
    enc = TransformerEncoder(2, 16, 4, 32, relative_factory=lambda: cape.FIRE(4))
    assert isinstance(enc.layers[0].self_attn.biases[0], cape.FIRE)
    models = [
        (enc, lambda m: m(rand(2, 5, 16, seed=9)).square().mean()),
        (
            Seq2Seq(12, position="fire", dim=16, heads=2, ffn_dim=32, encoder_layers=1,
                    decoder_layers=1),
            lambda m: m(torch.randint(3, 12, (2, 5)), torch.ones(2, 5, dtype=torch.bool),
                        torch.randint(3, 12, (2, 4)), torch.ones(2, 4, dtype=torch.bool)).mean(),
        ),
        (
            CTCModel(12, position="fire", position_options={"max_global_scaling": 1.2},
                     n_mels=8, dim=16, depth=1, heads=2, ffn_dim=32),
            lambda m: m(torch.randn(2, 30, 8), torch.tensor([30, 21]))[0].mean(),
        ),
    ]  # fmt: skip
    for model, loss_of in models:
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        fires = [mod for mod in model.modules() if isinstance(mod, cape.FIRE)]
        assert fires and all(f.heads in (2, 4) for f in fires)  # dim of cape.build = heads
        loss = loss_of(model)
        loss.backward()
        assert math.isfinite(float(loss.detach()))
        assert all(f.mlp[2].weight.grad is not None for f in fires)
        before = [f.mlp[2].weight.detach().clone() for f in fires]
        opt.step()
        assert any(not torch.equal(a, f.mlp[2].weight) for a, f in zip(before, fires, strict=True))
    ctc_fire = next(m for m in models[2][0].modules() if isinstance(m, cape.FIRE))
    assert float(ctc_fire.c.detach()) > 1.0  # CTC: c per second (0.1 per output frame)
    with pytest.raises(ValueError, match="position 'fire' reads 1-D positions"):
        ViT(3, position="fire", image_size=8, patch=4, dim=16, depth=1, heads=2)


# -- refused arguments ------------------------------------------------------------------------


def test_bad_arguments_name_the_argument() -> None:
    t, nan = torch.arange(4.0)[None], torch.tensor([[0.0, math.nan]])
    f2 = cape.FIRE(2)
    w = (f2.mlp[0].weight, f2.mlp[0].bias, f2.mlp[2].weight, f2.mlp[2].bias)
    cases = [
        (lambda: cape.FIRE(0), ValueError, "heads"),
        (lambda: cape.FIRE(2.0), TypeError, "heads"),
        (lambda: cape.FIRE(2, hidden=0), ValueError, "hidden"),
        (lambda: cape.FIRE(2, c=0.0), ValueError, "c"),
        (lambda: cape.FIRE(2, threshold=math.nan), ValueError, "threshold"),
        (lambda: cape.FIRE(2, causal=1), TypeError, "causal"),
        (lambda: cape.FIRE(2, augmentation="aug"), TypeError, "augmentation"),
        (lambda: cape.build("fire", 0), ValueError, "dim"),
        (lambda: fire_distance(nan, t), ValueError, "q_positions"),
        (lambda: fire_distance(t, torch.zeros(4)), ValueError, "k_positions"),
        (lambda: fire_distance(t[..., None, None], t), ValueError, "q_positions"),
        (lambda: fire_distance(torch.zeros(1, 4, 2), t), ValueError, "q_positions"),
        (lambda: fire_distance(torch.zeros(2, 4), torch.zeros(3, 4)), ValueError, "batch"),
        (lambda: fire_distance(t, t, c=math.nan), ValueError, "c"),
        (lambda: fire_distance(t, t, c="c"), TypeError, "c"),
        (lambda: fire_distance(t, t, threshold=torch.ones(2)), ValueError, "threshold"),
        (lambda: fire_distance(t, t, k_mask=torch.ones(1, 3, dtype=torch.bool)), ValueError,
         "k_mask"),
        (lambda: fire_distance(t, t, k_mask=torch.ones(1, 4)), TypeError, "k_mask"),
        (lambda: fire_distance(t * 1e37, t, c=100.0), ValueError, "positions"),
        (lambda: fire_bias(t, t, w[:3]), TypeError, "weights"),
        (lambda: fire_bias(t, t, (w[0], w[1], w[2][:, :3], w[3])), ValueError, "weights"),
        (lambda: f2(nan), ValueError, "q_positions"),
        (lambda: f2(t, k_mask=torch.ones(1, 4, dtype=torch.bool)), ValueError, "k_mask"),
        (lambda: f2(t, attn_mask=torch.ones(4, dtype=torch.bool)), ValueError, "attn_mask"),
        (lambda: f2(t, generator="g"), TypeError, "generator"),
        (lambda: MultiheadAttention(8, 2, biases=[cape.FIRE(4)]), ValueError,
         r"biases\[0\]\.heads"),
        (lambda: MultiheadAttention(8, 2, biases=[cape.FIRE(2, causal=True)])(
            torch.zeros(1, 4, 8)),
         ValueError, "bias.causal"),
    ]  # fmt: skip
    for fn, error, name in cases:
        with pytest.raises(error, match=name):
            fn()
