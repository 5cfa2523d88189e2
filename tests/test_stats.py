"""Student's t CDF and Welch's t-test against closed forms and an independent integration."""

from __future__ import annotations

import math

import pytest

from cape.lab.stats import regularized_incomplete_beta, t_cdf, welch_t_test

TS = [-30.0, -4.0, -1.5, -0.3, 0.0, 0.2, 1.0, 2.5, 7.0, 100.0]


@pytest.mark.parametrize("t", TS)
def test_t_cdf_df1_is_cauchy(t):
    assert t_cdf(t, 1.0) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)


@pytest.mark.parametrize("t", TS)
def test_t_cdf_df2_closed_form(t):
    assert t_cdf(t, 2.0) == pytest.approx(0.5 + t / (2.0 * math.sqrt(2.0 + t * t)), abs=1e-12)


@pytest.mark.parametrize("df", [0.7, 3.0, 5.88, 17.5, 250.0])
def test_t_cdf_symmetric_and_monotone(df):
    for t in TS:
        assert t_cdf(-t, df) == pytest.approx(1.0 - t_cdf(t, df), abs=1e-12)
    values = [t_cdf(t, df) for t in sorted(TS)]
    assert values == sorted(values) and 0.0 <= values[0] and values[-1] <= 1.0
    assert t_cdf(0.0, df) == 0.5


@pytest.mark.parametrize("t", [-3.0, -1.0, 0.5, 1.96, 2.7])
def test_t_cdf_large_df_tends_to_normal(t):
    normal = 0.5 * (1.0 + math.erf(t / math.sqrt(2.0)))
    assert t_cdf(t, 1e7) == pytest.approx(normal, abs=1e-6)
    assert abs(t_cdf(t, 30.0) - normal) > 1e-5 or t == 0.0  # finite df: heavier tails


def test_incomplete_beta_closed_forms():
    for x in (0.0, 0.01, 0.3, 0.5, 0.77, 0.999, 1.0):
        for a in (0.5, 1.0, 2.5, 40.0):
            assert regularized_incomplete_beta(a, 1.0, x) == pytest.approx(x**a, abs=1e-12)
            assert regularized_incomplete_beta(1.0, a, x) == pytest.approx(1 - (1 - x) ** a, abs=1e-12)
        # symmetry I_x(a, b) = 1 - I_{1-x}(b, a)
        assert regularized_incomplete_beta(2.5, 7.0, x) == pytest.approx(
            1.0 - regularized_incomplete_beta(7.0, 2.5, 1.0 - x), abs=1e-12)
    # I_{1/2}(a, a) = 1/2
    assert regularized_incomplete_beta(13.3, 13.3, 0.5) == pytest.approx(0.5, abs=1e-12)
    with pytest.raises(ValueError, match="x must"):
        regularized_incomplete_beta(1.0, 1.0, 1.5)
    with pytest.raises(ValueError, match="a and b"):
        regularized_incomplete_beta(0.0, 1.0, 0.5)


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
    assert p == pytest.approx(2.0 * t_cdf(-abs(t), df), abs=1e-12)
    assert p < 0.05  # clearly different groups


def test_welch_degenerate_cases():
    assert all(math.isnan(v) for v in welch_t_test([1.0], [1.0, 2.0]))
    assert welch_t_test([2.0, 2.0], [2.0, 2.0, 2.0]) == (0.0, 3.0, 1.0)
    t, df, p = welch_t_test([1.0, 1.0], [2.0, 2.0])
    assert t == -math.inf and p == 0.0
    with pytest.raises(ValueError, match="b must hold finite"):
        welch_t_test([1.0, 2.0], [1.0, math.nan])
