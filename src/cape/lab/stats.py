"""Welch's two-sample t-test, over scipy.stats.

The LFF paper compares encodings with t-tests over 3 runs each (sec. 4.4); `welch_t_test` is
that test for two groups of per-seed scores with unequal variances. scipy does the maths; this
module checks the inputs (errors name the argument) and settles the cases where scipy would
answer NaN although the answer is known (both groups constant).

- `welch_t_test(a, b) -> (t, df, p)`: Welch's t statistic, the Welch-Satterthwaite degrees of
  freedom and the two-sided p-value (scipy.stats.ttest_ind with equal_var=False).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

from scipy import stats

__all__ = ["welch_t_test"]


def _finite(name: str, values: Sequence[float]) -> list[float]:
    vals = [float(v) for v in values]
    if not all(math.isfinite(v) for v in vals):
        raise ValueError(f"{name} must hold finite numbers, got {vals}")
    return vals


def welch_t_test(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """Welch's unequal-variance t-test of mean(a) = mean(b): (t, df, two-sided p).

    t = (mean(a) - mean(b)) / sqrt(s_a^2/n_a + s_b^2/n_b) with sample variances (ddof=1);
    df by Welch-Satterthwaite. Fewer than 2 values in a group: (nan, nan, nan), nothing can be
    said. Both groups constant: t = 0, p = 1 if the means are equal, else t = +-inf, p = 0 (df =
    n_a + n_b - 2). Values must be finite (ValueError naming `a` or `b` otherwise).
    """
    xa, xb = _finite("a", a), _finite("b", b)
    na, nb = len(xa), len(xb)
    if na < 2 or nb < 2:
        return math.nan, math.nan, math.nan
    if len(set(xa)) == 1 and len(set(xb)) == 1:  # no spread at all: scipy would say NaN
        if xa[0] == xb[0]:
            return 0.0, float(na + nb - 2), 1.0
        return math.copysign(math.inf, xa[0] - xb[0]), float(na + nb - 2), 0.0
    with warnings.catch_warnings():
        if len(set(xa)) == 1 or len(set(xb)) == 1:  # a variance of exactly 0 is no precision loss
            warnings.filterwarnings("ignore", "Precision loss", RuntimeWarning)
        res = stats.ttest_ind(xa, xb, equal_var=False)
    return float(res.statistic), float(res.df), float(res.pvalue)
