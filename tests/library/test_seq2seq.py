"""cape.models.seq2seq.Seq2Seq and cape.models.search: the MT encoder-decoder and its decoding."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch

from cape.augment import augment_pair
from cape.encodings.relative import RelPos
from cape.encodings.rotary import Rotary
from cape.models import Seq2Seq
from cape.models.search import beam_search, greedy_decode, max_lengths, sequence_nll

VOCAB, PAD, BOS, EOS = 13, 0, 1, 2
TINY = dict(dim=32, encoder_layers=2, decoder_layers=2, heads=2, ffn_dim=64)
# the 1-D `cape.build` names of the translation study
MT_POSITIONS = ("nopos", "sinpos", "abspos", "relpos", "cape1d", "rotary")


def _model(position: str = "cape1d", seed: int = 0, **kw) -> Seq2Seq:
    torch.manual_seed(seed)
    return Seq2Seq(VOCAB, position=position, **{**TINY, **kw})


def _mask(lengths: list[int], width: int) -> torch.Tensor:
    return torch.arange(width)[None] < torch.tensor(lengths)[:, None]


def _tokens(batch: int, length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, length), generator=g)


def _np_sinusoid(pos: np.ndarray, dim: int) -> np.ndarray:
    """Transformer sinusoid, omega_k = 10000^(-2k/D), in the library's [cos || sin] layout."""
    omega = 10000.0 ** (-2.0 * np.arange(dim // 2, dtype=np.float64) / dim)
    phase = pos.astype(np.float64)[..., None] * omega
    return np.concatenate([np.cos(phase), np.sin(phase)], axis=-1)


# -- causality and padding ------------------------------------------------------------------


@pytest.mark.parametrize("position", MT_POSITIONS)
def test_decoder_is_causal_in_training(position: str) -> None:
    augmented = position in ("cape1d", "rotary")
    model = _model(
        position,
        dropout=0.1,
        alpha=1.2,
        position_options=({"max_global_shift": 10.0} if augmented else None),
    ).train()
    src, tgt = _tokens(3, 9, 1), _tokens(3, 8, 2)
    src_mask, tgt_mask = _mask([9, 6, 4], 9), _mask([8, 8, 5], 8)
    t = 3
    changed = tgt.clone()
    changed[:, t + 1 :] = (changed[:, t + 1 :] - 3 + 1) % (
        VOCAB - 3
    ) + 3  # every later token differs

    def run(tokens: torch.Tensor, seed: int = 7) -> torch.Tensor:
        torch.manual_seed(0)  # the same dropout masks
        return model(src, src_mask, tokens, tgt_mask, generator=torch.Generator().manual_seed(seed))

    a, b = run(tgt), run(changed)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], rtol=0, atol=1e-6)
    assert (a[:, t + 1 :] - b[:, t + 1 :]).abs().amax() > 1e-3  # later positions do see the change
    if augmented:  # the augmentation is live: other draws, other logits
        assert (run(tgt, seed=8)[:, : t + 1] - a[:, : t + 1]).abs().amax() > 1e-4


@pytest.mark.parametrize("position", MT_POSITIONS)
def test_padding_does_not_change_real_outputs(position: str) -> None:
    model = _model(position, alpha=1.3)
    model.eval()
    src, tgt = _tokens(3, 10, 3), _tokens(3, 7, 4)  # padded slots hold random real ids
    src_mask, tgt_mask = _mask([10, 6, 3], 10), _mask([7, 4, 2], 7)
    batched = model(src, src_mask, tgt, tgt_mask)
    for i, (s, t) in enumerate([(10, 7), (6, 4), (3, 2)]):
        alone = model(
            src[i : i + 1, :s],
            torch.ones(1, s, dtype=torch.bool),
            tgt[i : i + 1, :t],
            torch.ones(1, t, dtype=torch.bool),
        )
        torch.testing.assert_close(batched[i : i + 1, :t], alone, rtol=0, atol=2e-5)


