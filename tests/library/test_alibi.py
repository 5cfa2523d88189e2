"""ALiBi (Press et al. 2022): slopes, bias, attention, models. Expected values are computed here
independently (closed forms, float64 loops), and against x-transformers when installed."""

from __future__ import annotations

import math

import pytest
import torch

import cape
from cape.functional import alibi_bias, alibi_slopes
from cape.models import CTCModel, MultiheadAttention, Seq2Seq, TransformerEncoder, ViT


def rand(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# -- slopes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("heads", [1, 2, 4, 8, 16])
def test_slopes_of_a_power_of_two_are_the_geometric_sequence(heads: int) -> None:
    want = [2.0 ** (-8.0 * k / heads) for k in range(1, heads + 1)]
    assert alibi_slopes(heads).dtype == torch.float32
    assert alibi_slopes(heads).tolist() == pytest.approx(want, rel=1e-7)


# the paper's rule written out by hand: slopes(n) + every other slope of 2n, first H - n of them
OTHER = {
    3: [2**-4, 2**-8, 2**-2],  # slopes(2) = 2^-4, 2^-8; slopes(4)[0::2] = 2^-2, 2^-6
    5: [2**-2, 2**-4, 2**-6, 2**-8, 2**-1],  # slopes(8)[0::2] = 2^-1, 2^-3, 2^-5, 2^-7
    6: [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3],
    12: [2.0**-k for k in range(1, 9)] + [2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5],  # slopes(16)
}


@pytest.mark.parametrize("heads", sorted(OTHER))
def test_slopes_of_other_head_counts_follow_the_papers_rule(heads: int) -> None:
    assert alibi_slopes(heads).tolist() == pytest.approx(OTHER[heads], rel=1e-7)


# -- bias -------------------------------------------------------------------------------------


def loop_bias(qp, kp, slopes, causal=False):
    """-m |p_i - p_j| (causal: -m max(p_i - p_j, 0)) by a float64 loop -> [B, H, Tq, Tk]."""
    qp, kp = qp.double(), kp.double()
    b, tq, tk, h = max(qp.shape[0], kp.shape[0]), qp.shape[1], kp.shape[1], len(slopes)
    out = torch.zeros(b, h, tq, tk, dtype=torch.float64)
    for n in range(b):
        for c in range(h):
            for i in range(tq):
                for j in range(tk):
                    d = float(qp[min(n, qp.shape[0] - 1), i] - kp[min(n, kp.shape[0] - 1), j])
                    out[n, c, i, j] = -float(slopes[c]) * (max(d, 0.0) if causal else abs(d))
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_bias_equals_the_float64_loop(causal: bool) -> None:
    qp, kp = rand(2, 4, seed=1) * 3, rand(2, 6, seed=2) * 3
    slopes = alibi_slopes(3)
    got = alibi_bias(qp, kp, slopes, causal=causal)
    assert got.shape == (2, 3, 4, 6) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), loop_bias(qp, kp, slopes, causal), atol=1e-5, rtol=0)
    # [B, T, 1] positions and a batch of 1 (shared by the batch) are taken too
    shared = alibi_bias(qp[:1, :, None], kp, slopes, causal=causal)
    torch.testing.assert_close(
        shared.double(), loop_bias(qp[:1], kp, slopes, causal), atol=1e-5, rtol=0
    )


def test_token_positions_give_a_toeplitz_bias() -> None:
    t = torch.arange(7.0)[None]
    bias = alibi_bias(t, t, alibi_slopes(4))[0]  # [H, T, T]
    # each row is the previous one shifted right by one key
    torch.testing.assert_close(bias[:, 1:, 1:], bias[:, :-1, :-1], atol=0, rtol=0)
    assert bias[1, 0].tolist() == pytest.approx([-k * 2**-4 for k in range(7)])
    assert bool((bias.diagonal(dim1=-2, dim2=-1) == 0).all())


def test_bias_is_translation_invariant_also_in_seconds() -> None:
    seconds = torch.sort(rand(2, 9, seed=3).abs() * 4.0, dim=1).values  # frame times, s
    slopes = alibi_slopes(8)
    base = alibi_bias(seconds, seconds, slopes)
    for shift in (1.5, -30.0, 60.0):
        moved = alibi_bias(seconds + shift, seconds + shift, slopes)
        torch.testing.assert_close(moved, base, atol=2e-5, rtol=0)
    # twice the distance, twice the penalty: linear in seconds
    torch.testing.assert_close(alibi_bias(2 * seconds, 2 * seconds, slopes), 2 * base)


