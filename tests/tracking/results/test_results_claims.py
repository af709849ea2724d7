"""The claim rules of the results pages (tracking/results/claims.py) on hand-made tables:
each rule says reproduced / not reproduced on a case computed by hand, and "not testable
at this scale" below its minimum n, with the numbers in its reason."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests

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


def _studies(rows: dict[str, dict[str, list[float]]], fam: dict[str, str] = FAM
             ) -> pd.DataFrame:
    """dataset -> method -> its score per seed 0, 1, ... (seeds shared across methods)."""
    return pd.DataFrame([(ds, m, fam[m], k, v) for ds, ms in rows.items()
                         for m, vs in ms.items() for k, v in enumerate(vs)],
                        columns=["dataset", "method", "family", "seed", "score"])


SUP_A, SUP_B = [0.70, 0.71, 0.72, 0.73], [0.60, 0.62, 0.61, 0.63]


def _plus(base: list[float], d: list[float]) -> list[float]:
    return [round(x + y, 6) for x, y in zip(base, d, strict=True)]


def test_gain_everywhere_needs_a_significant_paired_gain_on_every_dataset():
    mm_a, mm_b = _plus(SUP_A, [0.02, 0.03, 0.025, 0.02]), _plus(SUP_B, [0.01, 0.012, 0.011, 0.013])
    fm_b = _plus(SUP_B, [0.03, -0.02, 0.01, -0.01])  # mean +0.0025 > 0, far from significant
    st = _studies({"a": {"sup": SUP_A, "mixmatch": mm_a, "fixmatch": _plus(SUP_A, [0.05] * 4)},
                   "b": {"sup": SUP_B, "mixmatch": mm_b, "fixmatch": fm_b}})
    d = _data(studies=st)
    p = [sps.ttest_rel(mm_a, SUP_A).pvalue, sps.ttest_rel(mm_b, SUP_B).pvalue]
    adj = multipletests(p, method="holm")[1]
    v = C.evaluate({"kind": "gain_everywhere", "method": "mixmatch"}, d)
    assert v.status == C.REPRODUCED, v
    assert "paired t over 4 shared seeds" in v.reason and f"Holm {adj[1]:.3g}" in v.reason
    # the old rule (mean gain > 0 everywhere) said reproduced for fixmatch
    v = C.evaluate({"kind": "gain_everywhere", "method": "fixmatch"}, d)
    assert v.status == C.NOT_REPRODUCED and "1 of 2 significant" in v.reason
    v = C.evaluate({"kind": "gain_everywhere", "method": "mixmatch", "min_datasets": 3}, d)
    assert v.status == C.UNTESTABLE and "2 dataset(s)" in v.reason
    assert C.evaluate({"kind": "gain_everywhere", "method": "comatch"}, d).status == \
        C.UNTESTABLE
    # a gains table alone (means) cannot be tested
    g = pd.DataFrame({"method": ["mixmatch"], "a": [0.02], "b": [0.01]})
    v = C.evaluate({"kind": "gain_everywhere", "method": "mixmatch"}, _data(gains=g))
    assert v.status == C.UNTESTABLE and "no per-seed" in v.reason


def test_most_reliable_gain_is_best_or_tied_on_its_worst_dataset():
    # worst cases (means): mixmatch +0.0115 (b), fixmatch +0.0125 (b), simclr -0.05
    mm_b = _plus(SUP_B, [0.01, 0.012, 0.011, 0.013])
    fm_b = _plus(SUP_B, [0.02, 0.005, 0.015, 0.010])
    rows = {"a": {"sup": SUP_A, "mixmatch": _plus(SUP_A, [0.02] * 4),
                  "fixmatch": _plus(SUP_A, [0.06, 0.05, 0.07, 0.06]),
                  "simclr": _plus(SUP_A, [0.01] * 4)},
            "b": {"sup": SUP_B, "mixmatch": mm_b, "fixmatch": fm_b,
                  "simclr": _plus(SUP_B, [-0.05] * 4)}}
    d = _data(studies=_studies(rows))
    v = C.evaluate({"kind": "most_reliable_gain", "method": "mixmatch"}, d)
    p = sps.ttest_rel(fm_b, mm_b).pvalue
    assert p > 0.05  # fixmatch's higher worst case is not significantly above on b
    assert v.status == C.REPRODUCED and "rank 2 of 3" in v.reason and "(tied)" in v.reason
    assert f"p = {p:.3g}" in v.reason
    # fixmatch clearly above mixmatch on b: not reproduced
    rows["b"]["fixmatch"] = _plus(SUP_B, [0.04, 0.041, 0.042, 0.043])
    v = C.evaluate({"kind": "most_reliable_gain", "method": "mixmatch"},
                   _data(studies=_studies(rows)))
    assert v.status == C.NOT_REPRODUCED and "fixmatch significantly above" in v.reason
    v = C.evaluate({"kind": "most_reliable_gain", "method": "fixmatch"},
                   _data(studies=_studies(rows)))
    assert v.status == C.REPRODUCED and "rank 1 of 3" in v.reason
    one = _studies({"a": {"sup": SUP_A, "mixmatch": SUP_A, "fixmatch": SUP_A}})
    assert C.evaluate({"kind": "most_reliable_gain", "method": "mixmatch"},
                      _data(studies=one)).status == C.UNTESTABLE


def test_family_beats_labeled_only_counts_significant_datasets():
    rows = {"a": {"sup": SUP_A, "mixmatch": _plus(SUP_A, [0.02, 0.03, 0.025, 0.02]),
                  "fixmatch": _plus(SUP_A, [-0.03] * 4)},
            "b": {"sup": SUP_B, "mixmatch": _plus(SUP_B, [0.03, -0.02, 0.01, -0.01]),
                  "fixmatch": _plus(SUP_B, [-0.02] * 4)}}
    d = _data(studies=_studies(rows))
    v = C.evaluate({"kind": "family_beats_labeled_only", "family": "semi"}, d)
    assert v.status == C.NOT_REPRODUCED and "(1 of 2 significantly above)" in v.reason
    v = C.evaluate({"kind": "family_beats_labeled_only", "family": "semi", "at_least": 1}, d)
    assert v.status == C.REPRODUCED


def _al(rows: list[tuple[str, int, str, int, float]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["dataset", "query_size", "strategy", "repetition",
                                       "auc"])


def _al_reps(table: dict[str, dict[str, list[float]]], q: int = 1) -> pd.DataFrame:
    return _al([(ds, q, s, k, v) for ds, ss in table.items() for s, vs in ss.items()
                for k, v in enumerate(vs)])


def test_oracle_best_needs_a_strategy_significantly_above_it_to_fail():
    # issue 41: the oracle lost on a higher mean with no significance behind it
    oracle = [0.92, 0.905, 0.93, 0.91, 0.93]
    t = {"a": {"oracle": oracle, "margin": [x + 0.004 for x in oracle[::-1]],
               "random": [0.80, 0.81, 0.82, 0.80, 0.81]},
         "b": {"oracle": [0.90] * 5, "margin": [0.85, 0.86, 0.84, 0.85, 0.86],
               "random": [0.80] * 5}}
    # margin on a: a higher mean, its order reversed so that the pairs do not agree
    assert np.mean(t["a"]["margin"]) > np.mean(oracle)
    p = sps.ttest_rel(t["a"]["margin"], oracle).pvalue
    assert p > 0.05
    v = C.evaluate({"kind": "oracle_best"}, _data(al=_al_reps(t)))
    assert v.status == C.REPRODUCED and f"p = {p:.3g}" in v.reason
    t["a"]["margin"] = [x + 0.02 for x in oracle]  # significantly above (constant +0.02)
    v = C.evaluate({"kind": "oracle_best"}, _data(al=_al_reps(t)))
    assert v.status == C.NOT_REPRODUCED and "a q=1: margin" in v.reason
    assert C.evaluate({"kind": "oracle_best", "min_problems": 3},
                      _data(al=_al_reps(t))).status == C.UNTESTABLE


def test_no_universal_winner_uses_best_or_tied_sets():
    # the old rule: random has the top mean on b, margin on a -> "no universal winner";
    # but margin is tied with random on b (not significantly below): margin is best or
    # tied everywhere, so the claim is not reproduced
    t = {"a": {"margin": [0.90, 0.91, 0.92, 0.90, 0.91], "random": [0.80, 0.81, 0.80, 0.82, 0.81]},
         "b": {"margin": [0.85, 0.87, 0.84, 0.86, 0.85], "random": [0.86, 0.85, 0.86, 0.86, 0.85]}}
    v = C.evaluate({"kind": "no_universal_winner"}, _data(al=_al_reps(t)))
    assert sps.ttest_rel(t["b"]["random"], t["b"]["margin"]).pvalue > 0.05
    assert v.status == C.NOT_REPRODUCED and "margin best or tied on all 2" in v.reason
    t["b"]["random"] = [x + 0.05 for x in t["b"]["margin"]]
    v = C.evaluate({"kind": "no_universal_winner"}, _data(al=_al_reps(t)))
    assert v.status == C.REPRODUCED and "b q=1: {random}" in v.reason


def test_few_runs_mislead_needs_significance_both_ways_by_brute_force():
    def brute(diff: list[float]) -> bool:
        up = down = False
        for c in itertools.combinations(diff, 3):
            r = sps.ttest_1samp(c, 0.0)
            up |= bool(np.mean(c) > 0 and r.pvalue < 0.05)
            down |= bool(np.mean(c) < 0 and r.pvalue < 0.05)
        return up and down

    for diff in ([0.03, 0.02, 0.01, -0.01, -0.04, -0.05],
                 [0.050, 0.051, 0.052, -0.050, -0.051, -0.052, 0.0]):
        rows = [("a", 1, "random", k, 0.7) for k in range(len(diff))]
        rows += [("a", 1, "margin", k, 0.7 + d) for k, d in enumerate(diff)]
        v = C.evaluate({"kind": "few_runs_mislead"}, _data(al=_al(rows)))
        assert v.status == (C.REPRODUCED if brute(diff) else C.NOT_REPRODUCED), (diff, v)
    # the first: 3-run means of both signs (the old sign-only rule's "reproduced") but no
    # 3-run subset significantly below 0; the second: significant both ways
    assert not brute([0.03, 0.02, 0.01, -0.01, -0.04, -0.05])
    assert brute([0.050, 0.051, 0.052, -0.050, -0.051, -0.052, 0.0])
    rows = [("a", 1, "random", k, 0.7) for k in range(6)]
    assert C.evaluate({"kind": "few_runs_mislead", "min_repetitions": 7},
                      _data(al=_al(rows + [("a", 1, "margin", k, 0.71) for k in range(6)]))
                      ).status == C.UNTESTABLE


def test_accuracy_masking():
    base = {"method": "fixmatch", "dataset": "p", "source": "mnist", "kind": "far"}
    rows = []
    for seed, (a0, a6, b6) in enumerate([(0.80, 0.79, 0.70), (0.81, 0.805, 0.71),
                                         (0.82, 0.815, 0.69)]):
        for src, acc in (("mnist", a6), ("breastmnist", b6)):
            rows += [{**base, "source": src, "seed": seed, "ratio": 0.0,
                      "best_test_bacc": a0, "rel_cci_final": np.nan},
                     {**base, "source": src, "seed": seed, "ratio": 0.6,
                      "best_test_bacc": acc, "rel_cci_final": 0.9}]
    t = pd.DataFrame(rows)
    for d in C.DIAGS[1:]:
        t[f"rel_{d}"] = np.nan
    v = C.evaluate({"kind": "accuracy_masking"}, _data(table_a1=t))
    # mnist: -0.01/-0.005/-0.005, interval inside ±0.03 and CCI +90 % -> masked;
    # breastmnist: accuracy fell by ~0.11, interval wholly below -0.03 -> not masked
    assert v.status == C.REPRODUCED, v
    assert "1 of 2 pairs masked, 1 not masked, 0 undecided" in v.reason
    v = C.evaluate({"kind": "accuracy_masking", "share": 0.75}, _data(table_a1=t))
    assert v.status == C.NOT_REPRODUCED
    v = C.evaluate({"kind": "accuracy_masking", "min_ratio": 0.7}, _data(table_a1=t))
    assert v.status == C.UNTESTABLE
    # a diagnostic that did not move decides "not masked" whatever the accuracy did
    v = C.evaluate({"kind": "accuracy_masking", "diag_change": 0.95}, _data(table_a1=t))
    assert v.status == C.NOT_REPRODUCED and "0 of 2 pairs masked, 2 not masked" in v.reason


def test_accuracy_masking_is_untestable_when_the_intervals_cross_the_margin():
    """One seed, or seeds too few for the spread, decide nothing: the verdict is "not
    testable at this scale" with the seeds the observed spread would need (the old rule
    called one run's difference flat and the pair masked)."""
    base = {"method": "fixmatch", "dataset": "p", "source": "mnist", "kind": "far",
            "rel_cci_final": 0.9}
    one = pd.DataFrame([{**base, "seed": 0, "ratio": 0.0, "best_test_bacc": 0.80},
                        {**base, "seed": 0, "ratio": 0.5, "best_test_bacc": 0.795}])
    for d in C.DIAGS[1:]:
        one[f"rel_{d}"] = np.nan
    v = C.evaluate({"kind": "accuracy_masking"}, _data(table_a1=one))
    assert v.status == C.UNTESTABLE and "(n = 1/1, untested)" in v.reason, v
    # three seeds with differences -0.04, +0.02, 0.0: the interval crosses -0.03
    wide = pd.DataFrame([{**base, "seed": s, "ratio": r, "best_test_bacc": a}
                         for s, (a0, a5) in enumerate([(0.80, 0.76), (0.78, 0.80),
                                                       (0.82, 0.82)])
                         for r, a in ((0.0, a0), (0.5, a5))])
    for d in C.DIAGS[1:]:
        wide[f"rel_{d}"] = np.nan
    v = C.evaluate({"kind": "accuracy_masking"}, _data(table_a1=wide))
    assert v.status == C.UNTESTABLE and "0 not masked, 1 undecided" in v.reason, v
    d = np.array([-0.04, 0.02, 0.0])
    need = next(n for n in range(2, 1000) if abs(d.mean()) + sps.t.ppf(0.95, n - 1)
                * d.std(ddof=1) / np.sqrt(n) < 0.03)
    assert f"fixmatch/mnist: ~{need} seeds" in v.reason


