"""TypiClust (Hacohen et al., 2022): typical points of uncovered clusters.

Built for the low-budget regime, where diverse *and* representative points beat uncertain
ones: cluster the embeddings of labeled and candidate points into |L| + q clusters (at most
``max_clusters``), then repeatedly take the cluster with the fewest labeled points (largest
first among ties, ignoring clusters smaller than ``min_cluster_size``) and query its most
typical candidate, typicality being the inverse mean distance to the ``knn`` nearest
neighbours inside the cluster.

``space`` says where the clusters live: ``embedding`` (default, the paper's: a learned
representation, here the classifier's penultimate activations) or ``raw`` (the inputs
themselves, flattened: what CDALBench's ``agents/typiclust.py`` clusters, with no
encoder). The raw option exists to measure whether that difference explains CDALBench's
USPS rows (docs/active.md, "USPS: core-set and TypiClust above the paper").
"""

from __future__ import annotations

import numpy as np

from scarcelab.active import register_strategy
from scarcelab.active.base import QueryState, Strategy, sq_dists


def typicality(emb: np.ndarray, knn: int) -> np.ndarray:
    import torch

    e = torch.from_numpy(np.ascontiguousarray(emb, dtype=np.float32))
    k = min(knn, len(emb) - 1)
    if k < 1:
        return np.ones(len(emb))
    d = sq_dists(e, e).sqrt_()
    nn = torch.topk(d, k + 1, largest=False).values[:, 1:]  # drop the point itself
    return (1.0 / (nn.mean(1) + 1e-8)).numpy()


@register_strategy("typiclust")
class TypiClust(Strategy):
    max_clusters: int = 500
    min_cluster_size: int = 5
    knn: int = 20
    space: str = "embedding"

    def __init__(self, **params: object) -> None:
        super().__init__(**params)
        if self.space not in ("embedding", "raw"):
            raise ValueError(f"typiclust: space={self.space!r} is not 'embedding' or 'raw' "
                             "(scarcelab al --set strategy.space=raw)")

    def select(self, state: QueryState, q: int, rng: np.random.Generator) -> np.ndarray:
        # Imported here, not at the top: the registry imports every strategy file to look
        # one name up, and sklearn's import was 1.2-1.7 of the 3.8-4.4 CPU-seconds that
        # importing the loop and looking up any strategy took (measured with bench/al_peers.py).
        from sklearn.cluster import KMeans

        n_lab = len(state.labeled)
        pts = np.concatenate([state.x[state.labeled], state.x[state.candidates]])
        emb = pts.reshape(len(pts), -1) if self.space == "raw" else state.model.embed(pts)
        k = int(min(n_lab + q, self.max_clusters, len(emb)))
        # sklearn is unannotated: n_init's type is inferred from its "auto" default (str)
        km = KMeans(n_clusters=k, n_init=1, max_iter=100,  # pyright: ignore[reportArgumentType]
                    random_state=int(rng.integers(2**31 - 1)))
        assign = km.fit_predict(emb.astype(np.float64))
        sizes = np.bincount(assign, minlength=k)
        covered = np.bincount(assign[:n_lab], minlength=k)
        taken = np.zeros(len(emb), dtype=bool)
        taken[:n_lab] = True
        picks: list[int] = []
        typ_cache: dict[int, np.ndarray] = {}
        for _ in range(q):
            free = np.bincount(assign[~taken], minlength=k) > 0
            ok = free & (sizes >= self.min_cluster_size)
            if not ok.any():
                ok = free
            cl = int(min(np.flatnonzero(ok), key=lambda c: (covered[c], -sizes[c], c)))
            members = np.flatnonzero(assign == cl)
            if cl not in typ_cache:
                typ_cache[cl] = typicality(emb[members], self.knn)
            typ = np.where(taken[members], -np.inf, typ_cache[cl])
            best = int(members[int(np.argmax(typ))])
            picks.append(best)
            taken[best] = True
            covered[cl] += 1
        return state.candidates[np.asarray(picks) - n_lab]
