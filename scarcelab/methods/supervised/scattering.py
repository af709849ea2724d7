"""``scattering``: deep hybrid networks (Oyallon, Belilovsky & Zagoruyko, ICCV 2017,
"Scaling the Scattering Transform"; gem ``pipelines/scattering.py``): a fixed 2D Morlet
scattering transform of order 2 and scale J takes the place of the network's early layers,
as gem's ``ScatteringModel.make_scat`` builds it per architecture:

* WRN (gem ``wrn_cifar.WideResNet``; ours ``WideResNetDEIC``): the transform replaces
  ``conv1``; BN (no affine) of the coefficients → 3×3 conv → BN → ReLU replaces the whole
  first stage and projects to the second stage's input width; the second and third stages
  lose their stride. WRN-16-8 on 32×32 at J = 2 thus works on 8×8 maps from the transform
  to the final pooling, as the unmodified network ends (before: 2×2).
* torchvision ResNet (gem ``rn.ResNet``; ours ``resnet50_imagenet``, ``resnet18``,
  ``resnet50``): the stem is removed, the transform replaces ``layer1``, the projection
  (conv with bias, coefficient BN momentum 0.9) replaces ``layer2`` and projects to
  ``layer3``'s width, ``layer3`` loses its stride, ``layer4`` keeps it. At 224 px and J = 3
  the maps are 28×28 up to ``layer3`` and 14×14 at the final pooling.
* any other network (``small_cnn`` …; no gem layout): the transform, BN (no affine) and a
  3×3 convolution replace the first convolution and the rest is kept, down-sampling
  included (maps 2^J smaller all the way).

The transform is our own (kymatio 0.3.0, the library gem uses, no longer imports with
SciPy ≥ 1.15: ``scipy.special.sph_harm`` was removed). It follows kymatio's Scattering2D
definitions: L = 8 orientations, Morlet wavelets ψ_{j,θ} with σ = 0.8·2^j, ξ = 3π/4·2^{-j},
slant 4/L, corrected to zero mean; a Gaussian low-pass φ_J with σ = 0.8·2^J;
coefficients ``x∗φ_J``, ``|x∗ψ_{j,θ}|∗φ_J`` and ``||x∗ψ_{j1,θ1}|∗ψ_{j2,θ2}|∗φ_J`` (j2 > j1),
subsampled by 2^J: ``1 + J·L + L²·J(J−1)/2`` channels per input channel. Convolutions
are periodic (filters periodised on the image grid; kymatio pads reflectively instead).
J is searched in {1, 2, 3} (J = 2 in the hybrid paper's CIFAR experiments; gem default 3
at 224 px) — our range.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet

from scarcelab.errors import TrialFailed
from scarcelab.methods import Batch, Losses, Progress, register
from scarcelab.methods.space import Choice
from scarcelab.methods.supervised._deic import COMMON_DEFAULTS, COMMON_SPACE, DEICMethod
from scarcelab.methods.supervised.harmonic import _replace
from scarcelab.models.wrn_deic import WideResNetDEIC
from scarcelab.models.wrn_trunk import PreActBlock

N_ANGLES = 8
MIN_SIDE = 4  # smallest map side a network without a gem hybrid layout gets (small_cnn)


def gabor(h: int, w: int, sigma: float, theta: float, xi: float, slant: float) -> torch.Tensor:
    """Periodised 2D Gabor filter on the (h, w) grid, complex128, as kymatio's ``gabor_2d``
    (rotation θ, envelope σ with aspect ``slant``, frequency ξ), normalised by 2πσ²/slant."""
    r = torch.tensor([[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]],
                     dtype=torch.float64)
    d = torch.diag(torch.tensor([1.0, slant * slant], dtype=torch.float64))
    curv = r @ d @ r.t() / (2 * sigma * sigma)
    ys = torch.arange(h, dtype=torch.float64)
    xs = torch.arange(w, dtype=torch.float64)
    out = torch.zeros(h, w, dtype=torch.complex128)
    for ky in (-1, 0, 1):
        for kx in (-1, 0, 1):
            y = (ys - h // 2)[:, None] + ky * h
            x = (xs - w // 2)[None, :] + kx * w
            arg = -(curv[0, 0] * x * x + (curv[0, 1] + curv[1, 0]) * x * y + curv[1, 1] * y * y)
            arg = arg + 1j * (x * xi * math.cos(theta) + y * xi * math.sin(theta))
            out = out + torch.exp(arg)
    out = out / (2 * math.pi * sigma * sigma / slant)
    return torch.roll(out, shifts=(-(h // 2), -(w // 2)), dims=(0, 1))  # origin at (0, 0)


def morlet(h: int, w: int, sigma: float, theta: float, xi: float, slant: float) -> torch.Tensor:
    """Gabor minus β·envelope with β chosen so the wavelet has zero mean (kymatio)."""
    wv = gabor(h, w, sigma, theta, xi, slant)
    env = gabor(h, w, sigma, theta, 0.0, slant)
    return wv - (wv.sum() / env.sum()) * env


class Scattering2D(nn.Module):
    """Order-2 scattering of (N, C, H, W) images -> (N, C·K, H/2^J, W/2^J), K as above."""

    phi_hat: torch.Tensor  # a registered buffer
    psi_hat: torch.Tensor  # a registered buffer

    def __init__(self, j: int, h: int, w: int, n_angles: int = N_ANGLES) -> None:
        super().__init__()
        if h % (2 ** j) or w % (2 ** j):
            raise ValueError(f"scattering J={j} needs sides divisible by {2 ** j}, got {h}x{w}")
        self.j, self.n_angles = j, n_angles
        phi = gabor(h, w, 0.8 * 2 ** j, 0.0, 0.0, 1.0).real
        psis = []
        for jj in range(j):
            for t in range(n_angles):
                theta = (int(n_angles - n_angles / 2 - 1) - t) * math.pi / n_angles
                psis.append(morlet(h, w, 0.8 * 2 ** jj, theta, 3.0 / 4.0 * math.pi / 2 ** jj,
                                   4.0 / n_angles))
        self.register_buffer("phi_hat", torch.fft.fft2(phi).to(torch.complex64),
                             persistent=False)  # fixed: rebuilt, never checkpointed
        self.register_buffer("psi_hat", torch.fft.fft2(torch.stack(psis)).to(torch.complex64),
                             persistent=False)

    @property
    def channels_per_input(self) -> int:
        return n_coefficients(self.j, self.n_angles)

    def _low(self, x_hat: torch.Tensor) -> torch.Tensor:
        s = 2 ** self.j
        return torch.fft.ifft2(x_hat * self.phi_hat).real[..., ::s, ::s]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        xh = torch.fft.fft2(x.float())  # (N, C, H, W)
        out = [self._low(xh)[:, :, None]]
        u1 = torch.fft.ifft2(xh[:, :, None] * self.psi_hat).abs()  # (N, C, J·L, H, W)
        u1h = torch.fft.fft2(u1)
        out.append(self._low(u1h))
        for j1 in range(self.j):
            for j2 in range(j1 + 1, self.j):
                a = u1h[:, :, j1 * self.n_angles:(j1 + 1) * self.n_angles, None]
                b = self.psi_hat[j2 * self.n_angles:(j2 + 1) * self.n_angles]
                u2 = torch.fft.ifft2(a * b).abs().flatten(2, 3)  # (N, C, L·L, H, W)
                out.append(self._low(torch.fft.fft2(u2)))
        s = torch.cat(out, dim=2)
        return s.reshape(n, c * s.shape[2], s.shape[3], s.shape[4])


def n_coefficients(j: int, n_angles: int = N_ANGLES) -> int:
    """Scattering channels per input channel: ``1 + J·L + L²·J(J−1)/2``."""
    return 1 + j * n_angles + n_angles * n_angles * j * (j - 1) // 2


class _Memo:
    """Least-recently-used transforms of evaluation batches, keyed by their bytes.

    Why: the transform is fixed, and on a CPU it is most of an evaluation's cost (the
    10,000 ciFAIR-10 test images at J = 3 took ~10 minutes on one thread). A tune study
    evaluates the same validation batches after every epoch of every trial, and the same
    test batches after each of its 10 retrains, so a study recomputed identical
    coefficients hundreds of times. Only evaluation batches on a CPU are kept: training
    batches are augmented afresh each time, and on a GPU the transform costs less than
    hashing the batch on the host would. A hit returns a copy, so nothing downstream can
    change the stored tensor; the bytes and the key (J, orientations, input shape, dtype
    and a 128-bit BLAKE2b of the input) make a false hit practically impossible."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = self.misses = 0
        self._store: OrderedDict[tuple[object, ...], torch.Tensor] = OrderedDict()

    def key(self, scat: Scattering2D, x: torch.Tensor) -> tuple[object, ...]:
        raw = x.detach().contiguous().view(torch.uint8).numpy()  # any dtype, bf16 too
        digest = hashlib.blake2b(raw.tobytes(), digest_size=16)
        return (scat.j, scat.n_angles, tuple(x.shape), str(x.dtype), digest.hexdigest())

    def get(self, key: tuple[object, ...]) -> torch.Tensor | None:
        out = self._store.get(key)
        if out is None:
            self.misses += 1
            return None
        self.hits += 1
        self._store.move_to_end(key)
        return out.clone()

    def put(self, key: tuple[object, ...], out: torch.Tensor) -> None:
        size = out.numel() * out.element_size()
        if size > self.max_bytes // 4:  # one batch may not flush the rest
            return
        self._store[key] = out.clone()
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, old = self._store.popitem(last=False)
            self.bytes -= old.numel() * old.element_size()

    def clear(self) -> None:
        self._store.clear()
        self.bytes = self.hits = self.misses = 0


