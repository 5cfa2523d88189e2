"""Property generators of the contract suite for `cape.models.CausalLM`: each draws a tiny model
and inputs, and its `Call.check` (or the call itself) verifies one property against an
independent computation. A property that does not hold is a failure of the suite (see
_contract.py's classes): "wrong-output" from a check, "exception" from an AssertionError.

- cache equals full: a prefill then one `step` per token gives the rows of one full forward;
- causal in training: with the same generator (CAPE's draws) and the same dropout seed, the
  logits at t do not change when the tokens after t do;
- a call leaves the model as it was: its state_dict bit for bit and every module's mode, after
  a refused call (one bad argument, a foreign cache, a cache refused inside generate's loop)
  and after a valid one (generate restores the modes it found, mixed ones too);
- outputs long and finite: generate gives int64 ids in [0, V) that start with the prompt
  (whatever its integer dtype), repeat eos once a row emitted it, and equal greedy decoding
  as the temperature vanishes; forward and loss give finite float32.
"""

from __future__ import annotations

import torch
from _contract import Call, Draw, expect
from _contract_lm import AUG, ids_in_range, model_kwargs, sampling, token_ids

from cape.models import CausalLM

VOCAB = 11
# (name, position_options) whose keys a cache keeps: fixed scaling factors, a centred xPos
CACHEABLE = (
    ("nopos", {}),
    ("sinpos", {}),
    ("cape1d", {}),
    ("abspos", {"num_positions": 16}),
    ("relpos", {"max_distance": 2.0}),
    ("rotary", {}),
    ("rotary", {"scaling": "yarn", "train_length": 4.0, "factor": 2.0}),
    ("rotary", {"scaling": "ntk", "train_length": 4.0, "factor": 2.0}),
    ("rotary", {"xpos": True, "xpos_center": 0.0, "xpos_scale_base": 16.0}),
    ("alibi", {}),
    ("fire", {"threshold": 2.0}),
    ("rotary", {"augmentation": AUG}),  # eval: nothing drawn
    ("alibi", {"augmentation": AUG}),
)
# in training: CAPE's draws (shared or per layer), keys that follow each call's span
TRAINED = CACHEABLE + (
    ("rotary", {"augmentation": AUG, "draw": "per_layer"}),
    ("fire", {"augmentation": AUG, "threshold": 2.0}),
    ("cape1d", {"augmentation": AUG}),
    ("rotary", {"scaling": "yarn", "train_length": 4.0}),
    ("rotary", {"xpos": True, "xpos_scale_base": 16.0}),
)


def _model(d: Draw, configs: tuple, *, dropout: float = 0.0) -> tuple[CausalLM, str]:
    name, options = d.choice(configs)
    heads = d.choice((1, 2))
    model = CausalLM(VOCAB, dim=4 * heads, layers=d.int(1, 2), heads=heads, ffn_dim=8,
                     dropout=dropout, position=name, position_options=options)  # fmt: skip
    return model, f"{name} {sorted(options)}"


def cache_equals_full(d: Draw) -> Call:
    """Prefill T0 tokens, then `step` the next ones one at a time: the rows equal one full
    forward over all of them (eval). A cache of another model is refused by name."""
    model, what = _model(d, CACHEABLE)
    model.eval()
    b, t0, n = d.int(1, 2), d.int(1, 4), d.int(1, 4)
    tokens = torch.randint(0, VOCAB, (b, t0 + n))
    d.args["model"] = what
    other = CausalLM(VOCAB, dim=4, layers=3, heads=1, ffn_dim=8).eval().start_cache()
    foreign = d.bad("cache", None, (other, "cache", {}))

    def call() -> tuple[torch.Tensor, torch.Tensor]:
        full = model(tokens)
        cache = model.start_cache() if foreign is None else foreign
        rows = [model.step(tokens[:, :t0], cache)]
        rows += [model.step(tokens[:, i : i + 1], cache) for i in range(t0, t0 + n)]
        return full, torch.cat(rows, dim=1)

    def check(out: tuple[torch.Tensor, torch.Tensor]) -> str | None:
        full, cached = out
        gap = float((full - cached).abs().max())
        tolerance = 1e-4 * (1.0 + float(full.abs().max()))  # float32 sums in another order
        return None if gap <= tolerance else f"cache != full: {gap:.3g}"

    return d.finish("properties.CausalLM cache equals full", call, ("cache",), check)