# -- positions ------------------------------------------------------------------------------


@pytest.mark.parametrize("position", ["cape1d", "rotary"])
def test_cape_eval_positions_are_scaled_indices(position: str) -> None:
    model = _model(position, alpha=1.1632).eval()
    src_mask, tgt_mask = _mask([6, 3], 6), _mask([5, 2], 5)
    src_pos, tgt_pos = model.positions(src_mask, tgt_mask)
    assert src_pos.dtype == tgt_pos.dtype == torch.float32
    assert src_pos.shape == (2, 6, 1) and tgt_pos.shape == (2, 5, 1)
    expect_src = torch.where(src_mask, torch.arange(6, dtype=torch.float32) * 1.1632, 0.0)
    expect_tgt = torch.where(tgt_mask, torch.arange(5, dtype=torch.float32), 0.0)
    assert torch.equal(src_pos[..., 0], expect_src)
    assert torch.equal(tgt_pos[..., 0], expect_tgt)
    assert model.positions(src_mask)[1] is None


@pytest.mark.parametrize("position", ["nopos", "sinpos", "abspos", "relpos"])
def test_other_rows_use_plain_indices_in_training(position: str) -> None:
    model = _model(position, alpha=1.5).train()  # alpha scales only augmented positions
    src_pos, tgt_pos = model.positions(_mask([5, 2], 5), _mask([4, 4], 4))
    assert torch.equal(src_pos[..., 0], torch.where(_mask([5, 2], 5), torch.arange(5.0), 0.0))
    assert torch.equal(tgt_pos[..., 0], torch.arange(4.0).expand(2, 4))


def test_cape_training_shift_is_shared_local_bounded_unscaled() -> None:
    alpha, dmax, emax = 1.3, 50.0, 0.5
    model = _model(
        "cape1d", alpha=alpha, position_options=dict(max_global_shift=dmax, max_local_shift=emax)
    ).train()
    batch, s, t = 64, 30, 25
    src_mask = _mask(
        torch.randint(1, s + 1, (batch,), generator=torch.Generator().manual_seed(0)).tolist(), s
    )
    tgt_mask = _mask(
        torch.randint(1, t + 1, (batch,), generator=torch.Generator().manual_seed(1)).tolist(), t
    )
    src_pos, tgt_pos = model.positions(src_mask, tgt_mask, torch.Generator().manual_seed(2))
    d_src = src_pos[..., 0] - alpha * torch.arange(s, dtype=torch.float32)  # Delta + eps_src
    d_tgt = tgt_pos[..., 0] - torch.arange(t, dtype=torch.float32)  # Delta + eps_tgt
    big = torch.tensor(1e9)
    hi = torch.maximum(
        torch.where(src_mask, d_src, -big).amax(1), torch.where(tgt_mask, d_tgt, -big).amax(1)
    )
    lo = torch.minimum(
        torch.where(src_mask, d_src, big).amin(1), torch.where(tgt_mask, d_tgt, big).amin(1)
    )
    # one global shift per sample for both sides, local shifts within +-emax, no scaling (a
    # scale would spread the offsets with the index): all offsets of a sample within 2 emax
    assert bool((hi - lo <= 2 * emax + 1e-4).all())
    assert float((hi - lo).max()) > emax  # local shifts are drawn (and not shared)
    centre = (hi + lo) / 2  # ~ the global shift: differs between samples, within +-Dmax
    assert float(centre.abs().max()) <= dmax + emax
    assert float(centre.std()) > dmax / 4
    assert not torch.equal(d_src[:, :1], d_tgt[:, :1])  # independent local draws
    assert bool((src_pos[~src_mask] == 0).all()) and bool((tgt_pos[~tgt_mask] == 0).all())
    # exactly the library's synchronised augmentation, no mean-normalisation, no scaling
    idx_s = torch.where(src_mask, torch.arange(s, dtype=torch.float32), 0.0)[..., None]
    idx_t = torch.where(tgt_mask, torch.arange(t, dtype=torch.float32), 0.0)[..., None]
    expect = augment_pair(
        idx_s,
        idx_t,
        src_mask,
        tgt_mask,
        alpha=alpha,
        max_global_shift=dmax,
        max_local_shift=emax,
        generator=torch.Generator().manual_seed(2),
    )
    assert torch.equal(src_pos, expect[0]) and torch.equal(tgt_pos, expect[1])


