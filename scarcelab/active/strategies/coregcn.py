"""CoreGCN (Caramalau et al., 2021): core-set on features of a GCN over the pool graph.

Nodes are labeled and candidate points; edges are the cosine similarities of their
classifier embeddings (self-loops removed, row-normalised, identity added). A two-layer GCN
is trained to tell labeled from unlabeled nodes (binary cross-entropy, unlabeled term
weighted by ``lambda_u``); its hidden features thus encode how far a point lies from the
labeled set *through the graph*, i.e. propagated uncertainty. Greedy k-center on those
features, starting from the labeled nodes, picks the query. The dense graph is quadratic
in the node count, hence the smaller default candidate subsample.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F  # noqa: N812

from scarcelab.active import register_strategy
from scarcelab.active.base import QueryState, Strategy, k_center_greedy


def normalized_adjacency(emb: np.ndarray) -> torch.Tensor:
    e = F.normalize(torch.from_numpy(np.ascontiguousarray(emb, dtype=np.float32)), dim=1)
    adj = e @ e.T
    adj.fill_diagonal_(0.0)
    adj = adj.clamp_min(0.0)
    adj = adj / adj.sum(1, keepdim=True).clamp_min(1e-8)
    return adj + torch.eye(len(e))


@register_strategy("coregcn")
class CoreGCN(Strategy):
    max_candidates = 1000
    hidden: int = 64
    epochs: int = 50
    lr: float = 1e-3
    weight_decay: float = 5e-4
    lambda_u: float = 1.2
    dropout: float = 0.3

    def gcn_features(self, emb: np.ndarray, n_labeled: int,
                     gen: torch.Generator) -> np.ndarray:
        adj = normalized_adjacency(emb)
        x = torch.from_numpy(np.ascontiguousarray(emb, dtype=np.float32))
        ax = adj @ x  # the first layer's propagation does not depend on the weights
        d = x.shape[1]
        w1 = ((torch.rand(d, self.hidden, generator=gen) * 2 - 1) / d ** 0.5).requires_grad_()
        w2 = ((torch.rand(self.hidden, 1, generator=gen) * 2 - 1) / self.hidden ** 0.5
              ).requires_grad_()
        opt = torch.optim.Adam([w1, w2], lr=self.lr, weight_decay=self.weight_decay)
        target = torch.zeros(len(x), 1)
        target[:n_labeled] = 1.0
        weight = torch.full((len(x), 1), self.lambda_u)
        weight[:n_labeled] = 1.0
        for _ in range(self.epochs):
            h = F.relu(ax @ w1)
            keep = torch.rand(h.shape, generator=gen) >= self.dropout
            out = adj @ ((h * keep / (1 - self.dropout)) @ w2)
            loss = F.binary_cross_entropy_with_logits(out, target, weight=weight)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            return F.relu(ax @ w1).numpy()

    def select(self, state: QueryState, q: int, rng: np.random.Generator) -> np.ndarray:
        emb = state.model.embed(np.concatenate([state.x[state.labeled],
                                                state.x[state.candidates]]))
        gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
        feats = self.gcn_features(emb, len(state.labeled), gen)
        n_lab = len(state.labeled)
        return state.candidates[k_center_greedy(feats[n_lab:], feats[:n_lab], q)]