def causal_in_training(d: Draw) -> Call:
    """Training forwards with the same generator and dropout seed over tokens that differ
    after position t (right padding sometimes): the logits at every real position <= t agree."""
    model, what = _model(d, TRAINED, dropout=d.choice((0.0, 0.1)))
    model.train()
    b, length = d.int(1, 2), d.int(2, 6)
    t = d.int(0, length - 2)
    tokens = torch.randint(0, VOCAB, (b, length))
    later = tokens.clone()
    later[:, t + 1 :] = (tokens[:, t + 1 :] + torch.randint(1, VOCAB, (b, length - t - 1))) % VOCAB
    lengths = torch.randint(1, length + 1, (b,)) if d.coin(0.3) else None
    mask = None if lengths is None else torch.arange(length)[None] < lengths[:, None]
    seed = d.int(0, 2**31 - 1)
    gen = d.bad("generator", torch.Generator(), ("gen",))
    d.args.update(model=what, t=t, lengths=lengths)

    def run(x: torch.Tensor) -> torch.Tensor:
        torch.manual_seed(seed)  # dropout's draws
        if isinstance(gen, torch.Generator):
            gen.manual_seed(seed)  # CAPE's draws
        return model(x, mask, generator=gen)

    def call() -> tuple[torch.Tensor, torch.Tensor]:
        return run(tokens), run(later)

    def check(out: tuple[torch.Tensor, torch.Tensor]) -> str | None:
        a, z = out
        for row in range(b):
            last = t if lengths is None else min(t, int(lengths[row]) - 1)
            gap = float((a[row, : last + 1] - z[row, : last + 1]).abs().max())
            if gap > 1e-5:
                return f"row {row}: logits at <= {last} moved by {gap:.3g} with later tokens"
        return None

    return d.finish("properties.CausalLM causal in training", call, ("generator",), check)


def _snapshot(model: CausalLM) -> tuple[dict[str, torch.Tensor], list[bool]]:
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return state, [m.training for m in model.modules()]


def _changes(model: CausalLM, before: tuple[dict[str, torch.Tensor], list[bool]]) -> str:
    state, modes = before
    now = model.state_dict()
    moved = [k for k, v in state.items() if k not in now or not torch.equal(v, now[k])]
    pairs = zip(model.modules(), modes, strict=True)
    flipped = [i for i, (m, was) in enumerate(pairs) if m.training != was]
    out = f"state_dict {moved[:3]}" if moved or set(now) != set(state) else ""
    return out + (f" modes of {len(flipped)} modules (first #{flipped[0]})" if flipped else "")


def _operation(d: Draw, model: CausalLM, train: bool) -> tuple[str, object, list[str]]:
    """One call of `model` (with, now and then, one refused argument) -> (label, callable,
    names of its arguments)."""
    which = d.choice(("forward", "loss", "step", "generate", "generate", "start_cache"))
    b, t = d.int(1, 2), d.int(1, 4)
    tokens = token_ids(d, "tokens", b, t)
    if which in ("forward", "loss"):
        mask = d.bad("mask", None, (torch.ones(b, t + 1, dtype=torch.bool), "mask"))
        gen = d.bad("generator", None, ("gen",))
        fn = getattr(model, "loss" if which == "loss" else "forward")
        return which, lambda: fn(tokens, mask, generator=gen), ["tokens", "mask", "generator"]
    if which == "start_cache":  # refused in training, and where keys would not stay valid
        return which, model.start_cache, ["eval", "factor", "xpos_center", "cache"]
    if which == "step":
        other = CausalLM(VOCAB, dim=4, layers=3, heads=1, ffn_dim=8).eval().start_cache()
        cache = d.bad("cache", "own", (other, None, "cache"))
        return which, lambda: model.step(
            tokens, model.start_cache() if cache == "own" else cache
        ), ["tokens", "cache", "eval"]  # fmt: skip
    max_new = d.bad("max_new", d.int(0, 3), (-1, 1.5, True, 2**24))
    kw = sampling(d)
    kw["cache"] = d.bad("cache", d.choice((None, True, False)), ("yes",))  # True: maybe refused
    kw["window"] = d.bad("window", d.choice((None, None, 2)), (0, True))
    names = ["prompt", "max_new", *kw, "factor", "xpos_center", "cacheable", "window"]
    return which, lambda: model.generate(tokens, max_new, **kw), names


