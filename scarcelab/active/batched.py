"""The greedy oracle's τ candidate fits as one batched fit (MLP / linear classifiers).

The oracle retrains the classifier once per candidate: τ = 20 fits per pick, 8,000 per
splice repetition, each a few dozen optimiser steps of a tiny MLP — time that goes to
Python and kernel-launch overhead, not arithmetic. Here the τ copies are stacked along a
leading dimension (weights (τ, out, in), forward by ``baddbmm``) and trained together:
one optimiser step updates all of them, and since Adam/NAdam/SGD are elementwise, each copy
follows the update it would get alone. Everything the sequential :func:`fit` does is kept
per copy: the same mini-batch order (the same generator state, so the same permutation for
all), at least one epoch, early stopping on its own validation loss with its own patience,
its own best weights, then its own test accuracy. A stopped copy keeps training with the
others (its trajectory is independent) but its later epochs are ignored, exactly as if it had
stopped. Results equal the sequential fits up to floating-point summation order (tested).

Only for :class:`~scarcelab.active.classifier.ALNet` without dropout; the loop falls back
to sequential fits otherwise (dropout masks would be drawn in a different order).
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Any

import torch
from torch.nn import functional as F  # noqa: N812

from scarcelab.accel import Accel
from scarcelab.active.classifier import ALNet, FitConfig, _optimizer


def supports(net: object, dropout: float) -> bool:
    return isinstance(net, ALNet) and dropout <= 0.0


def _forward(ws: list[torch.Tensor], bs: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """(τ, N, D) -> (τ, N, C) through the stacked layers; ReLU between them."""
    for i, (w, b) in enumerate(zip(ws, bs, strict=True)):
        x = torch.baddbmm(b.unsqueeze(1), x, w.transpose(1, 2))
        if i < len(ws) - 1:
            x = F.relu(x)
    return x


def fit_many(net: ALNet, start: dict[str, torch.Tensor], sets: list[torch.Tensor],
             x_all: torch.Tensor, y_all: torch.Tensor, x_val: torch.Tensor,
             y_val: torch.Tensor, x_te: torch.Tensor, y_te: torch.Tensor, cfg: FitConfig,
             data_gen: torch.Generator, accel: Accel | None = None) -> list[float]:
    """Test accuracy after fitting one copy of ``net`` (from weights ``start``) per index
    set in ``sets`` (equal lengths), each as :func:`~scarcelab.active.classifier.fit`
    would (``accel``: its precision and kernels, resolved). ``data_gen`` is consumed as one
    sequential fit would consume it."""
    cast: Any = (lambda: accel.autocast(x_all.device)) if accel is not None else nullcontext
    tau = len(sets)
    order = [f"hidden.{i}" for i in range(len(net.hidden))] + ["head"]
    ws = [start[f"{n}.weight"].detach().unsqueeze(0).repeat(tau, 1, 1).requires_grad_()
          for n in order]
    bs = [start[f"{n}.bias"].detach().unsqueeze(0).repeat(tau, 1).requires_grad_()
          for n in order]
    opt = _optimizer(cfg, [*ws, *bs], accel)
    idx = torch.stack(sets)  # (τ, n)
    xs = x_all.flatten(1)[idx]  # (τ, n, D)
    ys = y_all[idx]  # (τ, n)
    xv = x_val.flatten(1).unsqueeze(0).expand(tau, -1, -1)
    n = idx.shape[1]
    best = torch.full((tau,), math.inf)
    bad = torch.zeros(tau, dtype=torch.long)
    active = torch.ones(tau, dtype=torch.bool)
    best_w = [w.detach().clone() for w in ws]
    best_b = [b.detach().clone() for b in bs]
    for _ in range(cfg.max_epochs):
        perm = torch.randperm(n, generator=data_gen)
        for s in range(0, n, cfg.batch_size):
            j = perm[s:s + cfg.batch_size]
            with cast():
                logits = _forward(ws, bs, xs[:, j]).float()
            # sum over copies of each copy's mean loss: copy m's gradient is its own
            loss = F.cross_entropy(logits.flatten(0, 1), ys[:, j].flatten(),
                                   reduction="none").view(tau, -1).mean(1).sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        with torch.no_grad(), cast():
            lv = _forward(ws, bs, xv).float()
            val = F.cross_entropy(lv.flatten(0, 1), y_val.repeat(tau),
                                  reduction="none").view(tau, -1).mean(1)
            improved = active & (val < best - 1e-12)
            best = torch.where(improved, val, best)
            for w, bw in zip(ws, best_w, strict=True):
                bw[improved] = w.detach()[improved]
            for b, bb in zip(bs, best_b, strict=True):
                bb[improved] = b.detach()[improved]
            bad = torch.where(improved, 0, bad + active.long())
            active &= bad < cfg.patience
        if not bool(active.any()):
            break
    with torch.no_grad(), cast():
        xt = x_te.flatten(1).unsqueeze(0).expand(tau, -1, -1)
        pred = _forward(best_w, best_b, xt).argmax(2)
        return (pred == y_te.unsqueeze(0)).float().mean(1).tolist()