def test_encoder_beats_pairs_the_encoders_over_shared_seeds():
    t = pd.DataFrame({"encoder": ["@pretrain", "random"], "n_runs": [3, 3],
                      "x linear (all labels) accuracy": [0.7, 0.6],
                      "c seg/pq": [0.2, 0.25]})
    pre, rnd = [0.70, 0.72, 0.69], [0.60, 0.61, 0.60]
    pq_pre, pq_rnd = [0.20, 0.21, 0.19], [0.25, 0.26, 0.24]
    runs = pd.DataFrame(
        [("@pretrain", "x linear (all labels) accuracy", k, v) for k, v in enumerate(pre)]
        + [("random", "x linear (all labels) accuracy", k, v) for k, v in enumerate(rnd)]
        + [("@pretrain", "c seg/pq", k, v) for k, v in enumerate(pq_pre)]
        + [("random", "c seg/pq", k, v) for k, v in enumerate(pq_rnd)],
        columns=["encoder", "column", "seed", "value"])
    d = _data(transfer=t, transfer_runs=runs)
    v = C.evaluate({"kind": "encoder_beats", "columns": ["linear (all labels) accuracy"]}, d)
    p = sps.ttest_rel(pre, rnd).pvalue
    assert v.status == C.REPRODUCED and "paired t over 3 shared seeds" in v.reason
    assert f"p = {p:.3g}" in v.reason
    v = C.evaluate({"kind": "encoder_beats", "columns": ["/pq"]}, d)
    assert v.status == C.NOT_REPRODUCED and "c seg/pq: -0.0500" in v.reason
    # the old rule decided on the means of n = 1 cells; without per-seed values: no test
    v = C.evaluate({"kind": "encoder_beats", "columns": ["linear (all labels) accuracy"]},
                   _data(transfer=t))
    assert v.status == C.UNTESTABLE and "means only" in v.reason
    assert C.evaluate({"kind": "encoder_beats", "columns": ["finetune"]}, d).status == \
        C.UNTESTABLE


