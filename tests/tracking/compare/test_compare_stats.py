"""The statistics of ``scarcelab compare`` against independent references: scipy's paired
t-test and t quantiles, statsmodels' Holm correction, a brute-force coverage simulation of
the t-interval, and the tie / gain rules on hand-made per-seed tables whose answers are
worked out here."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests

from scarcelab.tracking import stats
from scarcelab.tracking.compare.analysis import TEST, VAL, analyse


@pytest.mark.parametrize("n", [2, 3, 5, 12])
def test_paired_t_is_scipys_ttest_rel_and_t_interval(n: int) -> None:
    rng = np.random.default_rng(n)
    x, y = rng.normal(0.7, 0.05, n), rng.normal(0.68, 0.05, n)
    got = stats.paired_t(x, y, alpha=0.05)
    ref = sps.ttest_rel(x, y)
    assert got.n == n
    assert got.t == pytest.approx(float(ref.statistic), rel=1e-12)
    assert got.p == pytest.approx(float(ref.pvalue), rel=1e-10)
    d = x - y
    lo, hi = sps.t.interval(0.95, n - 1, loc=d.mean(), scale=sps.sem(d))
    assert (got.low, got.high) == (pytest.approx(lo, rel=1e-12), pytest.approx(hi, rel=1e-12))
    assert got.mean == pytest.approx(d.mean()) and got.sd == pytest.approx(d.std(ddof=1))
    got90 = stats.paired_t(x, y, alpha=0.10)  # alpha sets the interval's level
    lo90, hi90 = sps.t.interval(0.90, n - 1, loc=d.mean(), scale=sps.sem(d))
    assert (got90.low, got90.high) == (pytest.approx(lo90), pytest.approx(hi90))


def test_the_t_interval_covers_the_true_difference_95_percent_of_the_time() -> None:
    """Brute force: 4000 paired samples of 3 seeds with a known mean difference; the 95 %
    interval must contain it in 95 % of them (binomial sd 0.34 %: +-1.5 % is 4 sd)."""
    rng = np.random.default_rng(0)
    true = 0.02
    hits = 0
    trials = 4000
    for _ in range(trials):
        split = rng.normal(0.0, 0.08, 3)  # the split's effect, shared by both methods
        x = 0.70 + true + split + rng.normal(0, 0.02, 3)
        y = 0.70 + split + rng.normal(0, 0.02, 3)
        r = stats.paired_t(x, y)
        hits += r.low <= true <= r.high
    assert abs(hits / trials - 0.95) < 0.015


def test_paired_t_edge_cases() -> None:
    one = stats.paired_t([0.8], [0.7])
    assert one.n == 1 and one.mean == pytest.approx(0.1) and np.isnan(one.p) \
        and np.isnan(one.low)
    same = stats.paired_t([0.8, 0.7, 0.6], [0.8, 0.7, 0.6])
    assert (same.mean, same.t, same.p, same.low, same.high) == (0.0, 0.0, 1.0, 0.0, 0.0)
    const = stats.paired_t([0.9, 0.8, 0.7], [0.8, 0.7, 0.6])  # always +0.1: certain
    assert const.p == 0.0 and const.t == np.inf
    assert const.low == pytest.approx(0.1) and const.high == pytest.approx(0.1)
    nan = stats.paired_t([0.9, np.nan, 0.7, 0.75], [0.8, 0.7, np.nan, 0.70])
    assert nan.n == 2 and nan.mean == pytest.approx(0.075)  # pairs with a NaN dropped
    assert stats.paired_t([], []).n == 0


def test_holm_is_statsmodels_holm_and_leaves_nan_out() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        p = rng.uniform(0, 0.2, rng.integers(1, 8))
        assert np.allclose(stats.holm(p), multipletests(p, method="holm")[1])
    p = np.array([0.01, np.nan, 0.04, 0.03])
    got = stats.holm(p)
    ref = multipletests(p[~np.isnan(p)], method="holm")[1]
    assert np.isnan(got[1]) and np.allclose(got[[0, 2, 3]], ref)  # 3 hypotheses, not 4


# -- the tie and gain rules on hand-made tables -------------------------------------------

FAMILIES = {"sup": "supervised", "mixup": "supervised", "fixmatch": "semi",
            "simclr": "self"}
# test balanced accuracy per seed (rows) and method; validation scores below
TABLE = {
    "sup": [0.70, 0.72, 0.68, 0.71],
    "mixup": [0.71, 0.74, 0.70, 0.73],  # the best labeled-only (mean 0.72)
    "fixmatch": [0.78, 0.80, 0.77, 0.81],  # the best (mean 0.79)
    "simclr": [0.76, 0.81, 0.74, 0.80],  # noisy: near the best
}
VALS = {"fixmatch": [0.60, 0.90, 0.70, 0.65]}  # the winner's validation: seed 1 highest


def _per_seed(table: dict[str, list[float]], vals: dict[str, list[float]] | None = None,
              drop: tuple[tuple[str, int], ...] = ()) -> pd.DataFrame:
    rows = []
    for m, xs in table.items():
        for s, x in enumerate(xs):
            if (m, s) in drop:
                continue
            v = (vals or {}).get(m, [x - 0.01] * len(xs))[s]
            rows.append({"method": m, "seed": s, TEST: x, VAL: v, "run_id": f"{m}-{s}",
                         "wall_s": 60.0 + s, "cpu_s": 50.0, "wall_s_all": 60.0 + s,
                         "cpu_s_all": 50.0, "failed_attempts": 0})
    return pd.DataFrame(rows)


def test_best_tied_worse_and_gains_match_an_independent_computation() -> None:
    an = analyse(_per_seed(TABLE, VALS), FAMILIES, alpha=0.05)
    t = an.table.set_index("method")
    assert an.best == "fixmatch" and an.baseline == "mixup"
    assert list(an.table["method"]) == ["fixmatch", "simclr", "mixup", "sup"]
    # the tie test: paired t of the best against each other method, Holm over three
    best = np.array(TABLE["fixmatch"])
    raw = {m: sps.ttest_rel(best, np.array(TABLE[m])).pvalue
           for m in ("simclr", "mixup", "sup")}
    adj = dict(zip(raw, multipletests(list(raw.values()), method="holm")[1], strict=True))
    for m in raw:
        assert t.loc[m, "p_vs_best"] == pytest.approx(raw[m])
        assert t.loc[m, "p_vs_best_holm"] == pytest.approx(adj[m])
        assert t.loc[m, "verdict"] == ("tied" if adj[m] >= 0.05 else "worse")
    # worked out by hand: simclr's differences to fixmatch (.02 -.01 .03 .01) are not
    # significant; mixup's (.07 .06 .07 .08) and sup's are
    assert t.loc["simclr", "verdict"] == "tied"
    assert t.loc["mixup", "verdict"] == t.loc["sup", "verdict"] == "worse"
    # the gain over mixup, paired, with its 95 % t-interval
    for m in TABLE:
        d = np.array(TABLE[m]) - np.array(TABLE["mixup"])
        lo, hi = sps.t.interval(0.95, 3, loc=d.mean(), scale=sps.sem(d)) \
            if d.std() > 1e-12 else (d.mean(), d.mean())  # mixup against itself
        assert t.loc[m, "gain"] == pytest.approx(d.mean())
        assert (t.loc[m, "gain_low"], t.loc[m, "gain_high"]) == (pytest.approx(lo),
                                                                 pytest.approx(hi))
        assert t.loc[m, "wins"] == f"{int((d > 0).sum())}/4"
    assert t.loc["fixmatch", "gain"] == pytest.approx(0.07)
    assert t.loc["fixmatch", f"{TEST}_mean"] == pytest.approx(0.79)
    assert t.loc["fixmatch", f"{TEST}_std"] == pytest.approx(np.std(TABLE["fixmatch"], ddof=1))
    # the model to deploy is chosen on validation, not on test (seed 3 has the best test)
    assert (an.winner_run, an.winner_seed) == ("fixmatch-1", 1)
    assert t.loc["fixmatch", "wall_s_total"] == pytest.approx(60 + 61 + 62 + 63)


def test_a_seed_a_method_missed_is_left_out_and_a_method_without_studies_is_failed() -> None:
    fams = {**FAMILIES, "byol": "self"}
    an = analyse(_per_seed(TABLE, drop=(("simclr", 2),)), fams)
    assert an.seeds_used == [0, 1, 3] and an.seeds_dropped == [2]
    assert an.failed_methods == ["byol"]
    t = an.table.set_index("method")
    assert t.loc["byol", "verdict"] == "failed" and t.loc["byol", "n_seeds"] == 0
    assert an.table["method"].iloc[-1] == "byol"  # failed methods come last
    # every statistic is over the complete seeds only
    keep = [0, 1, 3]
    d = np.array(TABLE["fixmatch"])[keep] - np.array(TABLE["simclr"])[keep]
    assert t.loc["simclr", "p_vs_best"] == pytest.approx(sps.ttest_1samp(d, 0).pvalue)
    assert t.loc["sup", f"{TEST}_mean"] == pytest.approx(np.mean(np.array(TABLE["sup"])[keep]))


def test_equal_means_rank_by_validation_and_one_seed_tests_nothing() -> None:
    table = {"sup": [0.7, 0.8], "fixmatch": [0.8, 0.7]}
    an = analyse(_per_seed(table, {"sup": [0.5, 0.5], "fixmatch": [0.6, 0.6]}),
                 {"sup": "supervised", "fixmatch": "semi"})
    assert an.best == "fixmatch"  # same mean test score, higher validation
    one = analyse(_per_seed({"sup": [0.7], "fixmatch": [0.8]}),
                  {"sup": "supervised", "fixmatch": "semi"})
    t = one.table.set_index("method")
    assert one.best == "fixmatch" and t.loc["sup", "verdict"] == "untested"
    assert np.isnan(t.loc["fixmatch", "gain_low"]) and one.notes


def test_a_labeled_only_winner_has_zero_gain_and_nothing_finished_is_said() -> None:
    table = {"sup": [0.8, 0.82, 0.81], "fixmatch": [0.7, 0.72, 0.69]}
    an = analyse(_per_seed(table), {"sup": "supervised", "fixmatch": "semi"})
    t = an.table.set_index("method")
    assert an.best == an.baseline == "sup" and t.loc["sup", "gain"] == 0.0
    assert t.loc["fixmatch", "gain"] == pytest.approx(-0.1067, abs=1e-4)
    empty = analyse(_per_seed({}).reindex(columns=["method", "seed", TEST, VAL, "run_id"]),
                    {"sup": "supervised", "fixmatch": "semi"})
    assert empty.best is None and set(empty.table["verdict"]) == {"failed"}


def test_no_common_seed_compares_nothing_but_lists_every_method() -> None:
    ps = _per_seed({"sup": [0.7, 0.8], "fixmatch": [0.9, 0.6]}, drop=(("sup", 1),
                                                                     ("fixmatch", 0)))
    an = analyse(ps, {"sup": "supervised", "fixmatch": "semi"})
    assert an.best is None and an.seeds_used == [] and an.seeds_dropped == [0, 1]
    t = an.table.set_index("method")
    assert set(t["verdict"]) == {"untested"} and t.loc["fixmatch", f"{TEST}_mean"] == 0.6
    assert "no seed has a finished study of every method" in an.notes[0]


def test_the_report_page_renders_every_case() -> None:
    """The markdown page for an answer, for a labeled-only winner and for no answer (no
    seed common to the methods): no crash, the headline rows, the answer's lines."""
    from scarcelab.tracking.compare import grid as G
    from scarcelab.tracking.compare import report as R

    class Spec:
        experiment, name = "exp", "compare-x"

    fams = {"sup": "supervised", "fixmatch": "semi"}
    g = G.build_grid("synthetic_tiny", list(fams), [0, 1, 2], {})
    plan = G.plan_budget(6, 2, None, 2.0)
    cases = {"answer": ({"sup": [0.7, 0.72, 0.69], "fixmatch": [0.8, 0.85, 0.79]}, ()),
             "labeled-only wins": ({"sup": [0.9, 0.92, 0.89], "fixmatch": [0.8, 0.85, 0.79]},
                                   ()),
             "none": ({"sup": [0.7, 0.72, 0.69], "fixmatch": [0.8, 0.85, 0.79]},
                      (("sup", 1), ("sup", 2), ("fixmatch", 0)))}
    for case, (table, drop) in cases.items():
        ps = _per_seed(table, drop=drop).assign(status="FINISHED", split_hash="h",
                                                budget_minutes=2.0, error="")
        an = analyse(ps, fams)
        md = R.markdown(an, R.Collected(ps, uri="sqlite:///x.db"), g, plan, Spec, "cmd", "now")
        head = md.split("## Headline table")[1].split("## Per seed")[0]
        assert head.count("| `") + head.count("| **`") == 2, (case, head)
        if case == "answer":
            assert "**Best: `fixmatch`**" in md and "**Winning model:** `runs:/fixmatch-" in md
            assert "the best semi/self method, `fixmatch`, +0.110" in md
        elif case == "labeled-only wins":
            assert "No method beat `sup` on average." in md
        else:
            assert "**No answer:** no seed has a finished study of every method" in md
