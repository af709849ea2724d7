"""tracking.stats against scipy and against hand computations written out here."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from scipy import stats as sps

from scarcelab.tracking.stats import (
    average_ranks,
    cd_diagram,
    cliques,
    friedman_test,
    nemenyi_cd,
    wilcoxon_holm,
)

# 4 problems x 3 methods, with a tie in row p2 (a and b share ranks 1 and 2 -> 1.5 each)
SCORES = pd.DataFrame(
    {"a": [0.9, 0.8, 0.7, 0.6], "b": [0.8, 0.8, 0.9, 0.5], "c": [0.1, 0.2, 0.3, 0.4]},
    index=["p1", "p2", "p3", "p4"],
)


def _random_scores(n: int, k: int, seed: int = 0, ties: bool = False) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, k)) + np.linspace(0, 1.5, k)
    if ties:
        x = np.round(x, 0)
    return pd.DataFrame(x, columns=[f"m{i}" for i in range(k)])


def test_average_ranks_by_hand():
    # ranks per row (1 = best): p1 a1 b2 c3; p2 a1.5 b1.5 c3; p3 b1 a2 c3; p4 a1 b2 c3
    expect = {"a": (1 + 1.5 + 2 + 1) / 4, "b": (2 + 1.5 + 1 + 2) / 4, "c": 3.0}
    r = average_ranks(SCORES)
    assert list(r.index) == ["a", "b", "c"]  # sorted ascending: best first
    for m, v in expect.items():
        assert r[m] == pytest.approx(v)


def test_friedman_matches_scipy_and_formula():
    for seed, ties in ((0, False), (1, True), (2, True)):
        df = _random_scores(9, 4, seed, ties)
        stat, p = friedman_test(df)
        ref = sps.friedmanchisquare(*[df[c] for c in df.columns])
        assert stat == pytest.approx(ref.statistic) and p == pytest.approx(ref.pvalue)
    # two methods (scipy refuses): chi2 = 12/(n k (k+1)) sum R^2 - 3 n (k+1), k=2, no ties
    df = pd.DataFrame({"x": [3.0, 2.0, 5.0, 1.0, 4.0], "y": [1.0, 1.0, 2.0, 0.0, 6.0]})
    # x wins 4 rows: rank sums x = 4*1 + 2 = 6, y = 4*2 + 1 = 9
    n, k = 5, 2
    chi2 = 12 / (n * k * (k + 1)) * (6**2 + 9**2) - 3 * n * (k + 1)
    stat, p = friedman_test(df)
    assert stat == pytest.approx(chi2) and p == pytest.approx(sps.chi2.sf(chi2, 1))
    # every row fully tied: no evidence
    assert friedman_test(pd.DataFrame({"x": [1.0, 2.0], "y": [1.0, 2.0]})) == (0.0, 1.0)


def test_wilcoxon_holm_matches_scipy_and_holm_by_hand():
    df = _random_scores(12, 4, seed=3)
    out = wilcoxon_holm(df, alpha=0.05)
    pairs = list(itertools.combinations(df.columns, 2))
    assert list(zip(out.a, out.b, strict=True)) == pairs
    raw = [sps.wilcoxon(df[a], df[b]).pvalue for a, b in pairs]
    np.testing.assert_allclose(out.p_value, raw)
    # Holm written out: sort ascending, multiply by (m - i), running max, cap at 1
    m = len(raw)
    order = sorted(range(m), key=lambda i: raw[i])
    adj, best = [0.0] * m, 0.0
    for pos, i in enumerate(order):
        best = max(best, min(1.0, (m - pos) * raw[i]))
        adj[i] = best
    np.testing.assert_allclose(out.p_holm, adj)
    assert list(out.significant) == [a < 0.05 for a in adj]
    assert out.significant.any() and not out.significant.all()  # the test case bites


def test_holm_small_case_by_hand():
    # three pairs; one identical pair (p = 1 by definition), two with exact p-values
    df = pd.DataFrame({"a": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
                       "b": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0],   # a > b in all 6 rows
                       "c": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]})  # identical to a
    out = wilcoxon_holm(df).set_index(["a", "b"])
    # exact two-sided signed-rank p for 6 rows all one sign: 2 / 2^6
    assert out.loc[("a", "b"), "p_value"] == pytest.approx(2 / 64)
    assert out.loc[("a", "c"), "p_value"] == 1.0
    assert out.loc[("b", "c"), "p_value"] == pytest.approx(2 / 64)
    # Holm: the two smallest (tied) 1/32 -> 3/32 and 2/32 -> running max 3/32; then 1
    assert out.loc[("a", "b"), "p_holm"] == pytest.approx(3 / 32)
    assert out.loc[("b", "c"), "p_holm"] == pytest.approx(3 / 32)
    assert out.loc[("a", "c"), "p_holm"] == 1.0
    assert not out.significant.any()
    assert wilcoxon_holm(df, alpha=0.1).significant.sum() == 2


def test_cliques_from_a_known_pattern():
    ranks = pd.Series({"A": 1.2, "B": 1.9, "C": 2.8, "D": 3.5, "E": 4.6})
    sig = {("A", "C"), ("A", "D"), ("A", "E"), ("B", "E"), ("B", "D")}
    rows = [(a, b, 0.0, 0.0, (a, b) in sig) for a, b in itertools.combinations("ABCDE", 2)]
    pw = pd.DataFrame(rows, columns=["a", "b", "p_value", "p_holm", "significant"])
    # A~B; B~C but B!~D; C~D~E (C-E not significant, D-E not significant)
    assert cliques(ranks, pw) == [["A", "B"], ["B", "C"], ["C", "D", "E"]]
    none_sig = pw.assign(significant=False)
    assert cliques(ranks, none_sig) == [["A", "B", "C", "D", "E"]]
    assert cliques(ranks, pw.assign(significant=True)) == []


def test_nemenyi_cd_matches_demsar_table():
    # Demšar (2006) Table 5(a): q_0.05 = 1.960, 2.343, 2.569, 2.728 for k = 2..5
    for k, q in ((2, 1.960), (3, 2.343), (4, 2.569), (5, 2.728)):
        n = 10
        assert nemenyi_cd(k, n) == pytest.approx(q * np.sqrt(k * (k + 1) / (6 * n)), abs=2e-3)


def test_cd_diagram_draws_ranks_and_cliques():
    df = _random_scores(15, 5, seed=4)
    fig = cd_diagram(df, title="unit")
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    ranks = average_ranks(df)
    for m, r in ranks.items():
        assert f"{m} ({r:.2f})" in texts
    assert any(t.startswith("unit") and "Friedman" in t for t in texts)
    thick = [ln for ln in ax.lines if ln.get_linewidth() > 3]
    assert len(thick) == len(cliques(ranks, wilcoxon_holm(df)))
    fig.canvas.draw()  # renders headless (Agg) without error


def test_missing_rows_dropped_with_warning_and_bad_input():
    df = SCORES.copy()
    df.loc["p5"] = [0.5, np.nan, 0.1]
    with pytest.warns(UserWarning, match="dropped 1 of 5 problems"):
        r = average_ranks(df)
    pd.testing.assert_series_equal(r, average_ranks(SCORES))
    with pytest.raises(ValueError, match="at least 2 methods"):
        friedman_test(SCORES[["a"]])
    with pytest.raises(TypeError, match="DataFrame"):
        average_ranks(np.zeros((2, 2)))  # type: ignore[arg-type]
