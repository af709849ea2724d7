"""A bit-identical fast path for :func:`~scarcelab.active.classifier.fit` on a dropout-free
:class:`~scarcelab.active.classifier.ALNet` trained with NAdam or Adam on the CPU.

Why it exists: the tabular AL protocol (CDALBench, e.g. splice: 60-24-24-12-2, batch 43,
one fit per new label) trains a network of ~2,400 weights thousands of times. A step of
that network costs ~670 µs through autograd and ``torch.optim`` on this machine, of which
the arithmetic is a few µs: the rest is building the graph, the autograd engine, gradient
accumulation and the optimiser's per-parameter bookkeeping (``bench/al_peers.py --part
rep`` measured training as 86-97 % of a repetition). Here the same ATen kernels are called
directly, in the order autograd calls them:

* forward: ``addmm(b, x, W.t())`` per layer (what ``F.linear`` runs for 2-D input), ReLU,
  ``log_softmax`` and ``nll_loss_forward`` (what ``F.cross_entropy`` runs);
* backward: ``nll_loss_backward``, ``_log_softmax_backward_data``, ``threshold_backward``
  for ReLU, and for each layer ``grad.t().mm(x)``, ``grad.sum(0)``, ``grad.mm(W)``;
* the optimiser: ``torch.optim.NAdam``/``Adam``'s single-device ``foreach`` update (which on
  the CPU runs one elementwise kernel per parameter), run once on a flat buffer that holds
  every parameter, with the step-size scalars computed by the same Python expressions.

Elementwise kernels give the same float per element wherever it sits in a buffer, and the
matrix products are the same BLAS calls, so the weights, the optimiser state and every
validation loss equal the autograd path's bit for bit
(``tests/core/active/test_al_fastfit.py`` checks weights, state and returned epochs against
the generic path over whole fits and a whole repetition). What is not covered falls back
to the generic path: dropout (masks are drawn per layer), other modules or optimisers,
non-default optimiser flags, CUDA, or anything else :func:`eligible` rejects.
``SCARCELAB_AL_FASTFIT=0`` turns it off.

The optimiser object stays the caller's ``torch.optim`` instance: its state is read into
flat buffers when a fit starts and written back when it ends, so ``state_dict()``, the
oracle's copies and a later generic fit see exactly what the generic path would leave.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # pragma: no cover
    from scarcelab.active.classifier import ALNet, FitConfig

_DEFAULTS = {"maximize": False, "capturable": False, "differentiable": False,
             "fused": None}


def enabled() -> bool:
    return os.environ.get("SCARCELAB_AL_FASTFIT", "1") != "0"


def eligible(net: object, opt: torch.optim.Optimizer) -> bool:
    """True when the fast path reproduces the generic one exactly for this net and
    optimiser; anything unusual goes the generic way."""
    from scarcelab.active.classifier import ALNet

    if not enabled() or type(net) is not ALNet:
        return False
    if any(d.p > 0.0 for d in [*net.drops, net.in_drop]):
        return False
    params = list(net.parameters())
    if any(p.device.type != "cpu" or p.dtype != torch.float32 or not p.requires_grad
           for p in params):
        return False
    if type(opt) not in (torch.optim.NAdam, torch.optim.Adam) or len(opt.param_groups) != 1:
        return False
    group = opt.param_groups[0]
    if len(group["params"]) != len(params) or any(
            a is not b for a, b in zip(group["params"], params, strict=True)):
        return False
    if any(group.get(k, v) != v for k, v in _DEFAULTS.items()):
        return False
    if (isinstance(group["lr"], torch.Tensor) or group.get("foreach") is False
            or any(isinstance(b, torch.Tensor) for b in group["betas"])):
        return False
    if type(opt) is torch.optim.NAdam and group.get("decoupled_weight_decay", False):
        return False
    if type(opt) is torch.optim.Adam and (group.get("amsgrad") or
                                          group.get("decoupled_weight_decay", False)):
        return False
    states = [opt.state.get(p, {}) for p in params]
    if any(states) and not all(states):
        return False  # partly initialised state: the generic path decides
    if all(states) and len({float(s["step"]) for s in states}) != 1:
        return False  # parameters at different steps (a custom training loop)
    return True


class _Flat:
    """Every parameter of an :class:`ALNet` (and its gradient and optimiser moments) in one
    flat buffer each, with per-layer views."""

    def __init__(self, net: ALNet, opt: torch.optim.Optimizer) -> None:
        self.params = list(net.parameters())
        sizes = [p.numel() for p in self.params]
        self.p = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.g = torch.empty_like(self.p)
        self.views = self._split(self.p, sizes)
        self.gviews = self._split(self.g, sizes)
        states = [opt.state.get(p, {}) for p in self.params]
        self.fresh = not all(states)
        if self.fresh:
            self.m = torch.zeros_like(self.p)
            self.v = torch.zeros_like(self.p)
            self.step = 0.0
            self.mu_product = torch.tensor(1.0, dtype=torch.float32)
        else:
            self.m = torch.cat([s["exp_avg"].reshape(-1) for s in states])
            self.v = torch.cat([s["exp_avg_sq"].reshape(-1) for s in states])
            self.step = float(states[0]["step"])
            self.mu_product = (states[0]["mu_product"].detach().clone()
                               if "mu_product" in states[0] else None)
        self.sizes = sizes
        # per layer (W, W.t(), b) and (dW, db), views built once per fit
        self.layers = [(self.views[i], self.views[i].t(), self.views[i + 1])
                       for i in range(0, len(self.views), 2)]
        self.glayers = [(self.gviews[i], self.gviews[i + 1])
                        for i in range(0, len(self.gviews), 2)]

    def _split(self, flat: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
        return [v.view_as(p) for v, p in zip(flat.split(sizes), self.params, strict=True)]

    def write_back(self, opt: torch.optim.Optimizer, best: torch.Tensor | None) -> None:
        """Weights (the best kept ones when given) into the net's parameters, moments and
        step into the optimiser's state, laid out as ``torch.optim`` lays them out."""
        src = best if best is not None else self.p
        with torch.no_grad():
            for p, v in zip(self.params, src.split(self.sizes), strict=True):
                p.copy_(v.view_as(p))
        is_nadam = type(opt) is torch.optim.NAdam
        for p, m, v in zip(self.params, self.m.split(self.sizes), self.v.split(self.sizes),
                           strict=True):
            st = opt.state[p]
            if self.fresh:
                st["step"] = torch.tensor(0.0, dtype=torch.float32)
                if is_nadam:
                    st["mu_product"] = torch.tensor(1.0, dtype=torch.float32)
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["step"].fill_(self.step)
            if is_nadam:
                st["mu_product"].copy_(self.mu_product)
            st["exp_avg"].copy_(m.view_as(p))
            st["exp_avg_sq"].copy_(v.view_as(p))


