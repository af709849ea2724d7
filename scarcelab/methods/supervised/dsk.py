"""``dsk``: dual selective kernel networks (Sun et al., ECCV 2020 VIPriors workshop,
"Visual Inductive Priors for Data-Efficient Image Classification" challenge entry;
gem ``pipelines/dsk``), trained with plain cross-entropy as in "Tune It or Don't Use It"
(which drops DSK's composite positive-class/cosine/centre loss).

A selective-kernel (SK) convolution (Li et al., CVPR 2019) runs M = 2 grouped 3×3
branches with dilation 1 and 2 (each conv → BN → ReLU), sums them, squeezes the sum by
global pooling into ``z = ReLU(BN(FC(s)))`` of size ``max(C/r, L)`` (r = 16, L = 32) and
mixes the branches with per-channel softmax attention over M. A strided SK convolution
convolves at stride 1 and down-samples with an anti-aliasing blur (``BlurPool``, Zhang,
ICML 2019: reflect padding, 3×3 binomial filter) before its BN (gem ``SKBlock``).

The *dual* unit is a whole residual block, as gem's ``selective_kernel.py`` builds it: two
independent copies of the block's residual branch (``branch1``, ``branch2``) are both
computed, and the block returns ``w·branch1 + (1−w)·branch2 + shortcut`` with
``w ~ Bernoulli(½)`` drawn once per block and forward pass (global RNG, seeded per trial) in
training and ``w = ½`` at inference. Computing both (rather than only the drawn one) is
what gem does: the branch not drawn still updates its BatchNorm statistics and, at zero
gradient, still gets SGD's momentum and weight-decay step. Per architecture:

* WRN (gem ``DSKWideBlock``; ours ``WideBlock`` of ``WideResNetDEIC``): a branch is
  BN → ReLU → SK(stride) → BN → ReLU → SK, 8 groups; the shortcut is the identity, or a
  1×1 convolution at stride 1 followed by ``BlurPool`` at the block's stride (which blurs
  even at stride 1, as gem's) when the width or stride changes; it takes the block input
  itself, not its pre-activation.
* torchvision ResNet bottleneck (gem ``DSKBottleneck``; ours ``resnet50_imagenet`` …): a
  branch is 1×1 conv → BN → ReLU to a bottleneck width of ``M·planes`` → SK(stride, 32
  groups) → 1×1 conv → BN to ``4·planes`` → ReLU; the block adds the torchvision
  ``downsample``, its strided 1×1 convolution replaced by a stride-1 one and ``BlurPool``,
  and applies ReLU.
* torchvision ResNet basic block (gem ``DSKBasicBlock``; ``resnet18``): a branch is
  SK(stride) → BN → ReLU → SK → BN → ReLU, 32 groups, the block as above.

Every convolution of the new blocks gets the base networks' initialisation (Kaiming normal,
fan-out), as gem's blocks get from the WRN / torchvision constructors that build them.

Networks without residual blocks (``small_cnn`` and the other CPU-scale nets; gem has no
DSK variant of them) fall back to a dual SK unit per 3×3 convolution (groups
``gcd(8, C_in, C_out)``) under the same selection rule, stated wherever used.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models.resnet import BasicBlock, Bottleneck

from scarcelab.methods import Batch, Losses, Progress, register
from scarcelab.methods.supervised._deic import DEICMethod
from scarcelab.methods.supervised.harmonic import _replace
from scarcelab.models.wrn_deic import WideBlock

GROUPS_WRN, GROUPS_RESNET, R, L, M = 8, 32, 16, 32, 2
GROUPS = GROUPS_WRN  # the per-convolution fallback's group count (capped by the widths)


class BlurPool(nn.Module):
    """Anti-aliased down-sampling: reflect-pad by 1, depthwise 3×3 binomial filter
    ``[1, 2, 1]ᵀ[1, 2, 1] / 16``, then stride ``stride`` (gem ``BlurPool(filt_size=3)``)."""

    filt: torch.Tensor  # a registered buffer

    def __init__(self, channels: int, stride: int) -> None:
        super().__init__()
        f = torch.tensor([1.0, 2.0, 1.0])
        k = torch.outer(f, f) / 16.0
        self.register_buffer("filt", k.expand(channels, 1, 3, 3).clone(), persistent=False)
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(F.pad(x, (1, 1, 1, 1), mode="reflect"), self.filt, stride=self.stride,
                        groups=x.shape[1])


class SKConv(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, groups: int) -> None:
        super().__init__()

        def branch(i: int) -> nn.Sequential:
            layers: list[nn.Module] = [nn.Conv2d(cin, cout, 3, 1, 1 + i, dilation=1 + i,
                                                 groups=groups, bias=False)]
            if stride > 1:
                layers.append(BlurPool(cout, stride))
            return nn.Sequential(*layers, nn.BatchNorm2d(cout), nn.ReLU(inplace=False))

        self.branches = nn.ModuleList([branch(i) for i in range(M)])
        d = max(cout // R, L)
        self.squeeze = nn.Sequential(nn.Conv2d(cout, d, 1, bias=False), nn.BatchNorm2d(d),
                                     nn.ReLU(inplace=False))
        self.attend = nn.Conv2d(d, cout * M, 1)
        self.cout = cout

    def attention(self, feats: torch.Tensor) -> torch.Tensor:
        """Softmax over the M branches, per channel: (N, M, C, 1, 1)."""
        z = self.squeeze(F.adaptive_avg_pool2d(feats.sum(1), 1))
        return torch.softmax(self.attend(z).view(-1, M, self.cout, 1, 1), dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = torch.stack([b(x) for b in self.branches], dim=1)  # (N, M, C, H, W)
        return (feats * self.attention(feats)).sum(1)


def dual(a: nn.Module, b: nn.Module, x: torch.Tensor, training: bool) -> torch.Tensor:
    """``w·a(x) + (1−w)·b(x)``, both computed: w ∈ {0, 1} drawn in training, ½ otherwise."""
    w = float(torch.randint(0, 2, ()).item()) if training else 0.5
    return w * a(x) + (1.0 - w) * b(x)


class _WideBranch(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, groups: int) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(cin)
        self.sk1 = SKConv(cin, cout, stride, groups)
        self.bn2 = nn.BatchNorm2d(cout)
        self.sk2 = SKConv(cout, cout, 1, groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.sk2(F.relu(self.bn2(self.sk1(F.relu(self.bn1(x))))))


class DSKWideBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, groups: int = GROUPS_WRN) -> None:
        super().__init__()
        self.shortcut = None if cin == cout and stride == 1 else nn.Sequential(
            nn.Conv2d(cin, cout, 1, 1, 0, bias=False), BlurPool(cout, stride))
        self.branch1 = _WideBranch(cin, cout, stride, groups)
        self.branch2 = _WideBranch(cin, cout, stride, groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        res = x if self.shortcut is None else self.shortcut(x)
        return dual(self.branch1, self.branch2, x, self.training) + res


class _BottleneckBranch(nn.Module):
    def __init__(self, cin: int, planes: int, stride: int, groups: int) -> None:
        super().__init__()
        mid, out = planes * M, planes * Bottleneck.expansion
        self.conv1 = nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid),
                                   nn.ReLU(inplace=True))
        self.sk = SKConv(mid, mid, stride, groups)
        self.conv3 = nn.Sequential(nn.Conv2d(mid, out, 1, bias=False), nn.BatchNorm2d(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv3(self.sk(self.conv1(x))))


class _BasicBranch(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, groups: int) -> None:
        super().__init__()
        self.sk1 = SKConv(cin, cout, stride, groups)
        self.bn1 = nn.BatchNorm2d(cout)
        self.sk2 = SKConv(cout, cout, 1, groups)
        self.bn2 = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn2(self.sk2(F.relu(self.bn1(self.sk1(x))))))


def anti_aliased(downsample: nn.Module | None) -> nn.Module | None:
    """A torchvision ``downsample`` (1×1 conv, BN) with its strided convolution replaced by
    the same convolution at stride 1 followed by ``BlurPool`` at the stride."""
    if downsample is None:
        return None
    layers: list[nn.Module] = []
    for m in downsample.children():
        if isinstance(m, nn.Conv2d) and m.stride[0] > 1:
            s = m.stride[0]
            m.stride = (1, 1)
            layers += [m, BlurPool(m.out_channels, s)]
        else:
            layers.append(m)
    return nn.Sequential(*layers)


class DSKResBlock(nn.Module):
    """gem ``DSKBottleneck`` / ``DSKBasicBlock``: ``ReLU(dual(branches) + downsample(x))``."""

    def __init__(self, block: Bottleneck | BasicBlock, groups: int = GROUPS_RESNET) -> None:
        super().__init__()
        stride = int(block.stride)
        if isinstance(block, Bottleneck):
            cin, planes = block.conv1.in_channels, block.conv3.out_channels // Bottleneck.expansion
            self.branch1: nn.Module = _BottleneckBranch(cin, planes, stride, groups)
            self.branch2: nn.Module = _BottleneckBranch(cin, planes, stride, groups)
        else:
            cin, cout = block.conv1.in_channels, block.conv2.out_channels
            self.branch1 = _BasicBranch(cin, cout, stride, groups)
            self.branch2 = _BasicBranch(cin, cout, stride, groups)
        self.downsample = anti_aliased(block.downsample)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        res = x if self.downsample is None else self.downsample(x)
        return F.relu(dual(self.branch1, self.branch2, x, self.training) + res)


class DualSK(nn.Module):
    """The fallback for networks without residual blocks: one 3×3 convolution as a dual SK
    unit under the same selection rule."""

    def __init__(self, conv: nn.Conv2d) -> None:
        super().__init__()
        g = math.gcd(math.gcd(GROUPS, conv.in_channels), conv.out_channels)
        s = conv.stride[0]
        self.a = SKConv(conv.in_channels, conv.out_channels, s, g)
        self.b = SKConv(conv.in_channels, conv.out_channels, s, g)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dual(self.a, self.b, x, self.training)


def _init(block: nn.Module) -> nn.Module:
    for m in block.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    return block


def dual_selective_kernels(backbone: nn.Module) -> tuple[str, int]:
    """Rebuild ``backbone`` (possibly wrapped, e.g. in ``Standardized``) with dual selective
    kernels in place; returns (layout: ``"wrn"``, ``"resnet"`` or ``"per_conv"``, number of
    blocks or convolutions converted)."""
    wide = [(n, m) for n, m in backbone.named_modules() if isinstance(m, WideBlock)]
    if wide:
        for name, b in wide:
            _replace(backbone, name, _init(DSKWideBlock(b.bn1.num_features,
                                                        b.conv1.out_channels, b.stride)))
        return "wrn", len(wide)
    res = [(n, m) for n, m in backbone.named_modules()
           if isinstance(m, (Bottleneck, BasicBlock))]
    if res:
        for name, b in res:
            _replace(backbone, name, _init(DSKResBlock(b)))
        return "resnet", len(res)
    convs = [(n, m) for n, m in backbone.named_modules()
             if isinstance(m, nn.Conv2d) and m.kernel_size == (3, 3)]
    for name, conv in convs:
        _replace(backbone, name, DualSK(conv))
    return "per_conv", len(convs)


@register("dsk")
class DSK(DEICMethod):
    paper = ("Sun et al. 2020, Visual Inductive Priors for Data-Efficient Image "
             "Classification (DSK networks), ECCV Workshops")

    def __init__(self, backbone: nn.Module, num_classes: int, hp: dict[str, Any]) -> None:
        if dual_selective_kernels(backbone)[1] == 0:
            raise ValueError("dsk: the backbone has no residual block or 3×3 convolution to "
                             "convert")
        super().__init__(backbone, num_classes, hp)

    def step(self, batch: Batch, progress: Progress) -> Losses:
        loss = F.cross_entropy(self.logits(batch.x[0]), batch.y)
        return {"loss": loss, "loss_labeled": loss}
