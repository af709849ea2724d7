"""tracking.stats against scipy and against hand computations written out here."""

from __future__ import annotations

import itertools
import re

import matplotlib
import matplotlib.colors as mcolors
import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from scipy import stats as sps

from scarcelab.tracking import stats
from scarcelab.tracking.query import render
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


# -- the CD diagram's geometry, dropped problems (mutation sample, docs/mutation.md) ---
K, N = 4, 10


NAMES = ["A", "B", "C", "D"]


def _ordered_scores() -> pd.DataFrame:
    """A beats B beats C beats D on every one of 10 problems, by distinct margins: every
    pair's Wilcoxon signed-rank test is exact with all 10 differences of one sign, so
    p = 2 / 2**10 = 0.001953 for each of the 6 pairs and Holm makes every adjusted p
    6 * 0.001953 = 0.0117 (the running max of (6 - i) * p). At alpha = 0.05 every pair
    differs (no clique); at alpha = 0.01 none does (one clique A-D). Ranks are 1, 2, 3, 4."""
    rng = np.random.default_rng(0)
    base = rng.uniform(0.2, 0.3, size=(N, 1))
    offsets = np.array([3.0, 2.0, 1.0, 0.0]) * 0.1
    noise = rng.uniform(0.0, 0.05, size=(N, K))
    return pd.DataFrame(base + offsets + noise, columns=NAMES)


def _lines(fig) -> list[Line2D]:  # type: ignore[no-untyped-def]
    return list(fig.axes[0].get_lines())


def _axis_line(fig) -> Line2D:  # type: ignore[no-untyped-def]
    """The rank axis: the longest thin horizontal black line (clique bars are thick)."""
    cands = [ln for ln in _lines(fig) if mcolors.same_color(ln.get_color(), "black")
             and ln.get_linewidth() < 2 and len(ln.get_xdata()) == 2
             and ln.get_ydata()[0] == ln.get_ydata()[1]]
    return max(cands, key=lambda ln: abs(ln.get_xdata()[1] - ln.get_xdata()[0]))


def _xpos(fig, rank: float) -> float:  # type: ignore[no-untyped-def]
    """x of a rank on the drawn axis (rank 1 at its left end, rank K at its right end)."""
    x0, x1 = sorted(_axis_line(fig).get_xdata())
    return x0 + (rank - 1) / (K - 1) * (x1 - x0)


def _clique_bars(fig) -> list[Line2D]:  # type: ignore[no-untyped-def]
    return [ln for ln in _lines(fig) if ln.get_linewidth() == 3.5]


def _labels(fig) -> dict[str, matplotlib.text.Text]:  # type: ignore[no-untyped-def]
    pat = re.compile(r"^([A-D]) \(\d\.\d\d\)$")
    return {m.group(1): t for t in fig.axes[0].texts if (m := pat.match(t.get_text()))}


def _data_bbox(fig, artist):  # type: ignore[no-untyped-def]
    """An artist's rendered extent in data units (the axes fill the figure, y in inches)."""
    fig.canvas.draw()
    bb = artist.get_window_extent(fig.canvas.get_renderer())
    return bb.transformed(fig.axes[0].transData.inverted())


def _half_lw(fig, line: Line2D) -> float:  # type: ignore[no-untyped-def]
    """Half a line's thickness in data y units (points -> pixels -> data)."""
    ax = fig.axes[0]
    px = line.get_linewidth() / 72.0 * fig.dpi / 2
    return float(ax.transData.inverted().transform((0, px))[1]
                 - ax.transData.inverted().transform((0, 0))[1])


@pytest.fixture(scope="module")
def cd_fig_clique():  # type: ignore[no-untyped-def]
    import matplotlib.pyplot as plt

    fig = stats.cd_diagram(_ordered_scores(), alpha=0.01, title="t")
    yield fig
    plt.close(fig)


@pytest.fixture(scope="module")
def cd_fig_no_clique():  # type: ignore[no-untyped-def]
    import matplotlib.pyplot as plt

    fig = stats.cd_diagram(_ordered_scores(), alpha=0.05)
    yield fig
    plt.close(fig)


def test_cd_diagram_cliques_follow_the_alpha_passed(cd_fig_clique, cd_fig_no_clique):
    """At alpha = 0.01 no Holm-adjusted p (0.0117) is significant: one bar joins A..D; at
    0.05 all pairs differ and no bar is drawn. The bar starts at its first member's rank
    and ends at its last member's (a hair beyond each end, never at another member)."""
    assert _clique_bars(cd_fig_no_clique) == []
    bars = _clique_bars(cd_fig_clique)
    assert len(bars) == 1
    xs, ys = bars[0].get_xdata(), bars[0].get_ydata()
    assert ys[0] == ys[1]
    step = _xpos(cd_fig_clique, 2) - _xpos(cd_fig_clique, 1)
    assert _xpos(cd_fig_clique, 1) - 0.1 * step < xs[0] <= _xpos(cd_fig_clique, 1)
    assert _xpos(cd_fig_clique, K) <= xs[1] < _xpos(cd_fig_clique, K) + 0.1 * step
    assert "α = 0.01" in cd_fig_clique.axes[0].texts[0].get_text()


