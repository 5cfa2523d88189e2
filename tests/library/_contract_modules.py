"""Case generators of the contract suite: every `cape.build` name (options, then forward) and the
models (constructors, then forward). Each takes a `Draw` and returns a `Call` (_contract.py)."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math

import torch
from _contract import Call, Draw, expect
from _contract_api import FLOATS_ALL, each, hop_value

import cape
from cape.build import AUGMENTATION_FIELDS
from cape.models import (
    CTCModel,
    MultiheadAttention,
    Seq2Seq,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
    ViT,
    attention_mask,
    beam_search,
    greedy_decode,
    max_lengths,
    position_plan,
    sequence_nll,
)

NAN, INF = math.nan, math.inf

# option -> (valid values, values that must be refused)
OPTIONS: dict[str, tuple[tuple, tuple]] = {
    "max_global_shift": ((0.0, 1.5, 60.0), (-1.0, NAN, "a")),
    "max_local_shift": ((0.0, 0.5), (-0.5, "x")),
    "max_global_scaling": ((1.0, 1.4), (0.5, 0.0)),
    "normalize": ((False, True), (1, "yes")),
    "augmentation": (
        (None, cape.Augmentation(max_global_shift=1.0), {"max_local_shift": 0.25}),
        ({"foo": 1}, "aug", 3),
    ),
    "freq_scale": ((1.0, 30.0, 0.4), (0.0, -1.0, NAN, 1e300)),
    "base": ((10000.0, 100.0), (1.0, 0.5, -3.0)),
    "rho": (("exact", "linspace"), ("other",)),
    "extent": ((1.0, 0.5, 2.0), (0.0, -1.0, INF)),
    "num_positions": ((4, 16), (0, -2, 3.5)),
    "overflow": (("mod", "clamp"), ("wrap",)),
    "init_std": ((0.02, 0.0), (-1.0, NAN)),
    "grid": (((2, 2), (3, 4)), ((0, 2), 4, (2,), "ab")),
    "cls_token": ((False, True), (1,)),
    "max_distance": ((4.0, 16.0, 1e3), (0.0, -1.0, NAN, 1e12, 1e30)),
    "step": ((1.0, 0.5), (0.0, -1.0, 1e-320)),
    "values": ((False, True), (1,)),
    "groups": ((1, 2), (0, -1, "2")),
    "fourier_dim": ((4, 8), (3, 0)),
    "hidden_dim": ((4, 8), (0,)),
    "gamma": ((1.0, 10.0), (0.0, -1.0)),
    "learnable": ((True, False), ("no",)),
    "mlp": ((True, True, False), ("no",)),
    "fourier": ((True, True, False), ("no",)),
    "low": ((-1.0, 0.0), (NAN,)),
    "high": ((1.0, 2.0), (INF,)),
    "fit_grid": ((None, None, (4, 4), (8, 6)), (4, (1,), "ab")),
    # Rotary's length extension and xPos (1-D)
    "scaling": ((None, "pi", "ntk", "yarn"), ("foo", 1)),
    "train_length": ((None, 2, 16.0, 1e3), (0, -1.0, NAN, "8")),
    "factor": ((None, 1.0, 4.0), (0.5, 0.0, NAN, "2")),
    "yarn_alpha": ((1.0, 0.0, 2.0), (-1.0, NAN, 64.0)),
    "yarn_beta": ((32.0, 8.0), (0.5, INF, NAN)),
    "xpos": ((False, True), (1, "yes")),
    "xpos_scale_base": ((512.0, 8.0), (0.0, -1.0, NAN)),
    "xpos_center": ((None, 0.0, -30.0), (NAN, INF, "0", 1e39)),
    # ALiBi
    "causal": ((False, True), (1, "yes")),
    "slopes": ((None,), ("ab", [0.0] * 9, [NAN], [[0.5]])),  # 9: no drawn head count
    # FIRE
    "hidden": ((32, 8), (0, -1, "8", 2.0)),
    "c": ((0.1, 1.0, 30.0), (0.0, -1.0, NAN, "1")),
    "threshold": ((512.0, 1.0, 0.02), (0.0, -2.0, INF, NAN)),
    # RoPE-ViT's 2-D rotary (rope-axial, rope-mixed)
    "heads": ((1, 2), (0, -1, "2", 1.5)),
    "theta": ((None, 100.0, 10.0, 2.0), (1.0, 0.5, NAN, INF, "10")),
}
SAMPLED = (
    cape.RandomizedPositions(64),
    {"kind": "pose", "target_length": 64},
    cape.RandomFloatPositions(8.0),
)


def _option(d: Draw, name: str, key: str, entry: object) -> object:
    valid, invalid = OPTIONS.get(key, ((None,), ()))
    if key == "preset":
        valid, invalid = entry.presets, ("video", 3)  # type: ignore[attr-defined]
    elif key == "pos_dim" and name.startswith("rope-"):  # 2-D, or M-D (a box's 4 edges)
        valid, invalid = (2, 2, 3, 4), (1, 0, "2")
    elif key == "pos_dim":
        valid, invalid = ((1, 2), (3, 0)) if name.startswith("rotary") else ((1, 2, 4), (0, -1))
    elif key == "sizes":
        n = 4 if name == "embed-4d" else 2
        valid, invalid = ((4,) * n, (2, 3) * (n // 2)), ((), (0, 3), "ab", 4)
    elif key == "max_local_shift" and name in ("cape2d", "sinpos2d"):
        valid = valid + ("auto",)
    elif key == "augmentation":  # the other augmentations of the family, objects or mappings
        valid = valid + SAMPLED
    return d.bad(key, d.choice(valid), invalid)


def build_encoding(d: Draw, name: str) -> tuple[str, object, dict, Call | None]:
    """A name of cape.ENCODINGS, its dim and options -> (name, module or None, options, the
    failing construction as a Call when it raised or was invalid)."""
    entry = cape.ENCODINGS[name]
    kind = entry.cls.kind
    dims = (2, 4, 8) if kind == "attention" else (4, 8, 16)
    if name.startswith("rope-"):  # RoPE-ViT's planes: hd/4 per axis
        dims = (4, 8, 16)
    dim = d.bad("dim", d.choice(dims), (0, -4, 2.5, "8"))
    params = inspect.signature(entry.cls).parameters
    required = {k for k, p in list(params.items())[1:] if p.default is p.empty} - set(entry.fixed)
    keys = [k for k in entry.options() if k in required or d.coin(0.25)]
    if "augmentation" in keys:  # the augmentation or its fields, not both
        keys = [k for k in keys if k not in AUGMENTATION_FIELDS]
    if "scaling" in keys and d.coin(0.8):  # a scaling mostly with the length it needs
        keys += [k for k in ("train_length",) if k not in keys]
    opts = {k: _option(d, name, k, entry) for k in keys}
    if d.coin(0.03):
        opts["no_such_option"] = 1
        d.invalid.append("no_such_option")
    # an error may also name an option of the name that was not given (a required one)
    names = ("dim", *opts, *entry.options())
    call = d.finish(f"build({name!r})", lambda: cape.build(name, dim, **opts), names)
    try:
        module = call.fn()
    except Exception:  # noqa: BLE001 - the construction itself is the case
        return name, None, opts, call
    if call.invalid:
        return name, None, opts, call
    return name, module, opts, None


def encoding_forward(d: Draw, name: str) -> Call:
    name, enc, opts, failed = build_encoding(d, name)
    if failed is not None:
        return failed
    enc.train(d.coin())
    label = f"{name}.forward"
    if enc.kind == "attention":
        return _attention_forward(d, name, enc, label, opts)
    m = enc.pos_dim or d.choice((1, 2))
    b, t = d.dims(2)
    dim = enc.dim
    layouts = ["x", "x+positions", "positions", "x+positions"]
    layouts += ["x+hop", "x+hop"] if m == 1 else ["grid", "x+grid", "x4", "x4"]
    layout = d.choice(layouts)
    kw: dict = {}
    h = w = 0
    if layout in ("grid", "x+grid", "x4"):
        h, w = d.int(0, 4), d.int(0, 4)
        t = h * w
    x = None
    if layout.startswith("x"):
        shape = (b, h, w, dim) if layout == "x4" else (b, t, dim)
        x = d.tensor("x", shape, kind="content", bad_dtypes=(torch.int64, torch.bool))
        x = d.bad("x", x, [torch.zeros(shape[:-1] + (dim + 1,)), torch.zeros(b, dim)])
    if "positions" in layout:
        grouped = name == "lff" and d.coin(0.3) and enc.groups > 1
        pshape = (b, t, enc.groups, enc.group_dim) if grouped else (b, t, m)
        if m == 1 and not grouped and d.coin(0.3):
            pshape = (b, t)
        # LFF reads [B, T, G, M] too: [B, T, 1, 1] is valid for G = M = 1, so its wrong rank is 5
        lff = name == "lff"
        kw["positions"] = d.tensor(
            "positions",
            pshape,
            dtypes=FLOATS_ALL + (torch.int64,),
            bad_dtypes=(torch.bool,),
            ranks=not lff,
        )
        if lff and isinstance(kw["positions"], torch.Tensor):
            p = kw["positions"]
            kw["positions"] = d.bad("positions", p, (p.reshape(p.shape + (1,) * (5 - p.dim())),))
    if "hop" in layout:
        kw["hop"] = hop_value(d, b, t)
    if "grid" in layout:
        kw["grid"] = d.bad("grid", (h, w), (4, (h,), (-1, w), ("a", w)))
    if layout in ("grid", "x+grid", "x4") and d.coin(0.3):
        kw["extent"] = d.bad("extent", d.choice((1.0, 0.5, 1e30)), (0.0, -1.0, NAN))
    if layout in ("x", "x+positions", "positions", "x+hop") and d.coin(0.3):
        if d.coin():
            kw["mask"] = d.mask("mask", (b, t))
        else:
            lengths = torch.tensor([d.int(0, t) for _ in range(b)], dtype=torch.long)
            wrong = [lengths.float()] + ([lengths + t + 1] if b else [])  # B = 0: no value
            kw["lengths"] = d.bad("lengths", lengths, wrong)
    if d.coin(0.2):
        kw["generator"] = d.bad("generator", torch.Generator().manual_seed(1), ("g",))
    cls_row = int(getattr(enc, "cls_position", None) is not None)

    def check(out: torch.Tensor) -> str | None:
        if isinstance(x, torch.Tensor):
            return expect(out, x.shape, x.dtype)
        if "positions" in kw:
            return expect(out, (b, t, dim), torch.float32)
        return expect(out, (1, t + cls_row, dim), torch.float32)

    return d.finish(label, lambda: enc(x, **kw), ("x", *kw, *opts), check)


def _alibi_forward(d: Draw, enc: object, label: str, opts: dict) -> Call:
    b, tq, tk = d.dims(3, hi=4)
    bq = d.choice((b, b, 1))  # batch 1: positions shared by the batch
    qp = d.tensor("q_positions", d.choice(((bq, tq), (bq, tq, 1))), bad_dtypes=(torch.bool,))
    qp = d.bad("q_positions", qp, (torch.zeros(bq, tq, 2),))
    kw: dict = {}
    self_attn = d.coin()
    if not self_attn:
        kw["k_positions"] = d.tensor("k_positions", (b, tk), bad_dtypes=(torch.bool,))
        if d.coin(0.3):
            kw["k_mask"] = d.mask("k_mask", (b, tk))
    if d.coin(0.3):
        kw["mask"] = d.mask("mask", (bq, tq))
    if d.coin(0.2):
        kw["generator"] = d.bad("generator", torch.Generator().manual_seed(2), ("g",))
    if isinstance(enc, cape.FIRE) and d.coin(0.3):  # the keys each query sees
        seen = torch.rand(b, tq, tq if self_attn else tk) < 0.7
        kw["attn_mask"] = d.bad("attn_mask", seen, (seen.reshape(-1), seen.float()))
    out_b = bq if self_attn else torch.broadcast_shapes((bq,), (b,))[0]
    if "attn_mask" in kw:
        out_b = torch.broadcast_shapes((out_b,), (b,))[0]
    shape = (out_b, enc.heads, tq, tq if self_attn else tk)  # type: ignore[attr-defined]
    return d.finish(
        label,
        lambda: enc(qp, **kw),
        ("q_positions", *kw, *opts),
        lambda out: expect(out, shape, torch.float32),
    )


def _attention_forward(d: Draw, name: str, enc: object, label: str, opts: dict) -> Call:
    if name in ("alibi", "fire"):
        return _alibi_forward(d, enc, label, opts)
    b, tq, tk = d.dims(3, hi=4)
    h = d.int(1, 2)
    if getattr(enc, "heads", None) is not None and d.coin(0.9):  # RoPE-Mixed: per head
        h = enc.heads  # type: ignore[attr-defined]
    hd = enc.head_dim  # type: ignore[attr-defined]
    m = enc.pos_dim  # type: ignore[attr-defined]
    q = d.tensor("q", (b, h, tq, hd), kind="content", dtypes=FLOATS_ALL[:2])
    q = d.bad("q", q, [torch.zeros(b, h, tq, hd + 2), torch.zeros(b, tq, hd)])
    self_attn = d.coin()
    if self_attn:
        tk = tq
    k = d.tensor("k", (b, h, tk, hd), kind="content", dtypes=(torch.float32,))
    kw: dict = {}
    names = ["q", "k"]
    if name == "relpos":
        names.append("v")
        v = d.tensor("v", (b, h, tk, hd), kind="content", dtypes=(torch.float32,))
        if not self_attn or d.coin(0.3):
            kw["q_positions"] = d.tensor("q_positions", (b, tq), bad_dtypes=(torch.bool,))
            kw["k_positions"] = d.tensor("k_positions", (b, tk), bad_dtypes=(torch.bool,))
        if d.coin(0.3):
            kw["key_padding_mask"] = d.mask("key_padding_mask", (b, tk))
        if d.coin(0.2):
            kw["is_causal"] = d.coin()
        if d.coin(0.2):
            kw["dropout_p"] = d.bad("dropout_p", 0.1, (-1.0, 2.0))
        vd = v.dtype if isinstance(v, torch.Tensor) else None
        return d.finish(
            label,
            lambda: enc(q, k, v, **kw),
            (*names, *kw, *opts),
            lambda out: expect(out, (b, h, tq, hd), vd),
        )
    if m == 2 or not self_attn or d.coin(0.3):
        kw["positions"] = d.tensor("positions", (b, tq, m), bad_dtypes=(torch.bool,))
    if not self_attn:
        kw["k_positions"] = d.tensor("k_positions", (b, tk, m), bad_dtypes=(torch.bool,))
    if d.coin(0.3):
        kw["mask"] = d.mask("mask", (b, tq))
    if d.coin(0.2):
        kw["generator"] = torch.Generator().manual_seed(2)
    qd = q.dtype if isinstance(q, torch.Tensor) else None
    return d.finish(
        label,
        lambda: enc(q, k, **kw),
        (*names, *kw, *opts),
        lambda out: (
            expect(out[0], (b, h, tq, hd), qd) or expect(out[1], (b, h, tk, hd), torch.float32)
        ),
    )


CLASSES = (
    "CAPE1d", "CAPE2d", "SineND", "AbsPos1d", "AbsPos2d", "EmbedND", "LearnableFourierFeatures",
    "NoPos", "RelPos", "Rotary", "PositionalEncoding", "ALiBi", "FIRE", "RoPE2d",
)  # fmt: skip


def encoding_classes(d: Draw, which: str) -> Call:
    """The classes themselves (and the protocol's base) with positional / odd arguments."""
    cls = getattr(cape, which)
    dim = d.bad("dim", d.choice((4, 8)), (0, -1, 2.5, "4", None))
    args: tuple = (dim,)
    names = ["dim", "head_dim", "heads"]
    if cls is cape.AbsPos1d:
        args += (d.bad("num_positions", d.choice((1, 8)), (0, "8")),)
        names.append("num_positions")
    elif cls is cape.AbsPos2d:
        args += (d.bad("grid", (2, 3), ((0, 3), (2,), 4)),)
        names.append("grid")
    elif cls is cape.EmbedND:
        args += (d.bad("sizes", (3, 3), ((), (0, 2), 3)),)
        names.append("sizes")
    elif cls is cape.PositionalEncoding:
        args += (d.bad("pos_dim", d.choice((1, 2)), (0, "2")),)
        names.append("pos_dim")
    kw: dict = {}
    if cls is cape.RoPE2d:  # axial, or mixed with its heads
        kw["variant"] = d.bad("variant", d.choice(("axial", "mixed")), ("spiral", 1))
        if kw["variant"] == "mixed":
            kw["heads"] = d.bad("heads", d.choice((1, 3)), (0, "2", None))
    if cls not in (cape.NoPos, cape.RelPos, cape.AbsPos2d) and d.coin(0.3):
        kw["augmentation"] = d.bad("augmentation", None, ("aug", {"max_global_shift": 1.0}))
        if cls in (cape.CAPE1d, cape.CAPE2d, cape.SineND) and kw["augmentation"] is None:
            kw.pop("augmentation")
    return d.finish(f"cape.{cls.__name__}", lambda: cls(*args, **kw), (*names, *kw))


# --- models --------------------------------------------------------------------------------------


def _content(d: Draw, name: str, shape: tuple[int, ...]) -> object:
    return d.tensor(name, shape, kind="content", dtypes=(torch.float32,))


def attention(d: Draw) -> Call:
    b, tq, tk = d.dims(3, hi=4)
    if d.coin(0.2):
        kkey = d.bad("key_mask", torch.rand(b, tk) < 0.7, (torch.ones(b, tk, dtype=torch.long),))
        causal = d.bad("causal", d.coin(), ("yes",))
        tq_, tk_ = d.bad("tq", tq, (-1,)), tk
        return d.finish(
            "models.attention_mask",
            lambda: attention_mask(kkey, causal, tq_, tk_, torch.device("cpu")),
            ("key_mask", "causal", "tq", "tk"),
        )
    dim, heads = d.choice((4, 8)), d.choice((1, 2))
    hd = dim // heads
    if d.coin(0.2):
        tkw = {"biases": d.bad("biases", [cape.RelPos(hd, 4)], (["relpos"], [cape.RelPos(hd + 2)]))}
    elif d.coin(0.25):
        tkw = {"rotary": d.bad("rotary", cape.Rotary(hd), (cape.RelPos(hd),))}
    elif d.coin(0.25):
        bias_cls = d.choice((cape.ALiBi, cape.FIRE))
        bias = bias_cls(heads, causal=d.coin(0.2))
        tkw = {"biases": d.bad("biases", [bias], ([bias_cls(heads + 1)], [cape.Rotary(hd)]))}
    else:
        tkw = {}
    heads_arg = d.bad("heads", heads, (0, 3, "2"))
    if d.coin(0.2):
        tkw["dropout"] = d.bad("dropout", 0.1, (1.0, -0.1, NAN))
    cross = d.coin()
    query = _content(d, "query", (b, tq, dim))
    kv = _content(d, "key_value", (b, tk, dim)) if cross else None
    kw: dict = {"key_value": kv}
    if d.coin(0.3):
        kw["key_mask"] = d.mask("key_mask", (b, tk if cross else tq))
    if d.coin(0.2):
        kw["causal"] = d.coin()
    if d.coin(0.3) and "rotary" in tkw or "biases" in tkw:
        kw["q_positions"] = d.tensor("q_positions", (b, tq, 1), bad_dtypes=(torch.bool,))
        if cross:
            kw["k_positions"] = d.tensor("k_positions", (b, tk, 1), bad_dtypes=(torch.bool,))

    def fn() -> torch.Tensor:
        return MultiheadAttention(dim, heads_arg, **tkw)(query, **kw)

    return d.finish(
        "models.MultiheadAttention",
        fn,
        ("dim", "heads", "query", *tkw, *kw),
        lambda out: expect(out, (b, tq, dim), torch.float32),
    )


def _relative_factory(d: Draw, hd: int, heads: int):
    which = d.choice((None, None, "relpos", "rotary", "alibi", "fire"))
    if which is None:
        return None
    if which == "alibi":
        return lambda: cape.ALiBi(heads)
    if which == "fire":
        return lambda: cape.FIRE(heads, hidden=4)
    return (lambda: cape.RelPos(hd, 4)) if which == "relpos" else (lambda: cape.Rotary(hd))


def stacks(d: Draw, which: str | None = None) -> Call:
    b, t, s = d.dims(3, hi=4)
    dim, heads = 8, d.choice((1, 2))
    which = which or d.choice(STACKS)
    decoder, layered = which.startswith("decoder"), which.endswith("layer")
    kw: dict = {}
    for key, valid, bad in (
        ("dropout", 0.1, (-0.5, 1.5, NAN)),
        ("layer_drop", 0.5, (-0.1, 2.0)),
        ("norm_first", False, ("no",)),
        ("activation", "relu", ("tanh",)),
    ):
        if d.coin(0.2):
            kw[key] = d.bad(key, valid, bad)
    ffn = d.bad("ffn_dim", 8, (0, -1, 2.5))
    names = ["dim", "heads", "ffn_dim", "x", *kw]
    if not layered:
        layers = d.bad("layers", d.int(1, 2), (0, "1"))
        kw["relative_factory"] = _relative_factory(d, dim // heads, heads)
        if d.coin(0.3):
            name = d.choice(("cape1d", "sinpos", "abspos", "nopos", "lff", "rotary"))
            kw["position"] = d.bad("position", _position_module(name, dim), (name, 3))
        names += ["layers", "position", "relative_factory"]
    x = _content(d, "x", (b, t, dim))
    fkw: dict = {}
    if d.coin(0.3):
        fkw["mask"] = d.mask("mask", (b, t))
    if d.coin(0.2):
        fkw["positions"] = d.tensor("positions", (b, t, 1), bad_dtypes=(torch.bool,))
    memory = _content(d, "memory", (b, s, dim)) if decoder else None
    if decoder and d.coin(0.3):
        fkw["memory_mask"] = d.mask("memory_mask", (b, s))
    names += list(fkw) + ["memory"]

    def fn() -> torch.Tensor:
        if layered:
            cls = TransformerDecoderLayer if decoder else TransformerEncoderLayer
            module = cls(dim, heads, ffn, **kw)
        else:
            cls = TransformerDecoder if decoder else TransformerEncoder
            module = cls(layers, dim, heads, ffn, **kw)
        module.train(False)
        return module(x, memory, **fkw) if decoder else module(x, **fkw)

    label = f"models.Transformer{'Decoder' if decoder else 'Encoder'}{'Layer' if layered else ''}"
    return d.finish(label, fn, names, lambda out: expect(out, (b, t, dim), torch.float32))


def _position_module(name: str, dim: int) -> object:
    if name == "lff":
        return cape.build(name, dim, pos_dim=1, fourier_dim=4, hidden_dim=4)
    return cape.build(name, dim, **({"num_positions": 8} if name == "abspos" else {}))


NAMES_1D = (
    "nopos", "sinpos", "cape1d", "abspos", "relpos", "rotary", "lff", "sine-1d", "alibi", "fire",
)  # fmt: skip
NAMES_2D = ("nopos", "sinpos2d", "cape2d", "abspos2d", "rotary2d", "lff", "sine-2d", "embed-2d")


def vit(d: Draw) -> Call:
    position = d.bad("position", d.choice(NAMES_2D), ("cape1d", "relpos", "alibi", "fire", 3))
    options = {"preset": "image"} if position == "cape2d" and d.coin() else None
    if position == "lff":
        options = {"fourier_dim": 4, "hidden_dim": 4}
    kw = dict(
        image_size=d.bad("image_size", d.choice((8, (8, 4))), (0, (8, 6), "8")),
        patch=d.bad("patch", 4, (0, 3)),
        dim=8,
        depth=1,
        heads=d.bad("heads", 2, (3, 0)),
        position=position,
        position_options=d.bad("position_options", options, ("opts", {"cls_token": True})),
        channels=d.bad("channels", 3, (0,)),
        mlp_ratio=d.bad("mlp_ratio", d.choice((4, 2.0)), (0, -1.0, NAN, "4")),
    )
    b = d.int(0, 2)
    hh, ww = d.choice((8, 4, 12, 0)), 4 * d.int(1, 2)
    images = d.tensor("images", (b, 3, hh, ww), kind="content", dtypes=(torch.float32,))
    images = d.bad("images", images, [torch.zeros(b, 3, 6, 8), torch.zeros(b, 1, 8, 8)])
    fkw: dict = {}
    if d.coin(0.2):
        fkw["extent"] = d.bad("extent", d.choice((1.0, 0.5)), (0.0, -1.0, NAN))
    if d.coin(0.3):
        fkw["generator"] = torch.Generator().manual_seed(3)
    train = d.coin()
    packed = d.coin(0.2)

    def fn() -> torch.Tensor:
        model = ViT(5, **kw).train(train)
        return model(list(images) if packed else images, **fkw)

    return d.finish(
        "models.ViT",
        fn,
        ("num_classes", *kw, "images", *fkw),
        lambda out: expect(out, (b, 5), torch.float32),
    )


def ctc(d: Draw) -> Call:
    position = d.bad("position", d.choice(NAMES_1D), ("cape2d", "nope", 3))
    kw = dict(
        n_mels=4,
        dim=8,
        depth=1,
        heads=2,
        ffn_dim=8,
        kernel=d.bad("kernel", d.choice((3, 4)), (0, "3")),
        stride=d.bad("stride", d.choice((1, 2)), (0, -1)),
        position=position,
        conv_dropout=d.bad("conv_dropout", 0.0, (1.0, -1.0)),
    )
    if position == "lff":
        kw["position_options"] = {"pos_dim": 1, "fourier_dim": 4, "hidden_dim": 4}
    b, f = d.int(0, 3), d.int(0, 9)
    feats = d.tensor("features", (b, f, 4), kind="content", dtypes=(torch.float32,))
    fkw: dict = {}
    if d.coin(0.4):
        lengths = torch.tensor([d.int(0, f) for _ in range(b)], dtype=torch.long)
        wrong = [lengths.float()] + ([lengths + f + 1] if b else [])  # B = 0: no value
        fkw["lengths"] = d.bad("lengths", lengths, wrong)
    if d.coin(0.4):
        fkw["hop"] = d.bad(
            "hop", d.choice((0.01, 0.02, torch.full((b,), 0.01))), (0.0, -1.0, NAN, [0.01])
        )
    if d.coin(0.2):
        fkw["frame_times"] = d.tensor("frame_times", (b, f), kind="index", dtypes=(torch.float32,))
    train = d.coin()

    def fn() -> tuple[torch.Tensor, torch.Tensor]:
        model = CTCModel(5, **kw).train(train)
        return model(feats, **fkw)

    def check(out: tuple) -> str | None:
        steps = out[0].shape[1]
        return expect(out[0], (b, steps, 5), torch.float32) or expect(out[1], (b,), torch.int64)

    return d.finish(
        "models.CTCModel", fn, ("vocab_size", *kw, "features", *fkw, "position_options"), check
    )


def seq2seq(d: Draw, which: str | None = None) -> Call:
    vocab = 7
    kw: dict = dict(dim=8, encoder_layers=1, decoder_layers=1, heads=2, ffn_dim=8)
    b, s, t = d.int(0, 2), d.int(0, 4), d.int(0, 4)

    def tokens(name: str, n: int) -> object:
        ids = torch.randint(1, vocab, (b, n))
        wrong = [ids.float(), ids[..., None], "ids"] + ([ids + vocab] if ids.numel() else [])
        return d.bad(name, ids, wrong)

    which = which or d.choice(("forward", "forward", "greedy", "beam", "nll", "max_lengths"))
    if which == "max_lengths":  # any [B, S] bool mask
        mask = torch.rand(b, s) < 0.7
        src_mask = d.bad("src_mask", mask, (mask.long(), mask[..., None], "m"))
        a = d.bad("max_len_a", 1.5, (-1.0, NAN))
        c = d.bad("max_len_b", 2.0, (INF, "2"))
        return d.finish(
            "models.max_lengths",
            lambda: max_lengths(src_mask, a, c),
            ("src_mask", "max_len_a", "max_len_b"),
            lambda out: expect(out, (b,), torch.int64),
        )
    kw["position"] = d.bad("position", d.choice(NAMES_1D[:6] + ("alibi", "fire")), ("cape2d", 3))
    kw["alpha"] = d.bad("alpha", d.choice((1.0, 1.2)), (0.0, -1.0, NAN))
    kw["pad_id"] = d.bad("pad_id", 0, (7, -1))
    src = tokens("src", s)
    src_mask = d.mask("src_mask", (b, s))
    if which in ("forward", "nll"):
        tgt = tokens("tgt", t)
        tgt_mask = d.mask("tgt_mask", (b, t))
    train = d.coin()

    def model() -> Seq2Seq:
        return Seq2Seq(vocab, **kw).train(train)

    names = ["vocab_size", *kw, "src", "src_mask"]
    if which == "forward":
        return d.finish(
            "models.Seq2Seq",
            lambda: model()(src, src_mask, tgt, tgt_mask),
            names + ["tgt", "tgt_mask"],
            lambda out: expect(out, (b, t, vocab), torch.float32),
        )
    if which == "nll":
        return d.finish(
            "models.sequence_nll",
            lambda: sequence_nll(model(), src, src_mask, tgt, tgt, tgt_mask),
            names + ["tgt_in", "tgt_out", "tgt_mask"],
            lambda out: expect(out, (b, t), torch.float32),
        )
    ids = dict(bos_id=d.bad("bos_id", 1, (7, -1)), eos_id=d.bad("eos_id", 2, (0, 9)))
    if which == "greedy":
        ids["max_len"] = d.bad("max_len", d.int(0, 4), (-1, 2.5))
        fn = greedy_decode
    else:
        ids["beam"] = d.bad("beam", d.int(1, 3), (0, "2"))
        ids["max_len_b"] = d.choice((1.0, 3.0))
        fn = beam_search
    return d.finish(
        f"models.{fn.__name__}",
        lambda: fn(model(), src, src_mask, **ids),
        names + list(ids),
        lambda out: None if isinstance(out, list) and len(out) == b else f"got {out!r}",
    )


def plan(d: Draw) -> Call:
    """`position_plan` by name (draw, sizes, options), then a `PositionPlan`'s shared draw of
    the positions every layer reads."""
    heads = d.choice((1, 2))
    dim = d.bad("dim", 4 * heads, (0, "8"))
    name = d.bad("position", d.choice(NAMES_1D[:6] + ("rotary", "alibi", "fire")), ("nope", 3))
    options: dict = {"num_positions": 8} if name == "abspos" else {}
    if d.coin(0.5):
        aug = {"max_global_shift": 2.0, "max_global_scaling": 1.2}
        options["augmentation"] = d.bad("augmentation", aug, (3, "big"))
    if d.coin(0.3):
        options["draw"] = d.bad("draw", d.choice(("shared", "per_layer")), ("both", 1))
    b, t = d.int(1, 3), d.int(1, 4)
    mask = d.mask("mask", (b, t))
    train = d.coin()

    def fn() -> object:
        made = position_plan(name, dim=dim, heads=heads, options=options)
        made.layer()
        return made.layer_positions(None, mask, (b, t), torch.device("cpu"), train, None)

    def check(out: object) -> str | None:
        return None if out is None else expect(out, (b, t, 1), torch.float32)

    call = d.finish("models.position_plan", fn, ("dim", "position", *options, "mask"), check)
    return call if d.coin() else dataclasses.replace(call, label="models.PositionPlan")


STACKS = ("encoder", "decoder", "encoder-layer", "decoder-layer")
GENERATORS = {
    "encodings": [functools.partial(encoding_forward, name=n) for n in sorted(cape.ENCODINGS)]
    + each(encoding_classes, CLASSES),
    "models": [attention, attention, vit, vit, ctc, ctc, plan]
    + each(stacks, STACKS)
    + each(seq2seq, ("forward", "greedy", "beam", "nll", "max_lengths")),
}
