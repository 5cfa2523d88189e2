"""relpos (Shaw et al. 2018): index, attention against a naive O(T^2 d) reference, memory,
module."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.profiler import ProfilerActivity, profile

from cape.encodings.relative import RelPos
from cape.functional.relative import num_buckets, relative_index, relpos_attention


def loop_index(q_pos, k_pos, k_max, step=1.0):
    """Independent index: python loops over pairs, offsets rounded in float64."""
    out = torch.empty(len(q_pos), len(k_pos), dtype=torch.long)
    for i, pi in enumerate(q_pos):
        for j, pj in enumerate(k_pos):
            off = round((float(pj) - float(pi)) / step)
            out[i, j] = min(max(off, -k_max), k_max) + k_max
    return out


def naive_relpos(q, k, v, rel_key, index, rel_value=None, kpm=None, attn_mask=None, causal=False):
    """Explicit [B, Tq, Tk, d] tables a_ij, einsum, masked softmax, in float64."""
    q, k, v, rel_key = (t.double() for t in (q, k, v, rel_key))
    b, _, tq, d = q.shape
    tk = k.shape[2]
    idx = index.expand(b, tq, tk)
    a_k = rel_key[idx]  # [B, Tq, Tk, d]
    logits = torch.einsum("bhid,bhjd->bhij", q, k) + torch.einsum("bhid,bijd->bhij", q, a_k)
    logits = logits / math.sqrt(d)
    allowed = torch.ones(b, 1, tq, tk, dtype=torch.bool)
    if kpm is not None:
        allowed = allowed & kpm[:, None, None, :]
    if attn_mask is not None:
        allowed = allowed & attn_mask
    if causal:
        allowed = allowed & (torch.arange(tk)[None, :] <= torch.arange(tq)[:, None])
    logits = logits.masked_fill(~allowed, float("-inf"))
    p = torch.nan_to_num(torch.softmax(logits, dim=-1), nan=0.0)
    out = torch.einsum("bhij,bhjd->bhid", p, v.double())
    if rel_value is not None:
        out = out + torch.einsum("bhij,bijd->bhid", p, rel_value.double()[idx])
    return out


def rand_qkv(b=2, h=3, tq=7, tk=7, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, t, d, generator=g) for t in (tq, tk, tk))


# -- index --------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    q_pos=st.lists(st.integers(-50, 50), min_size=1, max_size=6),
    k_pos=st.lists(st.integers(-50, 50), min_size=1, max_size=6),
    k_max=st.integers(1, 20),
)
def test_index_matches_loops_for_token_positions(q_pos, k_pos, k_max):
    got = relative_index(torch.tensor([q_pos]), torch.tensor([k_pos]), k_max)
    assert got.dtype == torch.long and got.shape == (1, len(q_pos), len(k_pos))
    assert torch.equal(got[0], loop_index(q_pos, k_pos, k_max))


def test_index_in_seconds_uses_step():
    hop, t = 0.04, 30  # frames centred at (i + 0.5) * hop seconds
    pos = (torch.arange(t, dtype=torch.float32) + 0.5) * hop
    idx = relative_index(pos[None], pos[None, :, None], max_distance=0.4, step=hop)
    assert num_buckets(0.4, hop) == 10
    j, i = torch.meshgrid(torch.arange(t), torch.arange(t), indexing="xy")
    assert torch.equal(idx[0], (j - i).clamp(-10, 10) + 10)


def test_clipping_shares_edge_buckets():
    pos = torch.arange(20.0)[None]
    idx = relative_index(pos, pos, max_distance=3)
    assert int(idx.min()) == 0 and int(idx.max()) == 6
    assert int(idx[0, 0, 19]) == 6 and int(idx[0, 0, 3]) == 6 and int(idx[0, 0, 2]) == 5
    assert int(idx[0, 19, 0]) == 0 and int(idx[0, 5, 5]) == 3
    # far pairs therefore get exactly the edge embedding: changing inner rows changes nothing
    q, k, v = rand_qkv(b=1, h=1, tq=20, tk=20)
    rel = torch.randn(7, 8)
    far = torch.zeros(1, 20, 20, dtype=torch.bool)
    far[0, 0, 10:] = True  # query 0 sees only keys 10..19, all beyond K
    out1 = relpos_attention(q, k, v, rel, idx, attn_mask=far[:, None])
    rel2 = rel.clone()
    rel2[:6] = torch.randn(6, 8)  # all but the +K edge
    out2 = relpos_attention(q, k, v, rel2, idx, attn_mask=far[:, None])
    torch.testing.assert_close(out1[..., 0, :], out2[..., 0, :])


# -- attention against the naive reference ------------------------------------------------


@pytest.mark.parametrize("values", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_naive(values, causal):
    q, k, v = rand_qkv()
    rel_k, rel_v = torch.randn(9, 8), torch.randn(9, 8)
    pos = torch.arange(7)
    idx = loop_index(pos, pos, 4)[None]
    out = relpos_attention(
        q, k, v, rel_k, idx, rel_value=rel_v if values else None, is_causal=causal
    )
    ref = naive_relpos(q, k, v, rel_k, idx, rel_v if values else None, causal=causal)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("values", [False, True])
def test_padding_and_cross_lengths(values):
    q, k, v = rand_qkv(tq=5, tk=9)
    rel_k, rel_v = torch.randn(7, 8), torch.randn(7, 8)
    g = torch.Generator().manual_seed(1)
    q_pos = torch.rand(2, 5, generator=g) * 10
    k_pos = torch.rand(2, 9, generator=g) * 10
    kpm = torch.ones(2, 9, dtype=torch.bool)
    kpm[0, 6:] = False
    idx = torch.stack([loop_index(q_pos[b], k_pos[b], 3) for b in range(2)])
    assert torch.equal(relative_index(q_pos, k_pos, 3), idx)
    out = relpos_attention(
        q, k, v, rel_k, idx, rel_value=rel_v if values else None, key_padding_mask=kpm
    )
    ref = naive_relpos(q, k, v, rel_k, idx, rel_v if values else None, kpm=kpm)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("values", [False, True])
def test_seconds_positions_and_float_mask(values):
    hop, t = 0.03, 12
    pos = ((torch.arange(t) + 0.5) * hop)[None].expand(2, t)
    q, k, v = rand_qkv(tq=t, tk=t)
    rel_k, rel_v = torch.randn(11, 8), torch.randn(11, 8)
    idx = relative_index(pos, pos, max_distance=0.15, step=hop)
    expected = torch.stack([loop_index(range(t), range(t), 5)] * 2)
    assert torch.equal(idx, expected)
    allowed = torch.rand(t, t, generator=torch.Generator().manual_seed(3)) > 0.3
    allowed |= torch.eye(t, dtype=torch.bool)
    additive = torch.zeros(t, t).masked_fill(~allowed, float("-inf"))
    rv = rel_v if values else None
    out_bool = relpos_attention(q, k, v, rel_k, idx, rel_value=rv, attn_mask=allowed)
    out_add = relpos_attention(q, k, v, rel_k, idx, rel_value=rv, attn_mask=additive)
    ref = naive_relpos(q, k, v, rel_k, idx, rv, attn_mask=allowed)
    torch.testing.assert_close(out_bool.double(), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_add.double(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("values", [False, True])
def test_fully_padded_rows_give_zero_and_finite_grads(values):
    q, k, v = (t.requires_grad_() for t in rand_qkv(tq=4, tk=4))
    rel_k = torch.randn(5, 8, requires_grad=True)
    rel_v = torch.randn(5, 8, requires_grad=True) if values else None
    kpm = torch.tensor([[False] * 4, [False, True, True, True]])
    idx = relative_index(torch.arange(4.0)[None], torch.arange(4.0)[None], 2)
    out = relpos_attention(
        q, k, v, rel_k, idx, rel_value=rel_v, key_padding_mask=kpm, is_causal=True
    )
    assert torch.isfinite(out).all()
    assert (out[0] == 0).all()  # every key padded
    assert (out[1, :, 0] == 0).all()  # causal + key 0 padded: query 0 sees nothing
    ref = naive_relpos(q, k, v, rel_k, idx, rel_v, kpm=kpm, causal=True)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    out.square().sum().backward()
    for t in (q, k, v, rel_k, rel_v):
        if t is not None:
            assert torch.isfinite(t.grad).all()


def test_gradients_reach_tables_and_match_naive():
    q, k, v = rand_qkv(b=1, h=2, tq=6, tk=6)
    rel_k = torch.randn(5, 8, requires_grad=True)
    rel_v = torch.randn(5, 8, requires_grad=True)
    idx = relative_index(torch.arange(6.0)[None], torch.arange(6.0)[None], 2)
    relpos_attention(q, k, v, rel_k, idx, rel_value=rel_v).sum().backward()
    rk64 = rel_k.detach().double().requires_grad_()
    rv64 = rel_v.detach().double().requires_grad_()
    naive_relpos(q, k, v, rk64, idx, rv64).sum().backward()
    assert rel_k.grad.abs().sum() > 0 and rel_v.grad.abs().sum() > 0
    torch.testing.assert_close(rel_k.grad.double(), rk64.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(rel_v.grad.double(), rv64.grad, atol=1e-5, rtol=1e-4)


def test_bf16_inputs_finite_and_close():
    q, k, v = rand_qkv()
    rel_k, rel_v = torch.randn(9, 8), torch.randn(9, 8)
    idx = relative_index(torch.arange(7.0)[None], torch.arange(7.0)[None], 4)
    kpm = torch.ones(2, 7, dtype=torch.bool)
    kpm[1] = False
    for rv in (None, rel_v):
        ref = relpos_attention(q, k, v, rel_k, idx, rel_value=rv, key_padding_mask=kpm)
        low = relpos_attention(
            q.bfloat16(), k.bfloat16(), v.bfloat16(), rel_k, idx, rel_value=rv, key_padding_mask=kpm
        )
        assert low.dtype == torch.bfloat16 and torch.isfinite(low).all()
        torch.testing.assert_close(low.float(), ref, atol=0.1, rtol=0.05)


def test_dropout_only_in_training():
    q, k, v = rand_qkv()
    rel_k, rel_v = torch.randn(9, 8), torch.randn(9, 8)
    idx = relative_index(torch.arange(7.0)[None], torch.arange(7.0)[None], 4)
    for rv in (None, rel_v):
        base = relpos_attention(q, k, v, rel_k, idx, rel_value=rv)
        ev = relpos_attention(q, k, v, rel_k, idx, rel_value=rv, dropout_p=0.5, training=False)
        torch.testing.assert_close(ev, base)
        torch.manual_seed(0)
        tr = relpos_attention(q, k, v, rel_k, idx, rel_value=rv, dropout_p=0.5, training=True)
        assert not torch.allclose(tr, base)


# -- memory -------------------------------------------------------------------------------


def _max_op_allocation(fn) -> int:
    """Largest net CPU allocation of any profiled op (children included): >= any single tensor
    an op creates and keeps, e.g. a [T, T, d] table of relative embeddings."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max(e.cpu_memory_usage for e in prof.events())


