"""C-Score learning-dynamics diagnostics for semi-supervised training (Chen et al.,
arXiv 2608.20667), plus the per-epoch hook that computes them for any ``SemiMethod``.

Why these exist: with a contaminated unlabeled pool, pseudo-label methods can keep their
clean accuracy while their learning dynamics collapse ("accuracy masking"). Five cheap
numbers, computed every epoch on a *fixed* seeded subsample of the unlabeled pool, make
that visible:

- ``diag/ple``  pseudo-label entropy, mean softmax entropy over unlabeled samples (nats,
  no threshold). Uniform softmax gives ``log C``.
- ``diag/cci``  class concentration index, ``KL(p̄ ‖ U) = log C − H(p̄)`` of the mean
  predicted distribution ``p̄``; 0 when predictions are balanced on average, ``log C``
  when every sample goes to one class (pseudo-label collapse).
- ``diag/sem_drift``  per class with both centroids defined, the L2 distance in logit space
  between the labeled-sample centroid and the centroid of unlabeled samples
  pseudo-labeled as that class, weighted by the weight the method gives them (its own
  filter, see below; a 0/1 mask: the passing samples); mean over those classes.
- ``diag/grad_align``  cosine between the gradients of the labeled and the unlabeled loss
  w.r.t. the final linear classifier's weight (negative: the unlabeled term fights the
  labeled one).
- ``diag/ood_ff``  oracle OOD filtration failure: pass rate of OOD samples through the
  method's filter divided by that of in-distribution samples (with soft weights: the mean
  weight, i.e. the weight-averaged pass rate); needs the ID/OOD flags a contamination run
  carries; 1 means the filter does not filter OOD at all.

*The method's own filter.* Sem-Drift, OOD-FF and ``diag/mask_rate`` use the pseudo-labels
and per-sample weights the method itself would train on in that epoch,
``Method.pseudo_targets`` (FlexMatch's class-wise thresholds from its current learning
status, SoftMatch's truncated-Gaussian weights of the aligned confidence, CoMatch's
memory-smoothed pseudo-labels and mask, DS3L's learned weights, MixMatch's unfiltered
guesses), read without a training step and without changing the method's state. Only a
method without pseudo-labels (``pseudo_targets`` returns ``None``: Mean Teacher) falls back
to the generic mask ``max softmax ≥ τ`` with the method's ``threshold`` hyperparameter or
``DEFAULT_THRESHOLD`` (0.95); ``diag/own_filter`` is 1 or 0 to say which was used.

Undefined values are NaN rather than a made-up number: Sem-Drift when no class has both
centroids (e.g. early epochs under τ = 0.95), Grad-Align when a gradient is exactly zero
(nothing passed the mask, so the unlabeled term has no gradient), OOD-FF when no OOD
sample is in the subsample. The only exception is OOD-FF when no OOD sample passes: that is
perfect filtration, 0, whatever the ID pass rate.
"""

from __future__ import annotations

import copy
import logging
import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from scarcelab.data.augment import AUGMENTATIONS, to_float
from scarcelab.data.bundle import DatasetBundle
from scarcelab.methods._parts import confidence_mask
from scarcelab.methods.base import Batch, Method, Progress, PseudoTargets
from scarcelab.models.classifier import normalize

log = logging.getLogger("scarcelab")

DEFAULT_THRESHOLD = 0.95
"""Fallback confidence threshold (FixMatch's τ) for methods without pseudo-labels of their
own that also have no ``threshold`` hyperparameter."""

ArrayLike = torch.Tensor | np.ndarray | Sequence[Any]


def _t(x: ArrayLike, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x).to(dtype)


def _check_probs(probs: torch.Tensor) -> None:
    if probs.ndim != 2 or probs.shape[0] == 0:
        raise ValueError(f"expected probabilities of shape (N>0, C), got {tuple(probs.shape)}")


def pseudo_label_entropy(probs: ArrayLike) -> float:
    """Mean Shannon entropy (nats) of the rows of ``probs`` (0·log 0 taken as 0)."""
    p = _t(probs)
    _check_probs(p)
    return float(-(torch.special.xlogy(p, p)).sum(1).mean())


