"""The greedy oracle of CDALBench: a cheap, strong upper reference for other strategies.

For each of the ``q`` picks it samples ``tau`` candidates (strategy RNG), retrains the
classifier with each one added (same batch order and dropout masks for all), and keeps the
one with the best *test* accuracy. Candidates come from the whole unlabeled pool. If none
improves on the accuracy so far, it falls back to the smallest-margin point of the whole
pool — CDALBench found that adding a point which hurts at this step can still be necessary,
and margin is the strongest cheap choice. It reads test labels by design, so
it is a reference, never a method.
"""

from __future__ import annotations

import numpy as np

from scarcelab.active import register_strategy
from scarcelab.active.base import QueryState, Strategy, top_q
from scarcelab.active.strategies.margin import margin_scores


@register_strategy("oracle")
class GreedyOracle(Strategy):
    needs_oracle = True
    tau: int = 20
    #: The τ candidates are drawn from, and the margin fallback ranks, the whole unlabeled
    #: pool (CDALBench's ``OracleALGame.step`` samples ``pool_rng.choice(len(x_unlabeled),
    #: τ)``), never a 5,000-point subsample.
    max_candidates = None

    def select(self, state: QueryState, q: int, rng: np.random.Generator) -> np.ndarray:
        if state.oracle_score is None:
            raise RuntimeError("the oracle strategy needs QueryState.oracle_score (the AL loop "
                               "sets it for strategies with needs_oracle = True)")
        chosen: list[int] = []
        best_so_far = state.current_accuracy if state.current_accuracy is not None else -1.0
        margins = -margin_scores(state.model.predict_proba(state.x[state.candidates]))
        for _ in range(q):
            free = np.flatnonzero(~np.isin(state.candidates, chosen))
            sample = rng.choice(free, min(self.tau, len(free)), replace=False)
            sets = [np.asarray([*chosen, state.candidates[i]]) for i in sample]
            scores = (state.oracle_scores(sets) if state.oracle_scores is not None
                      else [state.oracle_score(e) for e in sets])
            i_best = int(np.argmax(scores))
            if scores[i_best] > best_so_far:
                chosen.append(int(state.candidates[sample[i_best]]))
                best_so_far = scores[i_best]
            else:
                chosen.append(int(top_q(margins[free], 1, state.candidates[free])[0]))
        return np.asarray(chosen, dtype=np.int64)
