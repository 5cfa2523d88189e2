"""The fused path: an encoding's maths and its combination with the content in one compiled kernel.

In eager mode an encoding in training makes its phases, takes their sines into a buffer the size
of the content and adds that buffer to the content: three passes over `[B, T, D]`, and a CPU's
eager `sin` alone costs more than the add. `torch.compile` of the same pure functions
(`cape.functional`) fuses them into one pass that reads the content once and writes the output
once. cape takes that path by itself where it is safe and falls back to eager everywhere else:

- the encodings that have a pure kernel: the sinusoids (sinpos, CAPE1d, CAPE2d, SineND) in
  `add_to` / `enc(x, add=True)` when the embedding is computed (training with augmentation;
  eval-mode tables are cached and added as they are), and the rotary family's rotation of q, k;
- a compiler is present: a C++ compiler for CPU tensors (inductor builds C++), triton for CUDA;
- the call is not already being compiled, exported or traced (that outer graph fuses by itself),
  nor captured into a CUDA graph (a first call would compile during the capture);
- the content has at least `min_elements` elements (default 65536): below that the one-off
  compile (seconds, then cached on disk by inductor) is not worth it.

Random draws (CAPE's shifts and scales) stay eager, so both paths draw the same numbers from the
same generator; results agree to float rounding (inductor's sine is not eager's, bit for bit).
`cape.fusion(False)` turns it off per process (as a call or a `with` block), `cape.fusion(True)`
also fuses below `min_elements`; the environment variable `CAPE_FUSION=0` turns it off from
outside. If a compile fails (`_compile_errors`: the compiler's own failures only), cape warns
once, naming the failure, and stays eager for the rest of the process. The path stays automatic
because it pays: `cape bench encodings` measures each kernel fused against eager in one run.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import warnings
from collections.abc import Callable

import torch

from ._checks import check_bool

__all__ = ["fusion", "fusion_enabled", "can_fuse", "fused", "compiled_calls", "MIN_ELEMENTS"]

MIN_ELEMENTS = 65536


class _State:
    # one switch per process (compiled kernels are per process too): None = auto
    mode: bool | None = None if os.environ.get("CAPE_FUSION", "auto") != "0" else False
    broken: str | None = None  # why a compile failed: stays eager
    calls = 0  # compiled kernels run in this process (`compiled_calls`)


_STATE = _State()


class fusion:  # noqa: N801 - used like torch.set_grad_enabled, as a function or a `with`
    """Turn the fused (compiled) path on or off: `cape.fusion(False)` until turned on again,
    `with cape.fusion(False): ...` inside the block. None = auto (the default: fused where it
    is safe, for contents of at least `MIN_ELEMENTS` elements); True = fused at every size
    where a compiler is present. See the module docstring for where it applies."""

    def __init__(self, enabled: bool | None) -> None:
        self.previous = _STATE.mode
        _STATE.mode = None if enabled is None else check_bool("enabled", enabled)

    def __enter__(self) -> fusion:
        return self

    def __exit__(self, *exc: object) -> None:
        _STATE.mode = self.previous


def fusion_enabled() -> bool | None:
    """The switch: None = auto, True = always where possible, False = off."""
    return _STATE.mode


@functools.cache
def _compiler_present(device_type: str) -> bool:
    if device_type == "cpu":
        from torch._inductor import config  # inductor's own choice of C++ compiler

        cxx = getattr(config.cpp, "cxx", (None, "g++"))
        names = [c for c in (cxx if isinstance(cxx, tuple) else (cxx,)) if c]
        return any(shutil.which(n) for n in names + ["g++", "c++", "clang++"])
    if device_type == "cuda":
        from torch.utils._triton import has_triton

        return bool(has_triton())
    return False


def _tracing() -> bool:
    # an outer torch.compile / torch.export fuses by itself; a jit trace or an FX proxy
    # must record the eager ops
    return bool(torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.jit.is_scripting())


def can_fuse(x: torch.Tensor) -> bool:
    """Whether a kernel over the content x takes the fused path now (the module docstring)."""
    mode = _STATE.mode
    if mode is False or _STATE.broken is not None or _tracing():
        return False
    if type(x) is not torch.Tensor or x.is_meta:  # subclasses (FX proxies, fakes...) stay eager
        return False
    if _functorch_wrapped(x):  # inside torch.func's vmap / grad: dynamo cannot trace there
        return False
    if mode is None and x.numel() < MIN_ELEMENTS:
        return False
    if x.is_cuda and torch.cuda.is_current_stream_capturing():
        return False  # a first call would compile inside the CUDA graph being captured
    return _compiler_present(x.device.type)


def _functorch_wrapped(x: torch.Tensor) -> bool:
    check = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", None)
    return bool(check is not None and check(x))


_COMPILED: dict[Callable[..., torch.Tensor], Callable[..., torch.Tensor]] = {}
_EAGER: set[Callable[..., torch.Tensor]] = set()  # kernels compiled for too many variants
_MAX_VARIANTS = 64


def fused(kernel: Callable[..., torch.Tensor], *args: torch.Tensor | None) -> torch.Tensor:
    """kernel(*args) compiled (one entry per kernel: a module-level function, dynamic shapes),
    or eager where the compile fails. kernel: a pure function of tensors (and None)."""
    if kernel in _EAGER:
        return kernel(*args)
    compiled = _COMPILED.get(kernel)
    if compiled is None:
        compiled = torch.compile(kernel, dynamic=True, fullgraph=True)
        _COMPILED[kernel] = compiled
    try:
        out = compiled(*args)
        _STATE.calls += 1
        return out
    except _compile_errors() as e:  # the compiler's failures only: a kernel's own raise passes
        if "RecompileLimit" in type(e).__name__:  # more dtypes/ranks/masks than dynamo keeps
            return _recompiled(kernel, compiled, args)
        _STATE.broken = f"{type(e).__name__}: {e}".splitlines()[0]
        _warn(f"torch.compile of the fused path failed ({_STATE.broken})")
        return kernel(*args)


@functools.cache
def _compile_errors() -> tuple[type[BaseException], ...]:
    """What a failed compile raises: dynamo's and inductor's errors (a graph it cannot take, the
    recompile limit, a C++ or CUDA compile that fails), a missing compiler or header (OSError,
    CalledProcessError). Anything else a kernel raises is the caller's error and passes."""
    from torch._dynamo import exc as dynamo
    from torch._inductor import exc as inductor

    limit = getattr(dynamo, "FailOnRecompileLimitHit", dynamo.TorchDynamoException)
    return (dynamo.TorchDynamoException, limit, inductor.CppCompileError, OSError,
            subprocess.CalledProcessError)  # fmt: skip


def compiled_calls() -> int:
    """How many compiled kernels this process has run: what a benchmark or test compares
    before and after a call to know whether it took the fused path."""
    return _STATE.calls


def _recompiled(
    kernel: Callable[..., torch.Tensor],
    compiled: Callable[..., torch.Tensor],
    args: tuple[torch.Tensor | None, ...],
) -> torch.Tensor:
    # dynamo keeps 8 variants of a function by default, for all callers together; a kernel
    # meets one per dtype, rank, mask or not and position axes: allow more for ours only, and
    # only when compiling (a call that finds its variant never reads the limit)
    from torch._dynamo import config

    try:
        with config.patch(recompile_limit=_MAX_VARIANTS):
            out = compiled(*args)
        _STATE.calls += 1
        return out
    except _compile_errors():  # still more variants: this kernel stays eager
        _EAGER.add(kernel)
        _warn(f"{kernel.__name__} met more than {_MAX_VARIANTS} input variants")
        return kernel(*args)


def _warn(what: str) -> None:
    warnings.warn(
        f"cape: {what}; using the eager path from now on (`cape.fusion(False)` silences this)",
        RuntimeWarning,
        stacklevel=4,
    )