_ADDMM = torch.addmm
_RELU = torch.relu
_LOG_SOFTMAX = torch.log_softmax
_NLL = torch.ops.aten.nll_loss_forward.default
_NLL_BACKWARD = torch.ops.aten.nll_loss_backward.default
_LOG_SOFTMAX_BACKWARD = torch.ops.aten._log_softmax_backward_data.default
_RELU_BACKWARD = torch.ops.aten.threshold_backward.default
_ONE = torch.tensor(1.0)


def _forward(layers: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], x: torch.Tensor,
             keep: list[torch.Tensor] | None) -> torch.Tensor:
    """Logits; with ``keep``, each layer's input is appended to it (for the backward)."""
    h = x
    last = len(layers) - 1
    for i, (_, wt, b) in enumerate(layers):
        if keep is not None:
            keep.append(h)
        h = _ADDMM(b, h, wt)
        if i < last:
            h = _RELU(h)
    return h


def _loss_and_grads(flat: _Flat, x: torch.Tensor, y: torch.Tensor) -> None:
    """Forward, cross-entropy and backward of one mini-batch; gradients into ``flat.g``."""
    layers, glayers = flat.layers, flat.glayers
    acts: list[torch.Tensor] = []
    logp = _LOG_SOFTMAX(_forward(layers, x, acts), 1)
    total = _NLL(logp, y, None, 1, -100)[1]
    g = _LOG_SOFTMAX_BACKWARD(_NLL_BACKWARD(_ONE, logp, y, None, 1, -100, total), logp, 1,
                              logp.dtype)
    for i in range(len(layers) - 1, -1, -1):
        a = acts[i]
        gw, gb = glayers[i]
        torch.mm(g.t(), a, out=gw)
        torch.sum(g, 0, out=gb)
        if i > 0:
            g = _RELU_BACKWARD(g.mm(layers[i][0]), a, 0)


