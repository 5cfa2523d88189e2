"""The machinery of the contract suite (test_contract.py): drawing arguments, calling, classifying.

A case generator draws the arguments of one public call through `Draw` (valid values, edges such
as empty shapes, and, now and then, one value that must be refused: a wrong type, rank, dtype
or size, a NaN, a negative option...) and returns a `Call`. `classify` runs it and sorts the
outcome into one class:

- "valid": it returned what its documentation says (`Call.check` passes) and, when every input
  was finite, every floating-point output is finite;
- "error": a ValueError/TypeError whose message names one of the arguments given;
- a failure: "exception" (any other exception), "unnamed" (a ValueError/TypeError naming no
  argument given), "nonfinite" (NaN/inf out of finite inputs), "wrong-output" (shape, dtype),
  "accepted-invalid" (a value the generator knows to be invalid went through).

Content tensors (x, q, k, v, features, images) are drawn with moderate values (|x| <~ 10, or
NaN/inf): any network overflows on content near float32's range. Positions, hops, extents and
options are drawn up to float32's range and beyond (float64 1e300).
"""

from __future__ import annotations

import math
import random
import re
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import strategies as st

FAILURES = ("exception", "unnamed", "nonfinite", "wrong-output", "accepted-invalid")
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
NOT_FLOAT = (torch.int64, torch.int32, torch.bool, torch.complex64)


@dataclass
class Call:
    label: str
    fn: Callable[[], Any]
    names: Sequence[str]
    finite: bool = True
    invalid: list[str] = field(default_factory=list)
    check: Callable[[Any], str | None] = lambda out: None
    args: dict[str, Any] = field(default_factory=dict)


def _names_one(message: str, names: Sequence[str]) -> bool:
    return any(
        re.search(rf"(?<![A-Za-z0-9_]){re.escape(n)}(?![A-Za-z0-9])", message) for n in names
    )


def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return []


def classify(call: Call) -> tuple[str, str]:
    """Run `call` -> (outcome class, detail)."""
    try:
        out = call.fn()
    except (ValueError, TypeError) as e:
        if _names_one(str(e), call.names):
            return "error", f"{type(e).__name__}: {e}"
        return "unnamed", f"{type(e).__name__}: {e} (given: {list(call.names)})"
    except Exception as e:  # noqa: BLE001 - classifying every exception is the point
        frames = traceback.extract_tb(e.__traceback__)[-2:]
        where = "; ".join(f"{f.filename.split('/')[-1]}:{f.lineno}" for f in frames)
        return "exception", f"{type(e).__name__}: {str(e)[:200]} at {where}"
    if call.invalid:
        return "accepted-invalid", f"accepted {call.invalid}"
    problem = call.check(out)
    if problem:
        return "wrong-output", problem
    if call.finite:
        for t in _tensors(out):
            if (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all()):
                return "nonfinite", f"NaN/inf in an output of shape {tuple(t.shape)}"
    return "valid", ""


