"""Numpy fixtures for strategy tests: a fixed softmax model and a small pool.

The model is deterministic and cheap, so strategy tests check the query logic itself, not
classifier training; its embedding is a fixed nonlinear map so that embedding-based
strategies see a geometry different from the raw input.
"""

from __future__ import annotations

import numpy as np
import torch

from scarcelab.active.base import QueryState


class NumpyModel:
    """p = softmax(tanh(x V) W); ``embed`` = tanh(x V), or x itself when ``identity``."""

    def __init__(self, d_in: int, n_classes: int, d_emb: int = 5, seed: int = 0,
                 identity: bool = False) -> None:
        r = np.random.default_rng(seed)
        self.identity = identity
        self.v = r.normal(size=(d_in, d_emb)).astype(np.float32)
        d = d_in if identity else d_emb
        self.w = r.normal(size=(d, n_classes)).astype(np.float32)

    def embed(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        return x if self.identity else np.tanh(x @ self.v)

    def _softmax(self, z: np.ndarray) -> np.ndarray:
        z = z - z.max(-1, keepdims=True)
        e = np.exp(z)
        return (e / e.sum(-1, keepdims=True)).astype(np.float32)

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        return self._softmax(self.embed(x) @ self.w)

    def mc_predict_proba(self, x: np.ndarray, passes: int, generator: torch.Generator,
                         p: float | None = None) -> np.ndarray:
        rate = 0.2 if p is None else p
        e = self.embed(x)
        outs = []
        for _ in range(passes):
            keep = (torch.rand(e.shape, generator=generator) >= rate).numpy()
            outs.append(self._softmax((e * keep / (1 - rate)) @ self.w))
        return np.stack(outs)


def make_state(n: int = 80, d: int = 4, n_classes: int = 3, per_class: int = 2, seed: int = 0,
               candidates: np.ndarray | None = None, identity: bool = False) -> QueryState:
    r = np.random.default_rng(seed)
    x = r.normal(size=(n, d)).astype(np.float32)
    y = np.arange(n) % n_classes
    labeled = np.concatenate([np.flatnonzero(y == c)[:per_class] for c in range(n_classes)])
    unl = np.setdiff1d(np.arange(n), labeled)
    cand = unl if candidates is None else candidates

    def oracle_score(extra: np.ndarray) -> float:
        # a smooth, deterministic stand-in for "retrain and test": prefers large x[:, 0]
        return 0.5 + 0.01 * float(np.tanh(x[np.asarray(extra), 0]).sum())

    return QueryState(x=x, labeled=labeled, y_labeled=y[labeled], candidates=cand,
                      model=NumpyModel(d, n_classes, seed=seed, identity=identity),
                      num_classes=n_classes, oracle_score=oracle_score, current_accuracy=0.5)


# -- the template contract every registered strategy inherits -----------------------------

class StrategyContract:
    """What every strategy must do, whatever its score: ``strategy`` names the entry.

    A new strategy file is covered by this class without anyone writing a test for it.
    """

    strategy: str = ""
    q: int = 3

    def make(self):  # type: ignore[no-untyped-def]
        from scarcelab.active.loop import make_strategy

        return make_strategy(self.strategy)

    def test_returns_q_distinct_unlabeled(self) -> None:
        st = make_state()
        picked = self.make().query(st, self.q, np.random.default_rng(0))
        assert picked.dtype == np.int64 and len(picked) == self.q
        assert len(np.unique(picked)) == self.q
        assert np.isin(picked, st.candidates).all()
        assert not np.isin(picked, st.labeled).any()

    def test_deterministic_under_its_rng_only(self) -> None:
        st = make_state()
        np.random.seed(1)
        torch.manual_seed(1)
        a = self.make().query(st, self.q, np.random.default_rng(7))
        np_state, torch_state = np.random.get_state(), torch.get_rng_state()
        np.random.seed(2)
        torch.manual_seed(2)
        b = self.make().query(make_state(), self.q, np.random.default_rng(7))
        np.testing.assert_array_equal(a, b)
        # and it never draws from the global generators
        np.random.seed(1)
        torch.manual_seed(1)
        self.make().query(make_state(), self.q, np.random.default_rng(7))
        assert np.random.get_state()[1].tolist() == np_state[1].tolist()
        assert torch.equal(torch.get_rng_state(), torch_state)

    def test_q_larger_than_pool_returns_all(self) -> None:
        cand = np.array([10, 20, 30, 41])
        st = make_state(candidates=cand)
        picked = self.make().query(st, 10, np.random.default_rng(0))
        assert sorted(picked.tolist()) == cand.tolist()
        assert len(self.make().query(make_state(candidates=cand[:0]), 3,
                                     np.random.default_rng(0))) == 0

    def test_respects_candidate_subset(self) -> None:
        cand = np.arange(20, 60, 3)
        st = make_state(candidates=cand)
        picked = self.make().query(st, 4, np.random.default_rng(3))
        assert len(picked) == 4 and np.isin(picked, cand).all()

    def test_registered_name_matches(self) -> None:
        assert self.make().registered_name == self.strategy


def _instantiate() -> None:
    from scarcelab.active import STRATEGIES

    for name in STRATEGIES.names():
        globals()[f"TestStrategyContract_{name}"] = type(
            f"TestStrategyContract_{name}", (StrategyContract,), {"strategy": name})


_instantiate()


def test_cdalbench_strategies_are_registered() -> None:
    from conftest import CDALBENCH_STRATEGIES

    from scarcelab.active import STRATEGIES

    assert CDALBENCH_STRATEGIES <= set(STRATEGIES.names())
