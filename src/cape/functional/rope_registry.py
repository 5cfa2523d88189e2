"""The rope scalings by name: an open registry, as transformers' `ROPE_INIT_FUNCTIONS`.

A scaling turns the rotary frequencies omega_c = freq_scale base^(-2c/hd) [hd/2] into the ones
a call uses, and says by how much q and k are each multiplied (the attention factor). Some are
fixed (one table, made once by `cape.Rotary`); others depend on the call, through one value per
sample or per call (`RopeScaling.per_call`):

- "span": cape's extension factor s = max(1, L / train_length), L the length the valid
  positions cover (`position_span`), per sample; used when no fixed `factor` is given;
- "length": transformers' dynamic types, from the call's largest position + 1 (one value).

The entries (papers and transformers 5.x's `modeling_rope_utils`, whose rope types convert to
these names in `cape.integrations.hf`):

- "pi" (transformers "linear"): omega / s (Chen et al. 2023).
- "ntk": omega_c s^(-2c/(hd-2)), base x s^(hd/(hd-2)) (bloc97 2023).
- "yarn": the YaRN paper's NTK-by-parts, a ramp linear in r_c = L_train / lambda_c between
  yarn_alpha and yarn_beta, and the temperature 0.1 ln s + 1 (Peng et al. 2023, sec. 3.2-3.4).
- "yarn-hf": transformers' YaRN, the same method with the ramp linear in the channel index
  between the channels where r = beta_fast and r = beta_slow (rounded out when `truncate`), and
  the attention factor 0.1 mscale ln s + 1 over 0.1 mscale_all_dim ln s + 1 (DeepSeek) or given.
- "dynamic": transformers' dynamic NTK: NTK with s' = max(1, s L / L_train - (s - 1)) per call,
  L = largest position + 1 (cape computes it per call; transformers keeps a longer call's
  frequencies until a call is shorter than L_train, a state cape's modules do not hold).
- "longrope" (Phi-3): omega / short_factor, or omega / long_factor once L > L_train; attention
  factor sqrt(1 + ln s / ln L_train).
- "llama3" (Llama 3.1): wavelengths above L_train / low_freq_factor divided by s, below
  L_train / high_freq_factor kept, a smooth interpolation between.

`register_rope_scaling(name, scaling)` adds an entry (a `RopeScaling` subclass instance); its
options are checked once, in `cape.Rotary`'s constructor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from .._checks import check_bool, check_float, check_limit
from .rope_scaling import extension_factor

__all__ = ["RopeScaling", "ROPE_SCALINGS", "register_rope_scaling", "rope_scaling"]

Options = Mapping[str, Any]


class RopeScaling:
    """One rope scaling (module docstring). Subclasses set the class fields and implement
    `frequencies`; `attention_factor` defaults to 1 and `call_value` to the rule `per_call`.

    options: the scaling's own options with their defaults (beyond `factor` and
    `train_length`, which every scaling receives). per_call: "fixed", "span" or "length".
    needs: which of "factor" / "train_length" must be given.
    """

    options: ClassVar[dict[str, Any]] = {}
    per_call: ClassVar[str] = "fixed"
    needs: ClassVar[tuple[str, ...]] = ("factor",)

    def check(self, o: dict[str, Any], head_dim: int) -> dict[str, Any]:
        """Validate the options `o` (factor, train_length and `options`, defaults filled in)
        for a rotary of `head_dim` -> the options kept; ValueError/TypeError naming one."""
        return o

    def frequencies(self, omega: torch.Tensor, s: torch.Tensor, o: Options) -> torch.Tensor:
        """omega [hd/2] float32, s [B or 1, 1] float32 (the factor, or the call's value) ->
        [B or 1, hd/2] float32."""
        raise NotImplementedError

    def attention_factor(self, s: torch.Tensor, o: Options) -> torch.Tensor | None:
        """s [B or 1] -> q's and k's factor [B or 1] float32 (None: 1)."""
        return None

    def call_value(self, span: torch.Tensor, longest: torch.Tensor, o: Options) -> torch.Tensor:
        """The value of one call when not fixed: span [B] (`position_span`), longest [] (the
        largest valid position + 1) -> [B] or [1] float32."""
        if self.per_call == "span":
            return extension_factor(span, o["train_length"])
        raise NotImplementedError(f"{type(self).__name__} has no per-call value")

    def fixed_value(self, o: Options) -> float | None:
        """The value of every call when the scaling is fixed: the factor of a "fixed" scaling,
        or of a "span" one given a factor; None when each call has its own."""
        if self.per_call == "length" or o.get("factor") is None:
            return None
        return float(o["factor"])


def _positive(name: str, value: object, *, minimum: float = 0.0, strict: bool = True) -> float:
    return check_limit(name, check_float(name, value, minimum=minimum, strict=strict))


def _turns(omega: torch.Tensor, train_length: float) -> torch.Tensor:
    """r_c = L_train / lambda_c = L_train omega_c / (2 pi): turns over the training length."""
    return train_length * omega / (2 * math.pi)


class _PI(RopeScaling):
    per_call = "span"
    needs = ()

    def frequencies(self, omega, s, o):
        return omega / s


class _NTK(RopeScaling):
    per_call = "span"
    needs = ()

    def check(self, o, head_dim):
        if head_dim < 4:
            raise ValueError(f"scaling='ntk' needs head_dim >= 4 (hd - 2 > 0), got {head_dim}")
        return o

    def frequencies(self, omega, s, o):
        half = omega.shape[-1]
        exponent = torch.arange(half, device=omega.device, dtype=torch.float32) / (half - 1)
        return omega * s ** (-exponent)


class _YaRN(RopeScaling):
    options = {"yarn_alpha": 1.0, "yarn_beta": 32.0}
    per_call = "span"
    needs = ("train_length",)

    def check(self, o, head_dim):
        alpha = check_float("yarn_alpha", o["yarn_alpha"])
        beta = _positive("yarn_beta", o["yarn_beta"], strict=False)
        if not alpha < beta:
            raise ValueError(f"yarn_alpha must be < yarn_beta, got {alpha} and {beta}")
        return {**o, "yarn_alpha": alpha, "yarn_beta": beta}

    def frequencies(self, omega, s, o):
        alpha, beta = o["yarn_alpha"], o["yarn_beta"]
        ramp = ((_turns(omega, o["train_length"]) - alpha) / (beta - alpha)).clamp(0.0, 1.0)
        return (1 - ramp) * omega / s + ramp * omega

    def attention_factor(self, s, o):
        return 0.1 * torch.log(s) + 1.0


def _mscale(s: float, mscale: float = 1.0) -> float:
    return 1.0 if s <= 1 else 0.1 * mscale * math.log(s) + 1.0


class _YaRNHF(RopeScaling):
    options = {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": True,
        "mscale": None,
        "mscale_all_dim": None,
        "attention_factor": None,
    }
    needs = ("factor", "train_length")

    def check(self, o, head_dim):
        fast = _positive("beta_fast", o["beta_fast"])
        slow = _positive("beta_slow", o["beta_slow"])
        if not slow < fast:
            raise ValueError(f"beta_slow must be < beta_fast, got {slow} and {fast}")
        out = {**o, "beta_fast": fast, "beta_slow": slow, "truncate": check_bool(
            "truncate", o["truncate"])}  # fmt: skip
        for name in ("mscale", "mscale_all_dim", "attention_factor"):
            if o[name] is not None:
                out[name] = _positive(name, o[name], strict=name == "attention_factor")
        return out

    def frequencies(self, omega, s, o):
        # the channel c where r_c = n turns: c = hd ln(L_train / (2 pi n)) / (2 ln base)
        dim, base, train = 2 * omega.shape[-1], o["base"], o["train_length"]

        def channel(turns: float) -> float:
            return dim * math.log(train / (turns * 2 * math.pi)) / (2 * math.log(base))

        low, high = channel(o["beta_fast"]), channel(o["beta_slow"])
        if o["truncate"]:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # transformers' guard against a zero-width ramp
        c = torch.arange(dim // 2, device=omega.device, dtype=torch.float32)
        ramp = ((c - low) / (high - low)).clamp(0.0, 1.0)  # 0: kept, 1: interpolated
        return omega / s * ramp + omega * (1 - ramp)

    def attention_factor(self, s, o):
        if o["attention_factor"] is not None:
            return torch.full_like(s, o["attention_factor"])
        factor = float(o["factor"])
        if o["mscale"] and o["mscale_all_dim"]:
            value = _mscale(factor, o["mscale"]) / _mscale(factor, o["mscale_all_dim"])
        else:
            value = _mscale(factor)
        return torch.full_like(s, value)


class _Dynamic(RopeScaling):
    per_call = "length"
    needs = ("factor", "train_length")

    def check(self, o, head_dim):
        return _NTK().check(o, head_dim)

    def call_value(self, span, longest, o):
        s, train = float(o["factor"]), o["train_length"]
        return (s * torch.clamp(longest, min=train) / train - (s - 1)).clamp(min=1.0).reshape(1)

    def frequencies(self, omega, s, o):
        return _NTK().frequencies(omega, s, o)


class _LongRoPE(RopeScaling):
    options = {"short_factor": None, "long_factor": None, "attention_factor": None}
    per_call = "length"
    needs = ("train_length",)

    def check(self, o, head_dim):
        out = dict(o)
        for name in ("short_factor", "long_factor"):
            value = o[name]
            if not isinstance(value, (list, tuple)) or len(value) != head_dim // 2:
                raise ValueError(
                    f"{name} must be a list of head_dim / 2 = {head_dim // 2} factors, got "
                    f"{value!r}"
                )
            out[name] = tuple(_positive(f"{name}[{i}]", v) for i, v in enumerate(value))
        if o["attention_factor"] is not None:
            out["attention_factor"] = _positive("attention_factor", o["attention_factor"])
        if o.get("factor") is not None:
            out["factor"] = _positive("factor", o["factor"], minimum=1.0, strict=False)
        return out

    def call_value(self, span, longest, o):
        return longest.reshape(1).to(torch.float32)

    def frequencies(self, omega, s, o):
        short = torch.tensor(o["short_factor"], dtype=torch.float32, device=omega.device)
        long = torch.tensor(o["long_factor"], dtype=torch.float32, device=omega.device)
        ext = torch.where(s > o["train_length"], long, short)  # [B or 1, hd/2]
        return omega / ext

    def attention_factor(self, s, o):
        if o["attention_factor"] is not None:
            return torch.full_like(s, o["attention_factor"])
        factor = o.get("factor")
        if factor is None or factor <= 1.0:
            return None
        return torch.full_like(s, math.sqrt(1 + math.log(factor) / math.log(o["train_length"])))


class _Llama3(RopeScaling):
    options = {"low_freq_factor": 1.0, "high_freq_factor": 4.0}
    needs = ("factor", "train_length")

    def check(self, o, head_dim):
        low = _positive("low_freq_factor", o["low_freq_factor"])
        high = _positive("high_freq_factor", o["high_freq_factor"])
        if not low < high:
            raise ValueError(f"low_freq_factor must be < high_freq_factor, got {low} and {high}")
        return {**o, "low_freq_factor": low, "high_freq_factor": high}

    def frequencies(self, omega, s, o):
        train, low, high = o["train_length"], o["low_freq_factor"], o["high_freq_factor"]
        wavelength = 2 * math.pi / omega
        smooth = (train / wavelength - low) / (high - low)
        mixed = (1 - smooth) * omega / s + smooth * omega
        out = torch.where(wavelength > train / low, omega / s, omega)
        middle = (wavelength >= train / high) & (wavelength <= train / low)
        return torch.where(middle, mixed, out)


ROPE_SCALINGS: dict[str, RopeScaling] = {
    "pi": _PI(),
    "ntk": _NTK(),
    "yarn": _YaRN(),
    "yarn-hf": _YaRNHF(),
    "dynamic": _Dynamic(),
    "longrope": _LongRoPE(),
    "llama3": _Llama3(),
}


def register_rope_scaling(name: str, scaling: RopeScaling) -> None:
    """Add `scaling` to the registry under `name` (`Rotary(scaling=name, ...)` then takes it)."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    if not isinstance(scaling, RopeScaling):
        raise TypeError(f"scaling must be a cape RopeScaling, got {type(scaling).__name__}")
    ROPE_SCALINGS[name] = scaling


def rope_scaling(name: str) -> RopeScaling:
    """The registry's entry `name`; ValueError listing the names otherwise."""
    if name not in ROPE_SCALINGS:
        raise ValueError(f"scaling must be None or one of {sorted(ROPE_SCALINGS)}, got {name!r}")
    return ROPE_SCALINGS[name]