class Recorder:
    """Counts per class and the first few failures per call label."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.per_label: Counter[tuple[str, str]] = Counter()
        self.failures: list[str] = []

    def run(self, call: Call) -> None:
        outcome, detail = classify(call)
        self.counts[outcome] += 1
        self.per_label[(call.label, outcome)] += 1
        if outcome in FAILURES and sum(1 for f in self.failures if f.startswith(call.label)) < 3:
            self.failures.append(f"{call.label} [{outcome}] {detail}\n    args: {call.args}")

    def summary(self, title: str) -> str:
        total = sum(self.counts.values())
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))
        return f"{title}: {total} generated inputs: {counts}"


def short(value: Any) -> str:
    """A compact description of an argument for failure reports."""
    if isinstance(value, torch.Tensor):
        desc = f"tensor{tuple(value.shape)} {str(value.dtype).replace('torch.', '')}"
        if value.numel() and value.is_floating_point():
            v = value.detach().double()
            desc += f" |max| {float(v.abs().nan_to_num(0.0, 0.0, 0.0).max()):.3g}"
            if not bool(torch.isfinite(v).all()):
                desc += " non-finite"
        return desc
    if isinstance(value, (list, tuple)) and len(value) > 4:
        return f"{type(value).__name__}[{len(value)}]"
    return repr(value)


class Draw:
    """Hypothesis draws with the helpers every case generator needs."""

    def __init__(self, data: st.DataObject, p_bad: float = 0.08) -> None:
        self.data = data
        self.p_bad = p_bad
        # coins from one drawn seed: hypothesis's own integer draws lean to small values (twice
        # as many "rare" events as asked); choices and sizes (`int`) keep hypothesis's spread
        self.rng = random.Random(data.draw(st.integers(0, 2**32 - 1)))
        # parameters' initialisation and the few unseeded draws: the same on every run (the
        # caller restores torch's global generator afterwards)
        torch.manual_seed(self.rng.randrange(2**62))
        self.invalid: list[str] = []
        self.finite = True
        self.args: dict[str, Any] = {}

    # -- scalars ---------------------------------------------------------------------------
    def __call__(self, strategy: st.SearchStrategy) -> Any:
        return self.data.draw(strategy)

    def choice(self, seq: Sequence[Any]) -> Any:
        return self.data.draw(st.sampled_from(list(seq)))

    def int(self, lo: int, hi: int) -> int:
        return self.data.draw(st.integers(lo, hi))

    def coin(self, p: float = 0.5) -> bool:
        return self.rng.random() < p

    def bad(self, name: str, valid: Any, invalid: Sequence[Any]) -> Any:
        """`valid` most of the time, else one of `invalid` (values that must be refused)."""
        if invalid and self.coin(self.p_bad):
            value = self.choice(invalid)
            self.invalid.append(f"{name}={short(value)}")
        else:
            value = valid
        self.args[name] = short(value)
        return value

    def edge(self, name: str, valid: Any, edges: Sequence[Any]) -> Any:
        """`valid` most of the time, else an edge value (either outcome may be documented)."""
        value = self.choice(edges) if edges and self.coin(0.2) else valid
        self.args[name] = short(value)
        return value

    def dims(self, n: int, *, hi: int = 5, zero: bool = True) -> tuple[int, ...]:
        lo = 0 if zero and self.coin(0.15) else 1
        return tuple(self.int(lo, hi) for _ in range(n))

    # -- tensors ---------------------------------------------------------------------------
    def values(self, shape: Sequence[int], kind: str, dtype: torch.dtype) -> torch.Tensor:
        """kind: "pos" (positions: any magnitude), "content" (|x| <~ 10), "index" (integers),
        "positive" (> 0). Specials (NaN/inf) now and then, marking the inputs non-finite."""
        g = torch.Generator().manual_seed(self.int(0, 2**31 - 1))
        shape = tuple(shape)
        if kind == "index":
            t = torch.randint(-3, 12, shape, generator=g).to(torch.float64)
        elif kind == "positive":
            scale = self.choice((0.01, 1.0, 1e3, 1e30, 1e300))
            t = (torch.rand(shape, generator=g, dtype=torch.float64) + 0.1) * scale
        else:
            scale = (
                self.choice((1.0, 10.0))
                if kind == "content"
                else self.choice((1.0, 1.0, 100.0, 1e6, 1e30, 3e38, 1e300))
            )
            t = torch.randn(shape, generator=g, dtype=torch.float64) * scale
        if t.numel() and self.coin(0.08):
            t.view(-1)[self.int(0, t.numel() - 1)] = self.choice((math.nan, math.inf, -math.inf))
        out = t.to(dtype) if dtype.is_floating_point else t.clamp(-1e6, 1e6).to(dtype)
        if out.is_floating_point() and not bool(torch.isfinite(out).all()):
            self.finite = False
        return out

    def tensor(
        self,
        name: str,
        shape: Sequence[int],
        kind: str = "pos",
        *,
        dtype: torch.dtype = torch.float32,
        dtypes: Sequence[torch.dtype] = FLOATS,
        bad_dtypes: Sequence[torch.dtype] = NOT_FLOAT,
        ranks: bool = True,
    ) -> Any:
        """A tensor of `shape`; sometimes another float dtype (valid), sometimes refused ones:
        a non-float dtype, a wrong rank, a list, a string."""
        bad_dtypes = [b for b in bad_dtypes if b not in dtypes]
        if self.coin(0.15):
            dtype = self.choice(dtypes)
        value = self.values(shape, kind, dtype)
        invalid: list[Any] = ["a string", value.tolist() if value.numel() < 8 else [1.0]]
        invalid += [value.to(d) for d in bad_dtypes]
        if ranks:
            invalid += [value[..., None, None], torch.zeros((), dtype=value.dtype)]
        return self.bad(name, value, invalid)

    def mask(self, name: str, shape: Sequence[int]) -> Any:
        """A bool mask (True = real) of `shape`, or a refused one (long, float, wrong shape)."""
        g = torch.Generator().manual_seed(self.int(0, 2**31 - 1))
        m = torch.rand(tuple(shape), generator=g) < 0.7
        if m.dim() == 2 and m.shape[1] and self.coin(0.7):
            m[:, 0] = True  # usually every sample keeps a real token
        wrong = torch.ones(tuple(shape[:-1]) + (shape[-1] + 1,), dtype=torch.bool)
        return self.bad(name, m, [m.long(), m.float(), wrong, m[..., None], "mask"])

    def maybe(self, p: float, make: Callable[[], Any]) -> Any:
        return make() if self.coin(p) else None

    def finish(
        self, label: str, fn: Callable[[], Any], names: Sequence[str], check: Callable | None = None
    ) -> Call:
        return Call(
            label,
            fn,
            tuple(names),
            finite=self.finite,
            invalid=list(self.invalid),
            check=check or (lambda out: None),
            args=dict(self.args),
        )


def expect(
    out: Any, shape: Sequence[int] | None = None, dtype: torch.dtype | None = None
) -> str | None:
    """A tensor of `shape` and `dtype` (None = any) -> None, else what differs."""
    if not isinstance(out, torch.Tensor):
        return f"expected a tensor, got {type(out).__name__}"
    if shape is not None and tuple(out.shape) != tuple(shape):
        return f"shape {tuple(out.shape)}, expected {tuple(shape)}"
    if dtype is not None and out.dtype != dtype:
        return f"dtype {out.dtype}, expected {dtype}"
    return None