#: One per process, shared by every model of a study (each trial and retrain builds its own
#: front, with the same filters for the same J). 1 GiB holds the 10,000 ciFAIR-10 test
#: images at J = 1, 2 or 3 (0.28, 0.62, 0.42 GB of coefficients).
MEMO = _Memo(max_bytes=1 << 30)


class ScatteringFront(nn.Module):
    """The fixed transform as a layer: (N, C, H, W) -> (N, C·K, H/2^J, W/2^J), no gradient.

    Filters are built for the first input size seen (images of one dataset share it) and
    never checkpointed. ``min_side``: the smallest map side the rest of the network accepts
    (1 where, as in gem's hybrids, nothing down-samples the map far enough to empty it)."""

    def __init__(self, j: int, min_side: int) -> None:
        super().__init__()
        self.j, self.min_side = j, min_side
        self.scat: Scattering2D | None = None
        self._size: tuple[int, int] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = (x.shape[2], x.shape[3])
        if min(size) // 2 ** self.j < self.min_side:
            raise TrialFailed(f"scattering J={self.j} turns {size[0]}x{size[1]} inputs into "
                              f"maps smaller than {self.min_side}x{self.min_side}, too small "
                              "for the base network's down-sampling; use a smaller J")
        if self.scat is None or self._size != size:
            self.scat = Scattering2D(self.j, *size).to(x.device)
            self._size = size
        with torch.no_grad():
            if self.training or x.device.type != "cpu":
                return self.scat(x)
            key = MEMO.key(self.scat, x)
            out = MEMO.get(key)
            if out is None:
                out = self.scat(x)
                MEMO.put(key, out)
            return out


