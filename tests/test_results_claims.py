"""The claim rules of the results pages (tracking/results/claims.py) on hand-made tables:
each rule says reproduced / not reproduced on a case computed by hand, and "not testable
at this scale" below its minimum n, with the numbers in its reason."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from scarcelab.tracking.results import claims as C


def _gains(rows: dict[str, dict[str, float]]) -> pd.DataFrame:
    g = pd.DataFrame(rows).T
    g["median_gain"] = g.median(axis=1)
    g["worst_gain"] = g.drop(columns="median_gain").min(axis=1)
    return g.rename_axis("method").reset_index()


def _lb(families: dict[str, str]) -> pd.DataFrame:
    return pd.DataFrame({"method": list(families), "family": list(families.values())})


FAM = {"sup": "supervised", "mixmatch": "semi", "fixmatch": "semi", "simclr": "self"}


def _data(**kw) -> C.SuiteData:  # type: ignore[no-untyped-def]
    return C.SuiteData(**kw)


def test_gain_everywhere():
    g = _gains({"mixmatch": {"a": 0.02, "b": 0.01}, "fixmatch": {"a": 0.03, "b": -0.01},
                "sup": {"a": 0.0, "b": 0.0}})
    d = _data(gains=g, leaderboard=_lb(FAM))
    assert C.evaluate({"kind": "gain_everywhere", "method": "mixmatch"}, d).status == \
        C.REPRODUCED
    v = C.evaluate({"kind": "gain_everywhere", "method": "fixmatch"}, d)
    assert v.status == C.NOT_REPRODUCED and "b -0.0100" in v.reason
    v = C.evaluate({"kind": "gain_everywhere", "method": "mixmatch", "min_datasets": 3}, d)
    assert v.status == C.UNTESTABLE and "2 dataset(s)" in v.reason
    assert C.evaluate({"kind": "gain_everywhere", "method": "comatch"}, d).status == \
        C.UNTESTABLE


def test_most_reliable_gain_is_the_highest_worst_case():
    # worst cases: mixmatch +0.01, fixmatch -0.01, simclr -0.05 -> mixmatch; sup is not a
    # candidate (labeled-only) although its worst case (0) is higher than fixmatch's
    g = _gains({"mixmatch": {"a": 0.02, "b": 0.01}, "fixmatch": {"a": 0.06, "b": -0.01},
                "simclr": {"a": 0.01, "b": -0.05}, "sup": {"a": 0.0, "b": 0.0}})
    d = _data(gains=g, leaderboard=_lb(FAM))
    v = C.evaluate({"kind": "most_reliable_gain", "method": "mixmatch"}, d)
    assert v.status == C.REPRODUCED and "rank 1 of 3" in v.reason
    v = C.evaluate({"kind": "most_reliable_gain", "method": "fixmatch"}, d)
    assert v.status == C.NOT_REPRODUCED and "rank 2 of 3" in v.reason
    assert "highest: mixmatch +0.0100" in v.reason
    one = _gains({"mixmatch": {"a": 0.02}, "fixmatch": {"a": 0.01}, "sup": {"a": 0.0}})
    assert C.evaluate({"kind": "most_reliable_gain", "method": "mixmatch"},
                      _data(gains=one, leaderboard=_lb(FAM))).status == C.UNTESTABLE


def test_family_beats_labeled_only_counts_datasets():
    g = _gains({"mixmatch": {"a": 0.02, "b": -0.01}, "fixmatch": {"a": -0.03, "b": -0.02},
                "sup": {"a": 0.0, "b": 0.0}})
    d = _data(gains=g, leaderboard=_lb(FAM))
    v = C.evaluate({"kind": "family_beats_labeled_only", "family": "semi"}, d)
    assert v.status == C.NOT_REPRODUCED and "(1 of 2 > 0)" in v.reason
    v = C.evaluate({"kind": "family_beats_labeled_only", "family": "semi", "at_least": 1}, d)
    assert v.status == C.REPRODUCED


def _al(rows: list[tuple[str, int, str, int, float]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["dataset", "query_size", "strategy", "repetition",
                                       "auc"])


def test_oracle_best_and_no_universal_winner():
    rows = []
    for ds, aucs in (("a", {"oracle": 0.9, "random": 0.7, "margin": 0.8}),
                     ("b", {"oracle": 0.9, "random": 0.85, "margin": 0.8})):
        rows += [(ds, 1, s, 0, v) for s, v in aucs.items()]
    d = _data(al=_al(rows))
    assert C.evaluate({"kind": "oracle_best"}, d).status == C.REPRODUCED
    v = C.evaluate({"kind": "no_universal_winner"}, d)
    assert v.status == C.REPRODUCED and "a q=1: margin, b q=1: random" in v.reason
    # margin best on both -> one winner; the oracle loses on b
    rows2 = [r if not (r[0] == "b" and r[2] == "margin") else (*r[:4], 0.95) for r in rows]
    d2 = _data(al=_al(rows2))
    assert C.evaluate({"kind": "no_universal_winner"}, d2).status == C.NOT_REPRODUCED
    v = C.evaluate({"kind": "oracle_best"}, d2)
    assert v.status == C.NOT_REPRODUCED and "b q=1: margin 0.9500" in v.reason
    assert C.evaluate({"kind": "oracle_best", "min_problems": 3}, d).status == C.UNTESTABLE


def test_few_runs_mislead_by_brute_force():
    # margin - random per repetition: +0.03, +0.02, +0.01, -0.01, -0.04, -0.05
    diff = [0.03, 0.02, 0.01, -0.01, -0.04, -0.05]
    rows = [("a", 1, "random", k, 0.7) for k in range(6)]
    rows += [("a", 1, "margin", k, 0.7 + d) for k, d in enumerate(diff)]
    d = _data(al=_al(rows))
    means = [np.mean(c) for c in itertools.combinations(diff, 3)]
    assert max(means) > 0 > min(means)  # the hand check the rule must agree with
    v = C.evaluate({"kind": "few_runs_mislead"}, d)
    assert v.status == C.REPRODUCED and "1 of 1" in v.reason
    steady = [("a", 1, "random", k, 0.7) for k in range(6)] + \
        [("a", 1, "margin", k, 0.71 + 0.001 * k) for k in range(6)]
    assert C.evaluate({"kind": "few_runs_mislead"}, _data(al=_al(steady))).status == \
        C.NOT_REPRODUCED
    assert C.evaluate({"kind": "few_runs_mislead", "min_repetitions": 7}, d).status == \
        C.UNTESTABLE


def test_accuracy_masking():
    base = {"method": "fixmatch", "dataset": "p", "source": "mnist", "kind": "far"}
    t = pd.DataFrame([
        {**base, "ratio": 0.0, "best_test_bacc": 0.80, "rel_cci_final": np.nan},
        {**base, "ratio": 0.6, "best_test_bacc": 0.79, "rel_cci_final": 0.9},
        {**base, "source": "breastmnist", "ratio": 0.0, "best_test_bacc": 0.80,
         "rel_cci_final": np.nan},
        {**base, "source": "breastmnist", "ratio": 0.6, "best_test_bacc": 0.70,
         "rel_cci_final": 0.9},
    ])
    for d in C.DIAGS[1:]:
        t[f"rel_{d}"] = np.nan
    v = C.evaluate({"kind": "accuracy_masking"}, _data(table_a1=t))
    # mnist: |-0.01| <= 0.02 and CCI +90 % -> masked; breastmnist: accuracy fell by 0.10
    assert v.status == C.REPRODUCED and "1 of 2 pairs masked" in v.reason
    v = C.evaluate({"kind": "accuracy_masking", "share": 0.75}, _data(table_a1=t))
    assert v.status == C.NOT_REPRODUCED
    v = C.evaluate({"kind": "accuracy_masking", "min_ratio": 0.7}, _data(table_a1=t))
    assert v.status == C.UNTESTABLE


def test_encoder_beats():
    t = pd.DataFrame({"encoder": ["@pretrain", "random"], "n_runs": [1, 1],
                      "x linear (all labels) accuracy": [0.7, 0.6],
                      "c seg/pq": [0.2, 0.25], "c seg/cross/n/pq": [0.3, 0.2]})
    d = _data(transfer=t)
    assert C.evaluate({"kind": "encoder_beats", "columns": ["linear (all labels) accuracy"]},
                      d).status == C.REPRODUCED
    v = C.evaluate({"kind": "encoder_beats", "columns": ["/pq"]}, d)
    assert v.status == C.NOT_REPRODUCED and "c seg/pq: 0.2000 vs 0.2500" in v.reason
    assert C.evaluate({"kind": "encoder_beats", "columns": ["finetune"]}, d).status == \
        C.UNTESTABLE


def _retrains(values: dict[str, list[float]]) -> pd.DataFrame:
    return pd.DataFrame([("d", m, "s", v) for m, vs in values.items() for v in vs],
                        columns=["dataset", "method", "study_id", "score"])


def test_baseline_competitive_and_best_or_tied_use_welch():
    from scipy import stats

    r = _retrains({"ce": [0.50, 0.51, 0.52], "a": [0.60, 0.61, 0.62],
                   "b": [0.58, 0.60, 0.62], "c": [0.40, 0.41, 0.42]})
    p_a = stats.ttest_ind([0.60, 0.61, 0.62], [0.50, 0.51, 0.52], equal_var=False).pvalue
    assert p_a < 0.05
    v = C.evaluate({"kind": "baseline_competitive", "max_better": 1}, _data(retrains=r))
    assert v.status == C.NOT_REPRODUCED and "2 of 3 significantly better" in v.reason
    assert C.evaluate({"kind": "baseline_competitive", "max_better": 2},
                      _data(retrains=r)).status == C.REPRODUCED
    v = C.evaluate({"kind": "best_or_tied", "method": "b", "dataset": "d"}, _data(retrains=r))
    p = stats.ttest_ind([0.58, 0.60, 0.62], [0.60, 0.61, 0.62], equal_var=False).pvalue
    assert v.status == C.REPRODUCED and f"{p:.3g}" in v.reason
    assert C.evaluate({"kind": "best_or_tied", "method": "c", "dataset": "d"},
                      _data(retrains=r)).status == C.NOT_REPRODUCED
    assert C.evaluate({"kind": "best_or_tied", "method": "c", "dataset": "d",
                       "min_runs": 4}, _data(retrains=r)).status == C.UNTESTABLE


def test_needs_is_never_testable_and_says_what_it_needs():
    v = C.evaluate({"kind": "needs", "needs": "untuned studies"}, _data())
    assert v.status == C.UNTESTABLE and "untuned studies" in v.reason


@pytest.mark.parametrize("kind", sorted(C.RULES))
def test_every_rule_is_untestable_on_an_empty_suite(kind):
    params = {"gain_everywhere": {"method": "m"}, "most_reliable_gain": {"method": "m"},
              "needs": {"needs": "x"}, "best_or_tied": {"method": "m", "dataset": "d"}
              }.get(kind, {})
    v = C.evaluate({"kind": kind, **params}, _data(retrains=_retrains({})))
    assert v.status == C.UNTESTABLE, (kind, v)
    assert C.describe({"kind": kind, **params})
