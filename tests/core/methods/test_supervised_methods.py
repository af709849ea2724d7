"""Hand-computable checks of the supervised baselines' losses (mixup, supcon) and the
shared mixup / soft cross-entropy helpers they use."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models.resnet import BasicBlock, Bottleneck

from scarcelab.losses import nt_xent
from scarcelab.methods import Batch, Progress, get_method
from scarcelab.methods._parts import mixup, soft_cross_entropy
from scarcelab.methods.supervised.supcon import supcon_loss
from scarcelab.models import create_model


def _method(name: str, num_classes: int = 3, **hp: float):
    torch.manual_seed(0)
    cls = get_method(name)
    return cls(create_model("small_cnn", in_channels=1), num_classes, {**cls.defaults, **hp})


def test_soft_cross_entropy_by_hand() -> None:
    logits = torch.tensor([[0.0, math.log(3.0)]])  # probabilities 1/4, 3/4
    target = torch.tensor([[0.5, 0.5]])
    expected = -(0.5 * math.log(0.25) + 0.5 * math.log(0.75))
    assert soft_cross_entropy(logits, target).item() == pytest.approx(expected, rel=1e-6)
    onehot = torch.tensor([[0.0, 1.0]])
    assert soft_cross_entropy(logits, onehot).item() == pytest.approx(
        F.cross_entropy(logits, torch.tensor([1])).item(), rel=1e-6)


def test_mixup_reproduces_its_draws() -> None:
    x = torch.arange(12.0).view(4, 3)
    t = torch.eye(4)
    torch.manual_seed(3)
    mx, mt, lam = mixup(x, t, alpha=0.4)
    torch.manual_seed(3)
    lam_ref = float(torch.distributions.Beta(0.4, 0.4).sample())
    perm = torch.randperm(4)
    assert lam == pytest.approx(lam_ref)
    torch.testing.assert_close(mx, lam_ref * x + (1 - lam_ref) * x[perm])
    torch.testing.assert_close(mt, lam_ref * t + (1 - lam_ref) * t[perm])
    torch.testing.assert_close(mt.sum(1), torch.ones(4))


def test_mixup_keep_larger_and_disabled() -> None:
    x, t = torch.randn(8, 2), torch.eye(8)
    for s in range(20):
        torch.manual_seed(s)
        assert mixup(x, t, 0.75, keep_larger=True)[2] >= 0.5
    same = mixup(x, t, 0.0)
    assert same[2] == 1.0 and same[0] is x


def test_mixup_method_uniform_predictions_give_log_c() -> None:
    """With a zeroed head the prediction is uniform, so the cross-entropy against *any*
    mixed target distribution is exactly ln C, whatever λ was drawn."""
    m = _method("mixup", alpha=1.0)
    with torch.no_grad():
        m.head.weight.zero_()
        m.head.bias.zero_()
    x = torch.rand(6, 1, 16, 16)
    out = m.step(Batch(x=[x], y=torch.tensor([0, 1, 2, 0, 1, 2]), u=[]), Progress(0, 1, 0))
    assert out["loss"].item() == pytest.approx(math.log(3), rel=1e-6)
    assert 0.0 <= out["mixup_lambda"].item() <= 1.0


def test_mixup_method_loss_is_lambda_weighted_ce() -> None:
    """loss = λ CE(f(x̃), y) + (1 − λ) CE(f(x̃), y[perm]) — the paper's form."""
    m = _method("mixup", alpha=0.5).eval()  # eval: BatchNorm uses fixed statistics
    x, y = torch.rand(5, 1, 16, 16), torch.tensor([0, 1, 2, 1, 0])
    torch.manual_seed(11)
    out = m.step(Batch(x=[x], y=y, u=[]), Progress(0, 1, 0))
    torch.manual_seed(11)
    lam = float(torch.distributions.Beta(0.5, 0.5).sample())
    perm = torch.randperm(5)
    logits = m.logits(lam * x + (1 - lam) * x[perm])
    ref = lam * F.cross_entropy(logits, y) + (1 - lam) * F.cross_entropy(logits, y[perm])
    assert out["loss"].item() == pytest.approx(ref.item(), rel=1e-5)