@pytest.mark.parametrize("values", [False, True])
def test_no_T_T_d_tensor(values):
    """Memory is O(Tq Tk + (2K+1) d) per head; a [T, T, d] float32 table would be 64 MiB here."""
    t, d = 512, 64
    q, k, v = rand_qkv(b=1, h=1, tq=t, tk=t, d=d)
    rel_k = torch.randn(201, d, requires_grad=True)
    rel_v = torch.randn(201, d, requires_grad=True) if values else None
    idx = relative_index(torch.arange(float(t))[None], torch.arange(float(t))[None], 100)
    bound = t * t * d * 4 // 8

    def run():
        relpos_attention(q, k, v, rel_k, idx, rel_value=rel_v).sum().backward()

    assert _max_op_allocation(run) < bound
    # the check can fail: the naive gather of a [T, T, d] table trips it
    assert _max_op_allocation(lambda: rel_k.detach()[idx]) >= t * t * d * 4


# -- module -------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [False, True])
def test_module_default_positions_match_naive(values):
    mod = RelPos(8, max_distance=3, values=values)
    assert mod.rel_key.shape == (7, 8) and (mod.rel_value is not None) == values
    q, k, v = rand_qkv()
    out = mod(q, k, v)
    idx = loop_index(range(7), range(7), 3)[None]
    ref = naive_relpos(
        q, k, v, mod.rel_key.detach(), idx, None if not values else mod.rel_value.detach()
    )
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    out.sum().backward()
    assert mod.rel_key.grad is not None and mod.rel_key.grad.abs().sum() > 0
    assert f"values={values}" in repr(mod) and "num_buckets=7" in repr(mod)


