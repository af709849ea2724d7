"""Behaviours of scarcelab/methods that the seeded mutation sample (docs/mutation.md) showed
no test checked. Expected values are hand-derived from the documented contracts and the
papers cited in each method's docstring; every network here is tiny, CPU and seeded."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torchvision.models.resnet import BasicBlock, Bottleneck

from scarcelab.methods import Batch, DataInfo, Progress, get_method
from scarcelab.methods._parts import soft_cross_entropy
from scarcelab.methods.space import (
    Distribution,
    IntLogUniform,
    LogUniform,
    contains,
    int_pow10,
    pow10,
)

C = 3


class MeanPixel(nn.Module):
    """Features ``(mean pixel, 1)``, no BatchNorm: an image of constant value ``m`` under
    the head ``W = [[10, 0], [0, 0], [-10, 0]]`` has logits ``(10m, 0, -10m)``."""

    num_features = 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = x.mean(dim=(1, 2, 3))
        return torch.stack([m, torch.ones_like(m)], dim=1)


def _images(values: list[float]) -> torch.Tensor:
    return torch.tensor(values).view(-1, 1, 1, 1).expand(-1, 1, 4, 4).contiguous()


def _semi(name: str, backbone: nn.Module | None = None, **hp: object):
    torch.manual_seed(0)
    cls = get_method(name)
    m = cls(backbone if backbone is not None else MeanPixel(), C, {**cls.defaults, **hp})
    with torch.no_grad():
        m.head.weight.copy_(torch.tensor([[10.0, 0.0], [0.0, 0.0], [-10.0, 0.0]]))
        m.head.bias.zero_()
    m.on_train_start(DataInfo(n_labeled=3, n_unlabeled=4, num_classes=C,
                              labeled_class_counts=[1, 1, 1]))
    return m


def _ce(logits: list[float], y: int) -> float:
    return math.log(sum(math.exp(v) for v in logits)) - logits[y]


# ---------------------------------------------------------------------------------------
# _parts.soft_cross_entropy


def test_soft_cross_entropy_normalises_over_the_last_axis_of_a_3d_batch():
    """Classes are the last axis (the sum is over dim=-1), whatever the leading shape; for
    a 3-D input torch's implicit softmax dim would be 0, not the class axis."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 4, generator=g)
    targets = torch.softmax(torch.randn(2, 3, 4, generator=g), dim=-1)
    got = soft_cross_entropy(logits, targets, reduction="none")
    assert got.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            row, t = logits[i, j].tolist(), targets[i, j].tolist()
            lse = math.log(sum(math.exp(v) for v in row))
            want = -sum(tk * (lk - lse) for tk, lk in zip(t, row, strict=True))
            assert got[i, j].item() == pytest.approx(want, rel=1e-5)


# ---------------------------------------------------------------------------------------
# BYOL


def test_byol_heads_hidden_width_is_twice_the_backbone_features():
    """byol.py's docstring: heads are scaled to the backbone, hidden = 2·features (BYOL
    uses 4096 hidden / 256 out on ResNet-50's 2048 features, i.e. 2×)."""
    class Feats(nn.Module):
        num_features = 4

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.flatten(1)[:, :4]

    torch.manual_seed(0)
    m = get_method("byol")(Feats(), C, {"proj_dim": 6})
    lin = [mod for mod in m.projector.modules() if isinstance(mod, nn.Linear)]
    assert [(x.in_features, x.out_features) for x in lin] == [(4, 8), (8, 6)]
    t_lin = [mod for mod in m.target_projector.modules() if isinstance(mod, nn.Linear)]
    assert [(x.in_features, x.out_features) for x in t_lin] == [(4, 8), (8, 6)]


# ---------------------------------------------------------------------------------------
# DS3L


class MeanPixelWithSpare(MeanPixel):
    """MeanPixel plus a parameter the forward pass never uses (a frozen-out branch)."""

    def __init__(self) -> None:
        super().__init__()
        self.spare = nn.Parameter(torch.zeros(2))