def _moments(flat: _Flat, group: dict) -> torch.Tensor:
    """The part NAdam's and Adam's foreach updates share: the step count, L2 weight decay
    folded into the gradient, and both moment averages. Returns the decayed gradient."""
    beta1, beta2 = group["betas"]
    wd = group["weight_decay"]
    flat.step += 1.0
    grad = torch.add(flat.g, flat.p, alpha=wd) if wd != 0 else flat.g
    flat.m.lerp_(grad, 1 - beta1)
    flat.v.mul_(beta2)
    flat.v.addcmul_(grad, grad, value=1 - beta2)
    return grad


def _nadam_step(flat: _Flat, group: dict) -> None:
    """``torch.optim.NAdam``'s foreach update (torch/optim/nadam.py, ``_multi_tensor_nadam``,
    non-capturable branch) on the flat buffers."""
    beta1, beta2 = group["betas"]
    lr, eps, md = group["lr"], group["eps"], group["momentum_decay"]
    grad = _moments(flat, group)
    s = flat.step
    denom = flat.v.sqrt()
    bias_correction_sqrt = (1 - beta2 ** s) ** 0.5
    mu = beta1 * (1.0 - 0.5 * (0.96 ** (s * md)))
    mu_next = beta1 * (1.0 - 0.5 * (0.96 ** ((s + 1) * md)))
    assert flat.mu_product is not None  # NAdam's state always holds one
    flat.mu_product.mul_(mu)
    mp = flat.mu_product.item()
    denom.div_(bias_correction_sqrt)
    denom.add_(eps)
    flat.p.addcdiv_(grad, denom, value=(lr * (1.0 - mu) / (1.0 - mp)) * -1)
    flat.p.addcdiv_(flat.m, denom, value=(lr * mu_next / (1.0 - mp * mu_next)) * -1)


def _adam_step(flat: _Flat, group: dict) -> None:
    """``torch.optim.Adam``'s foreach update (torch/optim/adam.py, ``_multi_tensor_adam``,
    non-capturable, no amsgrad) on the flat buffers."""
    beta1, beta2 = group["betas"]
    lr, eps = group["lr"], group["eps"]
    _moments(flat, group)
    s = flat.step
    bias_correction1 = 1 - beta1 ** s
    bias_correction2 = 1 - beta2 ** s
    step_size = lr / bias_correction1 * -1
    bias_correction2_sqrt = bias_correction2 ** 0.5
    denom = flat.v.sqrt()
    denom.div_(bias_correction2_sqrt)
    denom.add_(eps)
    flat.p.addcdiv_(flat.m, denom, value=step_size)


def fast_fit(net: ALNet, x: torch.Tensor, y: torch.Tensor, x_val: torch.Tensor,
             y_val: torch.Tensor, cfg: FitConfig, data_gen: torch.Generator,
             opt: torch.optim.Optimizer) -> int:
    """:func:`~scarcelab.active.classifier.fit` for an :func:`eligible` net and optimiser;
    the same arguments, the same result, the same generator consumption."""
    from torch.nn import functional as F  # noqa: N812

    from scarcelab.active.classifier import _chunked

    flat = _Flat(net, opt)
    step = _nadam_step if type(opt) is torch.optim.NAdam else _adam_step
    group = opt.param_groups[0]
    x = x.flatten(1)
    x_val = x_val.flatten(1)
    layers = flat.layers
    best_loss, best, bad, epochs = math.inf, None, 0, 0
    n = x.shape[0]
    stop = n - n % cfg.batch_size if cfg.drop_last and n > cfg.batch_size else n
    with torch.no_grad():
        for _ in range(cfg.max_epochs):
            perm = torch.randperm(n, generator=data_gen)
            for s in range(0, stop, cfg.batch_size):
                idx = perm[s:s + cfg.batch_size]
                _loss_and_grads(flat, x.index_select(0, idx), y.index_select(0, idx))
                step(flat, group)
            epochs += 1
            logits = _chunked(lambda t: _forward(layers, t, None), x_val, cfg.eval_batch_size)
            val_loss = float(F.cross_entropy(logits, y_val))
            if val_loss < best_loss - 1e-12:
                best_loss, bad = val_loss, 0
                if cfg.restore_best:
                    best = flat.p.clone()
            else:
                bad += 1
                if bad >= cfg.patience:
                    break
    flat.write_back(opt, best)
    net.eval()
    return epochs