@pytest.mark.parametrize("values", [False, True])
@pytest.mark.parametrize("step", [1.0, 0.5, 3.0])
def test_module_short_inputs_use_only_reachable_buckets(values, step):
    """T - 1 < K: the sliced tables give the naive output and the naive gradients, and the
    buckets no pair can reach get no gradient at all."""
    mod = RelPos(8, max_distance=40, step=step, values=values)
    q, k, v = (t.requires_grad_() for t in rand_qkv(tq=6, tk=6))
    out = mod(q, k, v, is_causal=True)
    k_max = num_buckets(40, step)
    idx = loop_index(range(6), range(6), k_max, step)[None]
    tables = [mod.rel_key] + ([mod.rel_value] if values else [])
    ref_tables = [t.detach().double().requires_grad_() for t in tables]
    ref = naive_relpos(
        q.detach(),
        k.detach(),
        v.detach(),
        ref_tables[0],
        idx,
        ref_tables[1] if values else None,
        causal=True,
    )
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    g = torch.randn(out.shape, dtype=torch.float64)
    out.backward(g.float())
    ref.backward(g)
    for t, r in zip(tables, ref_tables, strict=True):
        torch.testing.assert_close(t.grad.double(), r.grad, atol=1e-5, rtol=1e-5)
        reach = round(5 / step)
        assert (
            t.grad[: k_max - reach].abs().sum() == 0
            and t.grad[k_max + reach + 1 :].abs().sum() == 0
        )


