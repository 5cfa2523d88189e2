"""Small statistics without scipy: Student's t distribution and Welch's two-sample t-test.

The LFF paper compares encodings with t-tests over 3 runs each (sec. 4.4); `welch_t_test` is
that test for two groups of per-seed scores with unequal variances.

- `regularized_incomplete_beta(a, b, x)`: I_x(a, b), by the continued fraction of Numerical
  Recipes (modified Lentz), with the symmetry I_x(a, b) = 1 - I_{1-x}(b, a) where the fraction
  converges slowly.
- `t_cdf(t, df)`: P(T <= t) for T ~ Student-t with `df` > 0 degrees of freedom (any real df):
  for t > 0, 1 - I_x(df/2, 1/2) / 2 with x = df / (df + t^2); symmetric for t < 0.
- `welch_t_test(a, b) -> (t, df, p)`: Welch's t statistic, the Welch-Satterthwaite degrees of
  freedom and the two-sided p-value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["regularized_incomplete_beta", "t_cdf", "welch_t_test"]

_TINY = 1e-300
_EPS = 1e-15
_MAX_ITER = 10_000


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b) (Numerical Recipes' betacf, modified Lentz)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, _MAX_ITER + 1):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)),
                   -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + aa / c
            c = c if abs(c) > _TINY else _TINY
            step = d * c
            h *= step
        if abs(step - 1.0) < _EPS:
            return h
    raise ArithmeticError(f"incomplete beta fraction did not converge for a={a}, b={b}, x={x}")


def regularized_incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b) = B(x; a, b) / B(a, b) for a, b > 0 and x in [0, 1]."""
    if not (a > 0 and b > 0 and math.isfinite(a) and math.isfinite(b)):
        raise ValueError(f"a and b must be finite and > 0, got a={a}, b={b}")
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x must lie in [0, 1], got {x}")
    if x == 0.0 or x == 1.0:
        return x
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def _two_sided(t: float, df: float) -> float:
    """P(|T| >= |t|) = I_x(df/2, 1/2), x = df / (df + t^2)."""
    if math.isinf(t):
        return 0.0
    return regularized_incomplete_beta(df / 2.0, 0.5, df / (df + t * t))


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` > 0 degrees of freedom (df need not be an integer)."""
    if not (df > 0 and math.isfinite(df)):
        raise ValueError(f"df must be finite and > 0, got {df}")
    if math.isnan(t):
        return math.nan
    tail = 0.5 * _two_sided(t, df)
    return 1.0 - tail if t > 0 else tail


def welch_t_test(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """Welch's unequal-variance t-test of mean(a) = mean(b): (t, df, two-sided p).

    t = (mean(a) - mean(b)) / sqrt(s_a^2/n_a + s_b^2/n_b) with sample variances (ddof=1);
    df by Welch-Satterthwaite. Fewer than 2 values in a group: (nan, nan, nan), nothing can be
    said. Both variances 0: t = 0, p = 1 if the means are equal, else t = +-inf, p = 0 (df =
    n_a + n_b - 2). Values must be finite (ValueError naming `a` or `b` otherwise).
    """
    groups = []
    for name, values in (("a", a), ("b", b)):
        vals = [float(v) for v in values]
        if not all(math.isfinite(v) for v in vals):
            raise ValueError(f"{name} must hold finite numbers, got {vals}")
        groups.append(vals)
    (xa, xb) = groups
    na, nb = len(xa), len(xb)
    if na < 2 or nb < 2:
        return math.nan, math.nan, math.nan
    ma, mb = math.fsum(xa) / na, math.fsum(xb) / nb
    va = math.fsum((v - ma) ** 2 for v in xa) / (na - 1)
    vb = math.fsum((v - mb) ** 2 for v in xb) / (nb - 1)
    sa, sb = va / na, vb / nb
    se2 = sa + sb
    if se2 == 0.0:
        if ma == mb:
            return 0.0, float(na + nb - 2), 1.0
        return math.copysign(math.inf, ma - mb), float(na + nb - 2), 0.0
    t = (ma - mb) / math.sqrt(se2)
    df = se2 * se2 / (sa * sa / (na - 1) + sb * sb / (nb - 1))
    return t, df, _two_sided(t, df)
