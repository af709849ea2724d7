"""Mechanics shared by several methods; each exists once, here.

Method files compose these instead of re-implementing them, so a fix (e.g. to how the
confidence mask treats ties) lands in every method at once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def confidence_mask(
    logits: torch.Tensor, threshold: float, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Hard pseudo-labels and the mask of samples whose confidence reaches ``threshold``.

    Returns ``(mask, pseudo_labels, probs)``; ``mask`` is float so that the masked loss
    is ``(loss * mask).mean()`` — averaged over *all* unlabeled samples as in FixMatch,
    which makes the unlabeled term shrink naturally while few samples pass. No gradient
    flows through pseudo-labels.
    """
    probs = torch.softmax(logits.detach() / temperature, dim=-1)
    conf, pseudo = probs.max(dim=-1)
    return (conf >= threshold).float(), pseudo, probs


def masked_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Mean over all samples of ``mask * CE``: zero (with a graph) when nothing passes."""
    return (F.cross_entropy(logits, targets, reduction="none") * mask).mean()


class ProjectionHead(nn.Module):
    """MLP projection head (Linear-BN-ReLU ... Linear), as in SimCLR v1/MoCo v2.

    Contrastive losses are computed on the projection, the probe on the backbone
    features before it: SimCLR (Chen et al. 2020, §4.2) shows the pre-projection
    representation is the better one for downstream linear classification.
    """

    def __init__(self, in_dim: int, hidden_dim: int, out_dim: int, layers: int = 2) -> None:
        super().__init__()
        mods: list[nn.Module] = []
        dim = in_dim
        for _ in range(layers - 1):
            mods += [nn.Linear(dim, hidden_dim, bias=False), nn.BatchNorm1d(hidden_dim),
                     nn.ReLU(inplace=True)]
            dim = hidden_dim
        mods.append(nn.Linear(dim, out_dim))
        self.net = nn.Sequential(*mods)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def split_logits(logits: torch.Tensor, sizes: list[int]) -> tuple[torch.Tensor, ...]:
    """Undo a concatenated forward pass (one pass keeps BatchNorm statistics joint)."""
    return tuple(logits.split(sizes))


@torch.no_grad()
def ema_update(target: nn.Module, source: nn.Module, momentum: float) -> None:
    """``target <- momentum * target + (1 - momentum) * source`` for parameters; buffers
    (BatchNorm running statistics) are copied, as in Mean Teacher, MoCo, BYOL and DINO."""
    for t, s in zip(target.parameters(), source.parameters(), strict=True):
        t.mul_(momentum).add_(s.detach(), alpha=1.0 - momentum)
    for t, s in zip(target.buffers(), source.buffers(), strict=True):
        t.copy_(s)


def sharpen(probs: torch.Tensor, temperature: float) -> torch.Tensor:
    """Temperature sharpening of a distribution (MixMatch Eq. 7): p^(1/T), renormalised."""
    p = probs ** (1.0 / temperature)
    return p / p.sum(dim=-1, keepdim=True)


class FeatureQueue(nn.Module):
    """A fixed-size FIFO of vectors (and optional integer labels / soft labels).

    Serves MoCo's negatives queue and CoMatch's memory bank alike. Stored as buffers so a
    checkpoint restores it; ``filled`` tells how many rows are valid yet.
    """

    def __init__(self, size: int, dim: int, label_dim: int = 0) -> None:
        super().__init__()
        self.register_buffer("feats", torch.zeros(size, dim))
        self.register_buffer("labels", torch.zeros(size, max(label_dim, 1)))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))
        self.size = size

    @property
    def filled(self) -> int:
        return int(self.count)

    @torch.no_grad()
    def push(self, feats: torch.Tensor, labels: torch.Tensor | None = None) -> None:
        n = feats.shape[0]
        if n >= self.size:  # keep the newest `size` rows
            feats = feats[-self.size :]
            labels = labels[-self.size :] if labels is not None else None
            n = self.size
        idx = (int(self.ptr) + torch.arange(n, device=feats.device)) % self.size
        self.feats[idx] = feats.detach().to(self.feats.dtype)
        if labels is not None:
            self.labels[idx] = labels.detach().reshape(n, -1).to(self.labels.dtype)
        self.ptr.fill_((int(self.ptr) + n) % self.size)
        self.count.fill_(min(self.size, int(self.count) + n))

    def get(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Valid rows (order not significant)."""
        n = self.filled
        return self.feats[:n], self.labels[:n]
