"""The Table-3 view: Welch's t-test against a hand computation (one-sided against the best,
as "not significantly worse than the best"; two-sided on request), bold/italic marking,
the average column, one study per cell (the ICCV paper: 10 runs on one split) and a
stand-in test set as its own, labelled column."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from scarcelab.tracking.query.table3 import render_table3, table3


def _scores() -> pd.DataFrame:
    rows = []
    data = {("ce", "cifair10"): [0.50, 0.52, 0.54], ("ole", "cifair10"): [0.49, 0.53, 0.51],
            ("gradl2", "cifair10"): [0.30, 0.31, 0.32],
            ("ce", "eurosat"): [0.80, 0.81, 0.82], ("ole", "eurosat"): [0.90, 0.91, 0.92],
            ("gradl2", "eurosat"): [0.85, 0.86, 0.87]}
    for (m, d), v in data.items():
        rows += [{"method": m, "dataset": d, "study_id": "s", "score": s} for s in v]
    rows.append({"method": "tvmf", "dataset": "cifair10", "study_id": "s", "score": 0.4})
    return pd.DataFrame(rows)


def _welch_p(a, b, one_sided=True):
    """Welch–Satterthwaite by hand; one-sided: P(T <= t) for H1 mean(a) < mean(b)."""
    a, b = np.asarray(a), np.asarray(b)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    t = (a.mean() - b.mean()) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    from scipy.special import stdtr  # Student-t CDF, independent of ttest_ind
    return stdtr(df, t) if one_sided else 2 * stdtr(df, -abs(t))


def test_welch_against_hand_formula_and_marks():
    long = table3(_scores())
    row = long[(long.method == "ole") & (long.dataset == "cifair10")].iloc[0]
    assert row.p_value == pytest.approx(_welch_p([0.49, 0.53, 0.51], [0.50, 0.52, 0.54]))
    two = table3(_scores(), alternative="two-sided")
    row2 = two[(two.method == "ole") & (two.dataset == "cifair10")].iloc[0]
    assert row2.p_value == pytest.approx(_welch_p([0.49, 0.53, 0.51], [0.50, 0.52, 0.54],
                                                  one_sided=False))
    assert row2.p_value == pytest.approx(2 * row.p_value)  # the method's mean is below
    best = long[long.best].set_index("dataset")["method"].to_dict()
    assert best == {"cifair10": "ce", "eurosat": "ole"}
    tied = set(long[long.tied_with_best & ~long.best].method + "/" +
               long[long.tied_with_best & ~long.best].dataset)
    assert "ole/cifair10" in tied and "gradl2/cifair10" not in tied
    one = long[(long.method == "tvmf")].iloc[0]
    assert np.isnan(one.p_value) and not one.tied_with_best  # one run: no test
    md = render_table3(long)
    assert "| ce | **52.00 ± 2.00** |" in md
    assert "*51.00 ± 2.00*" in md and "**91.00 ± 1.00**" in md
    gradl2 = next(line for line in md.splitlines() if line.startswith("| gradl2"))
    assert gradl2.rstrip().endswith(f"| {100 * (0.31 + 0.86) / 2:.2f} |")
    tvmf = next(line for line in md.splitlines() if line.startswith("| tvmf"))
    assert tvmf.rstrip().endswith("|  |")  # no average without every dataset


def test_one_sided_test_marks_fewer_ties_and_the_note_says_which():
    """p between α and 2α: tied under the two-sided test, significantly worse one-sided."""
    rng = np.random.default_rng(0)
    best = 0.60 + 0.01 * rng.standard_normal(10)
    # a shifted copy: Welch's t = -shift / sqrt(2 var / 10) = -1.9 with 18 degrees of
    # freedom, one-sided p ≈ 0.037, two-sided ≈ 0.074
    other = best - 1.9 * math.sqrt(2 * best.var(ddof=1) / 10)
    rows = [{"method": "ce", "dataset": "d", "study_id": "a", "score": v} for v in best]
    rows += [{"method": "ole", "dataset": "d", "study_id": "b", "score": v} for v in other]
    sc = pd.DataFrame(rows)
    one, two = table3(sc), table3(sc, alternative="two-sided")
    p1 = one[one.method == "ole"].p_value.iloc[0]
    p2 = two[two.method == "ole"].p_value.iloc[0]
    assert p1 == pytest.approx(_welch_p(other, best)) and 0.025 < p1 < 0.05 < p2
    assert not one[one.method == "ole"].tied_with_best.iloc[0]
    assert two[two.method == "ole"].tied_with_best.iloc[0]
    assert "one-sided, H1: the method's mean is below the best's" in render_table3(one)
    assert "(Welch's t-test over the retrains, two-sided" in render_table3(two)
    with pytest.raises(ValueError, match="alternative"):
        table3(sc, alternative="greater")


def test_a_cell_holds_one_study_unless_pooling_is_asked_for():
    """Two ce studies on one dataset (10 and 3 retrains): the cell is the 10-run study,
    n = 10, as the ICCV paper's 10 runs on one split; pool='studies' gives n = 13."""
    rows = [{"method": "ce", "dataset": "d", "study_id": "s10", "start_time": 1, "score": v}
            for v in np.linspace(0.50, 0.59, 10)]
    rows += [{"method": "ce", "dataset": "d", "study_id": "s3", "start_time": 2, "score": v}
             for v in (0.90, 0.91, 0.92)]
    sc = pd.DataFrame(rows)
    one = table3(sc).iloc[0]
    assert (one.n, one.n_studies, one.study_id) == (10, 2, "s10")
    assert one["mean"] == pytest.approx(0.545)
    pooled = table3(sc, pool="studies").iloc[0]
    assert (pooled.n, pooled.n_studies, pooled.study_id) == (13, 2, "")
    assert "several studies (2 at most): the one with the most retrains kept" in \
        render_table3(table3(sc))
    # equal sizes: the latest study
    eq = sc[sc.study_id == "s3"].assign(study_id="s3b", start_time=3)
    assert table3(pd.concat([sc[sc.study_id == "s3"], eq])).iloc[0].study_id == "s3b"


def test_a_stand_in_test_set_is_its_own_labelled_column():
    rows = [{"method": "ce", "dataset": "cifair10", "study_id": "a", "score": v,
             "test_set": "CIFAR-10"} for v in (0.5, 0.6)]
    rows += [{"method": "ce", "dataset": "cifair10", "study_id": "b", "score": v,
              "test_set": "ciFAIR-10"} for v in (0.4, 0.45)]
    rows += [{"method": "ce", "dataset": "cub", "study_id": "c", "score": 0.7,
              "test_set": "official"}]
    long = table3(pd.DataFrame(rows))
    assert sorted(long.column) == ["cifair10 (CIFAR-10 test set)",
                                   "cifair10 (ciFAIR-10 test set)", "cub"]
    head = render_table3(long).splitlines()[0]
    assert head == ("| Method | cifair10 (CIFAR-10 test set) | cifair10 (ciFAIR-10 test set) "
                    "| cub | Avg. |")