def class_concentration_index(probs: ArrayLike) -> float:
    """``KL(p̄ ‖ uniform)`` of the mean predicted class distribution ``p̄``."""
    p = _t(probs)
    _check_probs(p)
    mean = p.mean(0)
    c = p.shape[1]
    return float(torch.special.xlogy(mean, mean * c).sum().clamp_min(0.0))


def semantic_drift(
    labeled_logits: ArrayLike,
    labeled_y: ArrayLike,
    unlabeled_logits: ArrayLike,
    pseudo_labels: ArrayLike,
    mask: ArrayLike,
    num_classes: int,
) -> float:
    """Mean over classes with both centroids of ``‖μ_L(c) − μ_U(c)‖₂`` in logit space.

    ``μ_U(c)`` is the ``mask``-weighted mean of the unlabeled samples pseudo-labeled ``c``
    (``mask`` may be a 0/1 mask — the plain mean of the passing samples — or soft
    per-sample weights ≥ 0). NaN when no class has both centroids.
    """
    zl, zu = _t(labeled_logits), _t(unlabeled_logits)
    yl, pl = _t(labeled_y, torch.long), _t(pseudo_labels, torch.long)
    w = _t(mask)
    if bool((w < 0).any()):
        raise ValueError("semantic_drift: mask weights must be >= 0")
    keep = w > 0
    dists = []
    for c in range(num_classes):
        in_l = yl == c
        in_u = keep & (pl == c)
        if in_l.any() and in_u.any():
            wc = w[in_u]
            mu_u = (wc[:, None] * zu[in_u]).sum(0) / wc.sum()
            dists.append(torch.linalg.vector_norm(zl[in_l].mean(0) - mu_u))
    return float(torch.stack(dists).mean()) if dists else math.nan


def cosine(a: ArrayLike, b: ArrayLike) -> float:
    """Cosine of two flattened vectors; NaN if either is exactly zero (no direction)."""
    x, y = _t(a).flatten(), _t(b).flatten()
    nx, ny = torch.linalg.vector_norm(x), torch.linalg.vector_norm(y)
    if nx == 0 or ny == 0:
        return math.nan
    return float((x @ y) / (nx * ny))


def gradient_alignment(
    loss_labeled: torch.Tensor, loss_unlabeled: torch.Tensor, weight: torch.Tensor
) -> float:
    """Cosine between ``∂ℓL/∂W`` and ``∂ℓU/∂W`` for one parameter ``W`` (the classifier).

    Only the path to ``W`` is differentiated, so for the last linear layer this costs a
    matrix product, not a backward pass through the backbone. A loss with no path to
    ``W`` (e.g. a constant zero when nothing passed the mask) has a zero gradient: NaN.
    """
    grads = []
    for loss in (loss_labeled, loss_unlabeled):
        if not loss.requires_grad:
            return math.nan
        (g,) = torch.autograd.grad(loss, weight, retain_graph=True, allow_unused=True)
        if g is None:
            return math.nan
        grads.append(g.detach())
    return cosine(grads[0], grads[1])


def ood_filtration_failure(mask: ArrayLike, is_ood: ArrayLike) -> float:
    """``P(pass | OOD) / P(pass | ID)`` for a 0/1 ``mask``, or the ratio of mean weights
    for soft per-sample weights in [0, 1] (SoftMatch, DS3L: a weight-averaged pass rate).

    0 when no OOD sample passes (all OOD weights 0: perfect filtration); NaN when the
    samples hold no OOD or no ID sample; ``inf`` when OOD samples pass but no ID sample
    does.
    """
    m = _t(mask)
    o = _t(is_ood, torch.bool)
    if m.shape != o.shape:
        raise ValueError(f"mask {tuple(m.shape)} and OOD flags {tuple(o.shape)} differ")
    if not o.any() or o.all():
        return math.nan
    rate_ood = float(m[o].mean())
    rate_id = float(m[~o].mean())
    if rate_ood == 0.0:
        return 0.0
    return rate_ood / rate_id if rate_id > 0 else math.inf


# ---------------------------------------------------------------------------------------
# the per-epoch hook

