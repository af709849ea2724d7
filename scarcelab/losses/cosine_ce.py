"""Cosine loss plus cross-entropy (Barz & Denzler, WACV 2020, §3.3; gem
``OneHotCosineXentLoss``):

    L = (1 − e_y) + λ_xent · CE(logits, y),

where ``e`` is the L2-normalised embedding (its cosine with the one-hot target of class
``y`` is ``e_y``) and ``logits`` come from the extra layer on top of it. The two terms are
returned separately too, since the method logs both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def cosine_ce_loss(emb: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor,
                   xent_weight: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(total, cosine term, cross-entropy term), all means over the batch; ``emb`` is
    already L2-normalised."""
    cos = (1.0 - emb.gather(1, labels[:, None]).squeeze(1)).mean()
    ce = F.cross_entropy(logits, labels)
    return cos + xent_weight * ce, cos, ce