def _retrains(values: dict[str, list[float]]) -> pd.DataFrame:
    return pd.DataFrame([("d", m, "s", v) for m, vs in values.items() for v in vs],
                        columns=["dataset", "method", "study_id", "score"])


def test_baseline_competitive_and_best_or_tied_use_welch_with_holm():
    vals = {"ce": [0.50, 0.51, 0.52], "a": [0.60, 0.61, 0.62], "b": [0.58, 0.60, 0.62],
            "c": [0.40, 0.41, 0.42], "e": [0.49, 0.53, 0.56]}
    r = _retrains(vals)
    raw = [sps.ttest_ind(vals[m], vals["ce"], equal_var=False).pvalue for m in "abce"]
    adj = dict(zip("abce", multipletests(raw, method="holm")[1], strict=True))
    better = sorted(m for m in "abce" if np.mean(vals[m]) > 0.51 and adj[m] < 0.05)
    assert better == ["a", "b"] and raw[3] > 0.05  # e: higher mean, not significant
    v = C.evaluate({"kind": "baseline_competitive", "max_better": 1}, _data(retrains=r))
    assert v.status == C.NOT_REPRODUCED and "2 of 4 significantly above ce (a, b)" in v.reason
    assert "not significant: e" in v.reason
    assert C.evaluate({"kind": "baseline_competitive", "max_better": 2},
                      _data(retrains=r)).status == C.REPRODUCED
    # best or tied: a is best; b's Welch p against a, Holm over the 4 others
    raw = {m: sps.ttest_ind(vals["a"], vals[m], equal_var=False).pvalue
           for m in ("b", "c", "ce", "e")}
    adj = dict(zip(raw, multipletests(list(raw.values()), method="holm")[1], strict=True))
    v = C.evaluate({"kind": "best_or_tied", "method": "b", "dataset": "d"}, _data(retrains=r))
    assert v.status == C.REPRODUCED and f"Holm {adj['b']:.3g}" in v.reason
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


