"""Mechanics shared by several methods; each exists once, here.

Method files compose these instead of re-implementing them, so a fix (e.g. to how the
confidence mask treats ties) lands in every method at once.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

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
    flows through pseudo-labels. A confidence exactly equal to ``threshold`` passes
    (``>=``, as FixMatch's and USB's ``max_probs.ge(p_cutoff)``).
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


def joint_forward(fn: Callable[[torch.Tensor], torch.Tensor], *parts: torch.Tensor
                  ) -> tuple[torch.Tensor, ...]:
    """``fn`` over the concatenation of ``parts``, split back into one output per part.

    Semi-supervised methods pass the labeled batch and the unlabeled views through the
    network *together* so that BatchNorm normalises them with joint batch statistics (the
    FixMatch and USB reference implementations concatenate ``x`` and ``u`` the same way);
    this keeps that one pass and the bookkeeping of where each part's rows are in one place.
    """
    return tuple(fn(torch.cat(parts)).split([len(p) for p in parts]))


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


class _HostMirror:
    """Host copies of a module's integer counter buffers, kept in step with them.

    A counter such as a queue's write position changes by amounts the host knows (batch
    sizes), so the host can follow it exactly instead of reading the device buffer back,
    which is a blocking copy on a GPU. The buffers stay the truth for checkpoints:
    loading a state dict drops the mirror, and the next use reads the buffers once."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.values: dict[str, int] | None = dict.fromkeys(names, 0)  # the buffers' start

    def get(self, module: nn.Module) -> dict[str, int]:
        if self.values is None:  # after load_state_dict: one read
            self.values = {n: int(getattr(module, n)) for n in self.names}
        return self.values

    def set(self, module: nn.Module, **values: int) -> None:
        """Write the host values and the buffers (a fill from a host number: no copy)."""
        mirror = self.get(module)
        for n, v in values.items():
            mirror[n] = v
            getattr(module, n).fill_(v)


