"""Case generators of the contract suite: cape's functions (positions, augmentation, build) and
cape.functional. Each takes a `Draw` and returns a `Call` (see _contract.py)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import torch
from _contract import Call, Draw, expect
from _contract_rope import ROPE2D, SCALING, rope2d, scaling

import cape
import cape.functional as F

NAN, INF = math.nan, math.inf
BAD_INT = (-1, 2.5, True, "3")
BAD_POSITIVE = (0.0, -1.0, NAN, INF, "1", True)


def _pos_dtypes() -> tuple[torch.dtype, ...]:
    """Positions may be any real dtype (integers are token or grid indices)."""
    return (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32)


# --- cape.positions ------------------------------------------------------------------------------


def lengths_to_mask(d: Draw) -> Call:
    b, n = d.int(0, 4), d.int(0, 6)
    lengths = torch.tensor([d.int(0, n) for _ in range(b)], dtype=torch.long)
    wrong = [lengths.float(), lengths[None], [n] * b]
    if b:
        wrong += [lengths + n + 1, lengths - n - 1]
    lengths = d.bad("lengths", lengths, wrong)
    max_len = d.bad("max_len", n, BAD_INT)
    return d.finish(
        "cape.lengths_to_mask",
        lambda: cape.lengths_to_mask(lengths, max_len),
        ("lengths", "max_len"),
        lambda out: expect(out, (b, n), torch.bool),
    )


def _padding(d: Draw, b: int, t: int) -> dict:
    """{} or {"mask": ...} or {"lengths": ...} (both, now and then: refused)."""
    kw: dict = {}
    if d.coin(0.3):
        kw["mask"] = d.mask("mask", (b, t))
    if d.coin(0.2):
        lengths = torch.tensor([d.int(0, t) for _ in range(b)], dtype=torch.long)
        wrong = [lengths.float(), "l"] + ([lengths + t + 1] if b else [])  # B = 0: no value
        kw["lengths"] = d.bad("lengths", lengths, wrong)
    if len(kw) == 2:
        d.invalid.append("mask and lengths")
    return kw


def token_positions(d: Draw) -> Call:
    b, t = d.int(0, 4), d.int(0, 6)
    batch = d.bad("batch", b, (-1, 1.5, None))
    length = d.bad("length", t, (-2, "3", 2.0))
    kw = _padding(d, b, t)
    return d.finish(
        "cape.token_positions",
        lambda: cape.token_positions(batch, length, **kw),
        ("batch", "length", *kw),
        lambda out: expect(out, (b, t, 1), torch.float32),
    )


def hop_value(d: Draw, b: int, t: int) -> object:
    """A hop: seconds per frame, float or tensor [B] / [B, T] (or refused ones)."""
    form = d.choice(("float", "float", "per-sample", "per-step"))
    if form == "float":
        valid = d.edge("hop", d.choice((0.01, 0.03, 1.0)), (1e-30, 1e30, 1e38))
    else:
        shape = (b,) if form == "per-sample" else (b, t)
        valid = d.values(shape, "positive", d.choice((torch.float32, torch.float64)))
    return d.bad("hop", valid, [0.0, -0.01, NAN, INF, 1e300, [0.01, 0.02], "0.01", True])


def timestamps(d: Draw) -> Call:
    b, t = d.int(0, 4), d.int(0, 6)
    hop = hop_value(d, b, t)
    kw = _padding(d, b, t)
    if d.coin(0.3):
        kw["offset"] = d.bad("offset", d.choice((0.0, 0.5, 1.0)), (-1.0, NAN, 1e300, "0.5"))
    return d.finish(
        "cape.timestamps",
        lambda: cape.timestamps(b, t, hop, **kw),
        ("batch", "length", "hop", *kw),
        lambda out: expect(out, (b, t, 1), torch.float32),
    )


def grid_positions(d: Draw, which: str | None = None) -> Call:
    h = d.bad("height", d.int(0, 4), (-1, 2.0, True))
    w = d.bad("width", d.int(0, 4), (-2, "2"))
    kw: dict = {}
    use_ints = (which or d.choice(("positions", "indices"))) == "indices"
    fn = cape.grid_indices if use_ints else cape.grid_positions
    if d.coin(0.4) and not use_ints:
        kw["extent"] = d.bad("extent", d.choice((1.0, 0.5, 1e38)), (0.0, -1.0, INF, 1e300, "1"))
    if d.coin(0.4):
        kw["batch"] = d.bad("batch", d.int(0, 3), (-1, 1.5))

    def check(out: torch.Tensor) -> str | None:
        n = h * w  # type: ignore[operator]
        shape = (n, 2) if "batch" not in kw else (kw["batch"], n, 2)
        return expect(out, shape, torch.int64 if use_ints else torch.float32)

    return d.finish(f"cape.{fn.__name__}", lambda: fn(h, w, **kw), ("height", "width", *kw), check)


def as_positions(d: Draw) -> Call:
    b, t = d.dims(2)
    m = d.int(1, 4)
    shape = (b, t) if d.coin(0.3) else (b, t, m)
    pos = d.tensor(
        "positions",
        shape,
        dtypes=_pos_dtypes(),
        bad_dtypes=(torch.bool, torch.complex64),
        ranks=True,
    )
    kw: dict = {}
    if d.coin(0.3):
        kw["mask"] = d.mask("mask", (b, t))
    m_out = 1 if len(shape) == 2 else m
    if d.coin(0.3):
        kw["dims"] = d.bad("dims", m_out, (m_out + 1, 0, "2"))
    return d.finish(
        "cape.as_positions",
        lambda: cape.as_positions(pos, **kw),
        ("positions", *kw),
        lambda out: expect(out, (b, t, m_out), torch.float32),
    )


# --- cape.augment --------------------------------------------------------------------------------

BAD_AMOUNT = (-1.0, NAN, INF, "0.5", (), True)


def _amount(d: Draw, name: str, b: int, m: int) -> object:
    form = d.choice(("float", "float", "axes", "tensor"))
    if form == "float":
        valid = d.edge(name, d.choice((0.0, 0.5, 5.0)), (1e30, 1e38))
    elif form == "axes":
        valid = tuple(d.choice((0.0, 0.25, 2.0)) for _ in range(m))
    else:
        valid = torch.rand(d.choice(((b, m), (m,), ()))) * 2.0
    bad = list(BAD_AMOUNT) + [tuple([0.5] * (m + 1)), torch.full((b, m), -1.0)]
    return d.bad(name, valid, bad)


def _amounts(d: Draw, b: int, m: int) -> dict:
    kw: dict = {}
    for name in ("max_global_shift", "max_local_shift"):
        if d.coin(0.5):
            kw[name] = _amount(d, name, b, m)
    if d.coin(0.5):
        valid = d.edge("max_global_scaling", d.choice((1.0, 1.4)), (1e10, 1e38))
        kw["max_global_scaling"] = d.bad("max_global_scaling", valid, (0.5, 0.0, NAN, "1.2"))
    return kw


def _generator(d: Draw) -> dict:
    if not d.coin(0.3):
        return {}
    return {"generator": d.bad("generator", torch.Generator().manual_seed(0), ("gen", 3))}


def augment_positions(d: Draw) -> Call:
    b, t = d.dims(2)
    m = d.int(1, 3)
    pos = d.tensor("positions", (b, t, m), dtypes=FLOATS_ALL)
    mask = d.mask("mask", (b, t)) if d.coin(0.3) else None
    kw = _amounts(d, b, m) | _generator(d)
    kw["training"] = d.bad("training", d.coin(), ("yes", None))
    if d.coin(0.3):
        kw["normalize"] = d.bad("normalize", d.coin(), ("yes", 1))
    use_class = d.coin(0.3)
    if use_class:
        fields = {k: v for k, v in kw.items() if k.startswith("max") or k == "normalize"}
        rest = {k: v for k, v in kw.items() if k not in fields}

        def fn() -> torch.Tensor:
            return cape.Augmentation(**fields)(pos, mask, **rest)

        label = "cape.Augmentation"
    else:

        def fn() -> torch.Tensor:
            return cape.augment_positions(pos, mask, **kw)

        label = "cape.augment_positions"
    return d.finish(
        label,
        fn,
        ("positions", "mask", *kw),
        lambda out: expect(out, (b, t, m), torch.float32),
    )


FLOATS_ALL = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def augment_pair(d: Draw) -> Call:
    b, s, t = d.dims(3)
    m = d.int(1, 2)
    src = d.tensor("source", (b, s, m), kind="index")
    tgt = d.tensor("target", (b, t, m), kind="index")
    kw = _amounts(d, b, m) | _generator(d)
    if d.coin(0.4):
        kw["source_mask"] = d.mask("source_mask", (b, s))
    if d.coin(0.4):
        kw["target_mask"] = d.mask("target_mask", (b, t))
    if d.coin(0.3):
        kw["alpha"] = d.bad("alpha", d.choice((1.0, 1.1, 1e30)), BAD_POSITIVE)
    kw["training"] = d.bad("training", d.coin(), ("no",))
    return d.finish(
        "cape.augment_pair",
        lambda: cape.augment_pair(src, tgt, **kw),
        ("source", "target", *kw),
        lambda out: (
            expect(out[0], (b, s, m), torch.float32) or expect(out[1], (b, t, m), torch.float32)
        ),
    )


def mean_normalize(d: Draw) -> Call:
    b, t = d.dims(2)
    m = d.int(1, 3)
    pos = d.tensor("positions", (b, t, m), dtypes=FLOATS_ALL)
    mask = d.mask("mask", (b, t)) if d.coin(0.4) else None
    dtype = pos.dtype if isinstance(pos, torch.Tensor) else None
    return d.finish(
        "cape.mean_normalize",
        lambda: cape.mean_normalize(pos, mask),
        ("positions", "mask"),
        lambda out: expect(out, (b, t, m), dtype),
    )


# --- cape.build and its registry ---------------------------------------------------------------


def registry(d: Draw) -> Call:
    fn = d.choice((cape.encoding_class, cape.encoding_options))
    name = d.bad("name", d.choice(sorted(cape.ENCODINGS)), ("no-such", 3, None))
    return d.finish(f"cape.{fn.__name__}", lambda: fn(name), ("name",))


def value_checks(d: Draw) -> Call:
    """cape.value_checks(enabled) as a `with` block around a call with NaN positions: off, the
    NaN flows through; on, it is refused; after the block, the checks are as before."""
    enabled = d.bad("enabled", d.coin(0.5), (1, "no", None))
    nan = torch.tensor([[0.0, NAN, 2.0]])

    def call() -> torch.Tensor:
        before = cape.value_checks_enabled()
        with cape.value_checks(enabled):
            try:
                out = cape.CAPE1d(4)(positions=nan)
                refused = False
            except ValueError:
                out, refused = torch.full((1, 3, 4), NAN), True
        restored = cape.value_checks_enabled() == before
        return torch.tensor([float(refused), float(restored), float(torch.isnan(out).any())])

    def check(out: torch.Tensor) -> str | None:
        want = [float(enabled), 1.0, 1.0]  # refused iff on; restored; NaN out when off
        return None if out.tolist() == want else f"(refused, restored, NaN) {out.tolist()}"

    d.finite = False  # the NaN is the point
    return d.finish("cape.value_checks", call, ("enabled",), check)


def value_checks_enabled(d: Draw) -> Call:
    return d.finish(
        "cape.value_checks_enabled", lambda: torch.tensor(cape.value_checks_enabled()), ()
    )


def fusion(d: Draw) -> Call:
    """cape.fusion(enabled) as a `with` block around a small CAPE1d add_to in training: True
    takes the compiled kernel (a compiler is present here), None (auto) and False do not at
    this size; the sum is the eager one to float rounding; after the block, as before."""
    enabled = d.bad("enabled", d.choice((None, True, False)), (1, "no"))
    enc = cape.CAPE1d(8, augmentation=cape.Augmentation(max_global_shift=2.0)).train()
    x = torch.linspace(-1, 1, 2 * 5 * 8).reshape(2, 5, 8).requires_grad_(True)

    def call() -> torch.Tensor:
        before = cape.fusion_enabled()
        with cape.fusion(enabled):
            y = enc.add_to(x, generator=torch.Generator().manual_seed(1))
            ran = "Compiled" in type(y.grad_fn).__name__  # the kernel is an autograd Function
        restored = cape.fusion_enabled() == before
        with cape.fusion(False):
            ref = enc.add_to(x, generator=torch.Generator().manual_seed(1))
        close = torch.allclose(y, ref, atol=1e-5)
        return torch.tensor([float(ran), float(restored), float(close)])

    def check(out: torch.Tensor) -> str | None:
        want = [float(enabled is True), 1.0, 1.0]
        return None if out.tolist() == want else f"(compiled, restored, close) {out.tolist()}"

    return d.finish("cape.fusion", call, ("enabled",), check)


def fusion_enabled(d: Draw) -> Call:
    def call() -> torch.Tensor:
        state = cape.fusion_enabled()
        return torch.tensor(-1.0 if state is None else float(state))

    return d.finish("cape.fusion_enabled", call, ())


# --- cape.functional -----------------------------------------------------------------------------

BAD_DIM = (0, -2, 3, 2.0, "8")


def frequencies(d: Draw) -> Call:
    dim = d.bad("dim", d.choice((2, 4, 8)), BAD_DIM)
    kw: dict = {}
    if d.coin(0.5):
        kw["freq_scale"] = d.bad("freq_scale", d.choice((1.0, 30.0, 1e30)), BAD_POSITIVE + (1e300,))
    if d.coin(0.5):
        fn = F.sinusoid_frequencies
        if d.coin(0.4):
            kw["base"] = d.bad("base", d.choice((10000.0, 2.0)), (1.0, 0.5, NAN))
        shape = (dim // 2,) if isinstance(dim, int) else None
    else:
        fn = F.cape2d_frequencies
        if d.coin(0.4):
            kw["rho"] = d.bad("rho", d.choice(("exact", "linspace")), ("other", 1))
        shape = (2, dim // 2) if isinstance(dim, int) else None
    return d.finish(
        f"functional.{fn.__name__}",
        lambda: fn(dim, **kw),
        ("dim", *kw),
        lambda out: expect(out, shape, torch.float32),
    )


def _lead(d: Draw) -> tuple[int, ...]:
    return d.dims(d.int(1, 2), hi=4)


def sinusoids(d: Draw, which: str | None = None) -> Call:
    """sinusoidal_1d / sinusoidal_2d / axial_sinusoidal / sinusoid / shifted_sine / cos_sin."""
    which = which or d.choice(SINUSOIDS)
    lead = _lead(d)
    dim = d.choice((4, 8))
    m = 2 if which == "2d" else d.int(1, 2)
    if which == "1d":
        pos = d.tensor(
            "positions", lead, dtypes=_pos_dtypes(), bad_dtypes=(torch.complex64,), ranks=False
        )
        kw = {"freq_scale": d.bad("freq_scale", d.choice((1.0, 30.0)), BAD_POSITIVE)}
        return d.finish(
            "functional.sinusoidal_1d",
            lambda: F.sinusoidal_1d(pos, dim, **kw),
            ("positions", "dim", *kw),
            lambda out: expect(out, lead + (dim,), torch.float32),
        )
    if which in ("2d", "axial"):
        dim = d.bad("dim", dim * m, (3, 0, "8"))
        pos = d.tensor("positions", lead + (m,), dtypes=_pos_dtypes(), ranks=False)
        fn = F.sinusoidal_2d if which == "2d" else F.axial_sinusoidal
        return d.finish(
            f"functional.{fn.__name__}",
            lambda: fn(pos, dim),
            ("positions", "dim"),
            lambda out: expect(out, lead + (dim,), torch.float32),
        )
    k = d.int(1, 3)
    if which in ("doubled", "sinusoid"):
        freqs = d.tensor("freqs", (m, k), dtypes=(torch.float32,), ranks=False)
    if which == "doubled":
        return d.finish(
            "functional.doubled_frequencies",
            lambda: F.doubled_frequencies(freqs),
            ("freqs",),
            lambda out: (
                expect(out[0], (m, 2 * k), torch.float32) or expect(out[1], (2 * k,), torch.float32)
            ),
        )
    if which == "cos_sin":
        phase = d.tensor("phase", lead + (k,), dtypes=(torch.float32, torch.float64), ranks=False)
        return d.finish(
            "functional.cos_sin",
            lambda: F.cos_sin(phase),
            ("phase",),
            lambda out: expect(out, lead + (2 * k,), getattr(phase, "dtype", None)),
        )
    pos = d.tensor("positions", lead + (m,), dtypes=_pos_dtypes(), ranks=False)
    if which == "sinusoid":
        return d.finish(
            "functional.sinusoid",
            lambda: F.sinusoid(pos, freqs),
            ("positions", "freqs"),
            lambda out: expect(out, lead + (2 * k,), torch.float32),
        )
    freqs2 = d.tensor("freqs2", (m, 2 * k), dtypes=(torch.float32,), ranks=False)
    offset = d.bad("offset", torch.zeros(2 * k), (torch.zeros(2 * k + 1), "0", torch.zeros(1, 1)))
    return d.finish(
        "functional.shifted_sine",
        lambda: F.shifted_sine(pos, freqs2, offset),
        ("positions", "freqs2", "offset"),
        lambda out: expect(out, lead + (2 * k,), torch.float32),
    )


def fourier(d: Draw, which: str | None = None) -> Call:
    which = which or d.choice(("features", "lff", "lff", "kernel"))
    lead = _lead(d)
    if which == "kernel":
        valid = d.choice((0.0, 1.0, 1e30)) if d.coin() else torch.rand(lead) * 4
        dist = d.bad("distance_sq", valid, ("1", -1.0, torch.full(lead, -1e6)))
        gamma = d.bad("gamma", d.choice((1.0, 10.0, 0.1)), BAD_POSITIVE + (1e-300, 1e200))
        return d.finish(
            "functional.lff_kernel",
            lambda: F.lff_kernel(dist, gamma),
            ("distance_sq", "gamma"),
            lambda out: expect(out, None, torch.float32),
        )
    g, m, f = d.int(1, 2), d.int(1, 3), d.choice((2, 4))
    mlp_only = which == "lff" and d.coin(0.15)  # no weight: the MLP reads the raw positions
    weight = (
        None
        if mlp_only
        else d.tensor("weight", (f // 2, m), kind="content", dtypes=FLOATS_ALL, ranks=False)
    )
    if which == "features":
        pos = d.tensor("positions", lead + (m,), dtypes=_pos_dtypes(), ranks=False)
        return d.finish(
            "functional.fourier_features",
            lambda: F.fourier_features(pos, weight),
            ("positions", "weight"),
            lambda out: expect(out, lead + (f,), torch.float32),
        )
    pos = d.tensor("positions", lead + (g, m), dtypes=_pos_dtypes(), ranks=False)
    h, out_dim = d.int(1, 4), d.int(1, 4)
    mlp = d.bad("mlp", True, ("yes",)) if mlp_only or d.coin(0.8) else False
    kw: dict = {"mlp": mlp}
    if mlp is True:
        fin = m if weight is None else f
        kw["w1"] = d.tensor("w1", (fin, h), kind="content", dtypes=(torch.float32,), ranks=False)
        kw["b1"] = d.tensor("b1", (h,), kind="content", dtypes=(torch.float32,), ranks=False)
        kw["w2"] = d.tensor("w2", (h, out_dim), kind="content", dtypes=(torch.float32,))
        kw["b2"] = d.tensor("b2", (out_dim,), kind="content", dtypes=(torch.float32,))
    width = g * (out_dim if mlp is True else f)
    return d.finish(
        "functional.learnable_fourier_features",
        lambda: F.learnable_fourier_features(pos, weight, **kw),
        ("positions", "weight", *kw),
        lambda out: expect(out, lead + (width,), torch.float32),
    )


def relative(d: Draw, which: str | None = None) -> Call:
    which = which or d.choice(("buckets", "index", "attention", "attention"))
    if which != "attention":
        max_distance = d.bad(
            "max_distance", d.choice((1.0, 4.0, 100.0)), (0.0, -1.0, NAN, 1e12, 1e30, "4")
        )
        step = d.bad("step", d.choice((1.0, 0.5, 0.03)), (0.0, -1.0, 1e-320, INF))
    if which == "buckets":
        return d.finish(
            "functional.num_buckets",
            lambda: F.num_buckets(max_distance, step),
            ("max_distance", "step"),
        )
    b, tq, tk = d.dims(3, hi=4)
    if which == "index":
        qp = d.tensor("q_positions", (b, tq), dtypes=_pos_dtypes(), bad_dtypes=(torch.bool,))
        kp = d.tensor("k_positions", (b, tk), dtypes=_pos_dtypes(), bad_dtypes=(torch.bool,))
        return d.finish(
            "functional.relative_index",
            lambda: F.relative_index(qp, kp, max_distance, step),
            ("q_positions", "k_positions", "max_distance", "step"),
            lambda out: expect(out, (b, tq, tk), torch.long),
        )
    h, hd, dv, kmax = d.int(1, 2), d.choice((2, 4)), d.choice((2, 4)), d.int(1, 3)
    q = d.tensor("q", (b, h, tq, hd), kind="content", dtypes=(torch.float32, torch.float64))
    k = d.tensor("k", (b, h, tk, hd), kind="content", dtypes=(torch.float32,))
    v = d.tensor("v", (b, h, tk, dv), kind="content", dtypes=(torch.float32,))
    rel_key = d.tensor("rel_key", (2 * kmax + 1, hd), kind="content", dtypes=(torch.float32,))
    idx = torch.randint(0, 2 * kmax + 1, (b, tq, tk))
    index = d.bad("index", idx, (idx.float(), idx + 2 * kmax + 1, idx[:, :, :0] if tk else "i"))
    kw: dict = {}
    if d.coin(0.4):
        kw["rel_value"] = d.tensor("rel_value", (2 * kmax + 1, dv), kind="content")
    if d.coin(0.3):
        kw["key_padding_mask"] = d.mask("key_padding_mask", (b, tk))
    if d.coin(0.2):
        am = torch.rand(tq, tk) < 0.8
        wrong = torch.ones(tq, tk + 1, dtype=torch.bool)
        kw["attn_mask"] = d.bad("attn_mask", am, (wrong, "m", am.long()))
    if d.coin(0.2):
        kw["is_causal"] = d.bad("is_causal", d.coin(), ("yes",))
    if d.coin(0.2):
        kw["dropout_p"] = d.bad("dropout_p", d.choice((0.0, 0.5)), (-0.1, 1.5, NAN))
    if d.coin(0.2):
        kw["scale"] = d.bad("scale", d.choice((None, 0.5)), (0.0, -1.0, NAN))
    vd = v.dtype if isinstance(v, torch.Tensor) else None
    return d.finish(
        "functional.relpos_attention",
        lambda: F.relpos_attention(q, k, v, rel_key, index, **kw),
        ("q", "k", "v", "rel_key", "index", *kw),
        lambda out: expect(out, (b, h, tq, dv), vd),
    )


def rotary(d: Draw, which: str | None = None) -> Call:
    b, t = d.dims(2, hi=4)
    if (which or d.choice(("angles", "apply"))) == "angles":
        hd = d.bad("head_dim", d.choice((2, 4, 8)), (3, 0, "4"))
        mode = d.bad("mode", d.choice(("1d", "2d")), ("3d", 1))
        m = 2 if mode == "2d" else 1
        pos = d.tensor("positions", (b, t, m), dtypes=_pos_dtypes(), ranks=False)
        kw: dict = {}
        if d.coin(0.4):
            kw["freq_scale"] = d.bad("freq_scale", d.choice((1.0, 30.0)), BAD_POSITIVE)
        half = hd // 2 if isinstance(hd, int) else None
        return d.finish(
            "functional.rotary_angles",
            lambda: F.rotary_angles(pos, hd, mode=mode, **kw),
            ("positions", "head_dim", "mode", *kw),
            lambda out: expect(out, (b, t, half), torch.float32),
        )
    h, hd = d.int(1, 2), d.choice((2, 4))
    x = d.tensor("x", (b, h, t, hd), kind="content", dtypes=FLOATS_ALL)
    shapes = (
        (b, t, hd // 2),
        (1, t, hd // 2),
        (t, hd // 2),
        (b, h, t, hd // 2),
        (1, 1, t, hd // 2),
    )
    angles = d.tensor("angles", d.choice(shapes), ranks=False)  # ranks 2-4 are all valid
    angles = d.bad("angles", angles, (torch.zeros(hd // 2), torch.zeros(1, 1, 1, t, hd // 2)))
    xd = x.dtype if isinstance(x, torch.Tensor) else None
    return d.finish(
        "functional.apply_rotary",
        lambda: F.apply_rotary(x, angles),
        ("x", "angles"),
        lambda out: expect(out, (b, h, t, hd), xd),
    )


def alibi(d: Draw, which: str | None = None) -> Call:
    if (which or d.choice(("slopes", "bias"))) == "slopes":
        heads = d.bad("heads", d.int(1, 20), (0, -1, 2.5, "4"))
        n = heads if isinstance(heads, int) else None
        return d.finish(
            "functional.alibi_slopes",
            lambda: F.alibi_slopes(heads),
            ("heads",),
            lambda out: expect(out, (n,), torch.float32),
        )
    b, tq, tk = d.dims(3, hi=4)
    h = d.int(1, 3)
    bq = d.choice((b, 1))
    qp = d.tensor("q_positions", d.choice(((bq, tq), (bq, tq, 1))), dtypes=_pos_dtypes())
    kp = d.tensor("k_positions", (b, tk), dtypes=_pos_dtypes(), bad_dtypes=(torch.bool,))
    slopes = d.bad(
        "slopes",
        d.choice((F.alibi_slopes(h), torch.full((h,), 1e6), [0.5] * h)),
        (torch.zeros(h), -F.alibi_slopes(h), torch.full((h,), NAN), torch.ones(h, 1), "s"),
    )
    kw: dict = {}
    if d.coin(0.3):
        kw["causal"] = d.bad("causal", d.coin(), ("yes", 1))
    out_b = torch.broadcast_shapes((bq,), (b,))[0]
    return d.finish(
        "functional.alibi_bias",
        lambda: F.alibi_bias(qp, kp, slopes, **kw),
        ("q_positions", "k_positions", "slopes", *kw),
        lambda out: expect(out, (out_b, h, tq, tk), torch.float32),
    )


def fire(d: Draw, which: str | None = None) -> Call:
    """FIRE's normalised distances and its bias through given MLP weights."""
    which = which or d.choice(("distance", "bias"))
    b, tq, tk = d.dims(3, hi=4)
    bq = d.choice((b, 1))
    qp = d.tensor("q_positions", d.choice(((bq, tq), (bq, tq, 1))), dtypes=_pos_dtypes())
    kp = d.tensor("k_positions", (b, tk), dtypes=_pos_dtypes(), bad_dtypes=(torch.bool,))
    kw: dict = {}
    if d.coin(0.5):
        c = d.choice((0.1, 1.0, torch.tensor(2.0, requires_grad=True), -0.5))
        kw["c"] = d.bad("c", c, (NAN, "c", torch.ones(2), torch.tensor(True)))
    if d.coin(0.5):
        lim = d.choice((512.0, 1.0, torch.tensor([3.0]), 0.0))
        kw["threshold"] = d.bad("threshold", lim, (INF, None, torch.zeros(1, 2)))
    if d.coin(0.3):
        kw["causal"] = d.bad("causal", d.coin(), ("yes", 1))
    out_b = torch.broadcast_shapes((bq,), (b,))[0]
    if d.coin(0.3):
        shape = d.choice(((b, tk), (1, tk), (b, tq, tk), (1, 1, tk)))
        seen = torch.rand(shape) < 0.7
        wrong = torch.ones(b, tk + 1, dtype=torch.bool)
        kw["k_mask"] = d.bad("k_mask", seen, (seen.float(), wrong))
    if which == "distance":
        return d.finish(
            "functional.fire_distance",
            lambda: F.fire_distance(qp, kp, **kw),
            ("q_positions", "k_positions", *kw),
            lambda out: expect(out, (out_b, tq, tk), torch.float32),
        )
    h, hidden = d.int(1, 3), d.int(1, 5)
    dt = d.choice((torch.float32, torch.float32, torch.bfloat16, torch.float64))
    w = [torch.randn(hidden, 1), torch.randn(hidden), torch.randn(h, hidden), torch.randn(h)]
    weights = d.bad(
        "weights",
        tuple(t.to(dt) for t in w),
        (
            tuple(w[:3]),
            (w[0], w[1], w[2][:, :1], w[3]) if hidden > 1 else "w",
            (w[0].long(), *w[1:]),
        ),
    )
    return d.finish(
        "functional.fire_bias",
        lambda: F.fire_bias(qp, kp, weights, **kw),
        ("q_positions", "k_positions", "weights", *kw),
        lambda out: expect(out, (out_b, h, tq, tk), torch.float32),
    )