def test_accuracy_masking_tests_flatness_with_tost_when_seeds_allow():
    base = {"method": "fixmatch", "dataset": "p", "source": "mnist", "kind": "far"}
    rows = []
    for seed, (a0, a5) in enumerate([(0.80, 0.79), (0.82, 0.80), (0.81, 0.81)]):
        rows += [{**base, "seed": seed, "ratio": 0.0, "best_test_bacc": a0},
                 {**base, "seed": seed, "ratio": 0.5, "best_test_bacc": a5,
                  "rel_cci_final": 0.9}]
    t = pd.DataFrame(rows)
    for d in C.DIAGS[1:]:
        t[f"rel_{d}"] = np.nan
    x, y = np.array([0.79, 0.80, 0.81]), np.array([0.80, 0.82, 0.81])
    # the seeds are shared: paired t on the differences (scipy's ttest_rel interval)
    d = x - y
    ci = sps.ttest_rel(x, y).confidence_interval(confidence_level=0.90)
    assert ci.low == pytest.approx(d.mean() - sps.t.ppf(0.95, 2) * d.std(ddof=1) / np.sqrt(3))
    v = C.evaluate({"kind": "accuracy_masking", "acc_tol": 0.03}, _data(table_a1=t))
    assert (v.status == C.REPRODUCED) == (-0.03 < ci.low and ci.high < 0.03), v
    assert f"paired TOST over 3 seeds, 90% interval [{ci.low:+.4f}, {ci.high:+.4f}]" in v.reason
    # without seeds (or with < 2 shared) the arms are independent: Welch
    v1, v2 = x.var(ddof=1) / 3, y.var(ddof=1) / 3
    df = (v1 + v2) ** 2 / (v1 ** 2 / 2 + v2 ** 2 / 2)
    half = sps.t.ppf(0.95, df) * np.sqrt(v1 + v2)
    lo, hi = x.mean() - y.mean() - half, x.mean() - y.mean() + half
    v = C.evaluate({"kind": "accuracy_masking", "acc_tol": 0.03},
                   _data(table_a1=t.drop(columns="seed")))
    assert (v.status == C.REPRODUCED) == (-0.03 < lo and hi < 0.03), v
    assert f"Welch TOST (n = 3/3) 90% interval [{lo:+.4f}, {hi:+.4f}]" in v.reason
    # the 0.6 ratio the paper never ran is left out by max_ratio
    t6 = pd.concat([t, t[t["ratio"] == 0.5].assign(ratio=0.6, best_test_bacc=0.5)])
    v = C.evaluate({"kind": "accuracy_masking", "acc_tol": 0.03, "max_ratio": 0.5},
                   _data(table_a1=t6))
    assert "r=0.5" in v.reason and "r=0.6" not in v.reason