def test_module_short_inputs_project_on_reachable_buckets_only():
    """The q @ rel_key.T product has 2 (T-1) + 1 columns at T = 6, not 2K + 1 = 201."""
    mod = RelPos(8, max_distance=100)
    q, k, v = rand_qkv(tq=6, tk=6)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        mod(q, k, v)
    widths = {s[-1] for e in prof.events() if e.name == "aten::gather" for s in e.input_shapes if s}
    assert widths and max(widths) == 11, widths
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        mod(q, k, v, q_positions=torch.arange(6.0)[None].expand(2, 6))  # given: no slicing
    widths = {s[-1] for e in prof.events() if e.name == "aten::gather" for s in e.input_shapes if s}
    assert max(widths) == 201, widths


def test_module_positions_in_seconds():
    hop = 0.04
    mod = RelPos(8, max_distance=0.2, step=hop, values=True)
    assert mod.num_buckets == 11
    q, k, v = rand_qkv(tq=6, tk=6)
    pos = ((torch.arange(6) + 0.5) * hop)[None, :, None].expand(2, 6, 1)
    kpm = torch.ones(2, 6, dtype=torch.bool)
    kpm[1, 4:] = False
    out = mod(q, k, v, q_positions=pos, key_padding_mask=kpm)
    assert torch.equal(mod.index(pos), relative_index(pos, pos, 0.2, hop))
    idx = loop_index(range(6), range(6), 5)[None]
    ref = naive_relpos(q, k, v, mod.rel_key.detach(), idx, mod.rel_value.detach(), kpm=kpm)
    # padded positions count as 0 (library convention), so compare the real query rows
    real = kpm[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out.double()[real], ref[real], atol=1e-5, rtol=1e-5)


def test_module_init_scale():
    mod = RelPos(64, max_distance=200)
    assert 0.012 < float(mod.rel_key.detach().std()) < 0.025
    assert float(mod.rel_key.detach().abs().max()) <= 0.04 + 1e-6


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"head_dim": 0}, ValueError, "head_dim"),
        ({"head_dim": 2.5}, TypeError, "head_dim"),
        ({"head_dim": 8, "max_distance": -1}, ValueError, "max_distance"),
        ({"head_dim": 8, "max_distance": "far"}, TypeError, "max_distance"),
        ({"head_dim": 8, "step": 0}, ValueError, "step"),
        ({"head_dim": 8, "max_distance": 0.1, "step": 1.0}, ValueError, "max_distance"),
        ({"head_dim": 8, "values": "yes"}, TypeError, "values"),
    ],
)
def test_module_bad_args(kwargs, error, name):
    with pytest.raises(error, match=name):
        RelPos(**kwargs)


def test_bad_call_args():
    q, k, v = rand_qkv(tq=5, tk=7)
    mod = RelPos(8, max_distance=3)
    with pytest.raises(ValueError, match="k_positions"):
        mod(q, k, v)
    rel = torch.randn(7, 8)
    idx = relative_index(torch.arange(5.0)[None], torch.arange(7.0)[None], 3)
    with pytest.raises(ValueError, match="rel_key"):
        relpos_attention(q, k, v, torch.randn(7, 4), idx)
    with pytest.raises(ValueError, match="index"):
        relpos_attention(q, k, v, rel, idx.transpose(1, 2))
    with pytest.raises(TypeError, match="index"):
        relpos_attention(q, k, v, rel, idx.int())
    with pytest.raises(ValueError, match="key_padding_mask"):
        relpos_attention(q, k, v, rel, idx, key_padding_mask=torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="rel_value"):
        relpos_attention(q, k, v, rel, idx, rel_value=torch.randn(5, 8))
    with pytest.raises(ValueError, match="dropout_p"):
        relpos_attention(q, k, v, rel, idx, dropout_p=1.5)
    with pytest.raises(ValueError, match="q_positions"):
        relative_index(torch.zeros(1, 5, 2), torch.zeros(1, 7), 3)
