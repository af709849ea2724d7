"""``comatch`` (Li, Xiong & Hoi, ICCV 2021): co-trained class probabilities and
low-dimensional embeddings that regularise each other.

Per step, from one joint forward pass over the labeled weak view and three views of the
unlabeled images (weak; strong = RandAugment; SimCLR-style, as in the paper's CIFAR code):

1. pseudo-labels from the weak view, distribution-aligned toward uniform with the mean
   prediction of the last 32 batches;
2. *memory smoothing*: once the memory bank (embeddings and class distributions of
   recent weak labeled + unlabeled samples, a ``FeatureQueue``) is full, each
   pseudo-label is mixed with the embedding-similarity-weighted memory labels,
   ``q = α p + (1 − α) softmax(z·Z_mem/T) Q_mem`` (α = 0.9). The memory stores the
   distribution-aligned prediction ``p`` *before* smoothing (one-hot labels for labeled
   samples), so smoothing never feeds on its own output across steps: the authors'
   Train_CoMatch.py keeps ``probs_orig = probs.clone()`` before smoothing and pushes
   ``probs_w = torch.cat([probs_orig, onehot])``; USB's comatch.py does the same, and
   the paper describes the memory bank as weak-view class probabilities and embeddings;
3. unlabeled loss: soft cross-entropy of the strong view against ``q``, kept where
   ``max q ≥ τ`` (0.95);
4. graph contrastive loss: the pseudo-label graph ``W = q qᵀ`` (self-loops 1, edges
   below 0.8 removed, rows normalised) is the target for the embedding graph
   ``softmax(z_s0 · z_s1ᵀ / T)`` of the two strong views (T = 0.2)
   (:mod:`scarcelab.losses.graph_contrastive`).

Defaults are the paper's CIFAR-10 values (λc = 1, memory K = 2560 = 5 batches of
64 + 448, 64-d projection). Search space: SSL-vs-SSL App. F.1 (λU = 10^U(−1,1),
λc = 5·10^U(−1,1)); with smaller (CPU) batches a proportionally smaller ``memory_size``
keeps the memory as fresh as in the paper.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from scarcelab.losses.graph_contrastive import graph_contrastive_loss
from scarcelab.methods import Batch, Losses, Progress, PseudoTargets, SemiMethod, register
from scarcelab.methods._parts import (
    DistributionAlignment,
    FeatureQueue,
    ProjectionHead,
    soft_cross_entropy,
)
from scarcelab.methods.space import CLASSIFIER_DEFAULTS, CLASSIFIER_SPACE, pow10
from scarcelab.models import num_features


@register("comatch")
class CoMatch(SemiMethod):
    paper = "Li, Xiong & Hoi 2021, CoMatch, arXiv:2011.11183"
    has_pseudo_labels = True
    search_space = {
        **CLASSIFIER_SPACE,
        "lambda_u": pow10(1, -1, 1),
        "lambda_c": pow10(5, -1, 1),
    }
    defaults = {**CLASSIFIER_DEFAULTS, "lambda_u": 1.0, "lambda_c": 1.0,
                "threshold": 0.95, "temperature": 0.2, "contrast_threshold": 0.8,
                "alpha": 0.9, "proj_dim": 64, "memory_size": 2560, "da_window": 32}
    views = ("weak", "strong", "simclr")

    @classmethod
    def check_hparams(cls, hp: dict[str, Any]) -> None:
        # the pseudo-label graph's self-loops are 1 (Li et al.'s Train_CoMatch.py sets
        # the diagonal to 1 before the cut-off, as graph_contrastive_loss does): a
        # cut-off above 1 removes every edge and the row normalisation divides by zero
        c = float(hp["contrast_threshold"])
        cls._require(0.0 <= c <= 1.0, "comatch", "contrast_threshold", hp["contrast_threshold"],
                     "is outside [0, 1]: above 1 even the pseudo-label graph's self-loops are "
                     "cut and the contrastive loss is NaN; use a value in [0, 1] (default 0.8)")

    def __init__(self, backbone: nn.Module, num_classes: int, hp: dict[str, Any]) -> None:
        super().__init__(backbone, num_classes, hp)
        d = num_features(backbone)
        dim = int(self.hp["proj_dim"])
        self.projector = ProjectionHead(d, d, dim)
        self.memory = FeatureQueue(int(self.hp["memory_size"]), dim, label_dim=num_classes)
        self.align = DistributionAlignment(num_classes, window=int(self.hp["da_window"]))

    @torch.no_grad()
    def smooth(self, probs: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Memory-smoothed pseudo-labels (CoMatch Eq. 3); identity until memory is full."""
        if self.memory.filled < self.memory.size:
            return probs
        feats, labels = self.memory.get()
        affinity = torch.softmax(z @ feats.t() / float(self.hp["temperature"]), dim=1)
        alpha = float(self.hp["alpha"])
        return alpha * probs + (1.0 - alpha) * affinity @ labels

    @torch.no_grad()
    def _targets(self, logits_weak: torch.Tensor, z_weak: torch.Tensor, update: bool
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(aligned prediction p, memory-smoothed pseudo-label q, mask max q ≥ τ).
        ``update=False`` reads the alignment's running marginal without adding to it."""
        probs = self.align(torch.softmax(logits_weak.detach(), dim=-1), update=update)
        q = self.smooth(probs, z_weak)
        mask = (q.max(dim=-1).values >= float(self.hp["threshold"])).float()
        return probs, q, mask

    def _pseudo_targets(self, x: torch.Tensor, index: torch.Tensor | None) -> PseudoTargets:
        feats = self.backbone(x)
        logits = self.head(feats)
        z = F.normalize(self.projector(feats), dim=1)
        _, q, mask = self._targets(logits, z, update=False)
        return PseudoTargets(logits, q.argmax(dim=-1), mask)

    def step(self, batch: Batch, progress: Progress) -> Losses:
        x, (u_w, u_s0, u_s1) = batch.x[0], batch.u
        sizes = [len(x), len(u_w), len(u_s0), len(u_s1)]
        feats = self.backbone(torch.cat([x, u_w, u_s0, u_s1]))
        logits = self.head(feats)
        z = F.normalize(self.projector(feats), dim=1)
        l_x, l_w, l_s0, _ = logits.split(sizes)
        z_x, z_w, z_s0, z_s1 = z.split(sizes)
        loss_l = self.labeled_loss(l_x, batch.y)

        with torch.no_grad():
            z_w_d = z_w.detach()
            probs, q, mask = self._targets(l_w, z_w_d, update=True)
            onehot = F.one_hot(batch.y, self.num_classes).float()
            # the aligned prediction before smoothing goes into memory (see docstring)
            self.memory.push(torch.cat([z_w_d, z_x.detach()]), torch.cat([probs, onehot]))

        loss_u = (soft_cross_entropy(l_s0, q, reduction="none") * mask).mean()
        loss_c = graph_contrastive_loss(q, z_s0, z_s1, float(self.hp["temperature"]),
                                        float(self.hp["contrast_threshold"]))
        return {
            "loss": loss_l + float(self.hp["lambda_u"]) * loss_u
            + float(self.hp["lambda_c"]) * loss_c,
            "loss_labeled": loss_l,
            "loss_unlabeled": loss_u,
            "loss_contrastive": loss_c,
            "mask_rate": mask.mean(),
        }