class FeatureQueue(nn.Module):
    """A fixed-size FIFO of vectors (and optional integer labels / soft labels).

    Serves MoCo's negatives queue and CoMatch's memory bank alike. Stored as buffers so a
    checkpoint restores it; ``filled`` tells how many rows are valid yet. The write
    position and fill count are followed on the host (:class:`_HostMirror`), so pushing
    and reading never wait on the device.
    """

    feats: torch.Tensor  # a registered buffer
    labels: torch.Tensor  # a registered buffer
    ptr: torch.Tensor  # a registered buffer
    count: torch.Tensor  # a registered buffer

    def __init__(self, size: int, dim: int, label_dim: int = 0) -> None:
        super().__init__()
        self.register_buffer("feats", torch.zeros(size, dim))
        self.register_buffer("labels", torch.zeros(size, max(label_dim, 1)))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))
        self.size = size
        self._host = _HostMirror(("ptr", "count"))

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._host.values = None

    @property
    def filled(self) -> int:
        return self._host.get(self)["count"]

    @torch.no_grad()
    def push(self, feats: torch.Tensor, labels: torch.Tensor | None = None) -> None:
        n = feats.shape[0]
        if n >= self.size:  # keep the newest `size` rows
            feats = feats[-self.size :]
            labels = labels[-self.size :] if labels is not None else None
            n = self.size
        host = self._host.get(self)
        ptr, count = host["ptr"], host["count"]
        idx = (ptr + torch.arange(n, device=feats.device)) % self.size
        self.feats[idx] = feats.detach().to(self.feats.dtype)
        if labels is not None:
            self.labels[idx] = labels.detach().reshape(n, -1).to(self.labels.dtype)
        self._host.set(self, ptr=(ptr + n) % self.size, count=min(self.size, count + n))

    def get(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Valid rows (order not significant)."""
        n = self.filled
        return self.feats[:n], self.labels[:n]


# ---------------------------------------------------------------------------------------
# Additions for the supervised / semi-supervised method zoo (mixup, ramps, alignment,
# EMA teacher, class-wise thresholds). Everything below keeps the helpers above unchanged.


def soft_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean",
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """Cross-entropy against a target *distribution* (mixup targets, CoMatch's soft
    pseudo-labels). ``reduction="none"`` keeps one value per sample for masking.

    ``weight`` (C,) scales each class's term, ``-Σ_c w_c t_c log p_c``, and the mean is
    over samples, not over weights: torch's ``F.cross_entropy`` with probability targets
    and ``weight``, which SSL-vs-SSL's MixUp and MixMatch call on their mixed labels
    (tufts-ml/SSL-vs-SSL-benchmark src/MixMatch/libml/utils/misc.py, ``labeledtrain_loss
    = F.cross_entropy(logits_x, mixed_target[:batch_size], weights, reduction='mean')``).
    """
    logp = F.log_softmax(logits, dim=-1)
    if weight is not None:
        logp = logp * weight
    per_sample = -(targets * logp).sum(dim=-1)
    return per_sample if reduction == "none" else per_sample.mean()


def balanced_class_weights(counts: list[int] | torch.Tensor) -> torch.Tensor:
    """Inverse class frequencies of the labeled set, normalised to sum to 1.

    SSL-vs-SSL weights the labeled cross-entropy of every method this way: its
    ``dataset_configs[...]['class_weights']`` (src/config.py; TissueMNIST's
    ``[0.029, 0.195, 0.247, …]`` are ``1/n_c`` over the classes' train counts, scaled to
    sum 1), passed as ``weight`` to each method's labeled ``F.cross_entropy``. A class with
    no labeled sample gets 0 (no labeled term can name it).
    """
    n = torch.as_tensor(counts, dtype=torch.float32)
    inv = torch.where(n > 0, 1.0 / n.clamp(min=1.0), torch.zeros_like(n))
    total = inv.sum()
    if total <= 0:
        raise ValueError("balanced_class_weights: the labeled set has no sample")
    return inv / total


def mixup_draw(alpha: float, n: int, keep_larger: bool = False) -> dict[str, Any] | None:
    """The random part of :func:`mixup` for a batch of ``n``, drawn on the host from the
    global torch RNG in mixup's order (λ, then the partner permutation); ``None`` when
    ``alpha <= 0`` (no mixing, nothing drawn). What ``Method.host_draws`` hands over."""
    if alpha <= 0:
        return None
    lam = float(torch.distributions.Beta(alpha, alpha).sample())
    if keep_larger:
        lam = max(lam, 1.0 - lam)
    return {"lam": lam, "perm": torch.randperm(n)}


def mixup(
    x: torch.Tensor, targets: torch.Tensor, alpha: float, keep_larger: bool = False,
    drawn: dict[str, Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Mixup (Zhang et al. 2018): convex combination with a random partner in the batch.

    ``lam ~ Beta(alpha, alpha)`` is one scalar per batch, as in the paper and MixMatch.
    ``keep_larger`` applies MixMatch's ``lam' = max(lam, 1 - lam)`` so that the mixed
    sample stays closer to its own input, which is what lets MixMatch tell the labeled and
    unlabeled halves of a mixed batch apart. Randomness comes from the global torch RNG,
    which the training loop seeds per trial, so a run is reproducible from its seed:
    ``drawn`` is :func:`mixup_draw`'s result made before the step (the partner
    permutation then arrives on the device with the batch); without it it is drawn here.
    """
    if alpha <= 0:
        return x, targets, 1.0
    d = drawn if drawn is not None else mixup_draw(alpha, x.shape[0], keep_larger)
    assert d is not None
    lam, perm = d["lam"], d["perm"].to(x.device)
    if perm.shape[0] != x.shape[0]:
        raise ValueError(f"mixup: a permutation of {perm.shape[0]} drawn for a batch of "
                         f"{x.shape[0]}")
    mixed_x = lam * x + (1.0 - lam) * x[perm]
    mixed_t = lam * targets + (1.0 - lam) * targets[perm]
    return mixed_x, mixed_t, lam


def linear_rampup(fraction: float, warmup: float) -> float:
    """Weight in [0, 1] growing linearly over the first ``warmup`` share of training.

    Warm-ups are fractions of the planned training length (USB's convention), so they
    scale with ``max_epochs``; ``warmup <= 0`` means no warm-up.
    """
    if warmup <= 0:
        return 1.0
    return min(1.0, max(0.0, fraction / warmup))


def sigmoid_rampup(fraction: float, warmup: float) -> float:
    """``exp(-5 (1 - t)^2)`` ramp of Laine & Aila (2017), used by Mean Teacher and DS3L."""
    if warmup <= 0:
        return 1.0
    t = min(1.0, max(0.0, fraction / warmup))
    return float(torch.exp(torch.tensor(-5.0 * (1.0 - t) ** 2)))


class DistributionAlignment(nn.Module):
    """Distribution alignment of unlabeled predictions (ReMixMatch §3.2).

    Scales every prediction by ``target / running_model_marginal`` and renormalises, so
    the average pseudo-label distribution is pulled toward ``target`` (uniform unless
    given, e.g. the labeled class frequencies). The model marginal is estimated either as
    an EMA of batch means (``momentum``; SoftMatch uses 0.999) or as the mean over the
    last ``window`` batches (CoMatch uses 32). The estimate is updated with the current
    batch *before* aligning it, as both reference implementations do.

    The EMA starts from the *first batch's* mean, not from uniform: USB's
    ``DistAlignEMAHook.update_p`` (semilearn/algorithms/hooks/dist_align.py) sets
    ``p_model = mean(probs)`` while it is still ``None``. Starting at uniform with
    momentum 0.999 would keep ~90 % weight on the uniform start after 100 steps, so the
    alignment would barely act in short runs. ``forward(update=False)`` before any update
    aligns with the batch's own mean for the same reason, without storing it.
    """

    target: torch.Tensor  # a registered buffer
    p_model: torch.Tensor  # a registered buffer
    history: torch.Tensor  # a registered buffer
    n_seen: torch.Tensor  # a registered buffer

    def __init__(
        self,
        num_classes: int,
        momentum: float | None = None,
        window: int | None = None,
        target: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        if (momentum is None) == (window is None):
            raise ValueError("give exactly one of momentum (EMA) or window (moving average)")
        self.momentum = momentum
        self.window = window
        uniform = torch.full((num_classes,), 1.0 / num_classes)
        self.register_buffer("target", uniform if target is None else target / target.sum())
        self.register_buffer("p_model", uniform.clone())
        self.register_buffer("history", torch.zeros(window or 1, num_classes))
        self.register_buffer("n_seen", torch.zeros((), dtype=torch.long))
        self._host = _HostMirror(("n_seen",))

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._host.values = None

    @torch.no_grad()
    def update(self, probs: torch.Tensor) -> None:
        mean = probs.detach().mean(dim=0).to(self.p_model.dtype)
        seen = self._host.get(self)["n_seen"]  # followed on the host: no read-back
        if self.momentum is not None:
            if seen == 0:
                self.p_model.copy_(mean)
            else:
                self.p_model.mul_(self.momentum).add_(mean, alpha=1.0 - self.momentum)
        else:
            slot = seen % int(self.window or 1)
            self.history[slot] = mean
            filled = min(seen + 1, int(self.window or 1))
            self.p_model.copy_(self.history[:filled].mean(dim=0))
        self._host.set(self, n_seen=seen + 1)

    @torch.no_grad()
    def forward(self, probs: torch.Tensor, update: bool = True) -> torch.Tensor:
        if update:
            self.update(probs)
        seen = self._host.get(self)["n_seen"]
        p_model = self.p_model if seen > 0 else probs.detach().mean(dim=0)
        aligned = probs * (self.target + 1e-6) / (p_model + 1e-6)
        return aligned / aligned.sum(dim=-1, keepdim=True)


class EMATeacher(nn.Module):
    """An exponential-moving-average copy of a student network (Mean Teacher).

    The copy is frozen (no gradients) and updated after each optimiser step with decay
    ``min(1 - 1/(step + 1), decay)``: early on the teacher is the plain running average of
    the student (Tarvainen & Valpola's code), so it is not dominated by its random
    initialisation during the first ~1/(1 - decay) steps.
    """

    def __init__(self, student: nn.Module, decay: float) -> None:
        super().__init__()
        self.model = copy.deepcopy(student)
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.decay = decay

    @torch.no_grad()
    def update(self, student: nn.Module, step: int) -> None:
        ema_update(self.model, student, min(1.0 - 1.0 / (step + 1), self.decay))

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


class LearningStatus(nn.Module):
    """FlexMatch's curriculum pseudo-labelling (Zhang et al. 2021, Eqs. 6-11).

    Keeps, per unlabeled sample, the last class it was confidently (``>= tau``) predicted
    as, or -1. The learning effect of class c is the number of samples currently assigned
    to it, normalised by the largest class count (or, with threshold warm-up, by the
    number of still-unused samples when that is larger); the class threshold is
    ``tau * M(sigma_c)`` with the convex mapping ``M(x) = x / (2 - x)``. Before any sample
    is assigned every threshold is 0, so early training uses all pseudo-labels — the
    behaviour of the reference implementation.
    """

    selected: torch.Tensor  # a registered buffer

    def __init__(self, num_classes: int, n_unlabeled: int = 0) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.register_buffer("selected", torch.full((n_unlabeled,), -1, dtype=torch.long))

    def reset(self, n_unlabeled: int, device: torch.device | None = None) -> None:
        self.selected = torch.full((n_unlabeled,), -1, dtype=torch.long, device=device)

    def learning_effect(self, warmup: bool) -> torch.Tensor:
        # counts per class by a scatter over all samples (bin 0: the unused ones): boolean
        # selection and bincount both read the device back to size their output
        bins = torch.zeros(self.num_classes + 1, dtype=torch.long, device=self.selected.device)
        bins.scatter_add_(0, self.selected + 1, torch.ones_like(self.selected))
        counts = bins[1:].float()
        denom = counts.max()
        if warmup:
            denom = torch.maximum(denom, bins[0].float())
        return torch.where(denom > 0, counts / denom, torch.zeros_like(counts))

    def thresholds(self, tau: float, warmup: bool) -> torch.Tensor:
        sigma = self.learning_effect(warmup)
        return tau * sigma / (2.0 - sigma)

    @torch.no_grad()
    def update(self, index: torch.Tensor, pseudo: torch.Tensor, conf: torch.Tensor,
               tau: float) -> None:
        """Record the confident (``>= tau``) predictions of the samples at ``index``.

        Written for every sample (the unconfident ones rewrite their current value), not
        for a boolean selection of them, whose size the host would have to read back. The
        unconfident writes go first, so where an index occurs twice (a batch spanning two
        passes over the pool) the last confident prediction wins, as with the selection.
        """
        keep = conf >= tau
        values = torch.where(keep, pseudo, self.selected[index])
        order = torch.argsort(keep.to(torch.uint8), stable=True)
        self.selected.index_put_((index[order],), values[order])
