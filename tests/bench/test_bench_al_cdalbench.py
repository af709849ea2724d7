"""bench/al_cdalbench.py: the validation table is computed from the runs, not typed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("al_cdalbench", ROOT / "bench" /
                                                  "al_cdalbench.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def test_table_rows_are_means_and_sample_stds_of_the_runs_beside_the_paper() -> None:
    b = _bench()
    df = pd.DataFrame({
        "variant": ["default"] * 3 + ["test_stop"],
        "dataset": ["usps"] * 4, "query_size": [1] * 4, "strategy": ["random"] * 4,
        "repetition": [0, 1, 2, 0], "auc": [0.80, 0.82, 0.84, 0.70]})
    text = b.render(df, "sqlite:///x.db")
    row = next(ln for ln in text.splitlines() if ln.startswith("| usps q=1 | random"))
    # mean .82, sample std .02 over 3; paper .823 -> -0.003; the variant in its own column
    assert "| 0.823 ± 0.009 | 0.820 ± 0.020 (3) | 0.700 ± 0.000 (1) | -0.003 |" in row
    assert "1 of 1 default-protocol cells within ±0.02" in text


def test_variant_syntax() -> None:
    b = _bench()
    assert b._variant("one_fit_per_query@5=fit_per_label=0") == (
        "one_fit_per_query", 5, {"fit_per_label": 0})
    assert b._variant("test_stop=early_stop_on=test,lr=0.01") == (
        "test_stop", None, {"early_stop_on": "test", "lr": 0.01})


def test_repetitions_with_a_collapsed_fit_are_marked() -> None:
    """The mean al/collapsed_fits per repetition stands beside the cell (⊘n, n >= 0.5);
    runs from before the metric (NaN) are left out of the mean."""
    b = _bench()
    df = pd.DataFrame({
        "variant": ["default"] * 3 + ["hi_lr"] * 3,
        "dataset": ["splice"] * 6, "query_size": [1] * 6, "strategy": ["margin"] * 6,
        "repetition": [0, 1, 2] * 2, "auc": [0.77, 0.78, 0.79, 0.55, 0.74, 0.75],
        "collapsed": [0.0, float("nan"), 0.8, 290.0, 3.0, 1.0]})
    row = next(ln for ln in b.render(df, "x").splitlines() if ln.startswith("| splice q=1"))
    # default: mean(0, 0.8) = 0.4 < 0.5, unmarked; hi_lr: (290 + 3 + 1) / 3 = 98
    assert "| 0.780 ± 0.010 (3) | 0.680 ± 0.113 (3) ⊘98 |" in row


def test_variant_settings_reach_the_strategy_and_the_candidate_count() -> None:
    """The USPS variants (docs/active.md): ``strategy.space=raw`` and ``max_candidates=20``
    become the strategy's setting and the candidate count, not dataset overrides."""
    from scarcelab.active.loop import make_strategy

    b = _bench()
    name, _, over = b._variant("cdal=strategy.space=raw,max_candidates=20,budget=60")
    rc = b.run_config("usps", 1, "typiclust", over, 5)
    assert (rc.strategy_params, rc.max_candidates, rc.overrides) == (
        {"space": "raw"}, 20, {"budget": 60})
    strat = make_strategy(rc.strategy, rc.strategy_params, rc.max_candidates)
    assert (strat.space, strat.max_candidates) == ("raw", 20)
    test = b.run_config("splice", 1, "random", {"early_stop_on": "test"}, 1)
    assert test.overrides == {"stop_on": "test", "val_fraction": 0.0}
