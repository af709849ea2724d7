"""Likelihood-based surprise adequacy (Kim et al., 2019) as an AL score.

LSA = -log f_c(e): the negative log density of a candidate's embedding under a kernel
density estimate of the labeled embeddings of its predicted class c. Low-density points are
surprising. With a handful of labeled points per class a full-covariance KDE is singular, so
the kernel is isotropic with Scott's bandwidth on the class's mean per-dimension spread.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from scarcelab.active import register_strategy
from scarcelab.active.base import sq_dists
from scarcelab.active.strategies.dsa import SurpriseAdequacy


def _bandwidth(e: np.ndarray, fallback: float) -> float:
    n, d = e.shape
    sigma = float(e.std(0).mean()) if n > 1 else 0.0
    if sigma <= 0.0:
        sigma = fallback
    return sigma * n ** (-1.0 / (d + 4))


def lsa_scores(emb_c: np.ndarray, pred: np.ndarray, emb_l: np.ndarray,
               y_l: np.ndarray) -> np.ndarray:
    emb_c = np.asarray(emb_c, dtype=np.float64)
    emb_l = np.asarray(emb_l, dtype=np.float64)
    d = emb_c.shape[1]
    pooled = float(emb_l.std(0).mean()) if len(emb_l) > 1 else 0.0
    fallback = pooled if pooled > 0 else 1.0
    out = np.full(len(emb_c), np.inf)
    for c in np.unique(pred):
        ref = emb_l[y_l == c]
        rows = np.flatnonzero(pred == c)
        if len(ref) == 0:
            continue  # no labeled point of the predicted class: maximally surprising
        h = _bandwidth(ref, fallback)
        d2 = sq_dists(torch.from_numpy(emb_c[rows]), torch.from_numpy(ref))
        logf = (torch.logsumexp(-d2 / (2 * h * h), 1).numpy() - math.log(len(ref))
                - d * math.log(h * math.sqrt(2 * math.pi)))
        out[rows] = -logf
    return out


@register_strategy("lsa")
class LSA(SurpriseAdequacy):
    scores = staticmethod(lsa_scores)
