"""``ole``: Orthogonal Low-rank Embedding (Lezama et al., CVPR 2018), cross-entropy plus
``λ_ole`` times the OLÉ loss on the deep features (the input of the classifier layer).

OLÉ (paper Eq. 3; :mod:`scarcelab.losses.ole`) shrinks every class of the batch's features to
a low-rank subspace while keeping their union high-rank.

Deviation, stated: gem's ``OleClassifier`` builds ``OleLoss()`` without passing its
``lambda`` hyperparameter (so it always uses 0.25); here ``lambda_ole`` is used and
searched. Search range ``logU(0.01, 1)`` around the paper's 0.25 is ours (the benchmark's
method-specific ranges are not in the public code).
"""

from __future__ import annotations

import torch.nn.functional as F

from scarcelab.losses.ole import ole_loss
from scarcelab.methods import Batch, Losses, Progress, register
from scarcelab.methods.space import LogUniform
from scarcelab.methods.supervised._deic import COMMON_DEFAULTS, COMMON_SPACE, DEICMethod


@register("ole")
class OLE(DEICMethod):
    paper = "Lezama et al. 2018, OLÉ: Orthogonal Low-rank Embedding, arXiv:1712.01727"
    search_space = {**COMMON_SPACE, "lambda_ole": LogUniform(0.01, 1.0)}
    defaults = {**COMMON_DEFAULTS, "lambda_ole": 0.25}

    def step(self, batch: Batch, progress: Progress) -> Losses:
        feats = self.backbone(batch.x[0])
        ce = F.cross_entropy(self.head(feats), batch.y)
        ole = ole_loss(feats, batch.y)
        loss = ce + float(self.hp["lambda_ole"]) * ole
        return {"loss": loss, "loss_labeled": ce, "ole": ole.detach()}
