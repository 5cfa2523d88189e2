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


def causal_lm(d: Draw) -> Call:
    """A tiny CausalLM (any 1-D encoding, train or eval) called once: forward, loss, a cached
    prefill then one step (eval), or generate (greedy or sampled)."""
    heads = d.choice((1, 2))
    vocab = d.bad("vocab_size", 11, (1, 2.5))
    kw: dict = dict(dim=d.bad("dim", 4 * heads, (0, "8")), layers=d.int(1, 2), heads=heads)
    kw.update(ffn_dim=8, dropout=d.choice((0.0, 0.1)))
    name = d.bad("position", d.choice(NAMES), ("cape2d", 3))
    kw["position"] = name
    kw["position_options"] = _options(d, name) if name in NAMES else {}
    b, t = d.int(0, 2), d.int(1, 4)
    ids = torch.randint(0, 11, (b, t))
    wrong = [ids.float(), ids[..., None]] + ([ids + 11] if ids.numel() else [])
    tokens = d.bad("tokens", ids, wrong)
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
    max_new = d.bad("max_new", d.int(0, 3), (-1, 1.5))
    sample = dict(
        temperature=d.bad("temperature", d.choice((0.0, 1.0)), (-1.0, NAN, "hot")),
        top_k=d.bad("top_k", d.choice((None, 3)), (0, 12, 2.5)),
        eos=d.bad("eos", d.choice((None, 4)), (11, -1)),
        generator=d.bad("generator", torch.Generator().manual_seed(d.int(0, 9)), ("gen",)),
    )

    def check(out: object) -> str | None:
        return expect(out, (b, t + max_new), torch.int64)

    return d.finish(
        "models.CausalLM",
        lambda: model().generate(tokens, max_new, **sample),
        names + ["prompt", "max_new", *sample],
        check,
    )


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