def test_module_bias_is_float32_batch_shared_and_augmented_in_training() -> None:
    enc = cape.build("alibi", 4, max_global_shift=5.0, max_local_shift=0.3, max_global_scaling=1.5)
    assert isinstance(enc, cape.ALiBi) and enc.heads == 4 and enc.kind == "attention"
    t = torch.arange(6.0)[None]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        shared = enc.eval()(t)
    assert shared.shape == (1, 4, 6, 6) and shared.dtype == torch.float32
    torch.testing.assert_close(shared, alibi_bias(t, t, alibi_slopes(4)))
    pos = t.expand(3, 6)
    g = torch.Generator().manual_seed(0)
    drawn = enc.train()(pos, generator=g)
    assert drawn.shape == (3, 4, 6, 6) and not torch.allclose(drawn, shared.expand(3, -1, -1, -1))
    # the augmented bias is the bias of the augmented positions (one draw for q and k)
    aug = enc.augmentation(pos[..., None], generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(drawn, alibi_bias(aug, aug, enc.slopes))
    # .to(bfloat16) keeps the slopes exact
    assert enc.to(torch.bfloat16).slopes.dtype == torch.float32


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
    logits = logits.masked_fill(~allowed, float("-inf"))
    out = torch.softmax(logits, -1) @ v
    out = out.transpose(1, 2).reshape(b, tq, d)
    return out @ w["out_proj.weight"].T + w["out_proj.bias"]


@pytest.mark.parametrize("causal", [False, True])
def test_attention_equals_manual_softmax_with_bias_and_masks(causal: bool) -> None:
    torch.manual_seed(0)
    mha = MultiheadAttention(16, 4, biases=[cape.ALiBi(4)]).eval()
    x = rand(2, 5, 16, seed=4)
    key_mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    pos = torch.tensor([[0.0, 0.5, 1.0, 2.5, 3.0], [0.0, 1.0, 2.0, 3.0, 4.0]])
    got = mha(x, key_mask=key_mask, causal=causal, q_positions=pos)
    allowed = key_mask[:, None, None, :].expand(2, 1, 5, 5)
    if causal:
        allowed = allowed & torch.ones(5, 5, dtype=torch.bool).tril()
    want = manual_attention(mha, x, x, loop_bias(pos, pos, alibi_slopes(4)), allowed)
    real = key_mask  # outputs at padded queries are unspecified (their positions count as 0)
    torch.testing.assert_close(got[real].double(), want[real], atol=1e-5, rtol=0)
    # padded keys change nothing: their content is not read
    x2 = x.clone()
    x2[1, 3:] = 100.0
    out2 = mha(x2, key_mask=key_mask, causal=causal, q_positions=pos)
    torch.testing.assert_close(out2[1, :3], got[1, :3])
    # default positions are token indices; cross-attention over other keys
    kv = rand(2, 3, 16, seed=5)
    idx = torch.arange(5.0)[None].expand(2, 5)
    cross = mha(x, kv)
    want = manual_attention(
        mha, x, kv, loop_bias(idx, idx[:, :3], alibi_slopes(4)), torch.ones(2, 1, 5, 3).bool()
    )
    torch.testing.assert_close(cross.double(), want, atol=1e-5, rtol=0)


def test_attention_gradients_flow_and_bf16_autocast_stays_close() -> None:
    torch.manual_seed(1)
    mha = MultiheadAttention(16, 2, biases=[cape.ALiBi(2)])
    x = rand(2, 7, 16, seed=6).requires_grad_()
    mha(x, causal=True).square().sum().backward()
    assert x.grad is not None and bool(torch.isfinite(x.grad).all()) and x.grad.abs().sum() > 0
    assert all(p.grad is not None for p in mha.parameters())
    mha.eval()
    ref = mha(x.detach())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert mha.biases[0](torch.arange(7.0)[None]).dtype == torch.float32
        low = mha(x.detach())
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), ref, atol=0.05, rtol=0.05)


def test_incremental_decoding_matches_the_full_prefix() -> None:
    from cape.models.decode_cache import AttentionCache

    torch.manual_seed(2)
    mha = MultiheadAttention(8, 2, biases=[cape.ALiBi(2)]).eval()
    x = rand(1, 6, 8, seed=7)
    full = mha(x, causal=True)
    cache = AttentionCache()
    steps = [mha(x[:, i : i + 1], causal=True, cache=cache) for i in range(6)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)


def test_models_train_a_step_with_alibi() -> None:
    torch.manual_seed(3)
    enc = TransformerEncoder(2, 16, 4, 32, relative_factory=lambda: cape.ALiBi(4))
    assert enc.layers[0].self_attn.biases[0].heads == 4
    models = [
        (enc, lambda m: m(rand(2, 5, 16, seed=8)).square().mean()),
        (
            Seq2Seq(12, position="alibi", dim=16, heads=2, ffn_dim=32, encoder_layers=1,
                    decoder_layers=1),
            lambda m: m(torch.randint(3, 12, (2, 5)), torch.ones(2, 5, dtype=torch.bool),
                        torch.randint(3, 12, (2, 4)), torch.ones(2, 4, dtype=torch.bool)).mean(),
        ),
        (
            CTCModel(12, position="alibi", position_options={"max_global_scaling": 1.2},
                     n_mels=8, dim=16, depth=1, heads=2, ffn_dim=32),
            lambda m: m(torch.randn(2, 30, 8), torch.tensor([30, 21]))[0].mean(),
        ),
    ]  # fmt: skip
    for model, loss_of in models:
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        before = [p.detach().clone() for p in model.parameters()]
        loss = loss_of(model)
        loss.backward()
        opt.step()
        assert math.isfinite(float(loss.detach()))
        assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    assert isinstance(models[1][0].encoder.layers[0].self_attn.biases[0], cape.ALiBi)
    with pytest.raises(ValueError, match="position 'alibi' reads 1-D positions"):
        ViT(3, position="alibi", image_size=8, patch=4, dim=16, depth=1, heads=2)