def projection(channels: int, width: int, bias: bool, momentum: float) -> nn.Sequential:
    """gem's block after the transform: BN (no affine) of the coefficients, a 3×3 convolution
    to the width of the first stage kept, BN, ReLU."""
    return nn.Sequential(nn.BatchNorm2d(channels, affine=False, momentum=momentum),
                         nn.Conv2d(channels, width, 3, 1, 1, bias=bias),
                         nn.BatchNorm2d(width), nn.ReLU(inplace=True))


def _hybrid_wrn(net: WideResNetDEIC, j: int) -> None:
    """gem ``ScatteringModel.make_scat``, ``wrn_cifar.WideResNet`` branch: the transform
    replaces ``conv1``, the projection (conv without bias, BN momentum PyTorch's default)
    replaces ``block1`` and projects to ``block2``'s input width, and the first blocks of
    ``block2`` and ``block3`` lose their stride (``conv1`` and ``convShortcut``)."""
    n = net.n_per_stage
    later = cast("list[PreActBlock]", list(net.blocks)[n:])  # WideBlocks, all of them
    cin = net.conv.in_channels
    width = later[0].conv1.in_channels
    for b in (later[0], later[n]):
        b.conv1.stride = (1, 1)
        if b.shortcut is not None:
            b.shortcut.stride = (1, 1)
        b.stride = 1
    _replace(net, "conv", nn.Sequential(ScatteringFront(j, min_side=1),
                                        projection(cin * n_coefficients(j), width, bias=False,
                                                   momentum=0.1)))
    net.blocks = nn.Sequential(*later)