#: what ``nn.Module`` keeps in these slots is walked (tensors copied in place); every other
#: attribute is deep-copied
_WALKED = ("_parameters", "_buffers", "_modules")


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.shape == b.shape and a.dtype == b.dtype and a.device == b.device
            and a.stride() == b.stride())


@torch.no_grad()
def refresh_copy(dst: nn.Module, src: nn.Module) -> bool:
    """Make ``dst``, an earlier ``copy.deepcopy(src)``, what ``copy.deepcopy(src)`` would
    give now, reusing its memory: parameters and buffers copied in place (``copy_``, no
    allocation), everything else (hyper-parameters, python counters, an inner optimiser's
    state, plain tensor attributes) deep-copied with the same memo ``deepcopy`` would have,
    so that references to parameters land on ``dst``'s. Gradients are not copied (the
    diagnostic step never reads them). False, with ``dst`` unusable, when ``src``'s module
    tree no longer matches ``dst``'s: make a new copy then."""
    pairs = list(zip(src.modules(), dst.modules(), strict=False))
    if len(pairs) != len(list(src.modules())) or any(
            type(a) is not type(b) or a._modules.keys() != b._modules.keys()
            or a._parameters.keys() != b._parameters.keys()
            or a._buffers.keys() != b._buffers.keys() for a, b in pairs):
        return False
    memo: dict[int, Any] = {}
    for a, b in pairs:
        memo[id(a)] = b
        for slot in ("_parameters", "_buffers"):
            for name, t in getattr(a, slot).items():
                u = getattr(b, slot)[name]
                if t is None or u is None or not _same_layout(t, u):
                    if t is not None or u is not None:
                        return False
                    continue
                u.copy_(t)
                if slot == "_parameters":
                    u.requires_grad_(t.requires_grad)
                    u.grad = None
                memo[id(t)] = u
    for a, b in pairs:
        for k, v in a.__dict__.items():
            if k not in _WALKED:
                b.__dict__[k] = copy.deepcopy(v, memo)
    return True


@dataclass
class DiagnosticsConfig:
    """Sizes of the fixed diagnostic subsample and of the one Grad-Align batch.

    The defaults keep the cost near 1–3% of a small_cnn epoch on PneumoniaMNIST on CPU
    (``bench/diagnostics.py``): prediction-only passes over a few hundred images plus one
    forward pass of a reduced training batch.
    """

    n_unlabeled: int = 512
    n_labeled: int = 128
    batch_labeled: int = 32
    batch_unlabeled: int = 64
    seed: int = 0
    eval_batch_size: int = 512