def test_cd_bar_spans_the_nemenyi_cd_above_the_rank_axis(cd_fig_clique):
    """The scale bar is a horizontal dimgray segment starting at rank 1 whose length, in
    rank units of the drawn axis, is nemenyi_cd(k, N, alpha) of this diagram (k = 4,
    N = 10, alpha = 0.01: 1.80), placed between the axis and the title."""
    cd = stats.nemenyi_cd(K, N, 0.01)
    assert 1.5 < cd < K - 1  # drawn only when shorter than the axis
    fig = cd_fig_clique
    cand = [ln for ln in _lines(fig) if mcolors.same_color(ln.get_color(), "dimgray")
            and ln.get_linewidth() == 1.2]
    assert len(cand) == 1
    xs, ys = cand[0].get_xdata(), cand[0].get_ydata()
    assert len(ys) == 2 and ys[0] == ys[1]  # horizontal
    axis = _axis_line(fig)
    assert ys[0] > axis.get_ydata()[0]
    assert xs[0] == pytest.approx(_xpos(fig, 1))
    step = _xpos(fig, 2) - _xpos(fig, 1)
    assert (xs[1] - xs[0]) / step == pytest.approx(cd, rel=1e-9)
    assert any(t.get_text() == f"Nemenyi CD = {cd:.2f}" for t in fig.axes[0].texts)


@pytest.mark.parametrize("which", ["cd_fig_clique", "cd_fig_no_clique"])
def test_cd_diagram_draws_everything_inside_the_figure(which, request):
    """The axes span the figure with y in [0, height]: every line point and text anchor
    lies inside, so nothing (axis, bars, bottom labels) is cut off the saved image."""
    fig = request.getfixturevalue(which)
    ax = fig.axes[0]
    lo, hi = ax.get_ylim()
    assert lo == 0 and hi == pytest.approx(fig.get_figheight())
    for ln in _lines(fig):
        assert np.all((np.asarray(ln.get_ydata()) >= lo) & (np.asarray(ln.get_ydata()) <= hi))
        assert np.all((np.asarray(ln.get_xdata()) >= 0) & (np.asarray(ln.get_xdata()) <= 1))
    for t in ax.texts:
        x, y = t.get_position()
        assert 0 <= x <= 1 and lo <= y <= hi, t.get_text()


def test_cd_labels_sit_below_the_axis_and_the_clique_bars(cd_fig_clique, cd_fig_no_clique):
    """Methods are labelled below the axis and below the clique bars: each label's rendered
    top edge is under the bottom edge of the axis line and of every bar."""
    for fig in (cd_fig_clique, cd_fig_no_clique):
        axis = _axis_line(fig)
        floor = axis.get_ydata()[0] - _half_lw(fig, axis)
        for bar in _clique_bars(fig):
            floor = min(floor, bar.get_ydata()[0] - _half_lw(fig, bar))
        labels = _labels(fig)
        assert sorted(labels) == NAMES
        for name, t in labels.items():
            assert _data_bbox(fig, t).y1 < floor, name


def test_cd_labels_point_away_from_the_axis(cd_fig_clique):
    """The best half is labelled in the left margin, right-aligned so the text ends where
    its leader line ends; the rest in the right margin, left-aligned from the leader's end.
    Neither reaches into the rank axis."""
    fig = cd_fig_clique
    x0, x1 = sorted(_axis_line(fig).get_xdata())
    leaders = [ln for ln in _lines(fig) if len(ln.get_xdata()) == 3]
    for name, t in _labels(fig).items():
        rank = NAMES.index(name) + 1
        y = t.get_position()[1]
        (lead,) = [ln for ln in leaders if ln.get_xdata()[0] == pytest.approx(_xpos(fig, rank))]
        assert lead.get_ydata()[-1] == pytest.approx(y)
        end = lead.get_xdata()[-1]
        bb = _data_bbox(fig, t)
        if rank <= (K + 1) // 2:
            assert t.get_horizontalalignment() == "right"
            assert bb.x1 <= end < x0
        else:
            assert t.get_horizontalalignment() == "left"
            assert x1 < end <= bb.x0


def test_incomplete_problems_are_dropped_with_the_reason():
    df = pd.DataFrame({"a": [0.9, 0.8, np.nan], "b": [0.5, 0.4, 0.3]})
    with pytest.warns(UserWarning) as rec:
        r = stats.average_ranks(df)
    assert [str(w.message) for w in rec] == [
        "dropped 1 of 3 problems with a missing score: rank tests need every method scored "
        "on every problem"]
    assert r.to_dict() == {"a": 1.0, "b": 2.0}


def test_cd_figure_skips_a_single_block_instead_of_crashing():
    """One complete problem is one block: no rank test, so no diagram (found while writing
    these tests: a report over AL runs of one dataset and query size crashed)."""
    one = pd.DataFrame({"a": [0.8], "b": [0.7]}, index=["p1"])
    assert render.cd_figure(one, "t") is None
    two = pd.DataFrame({"a": [0.8, 0.6], "b": [0.7, 0.5]}, index=["p1", "p2"])
    assert render.cd_figure(two, "t") is not None