def _hybrid_resnet(net: ResNet, j: int) -> None:
    """gem ``ScatteringModel.make_scat``, ``rn.ResNet`` (torchvision) branch: stem (``conv1``,
    ``bn1``, ``relu``, ``maxpool``) removed, the transform replaces ``layer1``, the projection
    (conv with bias, coefficient BN momentum 0.9) replaces ``layer2`` and projects to
    ``layer3``'s input width, and ``layer3``'s first block loses its stride: a bottleneck's
    3×3 ``conv2`` and its ``downsample`` convolution; a basic block gets a stride-1 ``conv1``
    at its output width and no ``downsample``."""
    cin = net.conv1.in_channels
    for name in ("conv1", "bn1", "relu", "maxpool"):
        _replace(net, name, nn.Identity())
    first = net.layer3[0]
    if isinstance(first, Bottleneck):
        width = first.conv1.in_channels
        first.conv2.stride = (1, 1)
        down = first.downsample  # (conv 1×1, BN): a strided stage's first block has one
        assert isinstance(down, nn.Sequential)
        down_conv = down[0]
        assert isinstance(down_conv, nn.Conv2d)
        down_conv.stride = (1, 1)
    elif isinstance(first, BasicBlock):
        width = first.conv1.out_channels
        first.conv1 = nn.Conv2d(width, width, 3, 1, 1, bias=False)
        first.downsample = None
    else:
        raise ValueError(f"scattering: unsupported ResNet block {type(first).__name__}")
    first.stride = 1
    _replace(net, "layer1", ScatteringFront(j, min_side=1))
    net.layer2 = projection(cin * n_coefficients(j), width, bias=True, momentum=0.9)


def _hybrid_first_conv(backbone: nn.Module, j: int) -> None:
    """Networks gem has no hybrid of (``small_cnn`` and the other CPU-scale nets): the
    transform, BN (no affine, momentum 0.9) and a 3×3 convolution to the replaced layer's
    width stand in for the first convolution; the rest of the network, its down-sampling
    included, is kept, so its maps must not shrink below ``MIN_SIDE``."""
    for name, m in backbone.named_modules():
        if isinstance(m, nn.Conv2d):
            k = m.in_channels * n_coefficients(j)
            _replace(backbone, name, nn.Sequential(
                ScatteringFront(j, min_side=MIN_SIDE),
                nn.BatchNorm2d(k, affine=False, momentum=0.9),
                nn.Conv2d(k, m.out_channels, 3, 1, 1, bias=False)))
            return
    raise ValueError("scattering: the backbone has no convolution to replace")


def hybridize(backbone: nn.Module, j: int) -> str:
    """Make ``backbone`` (possibly wrapped, e.g. in ``Standardized``) a deep hybrid network
    in place, as gem builds one for its architecture; returns the layout used:
    ``"wrn"``, ``"resnet"`` or ``"first_conv"``."""
    for m in backbone.modules():
        if isinstance(m, WideResNetDEIC):
            _hybrid_wrn(m, j)
            return "wrn"
        if isinstance(m, ResNet):
            _hybrid_resnet(m, j)
            return "resnet"
    _hybrid_first_conv(backbone, j)
    return "first_conv"


@register("scattering")
class Scattering(DEICMethod):
    paper = "Oyallon et al. 2017, Scaling the Scattering Transform: Deep Hybrid Networks, ICCV"
    search_space = {**COMMON_SPACE, "J": Choice((1, 2, 3))}
    defaults = {**COMMON_DEFAULTS, "J": 2}

    def __init__(self, backbone: nn.Module, num_classes: int, hp: dict[str, Any]) -> None:
        hybridize(backbone, int({**self.defaults, **hp}["J"]))
        super().__init__(backbone, num_classes, hp)

    def step(self, batch: Batch, progress: Progress) -> Losses:
        loss = F.cross_entropy(self.logits(batch.x[0]), batch.y)
        return {"loss": loss, "loss_labeled": loss}


__all__ = ["Scattering2D", "ScatteringFront", "hybridize", "morlet", "n_coefficients"]
