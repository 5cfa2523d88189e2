"""Case generators of the contract suite for `cape.models.CausalLM` (issue 39, item 1): the
constructor over every 1-D encoding (scalings, xPos, CAPE's augmentation), then forward, loss,
a cached step or generate. Each takes a `Draw` and returns a `Call` (see _contract.py)."""

from __future__ import annotations

import math

import torch
from _contract import Call, Draw, expect

import cape
from cape.models import CausalLM, has_positions, without_positions

NAN = math.nan
NAMES = ("nopos", "sinpos", "cape1d", "abspos", "relpos", "rotary", "alibi", "fire")
AUG = cape.Augmentation(max_global_shift=2.0, max_local_shift=0.5, max_global_scaling=1.2)
ID_DTYPES = (torch.int32, torch.int16, torch.int8, torch.uint8, torch.uint16)
U64 = torch.uint64
# denormal (the greedy limit) to huge (the uniform limit); 0 = greedy
TEMPERATURES = (0.0, 0.0, 1.0, 0.7, 5e-324, 1e-45, 1e-30, 1e30, 1e300)
BAD_TEMPERATURES = (-1.0, NAN, math.inf, "hot", True, -5e-324)
BAD_EOS = (11, -1, True, False, 3.0, torch.tensor(3), "4")
# CAPE's successors, as objects or as the mappings config files write
SAMPLED = (cape.RandomizedPositions(16), {"kind": "pose", "target_length": 16})
SAMPLED += ({"kind": "random-float", "train_length": 4.0},)


def _options(d: Draw, name: str) -> dict:
    """position_options for `name`: a table size, a rotary scaling or xPos (with or without
    what a cache needs), CAPE's augmentation (or a refused one) where the encoding takes it."""
    options: dict = {"num_positions": 16} if name == "abspos" else {}
    if name == "rotary" and d.coin(0.4):
        options.update(scaling=d.choice(("pi", "ntk", "yarn")), train_length=4.0)
        if d.coin():
            options["factor"] = 2.0
    if name == "rotary" and d.coin(0.3):
        options.update(xpos=True, xpos_scale_base=16.0)
        if d.coin():
            options["xpos_center"] = 0.0
    if name in ("cape1d", "rotary", "alibi", "fire") and d.coin(0.5):
        refused = (cape.Augmentation(normalize=True), 3)
        options["augmentation"] = d.bad("augmentation", d.choice((AUG, AUG, *SAMPLED)), refused)
    return options


def token_ids(d: Draw, name: str, b: int, t: int, vocab: int = 11) -> object:
    """Token ids [B, T] in [0, vocab) of any integer dtype (int64 mostly; a corpus's uint8 /
    uint16 arrays, int8 ... int32), or a refused value: floats, bools, complex, another rank,
    a list, ids out of range (>= vocab, negative int8, a uint64 past 2**63 that wraps)."""
    ids = torch.randint(0, vocab, (b, t))
    if d.coin(0.4):
        ids = ids.to(d.choice(ID_DTYPES))
    wrong: list = [ids.float(), ids.bool(), ids.to(torch.complex64), ids[..., None], ids.flatten()]
    wrong += [ids.tolist(), "tokens"]
    if ids.numel():
        big = ids.long() + vocab
        wrong += [big, (ids.long() - 12).to(torch.int8), torch.full((b, t), 2**64 - 1, dtype=U64)]
        wrong += [big.to(torch.int16)]
    return d.bad(name, ids, wrong)


def sampling(d: Draw) -> dict:
    """generate's sampling keywords: temperatures from denormal to huge (0 = greedy), top_k,
    eos and a generator, or one refused value (wrong types, bools, NaN, inf, out of range)."""
    return dict(
        temperature=d.bad("temperature", d.choice(TEMPERATURES), BAD_TEMPERATURES),
        top_k=d.bad("top_k", d.choice((None, 1, 3, 11)), (0, 12, 2.5, True, "3")),
        eos=d.bad("eos", d.choice((None, 0, 4, 10)), BAD_EOS),
        generator=d.bad("generator", d.maybe(0.8, _generator), ("gen", 3, torch.zeros(1))),
    )


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(7)