def test_check_scale_names_every_shortfall_in_numbers():
    scale = pd.DataFrame({"dataset": ["breastmnist", "breastmnist"],
                          "method": ["sup", "fixmatch"], "seed": [0, 0],
                          "network": ["small_cnn", "small_cnn"],
                          "steps_per_trial": [42.0, 726.0], "trials": [1, 1]})
    needs = {"steps_per_trial": 35000, "trials": 3, "seeds": 3, "networks": ["resnet18"],
             "datasets": {"tissuemnist": "TissueMNIST"}, "source": "Sec. 4"}
    short = C.check_scale(needs, C.SuiteData(scale=scale))
    # median of 42 and 726 = 384 = 1.1 % of 35000
    assert short[0] == "1.1 % of the paper's steps per trial (median 384 of 35000; needs >= 50 %)"
    assert "1 of >= 3 completed trials" in short[1]
    assert "1 of >= 3 seeds" in short[2]
    assert "network small_cnn, not the paper's resnet18" in short[3]
    assert "breastmnist: neither the paper's nor a named stand-in" in short[4]
    # a rule that decides on these runs is overruled by the scale
    al = _al_reps({"a": {"oracle": [0.90, 0.91, 0.92], "margin": [0.80, 0.81, 0.80]},
                   "b": {"oracle": [0.90, 0.92, 0.91], "margin": [0.85, 0.84, 0.86]}})
    d = C.SuiteData(scale=scale, al=al)
    assert C.evaluate({"kind": "oracle_best"}, d).status == C.REPRODUCED
    v = C.evaluate({"kind": "oracle_best"}, d, needs=needs)
    assert v.status == C.UNTESTABLE and v.reason.startswith("below the scale the claim needs")
    assert v.reason.endswith("(paper's scale: Sec. 4)")
    # a rule that cannot run keeps its own reason
    v = C.evaluate({"kind": "oracle_best"}, C.SuiteData(scale=scale), needs=needs)
    assert v.reason == "no finished oracle repetitions"
    # at the scale: no shortfall, the rule decides
    ok = pd.DataFrame({"dataset": ["tissuemnist"] * 3, "method": ["sup"] * 3,
                       "seed": [0, 1, 2], "network": ["resnet18"] * 3,
                       "steps_per_trial": [20000.0] * 3, "trials": [3] * 3})
    assert C.check_scale(needs, C.SuiteData(scale=ok)) == []
    # nothing recorded is a shortfall, not a pass
    assert any("not recorded" in s for s in C.check_scale(needs, C.SuiteData()))
    # AL: repetitions per (problem, strategy)
    al = _al([("splice", 1, "margin", k, 0.7) for k in range(3)]
             + [("splice", 1, "random", 0, 0.7)])
    assert C.check_scale({"seeds": 50}, C.SuiteData(al=al)) == [
        "1 of >= 50 repetitions (splice / 1 / random)"]


def test_a_verdict_that_hinges_on_an_untested_comparison_is_not_testable():
    # one repetition per strategy: no spread, no test; the old rules called the oracle
    # beaten and the winners distinct on these means
    rows = [("a", 1, "oracle", 0, 0.90), ("a", 1, "margin", 0, 0.91), ("a", 1, "random", 0, 0.8),
            ("b", 1, "oracle", 0, 0.90), ("b", 1, "margin", 0, 0.80), ("b", 1, "random", 0, 0.85)]
    for kind in ("oracle_best", "no_universal_winner"):
        v = C.evaluate({"kind": kind}, _data(al=_al(rows)))
        assert v.status == C.UNTESTABLE and "could not be tested" in v.reason, (kind, v)
    r = _retrains({"ce": [0.5], "a": [0.6], "b": [0.7]})
    v = C.evaluate({"kind": "baseline_competitive", "min_runs": 1}, _data(retrains=r))
    assert v.status == C.UNTESTABLE