def _stack_inputs(model: Seq2Seq, *args) -> tuple[torch.Tensor, torch.Tensor]:
    seen = {}
    hooks = [
        stack.register_forward_pre_hook(lambda m, a, name=name: seen.__setitem__(name, a[0]))
        for name, stack in (("enc", model.encoder), ("dec", model.decoder))
    ]
    model(*args)
    for h in hooks:
        h.remove()
    return seen["enc"], seen["dec"]


@pytest.mark.parametrize(
    ("position", "alpha"), [("sinpos", 1.0), ("cape1d", 1.0337), ("cape1d", 1.0)]
)
def test_sinusoid_added_at_both_inputs_is_the_transformer_one(position: str, alpha: float) -> None:
    model = _model(position, alpha=alpha).eval()
    src, tgt = _tokens(2, 40, 5), _tokens(2, 30, 6)
    src_mask, tgt_mask = _mask([40, 17], 40), _mask([30, 9], 30)
    enc_in, dec_in = _stack_inputs(model, src, src_mask, tgt, tgt_mask)
    table = model.embed.weight.detach().numpy() * np.sqrt(32)
    for x, ids, mask, scale in ((enc_in, src, src_mask, alpha), (dec_in, tgt, tgt_mask, 1.0)):
        pos = np.arange(ids.shape[1], dtype=np.float32) * np.float32(scale)
        expect = table[ids.numpy()] + _np_sinusoid(pos, 32)[None] * mask.numpy()[..., None]
        np.testing.assert_allclose(x.detach().numpy(), expect, rtol=0, atol=2e-5)


def test_nopos_relpos_rotary_add_nothing_at_the_input() -> None:
    for position in ("nopos", "relpos", "rotary"):
        model = _model(position).eval()
        src, tgt = _tokens(1, 6, 1), _tokens(1, 5, 2)
        enc_in, dec_in = _stack_inputs(model, src, _mask([6], 6), tgt, _mask([5], 5))
        torch.testing.assert_close(enc_in, model.embed(src) * 32**0.5, rtol=0, atol=0)
        torch.testing.assert_close(dec_in, model.embed(tgt) * 32**0.5, rtol=0, atol=0)


def test_abspos_separate_tables_clamped_overflow() -> None:
    model = _model("abspos", position_options={"num_positions": 4}).eval()
    assert model.src_position.table is not model.tgt_position.table
    assert model.src_position.overflow == "clamp"
    src, tgt = _tokens(1, 7, 1), _tokens(1, 6, 2)
    enc_in, dec_in = _stack_inputs(model, src, _mask([7], 7), tgt, _mask([6], 6))
    rows = [0, 1, 2, 3, 3, 3, 3]
    expect_enc = model.embed(src) * 32**0.5 + model.src_position.table[rows]
    expect_dec = model.embed(tgt) * 32**0.5 + model.tgt_position.table[rows[:6]]
    torch.testing.assert_close(enc_in, expect_enc)
    torch.testing.assert_close(dec_in, expect_dec)