def test_ds3l_virtual_step_tolerates_a_parameter_without_gradient():
    """The virtual step differentiates with ``allow_unused=True``: a backbone parameter
    the loss does not reach gets no gradient and stays as it is in θ̂, so the meta step
    (WNet's update) is the same as for the backbone without that parameter."""
    batch = Batch(x=[_images([1.0, 0.0, -1.0])], y=torch.tensor([0, 1, 2]),
                  u=[_images([1.0, 0.2, -1.0, 0.05]), _images([0.0, 1.0, 0.5, -1.0])])
    outs, wnets = [], []
    for bb in (MeanPixel(), MeanPixelWithSpare()):
        m = _semi("ds3l", bb, wnet_lr=1e-2)
        outs.append(m.step(batch, Progress(5, 10, 0)))
        wnets.append([p.detach().clone() for p in m.wnet.parameters()])
    assert outs[1]["loss"].item() == pytest.approx(outs[0]["loss"].item(), rel=1e-6)
    for a, b in zip(*wnets, strict=True):
        torch.testing.assert_close(a, b)
    assert not all(torch.equal(a, b) for a, b in zip(
        wnets[0], [p for p in _semi("ds3l", MeanPixel()).wnet.parameters()], strict=True))


# ---------------------------------------------------------------------------------------
# FixMatch, weak_no_grad lever


def test_fixmatch_weak_no_grad_step_by_hand():
    """With ``weak_no_grad`` labeled (3) and strong (4) images share one pass and must be
    split back by their sizes. MeanPixel has no BatchNorm, so the result is the paper's
    loss worked out by hand: weak 1.0 and -1.0 pass τ = 0.95 (0.99995) with labels 0 and
    2, 0.2 (0.867) and 0.05 do not; loss_u = (CE(strong 0.0, 0) + CE(strong 0.5, 2)) / 4."""
    m = _semi("fixmatch", weak_no_grad=True, lambda_u=2.0)
    batch = Batch(x=[_images([1.0, 0.0, -1.0])], y=torch.tensor([0, 1, 2]),
                  u=[_images([1.0, 0.2, -1.0, 0.05]), _images([0.0, 1.0, 0.5, -1.0])])
    out = m.step(batch, Progress(0, 10, 0))

    def lg(v: float) -> list[float]:
        return [10 * v, 0.0, -10 * v]

    loss_l = (_ce(lg(1.0), 0) + _ce(lg(0.0), 1) + _ce(lg(-1.0), 2)) / 3
    loss_u = (_ce(lg(0.0), 0) + _ce(lg(0.5), 2)) / 4
    assert out["mask_rate"].item() == pytest.approx(0.5)
    assert out["loss_labeled"].item() == pytest.approx(loss_l, rel=1e-5)
    assert out["loss_unlabeled"].item() == pytest.approx(loss_u, rel=1e-5)
    assert out["loss"].item() == pytest.approx(loss_l + 2.0 * loss_u, rel=1e-5)


# ---------------------------------------------------------------------------------------
# MixMatch pseudo-targets (diagnostics)


def test_mixmatch_pseudo_targets_are_the_sharpened_argmax_with_unit_weights():
    """MixMatch filters nothing: every guess has weight 1, the label is the arg-max of
    the sharpened prediction (= the arg-max of the logits (10m, 0, -10m))."""
    m = _semi("mixmatch")
    pt = m.pseudo_targets(_images([1.0, -1.0, 0.2, -0.3]))
    assert pt is not None
    assert pt.labels.tolist() == [0, 2, 0, 2]
    assert pt.weights.tolist() == [1.0, 1.0, 1.0, 1.0]
    torch.testing.assert_close(pt.logits[:, 0], torch.tensor([10.0, -10.0, 2.0, -3.0]))


# ---------------------------------------------------------------------------------------
# search space


def test_contains_rejects_values_of_an_unknown_distribution_kind():
    class Fixed(Distribution):
        def suggest(self, trial, name):  # type: ignore[no-untyped-def]
            return 1

    assert contains(Fixed(), 1) is False


def test_pow10_and_int_pow10_bounds_are_the_papers_notation():
    """``3·10^U(-5,-2)`` is log-uniform on [3e-5, 3e-2]; ``int 10^U(1,3)`` on [10, 1000]."""
    d = pow10(3, -5, -2)
    assert isinstance(d, LogUniform)
    assert d.low == pytest.approx(3e-5) and d.high == pytest.approx(3e-2)
    assert contains(d, 3e-5) and not contains(d, 1e-6)
    i = int_pow10(1, 3)
    assert isinstance(i, IntLogUniform)
    assert (i.low, i.high) == (10, 1000)
    assert contains(i, 10) and not contains(i, 9)


# ---------------------------------------------------------------------------------------
# DSK