def model_kwargs(d: Draw) -> tuple[object, dict]:
    """(vocab_size, the other constructor keywords) of a tiny CausalLM, or one refused value:
    sizes 0, bools, strings, heads not dividing dim, dropout outside [0, 1), NaN, 2-D and
    unknown position names, a non-bool tie_embeddings."""
    heads = d.bad("heads", d.choice((1, 2)), (0, True, 3, "2"))
    vocab = d.bad("vocab_size", 11, (1, 2.5, True, "11", 0))
    dim = d.bad("dim", 4 * heads if isinstance(heads, int) else 8, (0, "8", True, -4))
    kw: dict = dict(dim=dim, layers=d.bad("layers", d.int(1, 2), (0, True, 1.0)), heads=heads)
    kw["ffn_dim"] = d.bad("ffn_dim", 8, (0, False, 8.5))
    kw["dropout"] = d.bad("dropout", d.choice((0.0, 0.1)), (-0.1, 1.0, NAN, True, "0.1"))
    name = d.bad("position", d.choice(NAMES), ("cape2d", "rope-mixed", "rotary2d", 3, "nope"))
    kw["position"] = name
    kw["position_options"] = _options(d, name) if name in NAMES else {}
    kw["tie_embeddings"] = d.bad("tie_embeddings", d.coin(0.8), ("yes", 1, None))
    return vocab, kw


def causal_lm(d: Draw) -> Call:
    """A tiny CausalLM (any 1-D encoding, train or eval) called once: forward, loss, a cached
    prefill then one step (eval), or generate (greedy or sampled, every option)."""
    vocab, kw = model_kwargs(d)
    b, t = d.int(0, 2), d.int(1, 4)
    tokens = token_ids(d, "tokens", b, t)
    which = d.choice(("forward", "loss", "step", "generate"))
    train = d.coin() and which != "step"
    names = ["vocab_size", *kw, *kw["position_options"], "tokens"]

    def model() -> CausalLM:
        return CausalLM(vocab, **kw).train(train)

    if which in ("forward", "loss"):
        mask = d.mask("mask", (b, t))
        gen = d.bad("generator", torch.Generator().manual_seed(d.int(0, 9)), ("gen",))
        if which == "forward":
            fn, want = (lambda: model()(tokens, mask, generator=gen)), (b, t, 11)
        else:
            fn, want = (lambda: model().loss(tokens, mask, generator=gen)), ()
        check = lambda out: expect(out, want, torch.float32)  # noqa: E731
        return d.finish(f"models.CausalLM.{which}", fn, names + ["mask", "generator"], check)
    if which == "step":

        def step() -> torch.Tensor:
            lm = model()
            cache = lm.start_cache()
            lm.step(tokens, cache)
            return lm.step(tokens[:, -1:], cache)

        check = lambda out: expect(out, (b, 1, 11), torch.float32)  # noqa: E731
        return d.finish("models.CausalLM.step", step, names, check)
    max_new = d.bad("max_new", d.int(0, 3), (-1, 1.5, True, 2**24))
    sample = sampling(d)
    sample["cache"] = d.bad("cache", d.choice((None, None, True, False)), ("yes", 1))
    sample["window"] = d.bad("window", d.choice((None, None, 1, 3)), (0, True, 2.0))

    def check(out: object) -> str | None:
        return expect(out, (b, t + max_new), torch.int64) or ids_in_range(out, 11)

    return d.finish(
        "models.CausalLM",
        lambda: model().generate(tokens, max_new, **sample),
        names + ["prompt", "max_new", *sample],
        check,
    )


def ids_in_range(out: object, vocab: int) -> str | None:
    """None when out holds token ids in [0, vocab), else what is wrong."""
    assert isinstance(out, torch.Tensor)
    if out.numel() and not (0 <= int(out.min()) and int(out.max()) < vocab):
        return f"ids outside [0, {vocab}): {out.min()}..{out.max()}"
    return None


def positions_taken_out(d: Draw) -> Call:
    """`without_positions` around a forward of a tiny CausalLM (any 1-D encoding), or
    `has_positions`; a model that is not a module is refused."""
    name = d.choice(NAMES)
    options = {"num_positions": 16} if name == "abspos" else {}
    lm = CausalLM(11, position=name, position_options=options, dim=4, layers=1, heads=1, ffn_dim=8)
    model = d.bad("model", lm.eval(), (None, "model", torch.zeros(2)))
    tokens = torch.randint(0, 11, (d.int(1, 2), d.int(1, 4)))
    if d.coin():
        return d.finish("models.has_positions", lambda: has_positions(model), ["model"],
                        lambda out: None if out is (name != "nopos") else f"got {out}")  # fmt: skip

    def blind() -> torch.Tensor:
        with without_positions(model) as had:
            assert had is (name != "nopos") and not has_positions(model)
            return model(tokens)

    check = lambda out: expect(out, (*tokens.shape, 11), torch.float32)  # noqa: E731
    return d.finish("models.without_positions", blind, ["model"], check)


GENERATORS = {"lm": [causal_lm, positions_taken_out]}
