"""Strategy-specific behaviour on hand-made cases (the contract is in test_active_contract)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_active_contract import NumpyModel, make_state

from scarcelab.active.base import QueryState, k_center_greedy
from scarcelab.active.loop import make_strategy


class FixedProba:
    """A model whose probabilities are given per row of x (x[:, 0] is the row id)."""

    def __init__(self, proba: np.ndarray, emb: np.ndarray | None = None) -> None:
        self.proba, self.emb = proba, emb

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        return self.proba[x[:, 0].astype(int)]

    def embed(self, x: np.ndarray) -> np.ndarray:
        return self.emb[x[:, 0].astype(int)] if self.emb is not None else x

    def mc_predict_proba(self, x, passes, generator, p=None):  # type: ignore[no-untyped-def]
        return np.stack([self.predict_proba(x)] * passes)


def _state(proba: np.ndarray, labeled: int = 0, emb: np.ndarray | None = None,
           y: np.ndarray | None = None) -> QueryState:
    n = len(proba)
    x = np.arange(n, dtype=np.float32)[:, None]
    lab = np.arange(labeled)
    ys = np.zeros(labeled, dtype=np.int64) if y is None else y[:labeled]
    return QueryState(x=x, labeled=lab, y_labeled=ys, candidates=np.arange(labeled, n),
                      model=FixedProba(proba, emb), num_classes=proba.shape[1])


PROBA = np.array([[0.90, 0.05, 0.05],   # confident
                  [0.40, 0.38, 0.22],   # smallest top-2 gap (0.02)
                  [0.34, 0.33, 0.33],   # max entropy, least confident, gap 0.01
                  [0.50, 0.45, 0.05],   # gap 0.05
                  [0.60, 0.20, 0.20]])


def test_margin_picks_smallest_top2_gap() -> None:
    st = _state(PROBA)
    rng = np.random.default_rng(0)
    # gaps: 0.85, 0.02, 0.01, 0.05, 0.40
    assert make_strategy("margin").query(st, 2, rng).tolist() == [2, 1]
    assert make_strategy("margin").query(st, 3, rng).tolist() == [2, 1, 3]


def test_entropy_and_least_confident_pick_flattest() -> None:
    st = _state(PROBA)
    rng = np.random.default_rng(0)
    assert make_strategy("entropy").query(st, 1, rng).tolist() == [2]
    # max-probabilities: .9 .4 .34 .5 .6
    assert make_strategy("least_confident").query(st, 3, rng).tolist() == [2, 1, 3]


def test_coreset_greedy_k_center_on_grid() -> None:
    g = np.stack(np.meshgrid(np.arange(5), np.arange(5), indexing="ij"), -1).reshape(-1, 2)
    # labeled: the corner (0, 0) (row 0); first pick: the farthest point (4, 4)
    g = g.astype(np.float32)
    pos = k_center_greedy(g[1:], g[:1], 3) + 1
    pts = [tuple(g[p]) for p in pos]
    assert pts[0] == (4, 4)
    assert set(pts[1:]) == {(0, 4), (4, 0)}  # both at distance 4 from the two centers
    # through the strategy (identity embedding)
    st = make_state(n=25, identity=True)
    st.x = g.astype(np.float32)
    st.labeled, st.y_labeled = np.array([0]), np.array([0])
    st.candidates = np.arange(1, 25)
    st.model = NumpyModel(2, 3, identity=True)
    assert make_strategy("coreset").query(st, 1, np.random.default_rng(0)).tolist() == [24]


def test_badge_first_pick_is_largest_gradient_norm_and_distances_exact() -> None:
    from scarcelab.active.strategies.badge import gradient_factors, kmeanspp_gradients

    st = make_state(n=50)
    xc = st.x[st.candidates]
    p, e = st.model.predict_proba(xc), st.model.embed(xc)
    a, h = gradient_factors(p, e)
    g = (a[:, :, None] * h[:, None, :]).reshape(len(a), -1).numpy()  # explicit embeddings
    first = kmeanspp_gradients(a, h, 1, np.random.default_rng(0))[0]
    assert first == int(np.argmax((g ** 2).sum(1)))
    # the implicit distance used for the next draw equals the explicit one
    d_explicit = ((g - g[first]) ** 2).sum(1)
    sq = (a * a).sum(1) * (h * h).sum(1)
    d_implicit = (sq + sq[first] - 2 * (a @ a[first]) * (h @ h[first])).clamp_min(0).numpy()
    np.testing.assert_allclose(d_implicit, d_explicit, atol=1e-5)


def test_badge_draws_proportional_to_d2() -> None:
    """Second picks over many seeds follow D^2: a point at distance 0 is never drawn."""
    from scarcelab.active.strategies.badge import kmeanspp_gradients

    a = torch.tensor([[1.0, -1.0], [1.0, -1.0], [0.1, -0.1], [0.5, -0.5]])
    h = torch.ones(4, 1)
    seconds = [kmeanspp_gradients(a, h, 2, np.random.default_rng(s))[1] for s in range(200)]
    counts = np.bincount(seconds, minlength=4)
    assert counts[0] == 0 and counts[1] == 0  # the first pick and its duplicate
    assert counts[2] > counts[3] > 0  # farther from the first pick = drawn more


def test_bald_zero_when_passes_agree_and_positive_when_not() -> None:
    from scarcelab.active.strategies.bald import bald_scores

    same = np.stack([PROBA] * 5)
    np.testing.assert_allclose(bald_scores(same), 0.0, atol=1e-6)
    split = np.stack([np.array([[1.0, 0.0]]), np.array([[0.0, 1.0]])] * 2)
    assert bald_scores(split)[0] == pytest.approx(np.log(2), abs=1e-4)


CENTERS = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])


def _three_blobs(model: NumpyModel) -> tuple[QueryState, np.ndarray, np.ndarray]:
    """(state, inputs, blob of each input): 30 points around each of ``CENTERS``, the two
    labeled points both in blob 0."""
    r = np.random.default_rng(0)
    x = np.concatenate([c + r.normal(scale=0.5, size=(30, 2)) for c in CENTERS])
    st = make_state(n=90, identity=True)
    st.x = x.astype(np.float32)
    st.model = model
    st.labeled, st.y_labeled = np.array([0, 1]), np.array([0, 0])
    st.candidates = np.setdiff1d(np.arange(90), st.labeled)
    return st, x, np.repeat(np.arange(3), 30)


def test_typiclust_covers_uncovered_clusters_with_typical_points() -> None:
    st, x, blob = _three_blobs(NumpyModel(2, 3, identity=True))
    centers = CENTERS
    picked = make_strategy("typiclust").query(st, 2, np.random.default_rng(0))
    assert set(blob[picked]) == {1, 2}
    for p in picked:  # typical = close to its blob's centre
        assert np.linalg.norm(x[p] - centers[blob[p]]) < 0.6


def test_coregcn_picks_far_from_labeled_blob() -> None:
    r = np.random.default_rng(1)
    x = np.concatenate([r.normal(size=(40, 3)) + 4, r.normal(size=(40, 3)) - 4])
    st = make_state(n=80, d=3, identity=True)
    st.x = x.astype(np.float32)
    st.model = NumpyModel(3, 2, identity=True)
    st.labeled, st.y_labeled = np.arange(5), np.zeros(5, dtype=np.int64)
    st.candidates = np.arange(5, 80)
    picked = make_strategy("coregcn").query(st, 1, np.random.default_rng(0))
    assert picked[0] >= 40


def test_dsa_and_lsa_rank_far_points_as_surprising() -> None:
    from scarcelab.active.strategies.dsa import dsa_scores
    from scarcelab.active.strategies.lsa import lsa_scores

    emb_l = np.array([[0.0, 0.0], [0.2, 0.0], [5.0, 0.0], [5.2, 0.0]])
    y_l = np.array([0, 0, 1, 1])
    emb_c = np.array([[0.05, 0.0], [2.0, 3.0]])  # near class 0 / far from everything
    pred = np.array([0, 0])
    d = dsa_scores(emb_c, pred, emb_l, y_l)
    assert d[1] > d[0]
    # hand check: candidate 0 -> nearest class-0 point (0, 0) at 0.05, whose nearest class-1
    # point is 5.0 away
    assert d[0] == pytest.approx(0.05 / 5.0, rel=1e-3)
    lsa = lsa_scores(emb_c, pred, emb_l, y_l)
    assert lsa[1] > lsa[0]
    # a predicted class without labeled points is maximally surprising
    assert np.isinf(dsa_scores(emb_c, np.array([2, 0]), emb_l, y_l)[0])


def test_galaxy_queries_midpoint_of_shortest_cut() -> None:
    from scarcelab.active.strategies.galaxy import cut_midpoints

    # binary; scores p0 order: L0(y=1) u u u L1(y=0) ... L2(y=0)  u  L3(y=1)
    p0 = np.array([0.05, 0.45, 0.60, 0.98,    # labeled rows 0..3
                   0.10, 0.20, 0.30,           # unlabeled between rows 0 and 1 (3 nodes)
                   0.70])                      # one unlabeled between rows 2 and 3
    proba = np.stack([p0, 1 - p0], 1)
    y_l = np.array([1, 0, 0, 1])
    mids = cut_midpoints(proba, y_l)
    assert mids[0] == 3  # row 7 (the single node of the shortest stretch) -> position 3
    assert 1 in mids  # the midpoint (row 5) of the 3-node stretch


def test_oracle_never_worse_than_its_margin_fallback() -> None:
    st = make_state(n=40)
    tau_all = make_strategy("oracle", {"tau": 1000})
    margin = make_strategy("margin")
    for q in (1, 3):
        o = tau_all.query(st, q, np.random.default_rng(0))
        m = margin.query(st, q, np.random.default_rng(0))
        assert st.oracle_score(o) >= st.oracle_score(m) - 1e-12


def test_oracle_falls_back_to_margin_when_nothing_improves() -> None:
    st = make_state(n=40)
    st.current_accuracy = 2.0  # unreachable: no candidate can improve
    o = make_strategy("oracle").query(st, 2, np.random.default_rng(0))
    m = make_strategy("margin").query(st, 2, np.random.default_rng(0))
    assert o.tolist() == m.tolist()


def test_unknown_strategy_parameter_is_rejected() -> None:
    with pytest.raises(TypeError, match="no parameter"):
        make_strategy("oracle", {"taux": 3})


# -- each strategy parameter changes what it names (tests/project/test_hparams_exercised.py) -------
class _RecordingMC(FixedProba):
    """Records the MC-dropout request a strategy makes."""

    asked: tuple[int, float | None] | None = None

    def mc_predict_proba(self, x, passes, generator, p=None):  # type: ignore[no-untyped-def]
        self.asked = (passes, p)
        return super().mc_predict_proba(x, passes, generator, p)


@pytest.mark.parametrize(("params", "asked"), [({}, (5, 0.2)),
                                               ({"passes": 3, "dropout": 0.4}, (3, 0.4))])
def test_bald_passes_and_dropout_reach_the_mc_dropout_model(params, asked) -> None:  # type: ignore[no-untyped-def]
    st = _state(PROBA)
    model = _RecordingMC(PROBA)
    st.model = model
    make_strategy("bald", params).query(st, 1, np.random.default_rng(0))
    assert model.asked == asked


def test_typiclust_knn_is_the_typicality_neighbourhood() -> None:
    """Typicality = 1 / mean distance to the ``knn`` nearest neighbours; on the line
    0, 1, 3: knn=1 gives 1, 1, 1/2 and knn=2 gives 1/2, 2/3, 2/5."""
    from scarcelab.active.strategies.typiclust import typicality

    emb = np.array([[0.0], [1.0], [3.0]])
    for knn, want in ((1, [1.0, 1.0, 0.5]), (2, [0.5, 2 / 3, 0.4])):
        strat = make_strategy("typiclust", {"knn": knn})
        np.testing.assert_allclose(typicality(emb, strat.knn), want, rtol=1e-5)


def _two_blobs_and_a_speck() -> QueryState:
    """Blobs of 30 around (0, 0) and (10, 0), one labeled point in each, and an unlabeled
    cluster of 3 points far away at (0, 10)."""
    r = np.random.default_rng(0)
    x = np.concatenate([c + r.normal(scale=0.3, size=(k, 2)) for c, k in
                        (((0.0, 0.0), 30), ((10.0, 0.0), 30), ((0.0, 10.0), 3))])
    st = make_state(n=len(x), identity=True)
    st.x = x.astype(np.float32)
    st.model = NumpyModel(2, 3, identity=True)
    st.labeled, st.y_labeled = np.array([0, 30]), np.array([0, 1])
    st.candidates = np.setdiff1d(np.arange(len(x)), st.labeled)
    return st


def test_typiclust_min_cluster_size_ignores_small_clusters() -> None:
    """The 3-point cluster is the only uncovered one: taken when clusters of 3 count
    (min_cluster_size=1), skipped at the default 5 for a covered but large blob."""
    st = _two_blobs_and_a_speck()
    small = make_strategy("typiclust", {"min_cluster_size": 1}).query(
        st, 1, np.random.default_rng(0))
    default = make_strategy("typiclust").query(st, 1, np.random.default_rng(0))
    assert small.tolist()[0] >= 60
    assert default.tolist()[0] < 60


def test_typiclust_max_clusters_caps_the_clustering(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import sklearn.cluster

    seen: list[int] = []
    real = sklearn.cluster.KMeans

    def spy(n_clusters, **kw):  # type: ignore[no-untyped-def]
        seen.append(n_clusters)
        return real(n_clusters=n_clusters, **kw)

    monkeypatch.setattr(sklearn.cluster, "KMeans", spy)
    st = _two_blobs_and_a_speck()
    for params in ({}, {"max_clusters": 2}):
        make_strategy("typiclust", params).query(st, 3, np.random.default_rng(0))
    assert seen == [5, 2]  # |L| + q = 5 clusters, unless capped


# -- distances, typicality, DSA by hand (mutation sample, docs/mutation.md) ----------------
def test_min_sq_dist_keeps_the_callers_precision():
    """float64 callers get float64 distances equal to brute force, not a float32 buffer."""
    from scarcelab.active.base import min_sq_dist_to

    g = torch.Generator().manual_seed(0)
    pts = torch.randn(50, 7, generator=g, dtype=torch.float64) * 1e3
    ctr = torch.randn(4, 7, generator=g, dtype=torch.float64) * 1e3
    got = min_sq_dist_to(pts, ctr, chunk=16)
    want = ((pts[:, None, :] - ctr[None, :, :]) ** 2).sum(-1).min(1).values
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-6)


def test_typicality_is_the_inverse_mean_distance_to_the_nearest_neighbours():
    """Points 0, 1, 2, 10 on a line, k = 1: nearest-neighbour distances 1, 1, 1, 8."""
    from scarcelab.active.strategies.typiclust import typicality

    emb = np.array([[0.0], [1.0], [2.0], [10.0]])
    np.testing.assert_allclose(typicality(emb, 1), [1.0, 1.0, 1.0, 1 / 8], rtol=1e-6)
    # k = 2: point 0 -> (1 + 2) / 2, point 1 -> (1 + 1) / 2, 2 -> (1 + 2) / 2, 10 -> (8 + 9) / 2
    np.testing.assert_allclose(typicality(emb, 2), [1 / 1.5, 1.0, 1 / 1.5, 1 / 8.5], rtol=1e-6)


def test_dsa_divides_by_distances_below_one():
    """DSA = dist_a / dist_b (Kim et al.); distances under 1 must not be clipped to 1: labeled
    class 0 at 0 and class 1 at 0.5, a candidate at 0.1 predicted 0 -> 0.1 / 0.5 = 0.2."""
    from scarcelab.active.strategies.dsa import dsa_scores

    s = dsa_scores(np.array([[0.1]]), np.array([0]), np.array([[0.0], [0.5]]), np.array([0, 1]))
    np.testing.assert_allclose(s, [0.2], rtol=1e-5)


# -- BADGE's distance update, margin's wide-class path, CoreGCN's init (mutation sample 2) --
def test_badge_third_pick_follows_the_updated_gradient_distances():
    """g = a ⊗ h on a line: P0 = 4 (largest norm, picked first), its duplicate (distance 0
    for ever), P1 = -2 and P2 = -1. After P1 or P2 is picked the other still lies at squared
    distance 1 from it, so D² sampling must pick it third for every seed, never the
    duplicate (an update that drives that distance to 0 would)."""
    from scarcelab.active.strategies.badge import kmeanspp_gradients

    a = torch.tensor([[1.0, 0.0]] * 4)
    h = torch.tensor([[4.0], [4.0], [-2.0], [-1.0]])
    g = torch.einsum("ni,nj->nij", a, h).flatten(1)  # the explicit embeddings, brute force
    assert torch.cdist(g, g)[2, 3].pow(2).item() == pytest.approx(1.0)
    for seed in range(20):
        got = kmeanspp_gradients(a, h, 3, np.random.default_rng(seed)).tolist()
        assert got[0] == 0 and sorted(got) == [0, 2, 3]


def test_margin_with_many_classes_is_top1_minus_top2():
    """Above the column-pass width (17+ classes) the margin still is p_(1) - p_(2), for any
    float dtype (long double takes numpy's generic partition, which orders nothing beyond
    its kth element)."""
    from scarcelab.active.strategies.margin import margin_scores

    rng = np.random.default_rng(1)
    for dt in (np.float32, np.float64, np.longdouble):
        p = np.array([rng.permutation(20) for _ in range(300)]).astype(dt) / 190
        ref = np.sort(p, axis=1)
        np.testing.assert_array_equal(margin_scores(p), ref[:, -1] - ref[:, -2])


def test_coregcn_weights_start_symmetric_around_zero(monkeypatch):
    """Both GCN layers start from U(±1/sqrt(fan_in)) (PyTorch's Linear default): inside the
    bound and of both signs, not shifted to one side."""
    from scarcelab.active.strategies.coregcn import CoreGCN

    start: list[torch.Tensor] = []
    real = torch.optim.Adam

    def spy(params, *a, **k):  # type: ignore[no-untyped-def]
        params = list(params)
        start.extend(p.detach().clone() for p in params)
        return real(params, *a, **k)

    monkeypatch.setattr(torch.optim, "Adam", spy)
    emb = np.random.default_rng(0).normal(size=(30, 16))
    gcn = CoreGCN(hidden=256, epochs=1)
    gcn.gcn_features(emb, 5, torch.Generator().manual_seed(0))
    w1, w2 = start
    for w, fan_in in ((w1, 16), (w2, 256)):
        bound = 1 / fan_in ** 0.5
        assert w.abs().max() <= bound
        assert (w < 0).float().mean() == pytest.approx(0.5, abs=0.15)
        assert float(w.mean()) == pytest.approx(0.0, abs=0.2 * bound)


class _NoEmbedding(NumpyModel):
    def embed(self, x: np.ndarray) -> np.ndarray:
        raise AssertionError("space='raw' must cluster the inputs, not the embeddings")


def test_typiclust_raw_space_clusters_the_inputs_without_the_model() -> None:
    """``space='raw'`` is CDALBench's TypiClust (k-means on the inputs): on inputs with
    three blobs it covers the two unlabeled ones and never asks the classifier to embed."""
    st, _, blob = _three_blobs(_NoEmbedding(2, 3, identity=True))
    picked = make_strategy("typiclust", {"space": "raw"}).query(st, 2, np.random.default_rng(0))
    assert set(blob[picked]) == {1, 2}
    with pytest.raises(AssertionError, match="raw"):
        make_strategy("typiclust").query(st, 2, np.random.default_rng(0))


def test_typiclust_unknown_space_names_the_setting() -> None:
    with pytest.raises(ValueError, match=r"space='pixels'.*strategy\.space=raw"):
        make_strategy("typiclust", {"space": "pixels"})
