"""The AL classifier and its fitting procedure (CDALBench Alg. 2), free of global RNG state.

CDALBench's reproducibility rests on separate seeds for the model (initialisation and
dropout, s_θ) and for the data (split and mini-batch order, s_D). PyTorch's layers draw
from the global generator, so this module initialises weights and draws dropout masks from
explicit ``torch.Generator`` objects instead; the global torch RNG is never read.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812


class SeededDropout(nn.Module):
    """Inverted dropout whose masks come from ``self.generator`` (set by the owner)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = float(p)
        self.generator: torch.Generator | None = None
        self.force = False  # on for MC-dropout passes in eval mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p <= 0.0 or not (self.training or self.force):
            return x
        if self.generator is None:
            raise RuntimeError("SeededDropout used without a generator (no global RNG allowed)")
        keep = torch.rand(x.shape, generator=self.generator) >= self.p
        return x * keep / (1.0 - self.p)


class ALNet(nn.Module):
    """MLP with the given hidden widths (none = a linear classifier); seeded dropout follows
    every hidden ReLU (for a linear classifier it acts on the input, so that MC-dropout
    strategies such as BALD still see model uncertainty). ``embed`` is the input of the
    last layer, before any dropout."""

    def __init__(self, in_features: int, num_classes: int, hidden: Sequence[int] = (),
                 dropout: float = 0.0) -> None:
        super().__init__()
        dims = [in_features, *hidden]
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:],
                                                                       strict=True))
        self.drops = nn.ModuleList(SeededDropout(dropout) for _ in hidden)
        self.in_drop = SeededDropout(dropout if not hidden else 0.0)
        self.head = nn.Linear(dims[-1], num_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        for lin, drop in zip(self.hidden, self.drops, strict=True):
            x = drop(F.relu(lin(x)))
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.in_drop(self.embed(x)))

    def set_dropout_generator(self, gen: torch.Generator | None, force: bool = False) -> None:
        for d in [*self.drops, self.in_drop]:
            d.generator = gen  # type: ignore[union-attr]
            d.force = force  # type: ignore[union-attr]

    @torch.no_grad()
    def seeded_init(self, gen: torch.Generator) -> None:
        """PyTorch's default Linear init (U(±1/sqrt(fan_in)) for weight and bias), drawn
        from ``gen``."""
        for lin in [*self.hidden, self.head]:
            bound = 1.0 / math.sqrt(lin.in_features)
            lin.weight.uniform_(-bound, bound, generator=gen)
            lin.bias.uniform_(-bound, bound, generator=gen)


@dataclass
class FitConfig:
    """Per-dataset optimiser settings (CDALBench Table 7) and the early-stopping rule."""

    optimizer: str = "nadam"
    lr: float = 1e-3
    weight_decay: float = 0.0
    batch_size: int = 32
    max_epochs: int = 50
    patience: int = 2


def _optimizer(cfg: FitConfig, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    name = cfg.optimizer.lower()
    table = {"nadam": torch.optim.NAdam, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW,
             "sgd": torch.optim.SGD}
    if name not in table:
        raise ValueError(f"unknown optimizer {cfg.optimizer!r}; valid: {sorted(table)}")
    return table[name](params, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=True)


def fit(net: ALNet, x: torch.Tensor, y: torch.Tensor, x_val: torch.Tensor, y_val: torch.Tensor,
        cfg: FitConfig, data_gen: torch.Generator, model_gen: torch.Generator) -> int:
    """CDALBench Alg. 2: train at least one epoch, then stop once the validation loss has not
    improved for ``patience`` epochs; the weights with the lowest validation loss are kept.

    Mini-batch order comes from ``data_gen`` (s_D), dropout masks from ``model_gen`` (s_θ).
    Returns the number of epochs run.
    """
    opt = _optimizer(cfg, list(net.parameters()))
    net.set_dropout_generator(model_gen)
    best_loss, best_state, bad, epochs = math.inf, None, 0, 0
    n = x.shape[0]
    for _ in range(cfg.max_epochs):
        net.train()
        perm = torch.randperm(n, generator=data_gen)
        for s in range(0, n, cfg.batch_size):
            idx = perm[s:s + cfg.batch_size]
            loss = F.cross_entropy(net(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        epochs += 1
        net.eval()
        with torch.no_grad():
            val_loss = float(F.cross_entropy(net(x_val), y_val))
        if val_loss < best_loss - 1e-12:
            best_loss, bad = val_loss, 0
            best_state = copy.deepcopy(net.state_dict())
        else:
            bad += 1
            if bad >= cfg.patience:
                break
    if best_state is not None:
        net.load_state_dict(best_state)
    net.eval()
    return epochs


@torch.no_grad()
def accuracy(net: ALNet, x: torch.Tensor, y: torch.Tensor) -> float:
    net.eval()
    return float((net(x).argmax(1) == y).float().mean())


class TorchModelView:
    """:class:`~scarcelab.active.base.ModelView` over an :class:`ALNet` (read-only use)."""

    def __init__(self, net: ALNet) -> None:
        self.net = net

    @torch.no_grad()
    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        self.net.eval()
        return torch.softmax(self.net(torch.as_tensor(x, dtype=torch.float32)), 1).numpy()

    @torch.no_grad()
    def embed(self, x: np.ndarray) -> np.ndarray:
        self.net.eval()
        return self.net.embed(torch.as_tensor(x, dtype=torch.float32)).numpy()

    @torch.no_grad()
    def mc_predict_proba(self, x: np.ndarray, passes: int, generator: torch.Generator,
                         p: float | None = None) -> np.ndarray:
        self.net.eval()
        drops = list(self.net.drops) if len(self.net.hidden) else [self.net.in_drop]
        saved = [d.p for d in drops]
        if p is not None:  # the classifier was trained without dropout: MC passes need some
            for d in drops:
                d.p = p
        self.net.set_dropout_generator(generator, force=True)
        try:
            xt = torch.as_tensor(x, dtype=torch.float32)
            return np.stack([torch.softmax(self.net(xt), 1).numpy() for _ in range(passes)])
        finally:
            self.net.set_dropout_generator(None, force=False)
            for d, sp in zip(drops, saved, strict=True):
                d.p = sp
