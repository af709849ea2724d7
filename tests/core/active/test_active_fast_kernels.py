"""The faster strategy kernels (issue 28, item 2) pick exactly what the plain definitions
pick: each against an independent brute-force reference (full sorts, a float64 distance
matrix, numpy's own reductions), on random data, ties, NaN and infinities."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_active_strategies import FixedProba

from scarcelab.active.base import (
    QueryState,
    entropy,
    k_center_greedy,
    min_sq_dist_to,
    sq_norms,
    top_q,
)
from scarcelab.active.loop import make_strategy
from scarcelab.active.strategies.bald import bald_scores, mean_over_passes
from scarcelab.active.strategies.least_confident import row_max
from scarcelab.active.strategies.margin import margin_scores


def _ref_top_q(scores: np.ndarray, q: int, cand: np.ndarray) -> np.ndarray:
    return cand[np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")[:q]]


def _proba(n: int, c: int, seed: int, dtype: type = np.float32) -> np.ndarray:
    z = np.random.default_rng(seed).normal(size=(n, c)) * 2
    e = np.exp(z - z.max(1, keepdims=True))
    return (e / e.sum(1, keepdims=True)).astype(dtype)


@pytest.mark.parametrize("kind", ["random", "ties", "all_equal", "nan", "inf", "float32"])
@pytest.mark.parametrize("q", [1, 3, 24, 25, 99])
def test_top_q_is_the_stable_argsort_prefix(kind: str, q: int) -> None:
    rng = np.random.default_rng(q)
    n = 100
    s = rng.normal(size=n)
    if kind == "ties":
        s = rng.integers(0, 4, size=n).astype(float)  # many equal scores at the cut
    elif kind == "all_equal":
        s = np.zeros(n)
    elif kind == "nan":
        s[rng.choice(n, 90, replace=False)] = np.nan  # fewer ordinary scores than q
    elif kind == "inf":
        s[[3, 50, 70]] = np.inf
        s[[4, 5]] = -np.inf
    elif kind == "float32":
        s = s.astype(np.float32)
    cand = rng.permutation(1000)[:n]
    assert top_q(s, q, cand).tolist() == _ref_top_q(s, q, cand).tolist()


@pytest.mark.parametrize("c", [2, 3, 10, 16, 17, 40])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_margin_scores_equal_a_full_sort(c: int, dtype: type) -> None:
    p = _proba(500, c, seed=c, dtype=dtype)
    p[:50] = np.round(p[:50], 1)  # rows with tied top values
    p[50, :2] = p[50].max()
    srt = np.sort(p, axis=1)
    got = margin_scores(p)
    assert got.dtype == srt.dtype
    np.testing.assert_array_equal(got, srt[:, -1] - srt[:, -2])


def test_margin_scores_keep_their_error_on_a_single_class() -> None:
    with pytest.raises(IndexError):
        margin_scores(np.ones((4, 1), dtype=np.float32))


@pytest.mark.parametrize("c", [1, 2, 10, 16, 17, 40])
def test_row_max_equals_numpy_max(c: int) -> None:
    p = _proba(300, c, seed=c)
    np.testing.assert_array_equal(row_max(p), p.max(1))


@pytest.mark.parametrize("shape", [(5, 400, 10), (1, 7, 3), (20, 50, 100)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mean_over_passes_is_numpys_mean_bit_for_bit(shape: tuple[int, ...],
                                                    dtype: type) -> None:
    a = np.random.default_rng(len(shape)).random(shape).astype(dtype)
    got = mean_over_passes(a)
    assert got.dtype == a.mean(0).dtype
    np.testing.assert_array_equal(got, a.mean(0))


def test_entropy_and_bald_scores_equal_the_plain_formulas() -> None:
    mc = np.stack([_proba(400, 10, seed=s) for s in range(5)])
    mc[0, 0] = [1.0] + [0.0] * 9  # a zero probability goes through the clip

    def plain_entropy(p: np.ndarray) -> np.ndarray:
        p = np.clip(p, 1e-12, 1.0)
        return -(p * np.log(p)).sum(-1)

    np.testing.assert_array_equal(entropy(mc), plain_entropy(mc))
    np.testing.assert_array_equal(bald_scores(mc), plain_entropy(mc.mean(0))
                                  - plain_entropy(mc).mean(0))


def _ref_k_center(pool: np.ndarray, centers: np.ndarray, q: int) -> list[int]:
    """Greedy k-center from a float64 distance matrix, no tricks."""
    pool = pool.astype(np.float64)
    if len(centers):
        c = centers.astype(np.float64)
        dist = ((pool[:, None, :] - c[None, :, :]) ** 2).sum(-1).min(1)
    else:
        dist = ((pool - pool.mean(0)) ** 2).sum(1)
    picked: list[int] = []
    for _ in range(q):
        i = int(np.argmax(dist))
        picked.append(i)
        dist = np.minimum(dist, ((pool - pool[i]) ** 2).sum(1))
        dist[i] = -1.0
    return picked


@pytest.mark.parametrize("d,n_centers,q", [(3, 0, 5), (3, 4, 1), (3, 4, 12), (64, 30, 10),
                                           (64, 1, 40)])
def test_k_center_greedy_picks_what_brute_force_picks(d: int, n_centers: int, q: int) -> None:
    rng = np.random.default_rng(d + n_centers + q)
    pool = rng.normal(size=(300, d)).astype(np.float32)
    centers = rng.normal(size=(n_centers, d)).astype(np.float32)
    assert k_center_greedy(pool, centers, q).tolist() == _ref_k_center(pool, centers, q)


def test_min_sq_dist_to_with_given_norms_equals_recomputed_ones() -> None:
    g = torch.Generator().manual_seed(0)
    pts, ctr = torch.randn(1000, 17, generator=g), torch.randn(9, 17, generator=g)
    ref = ((pts[:, None, :].double() - ctr[None].double()) ** 2).sum(-1).min(1).values
    a = min_sq_dist_to(pts, ctr, chunk=128)
    b = min_sq_dist_to(pts, ctr, chunk=128, point_norms=sq_norms(pts))
    assert torch.equal(a, b)
    torch.testing.assert_close(a.double(), ref, rtol=1e-5, atol=1e-4)


def test_strategies_pick_what_their_definitions_pick() -> None:
    """Through the query contract on a 2,000-point pool (partition path of top_q)."""
    rng = np.random.default_rng(7)
    n, lab = 2000, 20
    proba = _proba(n, 10, seed=7)
    emb = rng.normal(size=(n, 8)).astype(np.float32)
    st = QueryState(x=np.arange(n, dtype=np.float32)[:, None], labeled=np.arange(lab),
                    y_labeled=np.arange(lab) % 10, candidates=np.arange(lab, n),
                    model=FixedProba(proba, emb), num_classes=10)
    pc, cand = proba[lab:].astype(np.float64), np.arange(lab, n)
    srt = np.sort(pc, axis=1)
    refs = {"margin": -(srt[:, -1] - srt[:, -2]), "least_confident": 1.0 - pc.max(1),
            "entropy": -(pc * np.log(pc)).sum(1)}
    for name, score in refs.items():
        got = make_strategy(name).query(st, 10, np.random.default_rng(0))
        assert got.tolist() == _ref_top_q(score, 10, cand).tolist(), name
    got = make_strategy("coreset").query(st, 10, np.random.default_rng(0))
    assert got.tolist() == (cand[_ref_k_center(emb[lab:], emb[:lab], 10)]).tolist()


def test_mean_over_passes_on_a_pass_axis_innermost_in_memory() -> None:
    """12 passes stored pass-innermost: numpy sums that axis pairwise; the fast path must
    step aside and give numpy's values."""
    a = np.random.default_rng(3).random((300, 40, 12)).astype(np.float32).transpose(2, 0, 1)
    assert not a.flags.c_contiguous
    np.testing.assert_array_equal(mean_over_passes(a), a.mean(0))