def frequencies_fit(d: Draw, which: str | None = None) -> Call:
    """cape.functional.frequencies: a grid's sampling, aliasing, frequencies fitted to it."""
    import cape.functional.frequencies as FF

    which = which or d.choice(FITS)
    spacing = d.choice((0.25, 2 / 13, 1.0))
    if which in ("radii", "fit2d", "fit1d"):
        tiny = (1e-300,) if which != "radii" else ()  # float32 frequencies would overflow
        spacing = d.bad("spacing", spacing, (0.0, -1.0, NAN, "0.25") + tiny)
        span = d.bad("span", d.choice((2.0, 1.5)), (-2.0, NAN, INF, "2"))
    kw: dict = {}
    if d.coin(0.3) and which in ("radii", "fit2d", "fit1d"):
        kw["max_scaling"] = d.bad("max_scaling", d.choice((1.0, 1.4)), (0.5, NAN, INF))
    if which in ("sampling", "count"):
        pos = d.tensor("positions", (d.int(0, 6), 2), dtypes=_pos_dtypes(), bad_dtypes=())
        if which == "sampling":
            d.finite = False  # an axis with one value has an infinite spacing (documented)
            return d.finish(
                "functional.grid_sampling",
                lambda: FF.grid_sampling(pos),
                ("positions",),
                lambda out: expect(out[0], (2,), torch.float64) or expect(out[1], (2,)),
            )
    if which in ("aliased", "count"):
        k = d.int(0, 4)
        freqs = d.tensor("freqs", (2, k), kind="content", dtypes=FLOATS_ALL, ranks=False)
        if which == "count":
            return d.finish(
                "functional.count_aliased",
                lambda: FF.count_aliased(freqs, pos),
                ("freqs", "positions"),
            )
        spacings = d.bad("spacing", (spacing, 0.5), ((spacing,), (0.0, 0.5), "s"))
        return d.finish(
            "functional.aliased",
            lambda: FF.aliased(freqs, spacings),
            ("freqs", "spacing"),
            lambda out: expect(out, (k,), torch.bool),
        )
    if which in ("radii", "fit1d"):
        count = d.bad("count", d.int(1, 6), (0, -1, 2.5))
    if which == "radii":
        kw["rho"] = d.bad("rho", d.choice(("exact", "linspace", "midpoint")), ("other",))
        return d.finish(
            "functional.grid_radii",
            lambda: FF.grid_radii(count, spacing, span, **kw),
            ("count", "spacing", "span", *kw),
            lambda out: expect(out, (count,), torch.float64),
        )
    if which == "fit1d":
        return d.finish(
            "functional.grid_frequencies_1d",
            lambda: FF.grid_frequencies_1d(count, spacing, span, **kw),
            ("count", "spacing", "span", *kw),
            lambda out: expect(out, (count,), torch.float32),
        )
    if which == "fit2d":
        dim = d.bad("dim", 2 * d.int(1, 4), (0, 3, "4"))
        pair = d.bad("spacing", (spacing, spacing), ((spacing,), "ss", spacing))
        spans = d.bad("span", (span, span), ((span,), 2.0))
        return d.finish(
            "functional.grid_frequencies_2d",
            lambda: FF.grid_frequencies_2d(dim, pair, spans, **kw),
            ("dim", "spacing", "span", *kw),
            lambda out: expect(out, (2, dim // 2), torch.float32),
        )
    name = d.choice(("cape2d", "sinpos2d", "sine-2d", "rotary2d"))
    enc = cape.build(name, 8 if name != "rotary2d" else 4)
    grid = d.bad("grid", (d.int(1, 6), d.int(1, 6)), (4, (0, 2), ("a", 2)))
    ext = {"extent": d.bad("extent", 0.5, (0.0, NAN))} if d.coin(0.2) and name != "sine-2d" else {}
    module = d.bad("encoding", enc, (cape.NoPos(8), "cape2d"))
    return d.finish(
        "cape.count_aliased",
        lambda: cape.count_aliased(module, grid, **ext),
        ("encoding", "grid", *ext),
    )


SINUSOIDS = ("1d", "2d", "axial", "sinusoid", "shifted", "cos_sin", "doubled")
FITS = ("sampling", "aliased", "count", "radii", "fit2d", "fit1d", "encoding")


def each(generate: Callable[..., Call], options: Sequence[str]) -> list[Callable[[Draw], Call]]:
    """One generator per option: each public function gets its own share of the examples."""
    return [functools.partial(generate, which=o) for o in options]


GENERATORS = {
    "positions": [lengths_to_mask, token_positions, timestamps, as_positions]
    + each(grid_positions, ("positions", "indices")),
    "augment": [augment_positions, augment_pair, mean_normalize, registry, value_checks]
    + [value_checks_enabled, fusion, fusion_enabled],
    "functional": [frequencies]
    + each(sinusoids, SINUSOIDS)
    + each(fourier, ("features", "lff", "lff", "kernel"))
    + each(relative, ("buckets", "index", "attention", "attention"))
    + each(rotary, ("angles", "apply"))
    + each(alibi, ("slopes", "bias"))
    + each(fire, ("distance", "bias"))
    + each(frequencies_fit, FITS)
    + each(scaling, SCALING)
    + each(rope2d, ROPE2D),
}