@pytest.mark.parametrize("position", ["relpos", "rotary"])
def test_in_attention_rows_live_in_every_self_attention_only(position: str) -> None:
    model = _model(position, position_options={"max_distance": 5} if position == "relpos" else None)
    kind = RelPos if position == "relpos" else Rotary
    layers = list(model.encoder.layers) + list(model.decoder.layers)
    for layer in layers:
        mod = layer.self_attn.biases[0] if position == "relpos" else layer.self_attn.rotary
        assert isinstance(mod, kind) and mod.head_dim == 16
        if position == "relpos":
            assert mod.k_max == 5
    # positions arrive augmented from positions(): the stacks' contexts say so
    assert model.encoder.plan.augmented_by_stack and model.decoder.plan.augmented_by_stack
    for layer in model.decoder.layers:
        assert not layer.cross_attn.positional
    assert model.src_position is None and model.tgt_position is None


@pytest.mark.parametrize("position", MT_POSITIONS)
def test_forward_applies_the_positions_it_draws(position: str) -> None:
    model = _model(position, dropout=0.0).train()
    src, tgt = _tokens(2, 8, 1), _tokens(2, 6, 2)
    src_mask, tgt_mask = _mask([8, 5], 8), _mask([6, 4], 6)
    logits = model(src, src_mask, tgt, tgt_mask, generator=torch.Generator().manual_seed(4))
    src_pos, tgt_pos = model.positions(src_mask, tgt_mask, torch.Generator().manual_seed(4))
    memory = model.encode(src, src_mask, src_pos)
    torch.testing.assert_close(
        logits, model.decode(tgt, memory, src_mask, tgt_mask, tgt_pos), rtol=0, atol=0
    )
    # and the positions given are the ones applied, on both sides (stretched: every row sees it)
    model.eval()
    with torch.no_grad():
        memory = model.encode(src, src_mask, src_pos)
        stretched = model.encode(src, src_mask, 2 * src_pos)
        dec = model.decode(tgt, memory, src_mask, tgt_mask, tgt_pos)
        dec_stretched = model.decode(tgt, memory, src_mask, tgt_mask, 2 * tgt_pos)
    real_src, real_tgt = src_mask[..., None], tgt_mask[..., None]
    enc_change = float(((stretched - memory).abs() * real_src).max())
    dec_change = float(((dec_stretched - dec).abs() * real_tgt).max())
    if position == "nopos":
        assert enc_change == 0 and dec_change == 0
    else:
        assert enc_change > 1e-3 and dec_change > 1e-3


def test_rotary_ignores_the_global_shift_but_not_local_shifts() -> None:
    src, tgt = _tokens(2, 8, 1), _tokens(2, 6, 2)
    masks = _mask([8, 5], 8), _mask([6, 4], 6)
    results = {}
    for row, local in itertools.product(("rotary", "cape1d"), (0.0, 0.5)):
        model = _model(
            row, dropout=0.0, position_options=dict(max_global_shift=5.0, max_local_shift=local)
        )
        with torch.no_grad():
            ref = model.eval()(src, masks[0], tgt, masks[1])
            train = model.train()(
                src, masks[0], tgt, masks[1], generator=torch.Generator().manual_seed(0)
            )
        valid = masks[1]
        results[row, local] = float((train - ref).abs()[valid].max())
    assert results["rotary", 0.0] < 1e-4  # relative positions unchanged by a shared shift
    assert results["rotary", 0.5] > 1e-3
    assert results["cape1d", 0.0] > 1e-3  # an absolute sinusoid sees the shift


# -- parameters, spec, gradients, errors ----------------------------------------------------


