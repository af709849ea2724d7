"""Issue 12 items 12 and 14: one rank definition for the AL views (CDALBench's blocks), and
the significance statistics against scikit-posthocs / scipy on the same inputs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from scarcelab.tracking import stats
from scarcelab.tracking.al import cd_blocks, rank_table

sp = pytest.importorskip("scikit_posthocs")  # test-only dependency (requirements-dev.txt)


def _scores(seed: int, n: int = 12, k: int = 4, round_to: int | None = None) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, k)) + 0.4 * np.arange(k)
    if round_to is not None:
        x = np.round(x, round_to)  # ties within rows and between pairs
    return pd.DataFrame(x, columns=[f"m{i}" for i in range(k)])


@pytest.mark.parametrize("seed,round_to", [(0, None), (1, None), (2, 0), (3, 1)])
def test_nemenyi_matches_scikit_posthocs(seed, round_to):  # type: ignore[no-untyped-def]
    df = _scores(seed, round_to=round_to)
    ours = stats.nemenyi_pvalues(df)
    ref = sp.posthoc_nemenyi_friedman(df)
    np.testing.assert_allclose(ours.to_numpy(), ref.loc[ours.index, ours.columns].to_numpy(),
                               atol=1e-10)
    # the critical difference is the same test: |ΔR| > CD exactly when p < alpha
    r = stats.average_ranks(df)
    cd = stats.nemenyi_cd(df.shape[1], len(df), 0.05)
    for a in df.columns:
        for b in df.columns:
            if a != b:
                assert (abs(r[a] - r[b]) > cd) == (ours.loc[a, b] < 0.05)


@pytest.mark.parametrize("seed,round_to", [(0, None), (4, 1), (5, 2)])
def test_wilcoxon_holm_matches_scikit_posthocs(seed, round_to):  # type: ignore[no-untyped-def]
    df = _scores(seed, n=15, round_to=round_to)
    ours = stats.wilcoxon_holm(df)
    long = df.melt(var_name="g", value_name="v")
    ref = sp.posthoc_wilcoxon(long, val_col="v", group_col="g", p_adjust="holm")
    for row in ours.itertuples():
        assert row.p_holm == pytest.approx(float(ref.loc[row.a, row.b]), abs=1e-12)
    raw = sp.posthoc_wilcoxon(long, val_col="v", group_col="g")
    for row in ours.itertuples():
        assert row.p_value == pytest.approx(float(raw.loc[row.a, row.b]), abs=1e-12)


@pytest.mark.parametrize("round_to", [None, 0, 1])
def test_friedman_matches_scipy(round_to):  # type: ignore[no-untyped-def]
    df = _scores(7, round_to=round_to)
    ref = sps.friedmanchisquare(*[df[c] for c in df.columns])
    stat, p = stats.friedman_test(df)
    assert stat == pytest.approx(ref.statistic) and p == pytest.approx(ref.pvalue)


def test_friedman_and_cd_diagram_refuse_one_block():
    one = _scores(0, n=1)
    with pytest.raises(ValueError, match="at least 2 blocks"):
        stats.friedman_test(one)
    with pytest.raises(ValueError, match="at least 2 blocks"):
        stats.cd_diagram(one)


def _runs(rows: list[tuple[str, int, str, int, float]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["dataset", "query_size", "strategy", "repetition", "auc"])


def test_ranks_are_taken_per_dataset_query_size_repetition_block():
    """A wins one repetition of three by far, B the other two narrowly: on mean AUC A is
    first, over CDALBench's blocks B is. Problem "b" has one repetition only, so averaging
    per problem first would also weigh its single block like problem "a"'s three."""
    rows = []
    for k, (a, b) in enumerate([(0.9, 0.5), (0.45, 0.5), (0.45, 0.5)]):
        rows += [("a", 1, "A", k, a), ("a", 1, "B", k, b), ("a", 1, "C", k, 0.1)]
    rows += [("b", 1, "A", 0, 0.8), ("b", 1, "B", 0, 0.2), ("b", 1, "C", 0, 0.5)]
    runs = _runs(rows)
    blocks = cd_blocks(runs)
    assert len(blocks) == 4 and list(blocks.columns) == ["A", "B", "C"]
    by_hand = blocks.rank(axis=1, ascending=False).mean()
    table = rank_table(runs)
    for s in "ABC":
        assert table.loc[("mean", "all"), s] == pytest.approx(by_hand[s])
    assert table.loc[("mean", "all"), "A"] == pytest.approx((1 + 2 + 2 + 1) / 4)


def test_views_rank_al_strategies_over_the_same_blocks(monkeypatch):
    """tracking.query.views and tracking.al give the same AL ranks (they disagreed: the
    views ranked the mean AUC per problem)."""
    from scarcelab.tracking.query import views

    rows = []
    for k, (a, b) in enumerate([(0.9, 0.5), (0.45, 0.5), (0.45, 0.5)]):
        rows += [("a", 1, "A", k, a), ("a", 1, "B", k, b), ("a", 1, "C", k, 0.1)]
    runs = _runs(rows)
    frame = runs.rename(columns={"auc": "metrics.al/auc"}).assign(status="FINISHED")

    class FakeTracked:
        include_failed = False

        def role(self, name: str) -> pd.DataFrame:
            return frame if name == "al" else frame.iloc[0:0]

    r = views.al_ranks(FakeTracked()).set_index("method")  # type: ignore[arg-type]
    expected = rank_table(runs).loc[("mean", "all")]
    for s in "ABC":
        assert r.loc[s, "average_rank"] == pytest.approx(expected[s])
    assert r.loc["B", "average_rank"] < r.loc["A", "average_rank"]
    assert set(r.n_problems) == {3}


def test_rank_view_with_one_block_gives_no_friedman_p():
    from scarcelab.tracking.query.views import _rank_table

    with pytest.warns(UserWarning, match="no Friedman p-value"):
        out = _rank_table(_scores(0, n=1), "al")
    assert out["friedman_p"].isna().all() and len(out) == 4
