"""``flexmatch`` (Zhang et al., NeurIPS 2021): FixMatch with curriculum pseudo-labelling —
class-wise thresholds ``τ·M(σ_c)`` that rise as class c is learned.

The learning effect σ_c is estimated over the *whole unlabeled pool*: every sample
remembers the class it was last predicted as with confidence ≥ τ (``LearningStatus``,
sized from ``DataInfo.n_unlabeled`` and indexed by ``Batch.u_index``). Defaults follow
the paper (τ = 0.95, convex mapping x/(2−x), hard labels, T = 1, λU = 1) including its
*threshold warm-up* (paper Eq. 11: the still-unused samples count as one more class in
the normaliser ``max(max_c σ_c, N − Σ_c σ_c)``, so thresholds rise gradually while most
of the pool is unused), which is on by default in the paper and in USB
(``thresh_warmup=True`` in semilearn/algorithms/flexmatch/flexmatch.py and
``FlexMatchThresholdingHook``). SSL-vs-SSL App. F.1's "no warm-up" refers to the λU
ramp, which FlexMatch does not have either; ``threshold_warmup=False`` is kept as an
option (the paper's ablation). Search space as fixmatch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from scarcelab.methods import (
    Batch,
    DataInfo,
    Losses,
    Progress,
    PseudoTargets,
    SemiMethod,
    register,
)
from scarcelab.methods._parts import LearningStatus, joint_forward, masked_cross_entropy
from scarcelab.methods.space import CLASSIFIER_DEFAULTS, CLASSIFIER_SPACE, pow10


@register("flexmatch")
class FlexMatch(SemiMethod):
    paper = "Zhang et al. 2021, FlexMatch, arXiv:2110.08263"
    has_pseudo_labels = True
    search_space = {
        **CLASSIFIER_SPACE,
        "lambda_u": pow10(1, -1, 1),
    }
    defaults = {**CLASSIFIER_DEFAULTS, "lambda_u": 1.0, "threshold": 0.95,
                "temperature": 1.0, "threshold_warmup": True}
    views = ("weak", "strong")

    def __init__(self, backbone: nn.Module, num_classes: int, hp: dict[str, Any]) -> None:
        super().__init__(backbone, num_classes, hp)
        self.status = LearningStatus(num_classes)

    def on_train_start(self, info: DataInfo) -> None:
        self.status.reset(info.n_unlabeled, device=self.head.weight.device)

    def _targets(self, logits_weak: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(confidence, pseudo-label, mask, class thresholds) from the weak view and the
        current learning status; reads the status, never updates it."""
        probs = torch.softmax(logits_weak.detach() / float(self.hp["temperature"]), dim=-1)
        conf, pseudo = probs.max(dim=-1)
        class_thr = self.status.thresholds(float(self.hp["threshold"]),
                                           bool(self.hp["threshold_warmup"]))
        return conf, pseudo, (conf >= class_thr[pseudo]).float(), class_thr

    def _pseudo_targets(self, x: torch.Tensor, index: torch.Tensor | None) -> PseudoTargets:
        logits = self.logits(x)
        _, pseudo, mask, _ = self._targets(logits)
        return PseudoTargets(logits, pseudo, mask)

    def step(self, batch: Batch, progress: Progress) -> Losses:
        if batch.u_index is None:
            raise ValueError("flexmatch needs Batch.u_index to track per-sample learning status")
        if len(self.status.selected) == 0:
            raise RuntimeError("flexmatch: on_train_start(DataInfo) was not called")
        x, (u_weak, u_strong) = batch.x[0], batch.u
        l_x, l_w, l_s = joint_forward(self.logits, x, u_weak, u_strong)
        loss_l = self.labeled_loss(l_x, batch.y)
        conf, pseudo, mask, class_thr = self._targets(l_w)
        # thresholds of this step come from the status *before* this batch (USB order)
        self.status.update(batch.u_index.to(pseudo.device), pseudo, conf,
                           float(self.hp["threshold"]))
        loss_u = masked_cross_entropy(l_s, pseudo, mask)
        return {
            "loss": loss_l + float(self.hp["lambda_u"]) * loss_u,
            "loss_labeled": loss_l,
            "loss_unlabeled": loss_u,
            "mask_rate": mask.mean(),
            "threshold": class_thr.mean(),
        }