def test_tied_embeddings_share_storage() -> None:
    model = _model("sinpos").eval()
    assert model.out_proj is None and model.tgt_embed is None
    src, tgt = torch.full((1, 4), 3), torch.full((1, 3), 4)
    masks = torch.ones(1, 4, dtype=torch.bool), torch.ones(1, 3, dtype=torch.bool)
    before = model(src, masks[0], tgt, masks[1])
    with torch.no_grad():
        model.embed.weight[9] += torch.randn(32)  # token 9 is in no input: only the output uses it
    after = model(src, masks[0], tgt, masks[1])
    assert (after[..., 9] - before[..., 9]).abs().min() > 1e-3
    torch.testing.assert_close(after[..., :9], before[..., :9])
    params = [p for p in model.parameters() if p.shape[0] == VOCAB]
    assert len(params) == 1

    untied = _model("sinpos", tie_embeddings=False).eval()
    weights = {
        untied.embed.weight.data_ptr(),
        untied.tgt_embed.weight.data_ptr(),
        untied.out_proj.weight.data_ptr(),
    }
    assert len(weights) == 3
    before = untied(src, masks[0], tgt, masks[1])
    with torch.no_grad():
        untied.embed.weight[9] += torch.randn(32)
    torch.testing.assert_close(untied(src, masks[0], tgt, masks[1]), before, rtol=0, atol=0)


@pytest.mark.parametrize("position", MT_POSITIONS)
def test_spec_rebuilds_the_same_model(position: str) -> None:
    options = {
        "cape1d": {"max_global_shift": 10},
        "rotary": {"max_local_shift": 0.25},
        "relpos": {"max_distance": 4, "values": True},
        "abspos": {"num_positions": 12},
    }
    model = _model(
        position,
        position_options=options.get(position),
        alpha=1.1,
        tie_embeddings=position != "nopos",
    )
    spec = json.loads(json.dumps(model.spec))
    assert spec["position"] == position and spec["alpha"] == 1.1
    for key, value in options.get(position, {}).items():
        assert spec["position_options"][key] == value
    rebuilt = Seq2Seq(**spec)
    rebuilt.load_state_dict(model.state_dict())  # strict: same parameters and shapes
    assert rebuilt.spec == model.spec
    src, tgt = _tokens(2, 9, 1), _tokens(2, 7, 2)
    args = (src, _mask([9, 5], 9), tgt, _mask([7, 3], 7))
    torch.testing.assert_close(rebuilt.eval()(*args), model.eval()(*args), rtol=0, atol=0)
    # and training draws: the same generator gives the same augmentation
    torch.manual_seed(0)
    a = model.train()(*args, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    b = rebuilt.train()(*args, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("position", MT_POSITIONS)
def test_gradients_reach_every_parameter(position: str) -> None:
    model = _model(position).train()
    src, tgt = _tokens(2, 9, 1), _tokens(2, 7, 2)
    logits = model(
        src, _mask([9, 5], 9), tgt, _mask([7, 3], 7), generator=torch.Generator().manual_seed(0)
    )
    assert logits.dtype == torch.float32 and logits.shape == (2, 7, VOCAB)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), _tokens(2, 7, 3).flatten())
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert bool(torch.isfinite(p.grad).all()), name
        assert float(p.grad.abs().sum()) > 0, name


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(position="sinpos2d"), r"position 'sinpos2d' reads 2-D positions; tokens need 1-D"),
        (dict(position=3), "position must be a cape.build name"),
        (dict(position="cape1d", position_options={"normalize": True}), r"normalize=True .*causal"),
        (
            dict(position="nopos", position_options={"alpha": 1.0}),
            r"unknown option\(s\) \['alpha'\]",
        ),
        (
            dict(position="relpos", position_options={"stride": 2.0}),
            r"allowed: \['max_distance', 'step', 'values'\]",
        ),
        (dict(position="cape1d", alpha=0.0), "alpha must be"),
        (
            dict(position="cape1d", position_options={"max_global_shift": -1}),
            "max_global_shift must be",
        ),
        (dict(position="abspos", position_options={"overflow": "wrap"}), "overflow must be one of"),
        (dict(position="abspos", position_options={"num_positions": 0}), "num_positions"),
        (dict(position="relpos", position_options={"max_distance": 0}), "max_distance"),
        (dict(position_options=[("alpha", 1.0)]), "position_options must be a dict"),
        (dict(dim=30, heads=4), r"dim \(30\) must be divisible by heads \(4\)"),
        (dict(dim=6, heads=2, position="rotary"), "head_dim must be divisible by 2"),
        (dict(dim=7, heads=1, position="sinpos"), "dim must be even"),
        (dict(pad_id=VOCAB), "pad_id must lie in"),
        (dict(dropout=1.0), "dropout"),
        (dict(encoder_layers=0), "encoder_layers"),
        (dict(tie_embeddings=1), "tie_embeddings"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict, match: str) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        Seq2Seq(VOCAB, **{**TINY, **kwargs})


