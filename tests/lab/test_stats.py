"""Student's t quantiles and Welch's t-test (over scipy) against closed forms, printed tables,
the Welch-Satterthwaite formula worked out here and an independent integration."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from cape.lab.experiments.lff_generation.report import t_quantile_975
from cape.lab.stats import welch_t_test


def _t_pdf(x: float, df: float) -> float:
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    return c * (1.0 + x * x / df) ** (-(df + 1) / 2)


def _tail_by_simpson(t: float, df: float, n: int = 20000) -> float:
    """P(|T| >= |t|) = 1 - 2 * integral_0^|t| pdf, by Simpson's rule (independent of the CF)."""
    h = abs(t) / n
    s = _t_pdf(0.0, df) + _t_pdf(abs(t), df)
    s += sum((4 if i % 2 else 2) * _t_pdf(i * h, df) for i in range(1, n))
    return 1.0 - 2.0 * s * h / 3.0


def test_welch_hand_computed_example():
    a, b = [1.0, 2.0, 3.0, 4.0, 5.0], [2.0, 4.0, 6.0, 8.0, 10.0]
    # means 3 and 6, variances 2.5 and 10: se^2 = 0.5 + 2 = 2.5
    t, df, p = welch_t_test(a, b)
    assert t == pytest.approx(-3.0 / math.sqrt(2.5), rel=1e-12)
    assert df == pytest.approx(2.5**2 / (0.5**2 / 4 + 2.0**2 / 4), rel=1e-12)  # 5.882...
    assert p == pytest.approx(_tail_by_simpson(t, df), abs=1e-9)
    assert 0.1 < p < 0.12
    t2, df2, p2 = welch_t_test(b, a)
    assert (t2, df2) == pytest.approx((-t, df)) and p2 == pytest.approx(p)


def test_welch_equal_variances_reduce_to_student():
    a, b = [70.1, 72.4, 71.0], [75.3, 76.0, 77.2]
    t, df, p = welch_t_test(a, b)
    ma, mb = sum(a) / 3, sum(b) / 3
    va = sum((x - ma) ** 2 for x in a) / 2
    vb = sum((x - mb) ** 2 for x in b) / 2
    assert t == pytest.approx((ma - mb) / math.sqrt(va / 3 + vb / 3))
    assert 2.0 <= df <= 4.0  # between min(n) - 1 and n_a + n_b - 2
    assert p == pytest.approx(2.0 * stats.t.cdf(-abs(t), df), abs=1e-12)
    assert p < 0.05  # clearly different groups


def test_welch_integer_df_closed_forms():
    # two pairs with equal variances: df = (2 s)^2 / (2 s^2) = 2, where the t CDF has a closed form
    t, df, p = welch_t_test([0.0, 2.0], [5.0, 7.0])  # means 1 and 6, variances 2: se^2 = 2
    assert t == pytest.approx(-5.0 / math.sqrt(2.0), rel=1e-12) and df == pytest.approx(2.0)
    assert p == pytest.approx(1.0 - abs(t) / math.sqrt(2.0 + t * t), rel=1e-10)
    # one constant group: df = s_a^4 / (s_a^4 / 1) = 1, the Cauchy distribution
    t, df, p = welch_t_test([0.0, 2.0], [5.0, 5.0])  # se^2 = 2 / 2 = 1
    assert (t, df) == pytest.approx((-4.0, 1.0), rel=1e-12)
    assert p == pytest.approx(1.0 - 2.0 * math.atan(4.0) / math.pi, rel=1e-10)


def test_welch_degenerate_cases():
    assert all(math.isnan(v) for v in welch_t_test([1.0], [1.0, 2.0]))
    assert welch_t_test([2.0, 2.0], [2.0, 2.0, 2.0]) == (0.0, 3.0, 1.0)
    # constant groups whose float mean is not exactly their value still have no spread
    assert welch_t_test([0.1] * 3, [0.1] * 3) == (0.0, 4.0, 1.0)
    assert welch_t_test([0.1] * 3, [0.7] * 3) == (-math.inf, 4.0, 0.0)
    t, df, p = welch_t_test([1.0, 1.0], [2.0, 2.0])
    assert t == -math.inf and p == 0.0
    with pytest.raises(ValueError, match="b must hold finite"):
        welch_t_test([1.0, 2.0], [1.0, math.nan])
    with pytest.raises(ValueError, match="a must hold finite"):
        welch_t_test([math.inf, 2.0], [1.0, 2.0])


# t_{0.975, df} for df = 1..30 as printed (3 decimals) in the standard statistics tables
PRINTED_T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


def test_t_quantile_975_is_the_printed_table():
    """To 3 decimals, as the tables the archived reports were made with: exactly those values."""
    assert [t_quantile_975(df) for df in range(1, 31)] == list(PRINTED_T975)
    assert t_quantile_975(1) == round(math.tan(math.pi * 0.475), 3)  # Cauchy: 12.706
    # df = 2: t = (2p - 1) sqrt(2 / (4 p (1 - p))) = 4.3027
    assert t_quantile_975(2) == round(0.95 * math.sqrt(2 / (4 * 0.975 * 0.025)), 3)
    assert t_quantile_975(10**7) == 1.960  # the normal's 1.95996
    for df in (31, 120):  # beyond the table: the CDF at the quantile is 0.975 within rounding
        assert stats.t.cdf(t_quantile_975(df), df) == pytest.approx(0.975, abs=5e-4 * 0.06)
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match="df must be an int >= 1"):
            t_quantile_975(bad)
