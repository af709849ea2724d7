"""CoMatch's graph contrastive loss (Li, Xiong & Hoi, ICCV 2021, Eq. 6-8).

The pseudo-label graph ``W = q qᵀ`` (self-loops set to 1, edges below a cut-off removed,
each row normalised to sum 1) is the target for the embedding graph
``softmax(z1 · z2ᵀ / T)`` of two strong views: samples CoMatch believes share a class are
pulled together in embedding space, the rest pushed apart. Row normalisation follows the
authors' ``Train_CoMatch.py`` (``Q = Q / Q.sum(1, keepdim=True)``): row i is the target
distribution over the samples j that sample i should be close to.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def graph_contrastive_loss(
    q: torch.Tensor, z1: torch.Tensor, z2: torch.Tensor, temperature: float, cutoff: float
) -> torch.Tensor:
    """Cross-entropy between the row-normalised pseudo-label graph of ``q`` (N, C)
    (edges below ``cutoff`` dropped, self-loops kept) and ``softmax(z1 z2ᵀ / T)``.

    ``z1``/``z2`` (N, D) must be L2-normalised. With uncertain ``q`` (every ``q_i·q_j``
    below the cut-off) the graph is the identity and this reduces to an
    instance-contrastive (SimCLR-like) loss."""
    graph = q @ q.t()
    graph.fill_diagonal_(1.0)
    graph = graph * (graph >= cutoff).float()
    graph = graph / graph.sum(dim=1, keepdim=True)
    log_sim = F.log_softmax(z1 @ z2.t() / temperature, dim=1)
    return -(graph * log_sim).sum(dim=1).mean()