def test_sk_branches_end_in_relu():
    """SK convolution (Li et al. 2019, §3.1): each branch is conv → BN → ReLU, so each
    branch's output is non-negative (BN alone is zero-mean, half negative)."""
    from scarcelab.methods.supervised.dsk import SKConv

    torch.manual_seed(0)
    sk = SKConv(4, 8, 1, 4).train()
    x = torch.randn(3, 4, 6, 6)
    for b in sk.branches:
        y = b(x)
        assert y.min().item() >= 0.0 and y.max().item() > 0.0


# ---------------------------------------------------------------------------------------
# F-Conv


def test_full_convolution_counts_the_kxk_convs_it_widens():
    """WideBlock: conv1 and conv2 (3×3) widen, the 1×1 shortcut does not; a torchvision
    BasicBlock has two 3×3 convolutions, a Bottleneck one; a loose 3×3 counts 1."""
    from scarcelab.methods.supervised.fconv import full_convolution
    from scarcelab.models.wrn_deic import WideBlock

    wrn = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), WideBlock(4, 8, 2))
    assert full_convolution(wrn) == 3
    assert wrn[1].shortcut.padding == (0, 0) and wrn[1].conv1.padding == (2, 2)
    down = nn.Sequential(nn.Conv2d(4, 8, 1, 2, bias=False), nn.BatchNorm2d(8))
    assert full_convolution(nn.Sequential(BasicBlock(4, 8, 2, downsample=down))) == 2
    assert full_convolution(nn.Sequential(BasicBlock(8, 8))) == 2
    assert full_convolution(nn.Sequential(Bottleneck(32, 8))) == 1


# ---------------------------------------------------------------------------------------
# harmonic


def test_harmonize_makes_only_the_first_conv_a_harmonic_block_with_bn():
    from scarcelab.methods.supervised.harmonic import Harm2d, HarmBlockBN, harmonize

    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 4, 1),
                        nn.Conv2d(4, 6, 3, padding=1), nn.Conv2d(6, 6, 3, padding=1))
    assert harmonize(net) == 3
    assert [type(m) for m in net] == [HarmBlockBN, nn.Conv2d, Harm2d, Harm2d]
    assert net(torch.randn(2, 3, 5, 5)).shape == (2, 6, 5, 5)


# ---------------------------------------------------------------------------------------
# scattering


@pytest.mark.parametrize("h,w", [(8, 8), (8, 6)])
def test_gabor_lowpass_is_centred_at_the_origin(h, w):
    """Filters are periodised with their origin at index (0, 0) (kymatio's convention):
    the Gaussian low-pass peaks there and is symmetric, φ[y, x] = φ[-y, -x]."""
    from scarcelab.methods.supervised.scattering import gabor

    phi = gabor(h, w, 1.6, 0.0, 0.0, 1.0).real
    assert divmod(int(phi.argmax()), w) == (0, 0)
    flipped = torch.roll(torch.flip(phi, dims=(0, 1)), shifts=(1, 1), dims=(0, 1))
    torch.testing.assert_close(phi, flipped)


# ---------------------------------------------------------------------------------------
# SupCon


def test_supcon_averages_over_each_anchors_positives():
    """Khosla et al. 2020, Eq. 2 (L_out), T = 1, z = e1, e1, e2, e2 with labels 0, 0, 0, 1.
    Anchor 0 (and 1): positives {1, 2} with logits 1 and 0 among {1, 0, 0}:
    -(1 - 2 ln(e + 2)) / 2. Anchor 2: positives {0, 1}, logits 0, 0 among {0, 0, 1}:
    ln(e + 2). Anchor 3 has no positive and is skipped."""
    from scarcelab.methods.supervised.supcon import supcon_loss

    z = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    lse = math.log(math.e + 2)
    a0 = -(1 - 2 * lse) / 2
    want = (2 * a0 + lse) / 3
    got = supcon_loss(z, torch.tensor([0, 0, 0, 1]), 1.0)
    assert got.item() == pytest.approx(want, rel=1e-6)


# ---------------------------------------------------------------------------------------
# t-vMF


def test_tvmf_head_uses_nn_linears_initialisation_bound():
    """nn.Linear's init (kaiming_uniform_ with a = √5) draws U(-1/√fan_in, 1/√fan_in);
    with a = 0 the bound would be √(6/fan_in), 2.45× wider."""
    from scarcelab.methods.supervised.tvmf import TvMFHead

    torch.manual_seed(0)
    w = TvMFHead(400, 50, 16.0).weight.detach()
    bound = 1 / math.sqrt(400)
    assert w.abs().max().item() <= bound
    assert w.abs().max().item() > 0.95 * bound
