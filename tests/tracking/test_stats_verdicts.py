"""The two-arm tests the claim rules decide by (tracking/stats.py: Welch from values and
from a paper's mean ± sd, paired t over shared seeds, best-or-tied sets with Holm) against
scipy, statsmodels and hand computations written out here."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests

from scarcelab.tracking import stats


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_welch_is_scipys_from_values_and_from_stats(seed: int) -> None:
    rng = np.random.default_rng(seed)
    x, y = rng.normal(0.7, 0.03, 4 + seed), rng.normal(0.68, 0.06, 7)
    t, df, p = stats.welch_t(x, y)
    ref = sps.ttest_ind(x, y, equal_var=False)
    assert (t, p) == (pytest.approx(ref.statistic), pytest.approx(ref.pvalue))
    t2, df2, p2 = stats.welch_t_from_stats(x.mean(), x.std(ddof=1), len(x), y.mean(),
                                           y.std(ddof=1), len(y))
    ref2 = sps.ttest_ind_from_stats(x.mean(), x.std(ddof=1), len(x), y.mean(),
                                    y.std(ddof=1), len(y), equal_var=False)
    assert (t2, p2) == (pytest.approx(ref2.statistic), pytest.approx(ref2.pvalue))
    # Welch-Satterthwaite degrees of freedom, by hand
    v1, v2 = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    assert df == pytest.approx((v1 + v2) ** 2 / (v1 ** 2 / (len(x) - 1)
                                                  + v2 ** 2 / (len(y) - 1)))


def test_welch_by_hand_on_the_issues_cdalbench_cells() -> None:
    # issue 41: 0.9188 ± 0.0108 vs 0.9149 ± 0.0146, Welch p = .65 (n = 5 each assumed
    # here); by hand: se = sqrt(.0108²/5 + .0146²/5) = 0.008122, t = 0.0039 / se = 0.4802
    t, df, p = stats.welch_t_from_stats(0.9188, 0.0108, 5, 0.9149, 0.0146, 5)
    se = math.sqrt(0.0108 ** 2 / 5 + 0.0146 ** 2 / 5)
    assert t == pytest.approx(0.0039 / se) and t == pytest.approx(0.4802, abs=1e-4)
    assert p == pytest.approx(2 * sps.t.sf(t, df)) and 0.6 < p < 0.7


def test_welch_edge_cases() -> None:
    assert all(math.isnan(v) for v in stats.welch_t_from_stats(0.5, np.nan, 1, 0.4, 0.1, 3))
    assert stats.welch_t_from_stats(0.5, 0.0, 3, 0.5, 0.0, 3)[2] == 1.0
    assert stats.welch_t_from_stats(0.6, 0.0, 3, 0.5, 0.0, 3)[2] == 0.0


def test_compare_pairs_on_shared_seeds_else_welch() -> None:
    a = stats.Sample.of({0: 0.70, 1: 0.74, 2: 0.71, 3: 0.80})
    b = stats.Sample.of({0: 0.68, 1: 0.73, 2: 0.69, 9: 0.50})
    r = stats.compare(a, b)
    ref = sps.ttest_rel([0.70, 0.74, 0.71], [0.68, 0.73, 0.69])
    assert r.test == "paired t" and r.n == "3 shared seeds"
    assert r.p == pytest.approx(ref.pvalue) and r.diff == pytest.approx(0.05 / 3)
    # no shared seeds: Welch on all values
    c = stats.Sample.of({5: 0.6, 6: 0.62, 7: 0.61})
    r = stats.compare(a, c)
    assert r.test == "Welch t" and r.p == pytest.approx(
        sps.ttest_ind([0.70, 0.74, 0.71, 0.80], [0.6, 0.62, 0.61], equal_var=False).pvalue)
    # a paper's mean ± sd: Welch from the statistics
    r = stats.compare(stats.Sample.summary(0.803, 0.012, 50),
                      stats.Sample.summary(0.780, 0.014, 50))
    assert r.test == "Welch t" and r.p == pytest.approx(sps.ttest_ind_from_stats(
        0.803, 0.012, 50, 0.780, 0.014, 50, equal_var=False).pvalue)
    # one value each: no test
    r = stats.compare(stats.Sample.of([0.7]), stats.Sample.of([0.6]))
    assert r.test == "none" and math.isnan(r.p) and "too few" in r.text()


def test_best_or_tied_is_holm_over_the_comparisons_with_the_best() -> None:
    arms = {"a": [0.80, 0.82, 0.81, 0.83], "b": [0.79, 0.83, 0.80, 0.82],
            "c": [0.70, 0.71, 0.72, 0.70], "d": [0.76, 0.80, 0.74, 0.81]}
    res = stats.best_or_tied({k: stats.Sample.of(dict(enumerate(v))) for k, v in arms.items()})
    assert res.best == "a"
    raw = [sps.ttest_rel(arms["a"], arms[m]).pvalue for m in ("b", "d", "c")]
    adj = dict(zip(("b", "d", "c"), multipletests(raw, method="holm")[1], strict=True))
    for m in adj:
        assert res.p_holm[m] == pytest.approx(adj[m])
    assert set(res.tied) == {"a"} | {m for m in adj if adj[m] >= 0.05}
    assert "c" not in res.tied and "b" in res.tied
    # untestable arms (one value) are tied: no evidence they are worse
    one = stats.best_or_tied({"x": stats.Sample.of([0.9]), "y": stats.Sample.of([0.1])})
    assert one.tied == ("x", "y") and "untested" in one.describe()


def test_tost_welch_is_the_90_percent_welch_interval_inside_the_margin() -> None:
    x, y = [0.79, 0.80, 0.81], [0.80, 0.82, 0.81]
    ok, lo, hi = stats.tost_welch(x, y, 0.03)
    ci = sps.ttest_ind(x, y, equal_var=False).confidence_interval(0.90)
    assert (lo, hi) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert ok == (-0.03 < ci.low and ci.high < 0.03)
    assert not stats.tost_welch(x, y, 0.02)[0]  # the interval reaches -0.027
    assert stats.tost_welch([0.8], y, 0.03)[0] is False  # one run shows nothing


def test_tost_paired_is_the_90_percent_paired_interval_inside_the_margin() -> None:
    x, y = [0.79, 0.80, 0.81], [0.80, 0.82, 0.81]
    ok, lo, hi = stats.tost_paired(x, y, 0.03)
    ci = sps.ttest_rel(x, y).confidence_interval(0.90)
    assert (lo, hi) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert ok == (-0.03 < ci.low and ci.high < 0.03)
    assert not stats.tost_paired(x, y, 0.025)[0]  # the interval reaches -0.0269
    # a shared seed effect (+0.1 on both arms of seed 2) leaves the paired interval alone
    x2, y2 = [0.79, 0.80, 0.91], [0.80, 0.82, 0.91]
    assert stats.tost_paired(x2, y2, 0.03)[1] == pytest.approx(lo)
    assert not stats.tost_welch(x2, y2, 0.03)[0]  # Welch counts it as noise
    assert stats.tost_paired([0.8], [0.8], 0.03)[0] is False