def test_supcon_loss_by_hand() -> None:
    """Two classes, two identical unit vectors each, T = 1: every anchor has one positive
    with similarity 1 and two negatives with similarity 0, so the loss is
    -(1 - log(e + 2)) = log(e + 2) - 1."""
    z = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    loss = supcon_loss(z, torch.tensor([0, 0, 1, 1]), temperature=1.0)
    assert loss.item() == pytest.approx(math.log(math.e + 2) - 1, rel=1e-6)


def test_supcon_equals_nt_xent_when_only_views_share_a_label() -> None:
    """With a distinct label per sample the only positive is the other view: SupCon
    reduces to SimCLR's NT-Xent (independent implementation in scarcelab.losses)."""
    torch.manual_seed(0)
    z1, z2 = torch.randn(6, 8), torch.randn(6, 8)
    labels = torch.arange(6)
    got = supcon_loss(torch.cat([z1, z2]), torch.cat([labels, labels]), 0.2)
    assert got.item() == pytest.approx(nt_xent(z1, z2, 0.2).item(), rel=1e-5)


def test_supcon_skips_anchors_without_positives() -> None:
    z = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    only_pair = supcon_loss(z[:2], torch.tensor([0, 0]), 1.0)
    assert only_pair.item() == pytest.approx(0.0, abs=1e-6)  # log softmax over one entry
    loss = supcon_loss(z, torch.tensor([0, 0, 1]), 1.0)  # anchor 2 has no positive
    assert loss.item() == pytest.approx(math.log(math.e + 1) - 1, rel=1e-6)
    alone = supcon_loss(z[:1].clone().requires_grad_(), torch.tensor([0]), 1.0)
    assert alone.item() == 0.0 and alone.requires_grad


def test_supcon_method_is_probe_evaluated_and_supervised() -> None:
    cls = get_method("supcon")
    assert cls.family == "supervised" and cls.linear_probe
    assert cls.labeled_views == ("simclr", "simclr") and cls.views == ()
    m = _method("supcon")
    assert not hasattr(m, "head")
    x = torch.rand(4, 1, 16, 16)
    out = m.step(Batch(x=[x, x], y=torch.tensor([0, 0, 1, 1]), u=[]), Progress(0, 1, 0))
    assert out["loss"].requires_grad and out["loss_labeled"] is out["loss"]


# -- DEIC methods' structure and losses (mutation sample, docs/mutation.md) ------------
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


def test_harmonize_makes_only_the_first_conv_a_harmonic_block_with_bn():
    from scarcelab.methods.supervised.harmonic import Harm2d, HarmBlockBN, harmonize

    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 4, 1),
                        nn.Conv2d(4, 6, 3, padding=1), nn.Conv2d(6, 6, 3, padding=1))
    assert harmonize(net) == 3
    assert [type(m) for m in net] == [HarmBlockBN, nn.Conv2d, Harm2d, Harm2d]
    assert net(torch.randn(2, 3, 5, 5)).shape == (2, 6, 5, 5)


@pytest.mark.parametrize("h,w", [(8, 8), (8, 6)])
def test_gabor_lowpass_is_centred_at_the_origin(h, w):
    """Filters are periodised with their origin at index (0, 0) (kymatio's convention):
    the Gaussian low-pass peaks there and is symmetric, φ[y, x] = φ[-y, -x]."""
    from scarcelab.methods.supervised.scattering import gabor

    phi = gabor(h, w, 1.6, 0.0, 0.0, 1.0).real
    assert divmod(int(phi.argmax()), w) == (0, 0)
    flipped = torch.roll(torch.flip(phi, dims=(0, 1)), shifts=(1, 1), dims=(0, 1))
    torch.testing.assert_close(phi, flipped)


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


def test_tvmf_head_uses_nn_linears_initialisation_bound():
    """nn.Linear's init (kaiming_uniform_ with a = √5) draws U(-1/√fan_in, 1/√fan_in);
    with a = 0 the bound would be √(6/fan_in), 2.45× wider."""
    from scarcelab.methods.supervised.tvmf import TvMFHead

    torch.manual_seed(0)
    w = TvMFHead(400, 50, 16.0).weight.detach()
    bound = 1 / math.sqrt(400)
    assert w.abs().max().item() <= bound
    assert w.abs().max().item() > 0.95 * bound