def call_keeps_model(d: Draw) -> Call:
    """Any call of a CausalLM in train, eval or a mixed mode (the stack or the embedding in
    the other mode), refused or not: its state_dict and every module's mode are unchanged."""
    name, options = d.choice(TRAINED)
    model = CausalLM(VOCAB, dim=8, layers=1, heads=2, ffn_dim=8, dropout=0.1, position=name,
                     position_options=options)  # fmt: skip
    train = d.coin()
    model.train(train)
    mixed = d.choice((None, None, "stack", "embed"))
    if mixed is not None:
        getattr(model, mixed).train(not train)
    which, op, names = _operation(d, model, train)
    d.args.update(model=f"{name} {sorted(options)}", train=train, mixed=mixed)
    before = _snapshot(model)

    def call() -> object:
        try:
            out = op()  # type: ignore[operator]
        except Exception as e:
            changed = _changes(model, before)
            if changed:
                raise AssertionError(f"the refused call changed the model: {changed}") from e
            raise
        changed = _changes(model, before)
        if changed:
            raise AssertionError(f"the call changed the model: {changed}")
        return out

    return d.finish(f"properties.CausalLM.{which} keeps the model", call, names)


def generate_outputs(d: Draw) -> Call:
    """generate over every sampling option and prompt dtype: int64 ids in [0, V) that start
    with the prompt, eos repeated once emitted, the greedy result as the temperature vanishes;
    and forward's logits finite."""
    model, what = _model(d, TRAINED)
    model.train(d.coin(0.3))
    b, t = d.int(1, 3), d.int(1, 4)
    prompt = token_ids(d, "prompt", b, t)
    max_new = d.int(0, 5)
    kw = sampling(d)
    kw["cache"] = d.choice((None, False, True if model.can_cache else None))
    d.args["model"] = what

    def call() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = model.generate(prompt, max_new, **kw)
        greedy = model.generate(prompt, max_new, eos=kw["eos"])
        return out, greedy, model.eval()(prompt)

    def check(outs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> str | None:
        out, greedy, logits = outs
        problem = expect(out, (b, t + max_new), torch.int64) or ids_in_range(out, VOCAB)
        problem = problem or expect(logits, (b, t, VOCAB), torch.float32)
        if problem:
            return problem
        assert isinstance(prompt, torch.Tensor)
        if not torch.equal(out[:, :t], prompt.long()):
            return "the output does not start with the prompt"
        if kw["eos"] is not None:
            new = out[:, t:]
            ended = (new == kw["eos"]).cumsum(dim=1) > 0
            if bool((ended & (new != kw["eos"])).any()):
                return "a row went on after eos"
        if kw["temperature"] <= 1e-30 and not torch.equal(out, greedy):
            return f"temperature {kw['temperature']:g} is not the greedy limit"
        return None

    names = ["prompt", "max_new", *kw]
    return d.finish("properties.CausalLM outputs long and finite", call, names, check)


def constructed(d: Draw) -> Call:
    """The constructor alone, every keyword's refused values: a model or a named error."""
    vocab, kw = model_kwargs(d)
    names = ["vocab_size", *kw, *kw["position_options"]]
    return d.finish("models.CausalLM.__init__", lambda: CausalLM(vocab, **kw), names)


GENERATORS = {
    "lm-properties": [
        cache_equals_full,
        causal_in_training,
        call_keeps_model,
        call_keeps_model,
        generate_outputs,
        constructed,
    ]
}