class EpochDiagnostics:
    """Callable ``(method, epoch) -> {"diag/...": value}`` for ``train_trial``.

    Generic over the method interface: the filter is the method's own
    (``method.pseudo_targets`` on the unlabeled subsample, in eval mode, without a training
    step), with the generic confidence mask (the method's ``threshold``, else
    ``DEFAULT_THRESHOLD``) only for methods without pseudo-labels; Grad-Align comes from
    the ``loss_labeled`` / ``loss_unlabeled`` terms that ``method.step`` returns on one
    fixed diagnostic batch, w.r.t. ``method.head.weight``.

    ``method.step`` runs on a copy under a forked RNG, so the diagnostic step never
    touches the trained model's BatchNorm statistics, per-sample state (FlexMatch), queues
    or gradients, and never shifts the training random stream: a run with diagnostics
    trains exactly as one without. The copy is one scratch module per trained method, made
    at its first diagnosed epoch and refreshed in place at the next ones
    (:func:`refresh_copy`), not a new deep copy every epoch. The subsample (and the
    augmentation of the Grad-Align batch) are fixed by ``cfg.seed``, so epochs and trials
    are compared on the same images.
    OOD flags (``bundle.unlabeled_ood``) are read here and only here, as an oracle.

    Contaminated pools (``bundle.unlabeled_ood`` set): the ``cfg.n_unlabeled`` ID images
    are drawn from the *ID part* of the pool only, in the order of the uncontaminated pool
    (``bundle.unlabeled_origin``), with the same random draws as on the clean pool — so
    every ratio of a sweep, r = 0 included, evaluates the same ID images. OOD images are
    added beside them (never replacing any), as many as keep the pool's OOD share
    (``round(n · n_ood / n_id)``); the Grad-Align batch likewise holds
    ``cfg.batch_unlabeled`` fixed ID images plus OOD ones in the pool's proportion.
    """

    def __init__(self, bundle: DatasetBundle, device: str | torch.device = "cpu",
                 cfg: DiagnosticsConfig | None = None) -> None:
        self.cfg = cfg or DiagnosticsConfig()
        self.device = torch.device(device)
        self.num_classes = bundle.num_classes
        rng = np.random.default_rng(self.cfg.seed)
        n_u, n_l = len(bundle.unlabeled_x), len(bundle.labeled_y)
        flags = bundle.unlabeled_ood
        bu = self.cfg.batch_unlabeled
        if flags is None:
            self.u_idx = np.sort(rng.choice(n_u, min(self.cfg.n_unlabeled, n_u),
                                            replace=False))
            self.gu = torch.arange(min(bu, len(self.u_idx)))
        else:
            flags = np.asarray(flags, dtype=bool)
            origin = (np.arange(n_u) if bundle.unlabeled_origin is None
                      else np.asarray(bundle.unlabeled_origin))
            id_pos = np.flatnonzero(~flags)
            id_pos = id_pos[np.argsort(origin[id_pos], kind="stable")]
            ood_pos = np.flatnonzero(flags)
            ood_pos = ood_pos[np.argsort(origin[ood_pos], kind="stable")]
            # the same call as for a clean pool of len(id_pos) images: same ID draws
            pick = np.sort(rng.choice(len(id_pos), min(self.cfg.n_unlabeled, len(id_pos)),
                                      replace=False))
            share = len(ood_pos) / max(1, len(id_pos))
            n_ood = min(len(ood_pos), int(round(len(pick) * share)))
            ood_rng = np.random.default_rng([self.cfg.seed, 0x00D])
            pick_ood = np.sort(ood_rng.choice(len(ood_pos), n_ood, replace=False))
            self.u_idx = np.concatenate([id_pos[pick], ood_pos[pick_ood]])
            g_id = min(bu, len(pick))
            g_ood = min(n_ood, int(round(g_id * share)))
            self.gu = torch.cat([torch.arange(g_id), len(pick) + torch.arange(g_ood)])
        self.l_idx = np.sort(rng.choice(n_l, min(self.cfg.n_labeled, n_l), replace=False))
        self.xu = torch.as_tensor(bundle.unlabeled_x[self.u_idx]).to(self.device)
        self.xl = torch.as_tensor(bundle.labeled_x[self.l_idx]).to(self.device)
        self.yl = torch.as_tensor(bundle.labeled_y[self.l_idx], dtype=torch.long)
        self.u_pool = torch.as_tensor(self.u_idx, dtype=torch.long, device=self.device)
        self.is_ood = None if flags is None else torch.as_tensor(flags[self.u_idx],
                                                                 dtype=torch.bool)
        # the Grad-Align batch: a fixed slice of the subsamples, positions in the real pool
        self.gl = torch.arange(min(self.cfg.batch_labeled, len(self.xl)))
        self.gu_pool = self.u_pool[self.gu]
        self._warned = False
        self._scratch: Method | None = None
        self._scratch_of: weakref.ref[Method] | None = None

    def scratch(self, method: Method) -> Method:
        """A copy of ``method`` as it is now, for the diagnostic step: the one scratch copy
        of this method, refreshed, or a new one for a new method (the next trial)."""
        same = self._scratch_of is not None and self._scratch_of() is method
        if not (same and self._scratch is not None
                and refresh_copy(self._scratch, method)):
            self._scratch = None  # never two copies at once
            self._scratch = copy.deepcopy(method)
            self._scratch_of = weakref.ref(method)
        return self._scratch

    @torch.no_grad()
    def _logits(self, method: Method, x: torch.Tensor) -> torch.Tensor:
        bs = self.cfg.eval_batch_size
        out = [method.logits(normalize(to_float(x[i : i + bs]))).double().cpu()
               for i in range(0, len(x), bs)]
        return torch.cat(out)

    def _batch(self, method: Method) -> Batch:
        g = torch.Generator().manual_seed(self.cfg.seed + 1)
        x = to_float(self.xl[self.gl])
        u = to_float(self.xu[self.gu])
        xs = [normalize(AUGMENTATIONS.get(v)(x, g)) for v in method.labeled_views]
        us = [normalize(AUGMENTATIONS.get(v)(u, g)) for v in method.views]
        return Batch(x=xs, y=self.yl[self.gl].to(self.device), u=us, u_index=self.gu_pool)

    def grad_align(self, method: Method, epoch: int) -> float:
        if not hasattr(method, "head"):
            return math.nan
        probe = self.scratch(method)
        probe.train()
        devices = [self.device.index or 0] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            losses = probe.step(self._batch(probe), Progress(step=0, total_steps=1, epoch=epoch))
        if "loss_labeled" not in losses or "loss_unlabeled" not in losses:
            return math.nan
        return gradient_alignment(losses["loss_labeled"], losses["loss_unlabeled"],
                                  probe.head.weight)

    def __call__(self, method: Method, epoch: int) -> dict[str, float]:
        """The epoch's diagnostics. A diagnostic that cannot be computed for a method (an
        unusual ``step`` or head) gives NaN and one warning: measuring must never be what
        fails a training run."""
        out = self._guarded(self._compute, method, epoch)
        if isinstance(out, dict):
            return out
        return {k: math.nan for k in ("diag/ple", "diag/cci", "diag/sem_drift",
                                      "diag/grad_align")}

    def _guarded(self, fn: Any, method: Method, epoch: int) -> Any:
        try:
            return fn(method, epoch)
        except Exception as e:  # noqa: BLE001 - see __call__
            if not self._warned:
                log.warning("C-Score diagnostics failed for %s (%s: %s); logging NaN",
                            type(method).__name__, type(e).__name__, e)
                self._warned = True
            return math.nan

    def own_targets(self, method: Method) -> PseudoTargets | None:
        """The method's own pseudo-labels and weights on the unlabeled subsample (``None``
        for a method without pseudo-labels); logits and weights as float64 on the CPU."""
        bs = self.cfg.eval_batch_size
        parts: list[PseudoTargets] = []
        for i in range(0, len(self.xu), bs):
            t = method.pseudo_targets(normalize(to_float(self.xu[i : i + bs])),
                                      self.u_pool[i : i + bs])
            if t is None:
                return None
            parts.append(t)
        return PseudoTargets(
            logits=torch.cat([t.logits.detach().double().cpu() for t in parts]),
            labels=torch.cat([t.labels.detach().long().cpu() for t in parts]),
            weights=torch.cat([t.weights.detach().double().cpu() for t in parts]))

    def _compute(self, method: Method, epoch: int) -> dict[str, float]:
        targets = self.own_targets(method)
        was_training = method.training
        method.eval()
        try:
            zu = targets.logits if targets is not None else self._logits(method, self.xu)
            zl = self._logits(method, self.xl)
        finally:
            method.train(was_training)
        probs = torch.softmax(zu, dim=-1)
        if targets is not None:
            mask, pseudo = targets.weights, targets.labels
        else:  # documented fallback: methods without pseudo-labels of their own
            threshold = float(method.hp.get("threshold", DEFAULT_THRESHOLD))
            mask, pseudo, _ = confidence_mask(zu, threshold)
        out = {
            "diag/ple": pseudo_label_entropy(probs),
            "diag/cci": class_concentration_index(probs),
            "diag/sem_drift": semantic_drift(zl, self.yl, zu, pseudo, mask, self.num_classes),
            "diag/grad_align": self._guarded(self.grad_align, method, epoch),
            "diag/mask_rate": float(mask.mean()),
            "diag/own_filter": float(targets is not None),
        }
        if self.is_ood is not None and bool(self.is_ood.any()):
            out["diag/ood_ff"] = ood_filtration_failure(mask, self.is_ood)
        return out


__all__ = [
    "DEFAULT_THRESHOLD",
    "DiagnosticsConfig",
    "EpochDiagnostics",
    "class_concentration_index",
    "cosine",
    "gradient_alignment",
    "ood_filtration_failure",
    "pseudo_label_entropy",
    "semantic_drift",
]
