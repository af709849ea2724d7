"""DINO's self-distillation loss (Caron et al. 2021, Eq. 1-2 and Algorithm 1).

The teacher's output is *centred* (a running mean is subtracted) and *sharpened* (a low
temperature); the student's cross-entropy to it is averaged over pairs of different views.
Centring alone would push towards a uniform output and sharpening alone towards one
dominant dimension; together they avoid both collapses (DINO §3.1).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def dino_loss(
    student: list[torch.Tensor],
    teacher: list[torch.Tensor],
    center: torch.Tensor,
    student_temp: float,
    teacher_temp: float,
) -> torch.Tensor:
    """Mean over view pairs (s ≠ t) of ``H(softmax((t - c)/τt), softmax(s/τs))``.

    ``student[v]`` / ``teacher[v]`` are (N, K) logits of view v; ``center`` is (1, K) or
    (K,). The teacher side carries no gradient.
    """
    if len(student) != len(teacher) or len(student) < 2:
        raise ValueError("dino_loss needs at least two views from student and teacher")
    targets = [F.softmax((t.detach() - center) / teacher_temp, dim=1) for t in teacher]
    logs = [F.log_softmax(s / student_temp, dim=1) for s in student]
    total = student[0].new_zeros(())
    pairs = 0
    for ti, p in enumerate(targets):
        for si, log_q in enumerate(logs):
            if si == ti:
                continue
            total = total - (p * log_q).sum(1).mean()
            pairs += 1
    return total / pairs


@torch.no_grad()
def update_center(center: torch.Tensor, teacher: list[torch.Tensor], momentum: float) -> None:
    """In place: ``c <- m·c + (1 - m)·mean of the teacher outputs over views and batch``."""
    batch_mean = torch.cat([t.detach() for t in teacher]).mean(0, keepdim=True)
    center.mul_(momentum).add_(batch_mean.reshape(center.shape), alpha=1.0 - momentum)
