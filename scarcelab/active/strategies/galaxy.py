"""GALAXY (Zhang et al., 2022): graph-based bisection along the classifier's score lines.

For each class c, labeled and candidate points are ordered by the one-vs-rest margin
p_c - max_{c'≠c} p_{c'} and joined into a path graph. Wherever two consecutive *labeled*
nodes on a path disagree on "is class c", the decision boundary lies between them; the
shortest such stretch of unlabeled nodes is the most informative, and its midpoint is
queried (bisection, as in the S² algorithm GALAXY builds on). One query per stretch,
shortest stretches first; when no stretch remains the rest is filled by margin sampling,
as GALAXY falls back to uncertainty when the graph offers no cut.
"""

from __future__ import annotations

import numpy as np

from scarcelab.active import register_strategy
from scarcelab.active.base import QueryState, Strategy, top_q
from scarcelab.active.strategies.margin import margin_scores


def cut_midpoints(proba: np.ndarray, y_labeled: np.ndarray) -> list[int]:
    """Positions (rows of ``proba`` after the labeled ones) of stretch midpoints, shortest
    stretch first. Rows ``[:len(y_labeled)]`` of ``proba`` are the labeled nodes."""
    n_lab = len(y_labeled)
    segments: list[tuple[int, int, int, int]] = []  # (length, class, start, midpoint row)
    for c in range(proba.shape[1]):
        others = np.delete(proba, c, axis=1).max(1) if proba.shape[1] > 1 else 0.0
        order = np.argsort(proba[:, c] - others, kind="stable")
        last_lab, last_pos, between = None, -1, []
        for pos, node in enumerate(order):
            if node < n_lab:
                is_c = bool(y_labeled[node] == c)
                if last_lab is not None and is_c != last_lab and between:
                    segments.append((len(between), c, last_pos, int(between[len(between) // 2])))
                last_lab, last_pos, between = is_c, pos, []
            else:
                between.append(node)
    segments.sort()
    seen: set[int] = set()
    out = []
    for _, _, _, row in segments:
        if row not in seen:
            seen.add(row)
            out.append(row - n_lab)
    return out


@register_strategy("galaxy")
class Galaxy(Strategy):
    def select(self, state: QueryState, q: int, rng: np.random.Generator) -> np.ndarray:
        xc = state.x[state.candidates]
        p_c = state.model.predict_proba(xc)
        p_l = state.model.predict_proba(state.x[state.labeled])
        picks = cut_midpoints(np.concatenate([p_l, p_c]), state.y_labeled)[:q]
        if len(picks) < q:
            rest = np.setdiff1d(np.arange(len(xc)), picks)
            fill = top_q(-margin_scores(p_c[rest]), q - len(picks), rest)
            picks = [*picks, *fill.tolist()]
        return state.candidates[np.asarray(picks, dtype=np.int64)]
