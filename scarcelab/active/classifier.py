"""The AL classifier and its fitting procedure (CDALBench Alg. 2), free of global RNG state.

CDALBench's reproducibility rests on separate seeds for the model (initialisation and
dropout, s_θ) and for the data (split and mini-batch order, s_D). PyTorch's layers draw
from the global generator, so this module initialises weights and draws dropout masks from
explicit ``torch.Generator`` objects instead; the global torch RNG is never read.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from scarcelab.accel import Accel, resolve
from scarcelab.active import fastfit
from scarcelab.errors import ConfigError


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
        # Masks come from a CPU generator (s_θ) whatever the device, so a repetition draws
        # the same masks on CPU and GPU.
        keep = (torch.rand(x.shape, generator=self.generator) >= self.p).to(x.device)
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
        x = x.flatten(1)  # images work too: an MLP over pixels
        for lin, drop in zip(self.hidden, self.drops, strict=True):
            x = drop(F.relu(lin(x)))
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.in_drop(self.embed(x)))

    def set_dropout_generator(self, gen: torch.Generator | None, force: bool = False) -> None:
        for d in [*self.drops, self.in_drop]:
            d.generator = gen  # type: ignore[union-attr]
            d.force = force  # type: ignore[union-attr]

    def mc_dropouts(self) -> list[SeededDropout]:
        """The dropout layers MC passes switch on (the input's for a linear classifier)."""
        return list(self.drops) if len(self.hidden) else [self.in_drop]  # type: ignore[list-item]

    @torch.no_grad()
    def seeded_init(self, gen: torch.Generator) -> None:
        """PyTorch's default Linear init (U(±1/sqrt(fan_in)) for weight and bias), drawn
        from ``gen``."""
        for lin in [*self.hidden, self.head]:
            bound = 1.0 / math.sqrt(lin.in_features)
            lin.weight.uniform_(-bound, bound, generator=gen)
            lin.bias.uniform_(-bound, bound, generator=gen)


class ImageALNet(nn.Module):
    """A scarcelab backbone (``scarcelab.models``, e.g. ``resnet18``) plus a linear head, for
    the image sets. Inputs are [0, 1] images; the fixed normalisation of every scarcelab
    model is applied inside. One seeded dropout sits before the head: rate ``dropout``
    while training (0 by default) and the MC-dropout rate for BALD's passes, so that the
    strategies see the same interface as :class:`ALNet`. ``embed`` is the backbone's
    feature vector (the head's input).

    Construction and initialisation run inside ``torch.random.fork_rng`` seeded from
    s_θ: torchvision's layers initialise from the global RNG, and forking restores it
    afterwards, so the global state is untouched and the weights depend on s_θ alone.
    """

    def __init__(self, arch: str, in_channels: int, num_classes: int, dropout: float,
                 gen: torch.Generator) -> None:
        super().__init__()
        from scarcelab.models import create_model

        seed = int(torch.randint(0, 2**62, (1,), generator=gen))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.backbone = create_model(arch, in_channels=in_channels)
            self.head = nn.Linear(cast(int, self.backbone.num_features), num_classes)
        self.drop = SeededDropout(dropout)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        from scarcelab.models.classifier import normalize

        return self.backbone(normalize(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(self.embed(x)))

    def set_dropout_generator(self, gen: torch.Generator | None, force: bool = False) -> None:
        self.drop.generator = gen
        self.drop.force = force

    def mc_dropouts(self) -> list[SeededDropout]:
        return [self.drop]


ALModel = ALNet | ImageALNet


def build_net(arch: str, x_shape: tuple[int, ...], num_classes: int, hidden: Sequence[int],
              dropout: float, gen: torch.Generator) -> ALModel:
    """``arch="mlp"``: :class:`ALNet` over the flattened input (a linear classifier when
    ``hidden`` is empty); any other name: a scarcelab backbone on (N, C, H, W) images."""
    if arch == "mlp":
        net = ALNet(int(np.prod(x_shape[1:])), num_classes, hidden, dropout)
        net.seeded_init(gen)
        return net
    if len(x_shape) != 4:
        raise ValueError(f"arch={arch!r} needs images (N, C, H, W); this dataset has features "
                         f"of shape {x_shape[1:]} — use arch=mlp")
    return ImageALNet(arch, x_shape[1], num_classes, dropout, gen)


def resolve_device(name: str) -> torch.device:
    """``auto``: cuda when available; anything else must be a usable torch device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError as e:
        raise ConfigError(f"device={name!r} is not a torch device ({e}); use cpu, cuda, "
                          "cuda:N or auto") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={name!r} but no CUDA device is available here; use "
                          "device=auto (cuda when available, else cpu) or cpu")
    return dev


@dataclass
class FitSettings:
    """Per-dataset optimiser settings (CDALBench Table 7) and the early-stopping rule.

    Declared once and inherited by :class:`FitConfig` (what one :func:`fit` takes) and by
    the per-dataset :class:`scarcelab.active.datasets.ALConfig` (what a user sees, changes
    with ``--set`` and the AL loop logs as ``al.<field>``).
    """

    optimizer: str = "nadam"
    lr: float = 1e-3
    weight_decay: float = 0.0
    batch_size: int = 32
    max_epochs: int = 50
    patience: int = 2
    #: Keep the weights of the lowest validation loss (True) or those of the last epoch run
    #: (False: CDALBench's code, whose ``EarlyStopping`` only stops).
    restore_best: bool = True
    #: Drop the last incomplete mini-batch once the labeled set exceeds one batch (CDALBench's
    #: ``drop_last = batch_size < len(x_labeled)``).
    drop_last: bool = False


@dataclass
class FitConfig(FitSettings):
    """:class:`FitSettings` plus how many samples to score per forward pass, a memory
    setting that is not part of a dataset's protocol."""

    eval_batch_size: int = 1024


def _chunked(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
             bs: int) -> torch.Tensor:
    """``fn`` over ``x`` in chunks: a 5,000-image pool through a ResNet at once would hold
    gigabytes of activations."""
    if x.shape[0] <= bs:
        return fn(x)
    return torch.cat([fn(x[s:s + bs]) for s in range(0, x.shape[0], bs)])


def al_accel(accel: Accel | None, device: torch.device | str, arch: str) -> Accel:
    """The AL fits' precision and kernels: ``auto`` is the CUDA fast path for an image
    backbone only; an MLP classifier (``arch=mlp``: CDALBench's few-thousand-parameter
    nets, whose steps are launch-bound) keeps the former fp32 path on every device unless
    a setting is given. On CPU nothing changes (NCHW, as the AL always trained)."""
    return resolve(accel, device, cpu_channels_last="off", fast_auto=arch != "mlp")


def _autocast(accel: Accel | None, device: torch.device) -> Any:
    return accel.autocast(device) if accel is not None else nullcontext()


def _optimizer(cfg: FitConfig, params: Sequence[torch.Tensor], accel: Accel | None = None
               ) -> torch.optim.Optimizer:
    name = cfg.optimizer.lower()
    table = {"nadam": torch.optim.NAdam, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW,
             "sgd": torch.optim.SGD}
    if name not in table:
        raise ValueError(f"unknown optimizer {cfg.optimizer!r}; valid: {sorted(table)}")
    kernel: dict[str, Any] = {"foreach": True}
    if accel is not None and params:  # a fused kernel replaces the foreach one
        kernel = accel.optimizer_kwargs(table[name], params[0].device) or kernel
    return table[name](params, lr=cfg.lr, weight_decay=cfg.weight_decay, **kernel)


def fit(net: ALModel, x: torch.Tensor, y: torch.Tensor, x_val: torch.Tensor, y_val: torch.Tensor,
        cfg: FitConfig, data_gen: torch.Generator, model_gen: torch.Generator,
        opt: torch.optim.Optimizer | None = None, accel: Accel | None = None) -> int:
    """CDALBench Alg. 2: train at least one epoch, then stop once the validation loss has not
    improved for ``patience`` epochs; with ``cfg.restore_best`` the weights with the lowest
    validation loss are kept, otherwise those of the last epoch.

    Mini-batch order comes from ``data_gen`` (s_D), dropout masks from ``model_gen`` (s_θ).
    ``opt``: an optimiser over ``net``'s parameters to continue (CDALBench creates one per
    repetition and keeps its state across fits); None = a fresh one for this fit.
    ``accel`` (resolved, :func:`al_accel`): bf16 autocast around the forward passes (the
    loss in fp32) and the input layout; None or the CPU's resolution: the former fp32 path.
    Returns the number of epochs run.
    """
    opt = opt if opt is not None else _optimizer(cfg, list(net.parameters()), accel)
    net.set_dropout_generator(model_gen)
    bf16 = accel is not None and accel.bf16
    if not bf16 and fastfit.eligible(net, opt):  # the same result, no per-step autograd
        return fastfit.fast_fit(net, x, y, x_val, y_val, cfg, data_gen, opt)  # type: ignore[arg-type]
    if accel is not None and accel.nhwc_inputs:
        x, x_val = accel.images(x), accel.images(x_val)
    best_loss, best_state, bad, epochs = math.inf, None, 0, 0
    n = x.shape[0]
    has_bn = _has_batchnorm(net)  # once per fit, not per step
    for _ in range(cfg.max_epochs):
        net.train()
        perm = torch.randperm(n, generator=data_gen)
        stop = n - n % cfg.batch_size if cfg.drop_last and n > cfg.batch_size else n
        for s in range(0, stop, cfg.batch_size):
            idx = perm[s:s + cfg.batch_size]
            if idx.numel() < 2 and has_bn:
                continue  # a batch of one breaks BatchNorm's batch statistics
            if bf16:
                with _autocast(accel, x.device):
                    logits = net(x[idx])
                loss = F.cross_entropy(logits.float(), y[idx])
            else:
                loss = F.cross_entropy(net(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        epochs += 1
        net.eval()
        with torch.no_grad(), _autocast(accel, x.device):
            logits = _chunked(net, x_val, cfg.eval_batch_size).float()
            val_loss = float(F.cross_entropy(logits, y_val))
        if val_loss < best_loss - 1e-12:
            best_loss, bad = val_loss, 0
            # clone, not deepcopy: the same tensors copied, a fifth of the oracle's time saved
            if cfg.restore_best:
                best_state = {k: v.detach().clone() for k, v in net.state_dict().items()}
        else:
            bad += 1
            if bad >= cfg.patience:
                break
    if best_state is not None:
        net.load_state_dict(best_state)
    net.eval()
    return epochs


def _has_batchnorm(net: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in net.modules())


@torch.no_grad()
def accuracy(net: ALModel, x: torch.Tensor, y: torch.Tensor, eval_batch_size: int = 1024,
             accel: Accel | None = None) -> float:
    net.eval()
    if accel is not None:
        x = accel.images(x)
    with _autocast(accel, x.device):
        return float((_chunked(net, x, eval_batch_size).argmax(1) == y).float().mean())


class TorchModelView:
    """:class:`~scarcelab.active.base.ModelView` over an AL net (read-only use). Arrays are
    moved to the net's device in chunks and results come back as numpy on the CPU."""

    def __init__(self, net: ALModel, eval_batch_size: int = 1024,
                 accel: Accel | None = None) -> None:
        self.net = net
        self.bs = eval_batch_size
        self.device = next(net.parameters()).device
        self.accel = accel  # the fits' precision and input layout, resolved

    def _run(self, fn: Callable[[torch.Tensor], torch.Tensor], x: np.ndarray) -> np.ndarray:
        xt = torch.as_tensor(x, dtype=torch.float32)
        if self.accel is None:
            return torch.cat([fn(xt[s:s + self.bs].to(self.device)).float().cpu()
                              for s in range(0, max(1, xt.shape[0]), self.bs)]).numpy()
        acc = self.accel
        with acc.autocast(self.device):
            return torch.cat([fn(acc.images(xt[s:s + self.bs].to(self.device))).float().cpu()
                              for s in range(0, max(1, xt.shape[0]), self.bs)]).numpy()

    @torch.no_grad()
    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        self.net.eval()
        return self._run(lambda t: torch.softmax(self.net(t), 1), x)

    @torch.no_grad()
    def embed(self, x: np.ndarray) -> np.ndarray:
        self.net.eval()
        return self._run(self.net.embed, x)

    @torch.no_grad()
    def mc_predict_proba(self, x: np.ndarray, passes: int, generator: torch.Generator,
                         p: float | None = None) -> np.ndarray:
        self.net.eval()
        drops = self.net.mc_dropouts()
        saved = [d.p for d in drops]
        if p is not None:  # the classifier was trained without dropout: MC passes need some
            for d in drops:
                d.p = p
        self.net.set_dropout_generator(generator, force=True)
        try:
            return np.stack([self._run(lambda t: torch.softmax(self.net(t), 1), x)
                             for _ in range(passes)])
        finally:
            self.net.set_dropout_generator(None, force=False)
            for d, sp in zip(drops, saved, strict=True):
                d.p = sp
