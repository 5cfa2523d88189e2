"""`cape.models.CausalLM`: incremental decoding equals the full forward for every encoding,
logits at t never read later tokens (in training, CAPE's draws included), greedy generation is
the argmax continuation of repeated full forwards, sampling keeps to the top k, and what
cannot be cached or is not causal is refused by name."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cape.augment import Augmentation
from cape.encodings.rotary import Rotary
from cape.models import CausalLM
from cape.models.sampling import next_token
from cape.position_sampling import PoSE, RandomizedPositions

VOCAB = 13
TINY = dict(dim=32, layers=2, heads=2, ffn_dim=64)
ATOL = 1e-5
AUG = Augmentation(max_global_shift=5.0, max_local_shift=0.5, max_global_scaling=1.5)
LENGTH = dict(train_length=8.0, factor=2.0)  # texts of 16-20 tokens: beyond train_length

# name -> (cape.build name, position_options): every encoding whose keys a cache can keep
CACHED: dict[str, tuple[str, dict | None]] = {
    "nopos": ("nopos", None),
    "sinpos": ("sinpos", None),
    "cape1d": ("cape1d", None),  # the text preset: Dmax 5, emax 0.5
    "relpos": ("relpos", {"max_distance": 4.0}),  # < the lengths: clipped buckets
    "rotary": ("rotary", None),
    "rotary-pi": ("rotary", {"scaling": "pi", **LENGTH}),
    "rotary-ntk": ("rotary", {"scaling": "ntk", **LENGTH}),
    "rotary-yarn": ("rotary", {"scaling": "yarn", **LENGTH}),
    "rotary-xpos": ("rotary", {"xpos": True, "xpos_center": 0.0, "xpos_scale_base": 16.0}),
    "alibi": ("alibi", None),
    "fire": ("fire", {"threshold": 4.0}),  # < the lengths: the normaliser grows with i
    "rotary+cape": ("rotary", {"augmentation": AUG}),
    "rotary+cape-per-layer": ("rotary", {"augmentation": AUG, "draw": "per_layer"}),
    "alibi+cape": ("alibi", {"augmentation": AUG}),
    "fire+cape": ("fire", {"augmentation": AUG, "threshold": 4.0}),
    # CAPE's successors (cape.position_sampling), as objects or as config files write them
    "rotary+randomized": ("rotary", {"augmentation": RandomizedPositions(64)}),
    "rotary+pose": ("rotary", {"augmentation": PoSE(64)}),
    "rotary+random-float": (
        "rotary",
        {"augmentation": {"kind": "random-float", "train_length": 8}},
    ),
    "alibi+randomized": ("alibi", {"augmentation": {"kind": "randomized", "max_length": 64}}),
    "alibi+random-float": ("alibi", {"augmentation": {"kind": "random-float", "train_length": 8}}),
    "cape1d+randomized": ("cape1d", {"augmentation": RandomizedPositions(64)}),
}
# keys rescaled or re-centred by each call's span: full forwards only
SPAN = {
    "rotary-yarn-span": ("rotary", {"scaling": "yarn", "train_length": 8.0}),
    "rotary-xpos-span": ("rotary", {"xpos": True, "xpos_scale_base": 16.0}),
}
AUGMENTED = {"cape1d", "rotary+cape", "rotary+cape-per-layer", "alibi+cape", "fire+cape"}
AUGMENTED |= {"rotary+randomized", "rotary+pose", "rotary+random-float", "alibi+randomized"}
AUGMENTED |= {"alibi+random-float", "cape1d+randomized"}


def _model(case: str, seed: int = 0, **kw) -> CausalLM:
    position, options = {**CACHED, **SPAN}[case]
    torch.manual_seed(seed)
    return CausalLM(VOCAB, position=position, position_options=options, **{**TINY, **kw})


def _tokens(batch: int, length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def _full_argmax(model: CausalLM, prompt: torch.Tensor, steps: int) -> torch.Tensor:
    """The reference continuation: a full forward per new token, argmax of the last row."""
    out = prompt
    with torch.no_grad():
        for _ in range(steps):
            out = torch.cat([out, model(out)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return out


@pytest.mark.parametrize("case", sorted(CACHED))
def test_prefill_then_steps_equal_the_full_forward(case: str) -> None:
    model = _model(case).eval()
    tokens = _tokens(3, 18, 1)
    with torch.no_grad():
        full = model(tokens)
        cache = model.start_cache()
        rows = [model.step(tokens[:, :7], cache)]  # a prompt of 7, then one token at a time
        rows += [model.step(tokens[:, t : t + 1], cache) for t in range(7, 18)]
    steps = torch.cat(rows, dim=1)
    assert cache.length == 18 and steps.shape == (3, 18, VOCAB) and steps.dtype == torch.float32
    torch.testing.assert_close(steps, full, rtol=0, atol=ATOL)


@pytest.mark.parametrize("case", sorted({**CACHED, **SPAN}))
def test_logits_at_t_ignore_later_tokens_in_training(case: str) -> None:
    model = _model(case).train()  # dropout 0.1 and CAPE's draws on
    tokens, t = _tokens(2, 16, 2), 9
    changed = tokens.clone()
    changed[:, t + 1 :] = (changed[:, t + 1 :] + 1 + _tokens(2, 6, 3) % (VOCAB - 1)) % VOCAB

    def run(x: torch.Tensor, seed: int) -> torch.Tensor:
        torch.manual_seed(0)  # the same dropout masks (they read shapes only)
        return model(x, generator=torch.Generator().manual_seed(seed))

    a, b = run(tokens, 5), run(changed, 5)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], rtol=0, atol=ATOL)
    assert (a[:, t + 1 :] - b[:, t + 1 :]).abs().max() > 1e-3  # later tokens do matter there
    if case in AUGMENTED:  # the generator really feeds CAPE's draws
        assert (a[:, : t + 1] - run(tokens, 6)[:, : t + 1]).abs().max() > 1e-4


@pytest.mark.parametrize("case", sorted({**CACHED, **SPAN}))
def test_greedy_generate_is_the_argmax_of_full_forwards(case: str) -> None:
    model = _model(case, dropout=0.0).eval()
    prompt = _tokens(3, 5, 4)
    expected = _full_argmax(model, prompt, 12)
    got = model.train().generate(prompt, 12)  # generate decodes in eval mode, then restores
    assert model.training
    assert got.shape == (3, 17) and got.dtype == torch.long
    assert torch.equal(got, expected)
    model.loss(got).backward()  # generated tokens can be trained on (not inference tensors)
    if case in CACHED:  # the cached and the uncached loops agree
        assert torch.equal(model.generate(prompt, 12, cache=False), got)


def test_a_window_reads_only_the_last_tokens() -> None:
    """generate(window=W): each token is the argmax of a full forward over the last W tokens
    (a learned table of W rows sees no position past its last), never through the cache."""
    torch.manual_seed(0)
    model = CausalLM(VOCAB, position="abspos", position_options={"num_positions": 6}, **TINY)
    model.eval()
    with torch.no_grad():  # large weights: the argmax depends on what the model reads
        for p in model.parameters():
            p.normal_(0.0, 1.0)
    prompt = _tokens(2, 5, 7)
    seq = prompt
    with torch.no_grad():
        for _ in range(8):
            seq = torch.cat([seq, model(seq[:, -6:])[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(model.generate(prompt, 8, window=6), seq)
    assert torch.equal(model.generate(prompt, 8, window=6, cache=False), seq)
    assert not torch.equal(model.generate(prompt, 8, cache=False), seq)  # the window mattered
    with pytest.raises(ValueError, match="window"):
        model.generate(prompt, 8, window=6, cache=True)
    with pytest.raises(ValueError, match="window"):
        model.generate(prompt, 8, window=0)


def test_sampling_keeps_to_the_top_k_and_is_reproducible() -> None:
    model = _model("rotary+cape").eval()
    prompt = _tokens(8, 3, 5)

    def sample(seed: int, top_k: int | None) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        return model.generate(prompt, 24, temperature=3.0, top_k=top_k, generator=gen)

    def outside_top3(out: torch.Tensor) -> int:
        with torch.no_grad():
            logits = model(out)[:, 2:-1]  # the rows that chose tokens 3..
        top = logits.topk(3, dim=-1).indices
        return int((top != out[:, 3:, None]).all(-1).sum())

    out = sample(0, 3)
    assert out.shape == (8, 27) and torch.equal(out[:, :3], prompt)
    assert outside_top3(out) == 0
    assert outside_top3(sample(0, None)) > 0  # hot sampling without the cut leaves the top 3
    assert torch.equal(sample(0, 3), out)
    assert not torch.equal(sample(1, 3), out)


def test_eos_ends_a_row_and_fills_it() -> None:
    model = _model("alibi").eval()
    gen = torch.Generator().manual_seed(0)
    out = model.generate(_tokens(6, 2, 6), 30, temperature=2.0, generator=gen, eos=4)
    assert out.shape == (6, 32)
    ended = 0
    for row in out[:, 2:].tolist():
        if 4 in row:
            ended += 1
            first = row.index(4)
            assert set(row[first:]) == {4}
    assert ended > 0


def test_loss_is_next_token_cross_entropy_over_real_tokens() -> None:
    model = _model("rotary").eval()
    tokens = _tokens(3, 10, 7)
    mask = torch.arange(10)[None] < torch.tensor([10, 6, 2])[:, None]
    logits = model(tokens, mask)
    expected = [
        F.cross_entropy(logits[i, : n - 1], tokens[i, 1:n], reduction="sum")
        for i, n in enumerate((10, 6, 2))
    ]
    loss = model.loss(tokens, mask)
    torch.testing.assert_close(loss, torch.stack(expected).sum() / (9 + 5 + 1))
    other = torch.where(mask, tokens, (tokens + 3) % VOCAB)  # padding holds other ids
    torch.testing.assert_close(model.loss(other, mask), loss)
    full = F.cross_entropy(model(tokens)[:, :-1].reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    torch.testing.assert_close(model.loss(tokens), full)
    model.train().loss(tokens, mask).backward()
    assert model.out_proj is None and model.embed.weight.grad is not None  # tied head


@pytest.mark.parametrize("case", ["cape1d", "relpos", "rotary-xpos", "fire"])
def test_right_padding_leaves_real_tokens_unchanged(case: str) -> None:
    model = _model(case).eval()
    tokens = _tokens(2, 12, 8)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, 7:] = False
    with torch.no_grad():
        padded = model(tokens, mask)[1, :7]
        alone = model(tokens[1:, :7])[0]
    torch.testing.assert_close(padded, alone, rtol=0, atol=ATOL)


@pytest.mark.parametrize(
    ("case", "option"), [("rotary-yarn-span", "factor"), ("rotary-xpos-span", "xpos_center")]
)
def test_a_cache_is_refused_where_keys_follow_the_span(case: str, option: str) -> None:
    model = _model(case).eval()
    with pytest.raises(ValueError, match=rf"position_options\['{option}'\]"):
        model.start_cache()
    if case == "rotary-yarn-span":  # generate centres an xPos itself (next test)
        with pytest.raises(ValueError, match=option):
            model.generate(_tokens(1, 3, 9), 2, cache=True)
    assert not model.can_cache and _model("rotary-yarn").can_cache


def test_generate_centres_an_xpos_for_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    # xPos centred on each call's positions: generate fixes its centre at the final midpoint,
    # which cancels in q . k, so it decodes through the cache with the full forwards' tokens
    model = _model("rotary-xpos-span", dropout=0.0).eval()
    prompt = _tokens(3, 5, 4)
    reference = model.generate(prompt, 12, cache=False)
    steps = []
    monkeypatch.setattr(model, "step", lambda *a: steps.append(1) or CausalLM.step(model, *a))
    assert torch.equal(model.generate(prompt, 12), reference)
    assert len(steps) == 12  # the prompt, then 11 single tokens
    rotaries = [m for m in model.modules() if isinstance(m, Rotary) and m.xpos]
    assert rotaries and all(m.xpos_center is None for m in rotaries)  # restored
    assert not model.can_cache
    # the logits themselves: the centre cancels (a full forward centred at 0 or at the
    # sequence's own midpoint), and cached steps at a fixed centre give the full forward's
    full = model(reference)
    for m in rotaries:
        m.xpos_center = 0.0
    torch.testing.assert_close(model(reference), full, rtol=1e-4, atol=1e-4)
    cache = model.start_cache()
    with torch.inference_mode():
        stepped = [model.step(reference[:, :5], cache)]
        stepped += [model.step(reference[:, t : t + 1], cache) for t in range(5, 17)]
    torch.testing.assert_close(torch.cat(stepped, dim=1), full, rtol=1e-4, atol=1e-4)


def test_cache_and_step_need_eval_mode() -> None:
    model = _model("rotary").train()
    with pytest.raises(ValueError, match="eval"):
        model.start_cache()
    cache = model.eval().start_cache()
    with pytest.raises(ValueError, match="eval"):
        model.train().step(_tokens(1, 2, 0), cache)


NORMALIZED = Augmentation(max_global_shift=5.0, normalize=True)


@pytest.mark.parametrize(
    ("position", "options"),
    [
        ("cape1d", {"augmentation": NORMALIZED}),
        ("rotary", {"augmentation": NORMALIZED}),
        ("rotary", {"augmentation": NORMALIZED, "draw": "per_layer"}),
        ("alibi", {"augmentation": NORMALIZED}),
    ],
)
def test_mean_normalisation_is_refused(position: str, options: dict) -> None:
    with pytest.raises(ValueError, match="normalize"):
        CausalLM(VOCAB, position=position, position_options=options, **TINY)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        (dict(top_k=VOCAB + 1, temperature=1.0), ValueError, "top_k"),
        (dict(top_k=0, temperature=1.0), ValueError, "top_k"),
        (dict(temperature=-1.0), ValueError, "temperature"),
        (dict(eos=VOCAB), ValueError, "eos"),
        (dict(cache="yes"), TypeError, "cache"),
    ],
)
def test_generate_names_bad_arguments(kwargs: dict, error: type, words: str) -> None:
    model = _model("rotary")
    with pytest.raises(error, match=words):
        model.generate(_tokens(1, 3, 0), 2, **kwargs)
    with pytest.raises(ValueError, match="prompt"):
        model.generate(_tokens(1, 0, 0), 2)


def test_spec_rebuilds_the_model_and_options_are_checked() -> None:
    model = _model("rotary-yarn", tie_embeddings=False)
    rebuilt = CausalLM(**model.spec)
    assert rebuilt.spec == model.spec and rebuilt.out_proj is not None
    assert CausalLM(VOCAB, position="alibi", **TINY).stack.layers[0].self_attn.biases[0].causal
    with pytest.raises(ValueError, match="position"):
        CausalLM(VOCAB, position="cape2d", **TINY)  # reads 2-D positions
    with pytest.raises(ValueError, match="divisible"):
        CausalLM(VOCAB, dim=30, heads=4)


# --- argument checks: every integer dtype, temperatures at their limits, eos, 2-D names ------

SMALL = dict(dim=8, layers=1, heads=2, ffn_dim=8, dropout=0.0)
PROMPT = torch.tensor([[1, 2, 3]])
INTEGERS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.uint16, torch.uint32]


def _small() -> CausalLM:
    torch.manual_seed(0)
    return CausalLM(11, **SMALL).eval()


@pytest.mark.parametrize("dtype", INTEGERS + [torch.uint64], ids=str)
def test_every_integer_dtype_reads_as_the_same_ids(dtype: torch.dtype) -> None:
    # nn.Embedding reads int32/int64 only, cross_entropy's targets int64/uint8 only: the ids of
    # any integer dtype (a corpus's uint8 / uint16 arrays) give what int64 ids give
    model, ids = _small(), PROMPT.to(dtype)
    assert torch.equal(model(ids), model(PROMPT))
    assert torch.equal(model.loss(ids), model.loss(PROMPT))
    stepped = model.step(ids, model.start_cache())
    assert torch.equal(stepped, model.step(PROMPT, model.start_cache()))
    for max_new in (0, 2):  # long for max_new = 0 too, as the docstring says
        out = model.generate(ids, max_new)
        assert out.dtype == torch.int64 and torch.equal(out, model.generate(PROMPT, max_new))


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda m: m(PROMPT.bool()), TypeError, "tokens must be an integer tensor"),
        (lambda m: m.generate(PROMPT.bool(), 2), TypeError, "prompt must be an integer tensor"),
        (lambda m: m(torch.tensor([[255]], dtype=torch.uint8)), ValueError, "tokens must hold"),
        (lambda m: m(torch.tensor([[-1]], dtype=torch.int8)), ValueError, "tokens must hold"),
        (lambda m: m(torch.tensor([[2**63 + 1]], dtype=torch.uint64)), ValueError, "tokens must"),
        (lambda m: m.generate(PROMPT, 2, eos=True), TypeError, "eos must be None or an int"),
        (lambda m: m.generate(PROMPT, 2, eos=3.0), TypeError, "eos must be None or an int"),
        (lambda m: m.generate(PROMPT, 2, eos=torch.tensor(3)), TypeError, "eos must be"),
        (lambda m: m.generate(PROMPT, 2, eos=11), ValueError, "eos must be None or a token id"),
        (lambda m: m.generate(PROMPT, 2**24), ValueError, r"max_new: prompt \+ max_new"),
    ],
)
def test_bad_tokens_and_eos_are_refused_by_name(call, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        call(_small())


def test_a_2d_name_is_refused_for_its_positions_before_its_options() -> None:
    # rope-mixed needs heads= among its own options: the model's reason comes first
    for name in ("rope-mixed", "rope-axial", "rotary2d", "cape2d", "sine-2d"):
        with pytest.raises(ValueError, match=rf"'{name}' reads 2-D positions; a language model"):
            CausalLM(11, dim=8, heads=2, position=name)


@pytest.mark.parametrize("temperature", [5e-324, 1e-45, 1e-38, 1e-30])
def test_a_vanishing_temperature_is_the_greedy_limit(temperature: float) -> None:
    # softmax(l / T) -> all its mass on the argmax as T -> 0 (ties shared): a denormal T is
    # greedy decoding, not a NaN distribution
    model = _small()
    g = torch.Generator().manual_seed(0)
    out = model.generate(PROMPT, 6, temperature=temperature, generator=g)
    assert torch.equal(out, model.generate(PROMPT, 6))
    tied = torch.tensor([[1.0, 3.0, 3.0, -2.0]] * 500)  # two maxima: each drawn, nothing else
    drawn = next_token(tied, temperature, None, g)
    assert set(drawn.tolist()) == {1, 2} and 150 < int((drawn == 1).sum()) < 350


@pytest.mark.parametrize("temperature", [1e30, 1e38, 1e300])
def test_a_huge_temperature_is_the_uniform_limit(temperature: float) -> None:
    # softmax(l / T) -> 1 / V as T -> inf: 4000 draws over V = 4 land ~1000 on each id
    logits = torch.tensor([[5.0, -3.0, 0.0, 2.0]]).expand(4000, 4)
    drawn = next_token(logits, temperature, None, torch.Generator().manual_seed(0))
    counts = torch.bincount(drawn, minlength=4)
    assert int(counts.min()) > 880 and int(counts.max()) < 1120, counts.tolist()
    out = _small().generate(PROMPT, 4, temperature=temperature)
    assert out.dtype == torch.int64 and out.shape == (1, 7)