# -- reference --------------------------------------------------------------------------------


@pytest.mark.parametrize("heads", [1, 3, 4, 6, 8, 12])
def test_slopes_and_bias_match_x_transformers(heads: int) -> None:
    xt = pytest.importorskip("x_transformers.x_transformers")
    ref = xt.AlibiPositionalBias(heads=heads, total_heads=heads)
    torch.testing.assert_close(alibi_slopes(heads), ref.slopes.flatten().float())
    t = torch.arange(9.0)[None]
    theirs = ref(9, 9).float()  # [H, T, T] (token indices)
    torch.testing.assert_close(alibi_bias(t, t, alibi_slopes(heads))[0], theirs.reshape(-1, 9, 9))
    pos = torch.sort(rand(2, 6, seed=9) * 5, dim=1).values
    theirs = ref.forward_custom_pos(pos).float()
    torch.testing.assert_close(alibi_bias(pos, pos, alibi_slopes(heads)), theirs)


# -- refused arguments ------------------------------------------------------------------------


def test_bad_arguments_name_the_argument() -> None:
    t, nan = torch.arange(4.0)[None], torch.tensor([[0.0, math.nan]])
    s2 = alibi_slopes(2)
    cases = [
        (lambda: alibi_slopes(0), ValueError, "heads"),
        (lambda: alibi_slopes(2.0), TypeError, "heads"),
        (lambda: cape.ALiBi(0), ValueError, "heads"),
        (lambda: cape.ALiBi(2, slopes=[0.5]), ValueError, "slopes"),
        (lambda: cape.ALiBi(2, slopes=[0.5, 0.0]), ValueError, "slopes"),
        (lambda: cape.ALiBi(2, slopes=[0.5, -1.0]), ValueError, "slopes"),
        (lambda: cape.ALiBi(2, slopes="ab"), TypeError, "slopes"),
        (lambda: cape.ALiBi(2, causal=1), TypeError, "causal"),
        (lambda: cape.ALiBi(2, augmentation="aug"), TypeError, "augmentation"),
        (lambda: alibi_bias(t, t, torch.tensor([0.5, math.nan])), ValueError, "slopes"),
        (lambda: alibi_bias(nan, t, s2), ValueError, "q_positions"),
        (lambda: alibi_bias(t, torch.zeros(4), alibi_slopes(2)), ValueError, "k_positions"),
        (lambda: alibi_bias(t[..., None, None], t, alibi_slopes(2)), ValueError, "q_positions"),
        (lambda: alibi_bias(torch.zeros(1, 4, 2), t, alibi_slopes(2)), ValueError, "q_positions"),
        (lambda: alibi_bias(torch.zeros(2, 4), torch.zeros(3, 4), s2), ValueError, "batch"),
        (lambda: alibi_bias(t * 1e37, t, alibi_slopes(2) * 100), ValueError, "positions"),
        (lambda: cape.ALiBi(2)(t, k_mask=torch.ones(1, 4, dtype=torch.bool)), ValueError, "k_mask"),
        (lambda: cape.ALiBi(2)(t, generator="g"), TypeError, "generator"),
        (lambda: MultiheadAttention(8, 2, biases=[cape.ALiBi(4)]), ValueError,
         r"biases\[0\]\.heads"),
        (lambda: MultiheadAttention(8, 2, biases=[cape.Rotary(4)]), TypeError, "bias"),
        (lambda: MultiheadAttention(8, 2, biases=[cape.ALiBi(2, causal=True)])(
            torch.zeros(1, 4, 8)),
         ValueError, "bias.causal"),
    ]  # fmt: skip
    for fn, error, name in cases:
        with pytest.raises(error, match=name):
            fn()


def test_ctc_model_counts_the_papers_slopes_per_output_frame() -> None:
    # a frame of the CTC model spans stride x 10 ms: the paper's per-token slopes 2^-8h/H,
    # per frame, are 2^-8h/H / (stride * 0.01) per second (what the bias reads)
    for stride, heads in ((3, 4), (2, 2)):
        model = CTCModel(12, position="alibi", n_mels=8, dim=16, depth=1, heads=heads, ffn_dim=32,
                         stride=stride, kernel=stride)  # fmt: skip
        got = model.encoder.layers[0].self_attn.biases[0].slopes
        want = [2.0 ** (-8 * (h + 1) / heads) / (stride * 0.01) for h in range(heads)]
        assert got.tolist() == pytest.approx(want, rel=1e-6)
    given = CTCModel(12, position="alibi", position_options={"slopes": [1.0, 2.0]}, n_mels=8,
                     dim=16, depth=1, heads=2, ffn_dim=32)  # fmt: skip
    assert given.encoder.layers[0].self_attn.biases[0].slopes.tolist() == [1.0, 2.0]