def test_bad_vocab_and_inputs_are_named() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        Seq2Seq(1)
    with pytest.raises(TypeError, match="vocab_size"):
        Seq2Seq(10.0)
    model = _model("cape1d")
    src, mask = _tokens(2, 5, 0), _mask([5, 3], 5)
    with pytest.raises(TypeError, match="src must be an integer tensor"):
        model.encode(src.float(), mask)
    with pytest.raises(TypeError, match="src_mask must be a bool tensor"):
        model.encode(src, mask.long())
    with pytest.raises(ValueError, match=r"tgt_mask must have shape \[2, 3\]"):
        model(src, mask, src[:, :3], mask)
    with pytest.raises(ValueError, match="src_pos must have shape"):
        model.encode(src, mask, torch.zeros(2, 4, 1))


# -- search ---------------------------------------------------------------------------------


def _searchable(position: str, seed: int, vocab: int = VOCAB, eos_bias: float = 0.05) -> Seq2Seq:
    """An untrained model whose outputs are not degenerate: untied output projection (tied, it
    mostly repeats its input token) and a final-norm bias towards EOS (p(EOS) ~ 0.1-0.5), so
    that searches finish at various lengths."""
    torch.manual_seed(seed)
    model = Seq2Seq(vocab, position=position, **{**TINY, "dropout": 0.0}, tie_embeddings=False)
    with torch.no_grad():
        model.decoder.norm.bias.copy_(eos_bias * 32 * model.out_proj.weight[EOS])
    return model


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    src = _tokens(4, 9, seed)
    src[:, 0] = BOS
    mask = _mask([9, 7, 4, 2], 9)
    return src, mask


def _score(model: Seq2Seq, src, mask, hyps: list[list[int]], limits: list[int]) -> torch.Tensor:
    """Total log-probability of each output (with its EOS when it finished) via sequence_nll."""
    width = max(limits) + 1
    tin = torch.full((len(hyps), width), PAD)
    tout = torch.full((len(hyps), width), PAD)
    tmask = torch.zeros(len(hyps), width, dtype=torch.bool)
    for i, h in enumerate(hyps):
        out = h + [EOS] if len(h) < limits[i] else h  # shorter than the limit = it finished
        tin[i, : len(out)] = torch.tensor([BOS] + out[:-1])
        tout[i, : len(out)] = torch.tensor(out)
        tmask[i, : len(out)] = True
    return -sequence_nll(model, src, mask, tin, tout, tmask).sum(1)


@pytest.mark.parametrize("position", MT_POSITIONS)
def test_beam_one_is_greedy(position: str) -> None:
    model = _searchable(position, 1)
    src, mask = _batch(2)
    limits = max_lengths(mask, 1.0, 3)
    greedy = greedy_decode(model, src, mask, bos_id=BOS, eos_id=EOS, max_len=limits)
    beam = beam_search(model, src, mask, bos_id=BOS, eos_id=EOS, beam=1, max_len_a=1.0, max_len_b=3)
    assert beam == greedy
    assert all(len(h) <= n for h, n in zip(greedy, limits.tolist(), strict=True))


