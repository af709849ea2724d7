"""InfoNCE with explicit negatives: the MoCo form of the contrastive loss (He et al. 2020).

Each query ``q[i]`` is scored against its positive key ``k[i]`` and a set of negatives
(MoCo: a queue of keys from earlier batches, produced by the slowly moving key encoder).
Unlike NT-Xent, queries are never compared with each other: only keys are negatives,
which is what lets the queue be far larger than the batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def info_nce(
    q: torch.Tensor,
    k: torch.Tensor,
    negatives: torch.Tensor | None,
    temperature: float,
    *,
    in_batch: bool = True,
) -> torch.Tensor:
    """Mean cross-entropy of picking ``k[i]`` for ``q[i]`` among the candidate keys.

    Candidates are ``negatives`` (rows, e.g. the queue) plus, when ``in_batch``, the keys
    of the other samples in the batch: with an empty queue (the first step) the loss is
    then still informative instead of a constant 0. All vectors are L2-normalised here.
    Keys and negatives carry no gradient (the key encoder is updated by momentum only).
    """
    if q.ndim != 2 or q.shape != k.shape:
        raise ValueError(f"info_nce expects q and k of equal shape (N, D), got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}")
    q = F.normalize(q, dim=1)
    k = F.normalize(k.detach(), dim=1)
    n = q.shape[0]
    if in_batch:  # row i: all keys of the batch, positive on the diagonal
        parts = [q @ k.t()]
        target = torch.arange(n, device=q.device)
    else:  # row i: the positive first, then negatives only (MoCo's logits layout)
        parts = [(q * k).sum(1, keepdim=True)]
        target = torch.zeros(n, dtype=torch.long, device=q.device)
    if negatives is not None and len(negatives):
        parts.append(q @ F.normalize(negatives.detach().to(q.dtype), dim=1).t())
    return F.cross_entropy(torch.cat(parts, dim=1) / temperature, target)
