"""``scattering``: deep hybrid networks (Oyallon, Belilovsky & Zagoruyko, ICCV 2017,
"Scaling the Scattering Transform"; gem ``pipelines/scattering.py``): a fixed 2D Morlet
scattering transform of order 2 and scale J replaces the first convolution, followed by
BatchNorm (no affine) and a learned 3×3 convolution to that layer's width; the rest of
the network is unchanged and sees maps 2^J times smaller.

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

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from scarcelab.errors import TrialFailed
from scarcelab.methods import Batch, Losses, Progress, register
from scarcelab.methods.space import Choice
from scarcelab.methods.supervised._deic import COMMON_DEFAULTS, COMMON_SPACE, DEICMethod
from scarcelab.methods.supervised.harmonic import _replace

N_ANGLES = 8
MIN_SIDE = 4  # smallest scattering map side handed to the base network


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
        j, n = self.j, self.n_angles
        return 1 + j * n + n * n * j * (j - 1) // 2

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


class ScatteringStem(nn.Module):
    """Scattering → BatchNorm(affine=False) → 3×3 conv to the replaced layer's width.
    Filters are built for the first input size seen (images of one dataset share it)."""

    def __init__(self, conv: nn.Conv2d, j: int) -> None:
        super().__init__()
        self.j, self.cin = j, conv.in_channels
        k = 1 + j * N_ANGLES + N_ANGLES * N_ANGLES * j * (j - 1) // 2
        # momentum 0.9 (gem's ResNet hybrid stem): scattering coefficients have tiny
        # variances, so running statistics started at var = 1 must forget that quickly or
        # evaluation sees inputs scaled far off those of training
        self.bn = nn.BatchNorm2d(self.cin * k, affine=False, momentum=0.9)
        self.conv = nn.Conv2d(self.cin * k, conv.out_channels, 3, 1, 1, bias=False)
        self.scat: Scattering2D | None = None
        self._size: tuple[int, int] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = (x.shape[2], x.shape[3])
        if min(size) // 2 ** self.j < MIN_SIDE:
            raise TrialFailed(f"scattering J={self.j} turns {size[0]}x{size[1]} inputs into "
                              f"maps smaller than {MIN_SIDE}x{MIN_SIDE}, too small for the "
                              "base network's down-sampling; use a smaller J")
        if self.scat is None or self._size != size:
            self.scat = Scattering2D(self.j, *size).to(x.device)
            self._size = size
        with torch.no_grad():
            s = self.scat(x)
        return self.conv(self.bn(s))


def hybridize(backbone: nn.Module, j: int) -> None:
    for name, m in backbone.named_modules():
        if isinstance(m, nn.Conv2d):
            _replace(backbone, name, ScatteringStem(m, j))
            return
    raise ValueError("scattering: the backbone has no convolution to replace")


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


__all__ = ["Scattering2D", "hybridize", "morlet"]