def test_beam_finds_at_least_greedys_log_prob() -> None:
    """Not a theorem for beam search (greedy's prefix can be pruned), but it holds for these
    fixed seeds: with length_penalty=0 the beam's total log-prob (recomputed by sequence_nll)
    is >= greedy's wherever greedy finished, and strictly better for several sentences."""
    both = better = 0
    for seed, position in itertools.product(range(4), ("cape1d", "relpos", "abspos")):
        model = _searchable(position, seed)
        src, mask = _batch(seed + 10)
        limits = max_lengths(mask, 1.0, 4)
        greedy = greedy_decode(model, src, mask, bos_id=BOS, eos_id=EOS, max_len=limits)
        beam = beam_search(
            model,
            src,
            mask,
            bos_id=BOS,
            eos_id=EOS,
            beam=4,
            max_len_a=1.0,
            max_len_b=4,
            length_penalty=0.0,
        )
        g = _score(model, src, mask, greedy, limits.tolist())
        b = _score(model, src, mask, beam, limits.tolist())
        for i, n in enumerate(limits.tolist()):
            if len(greedy[i]) < n:  # greedy finished: so did the beam, at least as well
                assert len(beam[i]) < n, (position, seed, i)
                assert float(b[i]) >= float(g[i]) - 1e-4, (position, seed, i, beam[i], greedy[i])
                both += 1
                better += float(b[i]) > float(g[i]) + 1e-3
    assert both >= 20 and better >= 5  # the comparison is not vacuous


def test_wide_beam_is_exhaustive_with_length_normalisation() -> None:
    """Vocab {pad, bos, eos, 3, 4}, 3 steps: a beam wider than every candidate set finds the
    finished output with the best sum log p / length (length with EOS), checked by brute force."""
    src = torch.tensor([[BOS, 3, 4, 4, EOS]])
    mask = torch.ones_like(src, dtype=torch.bool)
    finished = [list(h) for n in range(3) for h in itertools.product((BOS, 3, 4), repeat=n)]
    found = []
    for seed, penalty in itertools.product(range(4), (0.0, 1.0, 2.0)):
        model = _searchable("cape1d", seed, vocab=5, eos_bias=0.0)
        best = beam_search(
            model,
            src,
            mask,
            bos_id=BOS,
            eos_id=EOS,
            beam=40,
            max_len_a=0.0,
            max_len_b=3,
            length_penalty=penalty,
        )[0]
        total = _score(
            model,
            src.expand(len(finished), -1),
            mask.expand(len(finished), -1),
            finished,
            [3] * len(finished),
        )
        lengths = torch.tensor([len(h) + 1 for h in finished], dtype=torch.float32)
        assert best == finished[int((total / lengths**penalty).argmax())], (seed, penalty)
        found.append(tuple(best))
    assert len({len(h) for h in found}) == 3  # empty, one- and two-token winners all occur


def test_unfinished_search_returns_the_best_live_hypothesis() -> None:
    """EOS pushed far down: within 2 steps nothing finishes, and beam search returns the best
    2-token sequence among the extensions of the top-3 first tokens (brute force)."""
    model = _searchable("relpos", 5, eos_bias=-1.0)
    src, mask = _batch(3)
    src, mask = src[:1, :5], mask[:1, :5]
    out = beam_search(model, src, mask, bos_id=BOS, eos_id=EOS, beam=3, max_len_a=0.0, max_len_b=2)
    allowed = [v for v in range(VOCAB) if v not in (PAD, EOS)]
    firsts = [[a] for a in allowed]
    first = _score(
        model, src.expand(len(firsts), -1), mask.expand(len(firsts), -1), firsts, [1] * len(firsts)
    )
    top3 = [allowed[i] for i in first.topk(3).indices.tolist()]
    pairs = [[a, b] for a in top3 for b in allowed]
    total = _score(
        model, src.expand(len(pairs), -1), mask.expand(len(pairs), -1), pairs, [2] * len(pairs)
    )
    assert out == [pairs[int(total.argmax())]]
    assert out != [pairs[int(total.argmin())]]


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_search_same_alone_and_in_a_padded_batch(search: str) -> None:
    model = _searchable("rotary", 2)
    src, mask = _batch(5)
    src = torch.where(mask, src, 7)  # padding holds real ids: only the mask may matter

    def run(s, m):
        if search == "greedy":
            return greedy_decode(
                model, s, m, bos_id=BOS, eos_id=EOS, max_len=max_lengths(m, 1.5, 2)
            )
        return beam_search(model, s, m, bos_id=BOS, eos_id=EOS, beam=3, max_len_a=1.5, max_len_b=2)

    batched = run(src, mask)
    for i, n in enumerate(mask.sum(1).tolist()):
        assert run(src[i : i + 1, :n], mask[i : i + 1, :n]) == [batched[i]]


def test_greedy_matches_teacher_forced_argmax() -> None:
    for position in ("cape1d", "relpos", "sinpos"):
        model = _searchable(position, 4)
        src, mask = _batch(6)
        limits = max_lengths(mask, 1.0, 3).tolist()
        outs = greedy_decode(model, src, mask, bos_id=BOS, eos_id=EOS, max_len=torch.tensor(limits))
        for i, out in enumerate(outs):
            full = out + [EOS] if len(out) < limits[i] else out
            tin = torch.tensor([[BOS] + full[:-1]])
            logits = model.eval()(
                src[i : i + 1], mask[i : i + 1], tin, torch.ones_like(tin, dtype=torch.bool)
            )
            logits[..., PAD] = float("-inf")  # search never emits padding
            assert logits.argmax(-1)[0].tolist() == full


def test_search_restores_mode_and_checks_arguments() -> None:
    model = _model("cape1d").train()
    src, mask = _batch(0)
    out = beam_search(model, src, mask, bos_id=BOS, eos_id=EOS, beam=2)
    assert model.training and len(out) == 4
    greedy_decode(model.eval(), src, mask, bos_id=BOS, eos_id=EOS, max_len=3)
    assert not model.training
    nll = sequence_nll(model, src, mask, src, src, mask)
    assert nll.shape == (4, 9) and bool((nll[~mask] == 0).all()) and bool((nll[mask] > 0).all())
    with pytest.raises(ValueError, match="eos_id must lie in"):
        greedy_decode(model, src, mask, bos_id=BOS, eos_id=VOCAB, max_len=3)
    with pytest.raises(ValueError, match="eos_id must differ"):
        beam_search(model, src, mask, bos_id=BOS, eos_id=PAD)
    with pytest.raises(ValueError, match="beam must be"):
        beam_search(model, src, mask, bos_id=BOS, eos_id=EOS, beam=0)
    with pytest.raises(TypeError, match="model must be a cape Seq2Seq"):
        greedy_decode(torch.nn.Linear(2, 2), src, mask, bos_id=BOS, eos_id=EOS, max_len=3)


def test_sequence_nll_is_the_teacher_forced_cross_entropy() -> None:
    model = _model("abspos").train()
    src, mask = _batch(1)
    tin, tout = _tokens(4, 6, 2), _tokens(4, 6, 3)
    tmask = _mask([6, 5, 2, 1], 6)
    nll = sequence_nll(model, src, mask, tin, tout, tmask)
    assert model.training
    logits = model.eval()(src, mask, tin, tmask)
    expect = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tout, reduction="none")
    torch.testing.assert_close(nll, torch.where(tmask, expect, 0.0))


def test_token_ids_of_any_integer_dtype_are_read() -> None:
    """uint8 / int16 ids (a tokenizer's compact arrays) give the int64 model's outputs."""
    model = _model("rotary", dropout=0.0).eval()
    src, tgt = _tokens(2, 8, 1), _tokens(2, 6, 2)
    src_mask, tgt_mask = _mask([8, 5], 8), _mask([6, 4], 6)
    want = model(src, src_mask, tgt, tgt_mask)
    for dtype in (torch.uint8, torch.int16, torch.int32):
        got = model(src.to(dtype), src_mask, tgt.to(dtype), tgt_mask)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
