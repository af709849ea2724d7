"""Hand-computed training steps of the semi-supervised methods (issue 12).

The backbone here is ``MeanPixel``: features ``(mean pixel, 1)``, no BatchNorm, so with the
head set to ``W = [[10, 0], [0, 0], [-10, 0]]`` an image of constant value ``m`` has logits
``(10m, 0, −10m)`` whatever else is in the batch. Every expected number below is worked
out from that formula in plain Python (``math``), independently of the code under test.
The weak and strong views hold *different* images, so taking pseudo-labels, thresholds or
weights from the wrong view changes the result.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from scarcelab.losses.graph_contrastive import graph_contrastive_loss
from scarcelab.methods import Batch, DataInfo, Progress, get_method
from scarcelab.methods._parts import LearningStatus, confidence_mask

C = 3
WEAK = [1.0, 0.2, -1.0, 0.05]
STRONG = [0.0, 1.0, 0.5, -1.0]
LABELED = [1.0, 0.0, -1.0]
Y = [0, 1, 2]


class MeanPixel(nn.Module):
    """Features ``(mean pixel, 1)``, no BatchNorm: an image of constant value ``m`` under
    the head ``W = [[10, 0], [0, 0], [-10, 0]]`` has logits ``(10m, 0, -10m)``."""

    num_features = 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = x.mean(dim=(1, 2, 3))
        return torch.stack([m, torch.ones_like(m)], dim=1)


def _method(name: str, n_unlabeled: int = 4, **hp: object):
    torch.manual_seed(0)
    cls = get_method(name)
    m = cls(MeanPixel(), C, {**cls.defaults, **hp})
    with torch.no_grad():
        m.head.weight.copy_(torch.tensor([[10.0, 0.0], [0.0, 0.0], [-10.0, 0.0]]))
        m.head.bias.zero_()
    m.on_train_start(DataInfo(n_labeled=3, n_unlabeled=n_unlabeled, num_classes=C,
                              labeled_class_counts=[1, 1, 1]))
    return m


def _images(values: list[float]) -> torch.Tensor:
    return torch.tensor(values).view(-1, 1, 1, 1).expand(-1, 1, 4, 4).contiguous()


def _batch(m, views: list[list[float]]) -> Batch:
    return Batch(x=[_images(LABELED) for _ in m.labeled_views], y=torch.tensor(Y),
                 u=[_images(v) for v in views], u_index=torch.arange(len(views[0])))


def logits(v: float) -> list[float]:
    return [10 * v, 0.0, -10 * v]


def softmax(z: list[float]) -> list[float]:
    e = [math.exp(a) for a in z]
    return [a / sum(e) for a in e]


def ce(z: list[float], y: int) -> float:
    return math.log(sum(math.exp(a) for a in z)) - z[y]


def argmax(p: list[float]) -> int:
    return max(range(len(p)), key=lambda i: p[i])


LOSS_L = sum(ce(logits(v), y) for v, y in zip(LABELED, Y, strict=True)) / 3


# ---------------------------------------------------------------------------------------
# FixMatch


def test_fixmatch_step_by_hand_pseudo_labels_from_the_weak_view() -> None:
    m = _method("fixmatch", lambda_u=2.0)
    out = m.step(_batch(m, [WEAK, STRONG]), Progress(0, 10, 0))
    probs = [softmax(logits(v)) for v in WEAK]
    mask = [1.0 if max(p) >= 0.95 else 0.0 for p in probs]
    assert mask == [1.0, 0.0, 1.0, 0.0]  # 0.99995, 0.867, 0.99995, 0.51
    pseudo = [argmax(p) for p in probs]
    loss_u = sum(k * ce(logits(s), y) for k, s, y in zip(mask, STRONG, pseudo, strict=True)) / 4
    assert out["mask_rate"].item() == pytest.approx(0.5)
    assert out["loss_labeled"].item() == pytest.approx(LOSS_L, rel=1e-5)
    assert out["loss_unlabeled"].item() == pytest.approx(loss_u, rel=1e-5)
    assert out["loss"].item() == pytest.approx(LOSS_L + 2.0 * loss_u, rel=1e-5)


# ---------------------------------------------------------------------------------------
# FlexMatch


def _flex_status(m) -> None:
    # pool of 8: counts per class (2, 1, 0), 5 unused
    m.status.selected.copy_(torch.tensor([0, 0, 1, -1, -1, -1, -1, -1]))


def _flex_expected(warmup: bool) -> tuple[list[float], list[float], float]:
    counts, unused = [2, 1, 0], 5
    denom = max(max(counts), unused) if warmup else max(counts)
    sigma = [c / denom for c in counts]
    thr = [0.95 * s / (2 - s) for s in sigma]
    probs = [softmax(logits(v)) for v in WEAK]
    pseudo = [argmax(p) for p in probs]
    mask = [1.0 if max(p) >= thr[c] else 0.0 for p, c in zip(probs, pseudo, strict=True)]
    loss_u = sum(k * ce(logits(s), y) for k, s, y in zip(mask, STRONG, pseudo, strict=True)) / 4
    return thr, mask, loss_u


def test_flexmatch_threshold_warmup_is_on_by_default() -> None:
    """Issue 12 item 2: paper Eq. 11 / USB ``thresh_warmup=True``."""
    assert get_method("flexmatch").defaults["threshold_warmup"] is True


@pytest.mark.parametrize("warmup", [True, False])
def test_flexmatch_step_by_hand(warmup: bool) -> None:
    m = _method("flexmatch", n_unlabeled=8, threshold_warmup=warmup)
    _flex_status(m)
    out = m.step(_batch(m, [WEAK, STRONG]), Progress(0, 10, 0))
    thr, mask, loss_u = _flex_expected(warmup)
    # warm-up: sigma = (2, 1, 0) / 5 -> thresholds (0.2375, 0.1056, 0): all four pass;
    # without: sigma = (2, 1, 0) / 2 -> (0.95, 0.3167, 0): only the two confident ones
    assert mask == ([1.0] * 4 if warmup else [1.0, 0.0, 1.0, 0.0])
    assert out["threshold"].item() == pytest.approx(sum(thr) / 3, rel=1e-6)
    assert out["mask_rate"].item() == pytest.approx(sum(mask) / 4)
    assert out["loss_unlabeled"].item() == pytest.approx(loss_u, rel=1e-5)
    assert out["loss"].item() == pytest.approx(LOSS_L + loss_u, rel=1e-5)
    # status updated *after* masking, from the weak view: samples 0 and 2 are >= 0.95
    assert m.status.selected.tolist() == [0, 0, 2, -1, -1, -1, -1, -1]


def test_flexmatch_default_step_uses_the_warmup_thresholds() -> None:
    m = _method("flexmatch", n_unlabeled=8)
    _flex_status(m)
    out = m.step(_batch(m, [WEAK, STRONG]), Progress(0, 10, 0))
    assert out["mask_rate"].item() == 1.0  # fails with threshold_warmup off by default


# ---------------------------------------------------------------------------------------
# SoftMatch


def _var(xs: list[float]) -> float:
    mu = sum(xs) / len(xs)
    return sum((x - mu) ** 2 for x in xs) / (len(xs) - 1)


def test_softmatch_step_by_hand_first_batch_alignment_and_unaligned_pseudo_labels() -> None:
    """Issue 12 item 3: the alignment marginal starts at the first batch's mean; weights
    from the aligned confidence; pseudo-labels from the unaligned prediction (USB)."""
    m = _method("softmatch")  # ema 0.999, n_sigma 2
    out = m.step(_batch(m, [WEAK, STRONG]), Progress(0, 10, 0))
    probs = [softmax(logits(v)) for v in WEAK]
    p_model = [sum(p[c] for p in probs) / 4 for c in range(C)]  # first batch: its mean
    aligned = []
    for p in probs:
        a = [p[c] * (1 / 3 + 1e-6) / (p_model[c] + 1e-6) for c in range(C)]
        aligned.append([x / sum(a) for x in a])
    conf = [max(a) for a in aligned]
    mu = 0.999 / 3 + 0.001 * sum(conf) / 4  # the Gaussian keeps mu0 = 1/C, var0 = 1
    var = 0.999 * 1.0 + 0.001 * _var(conf)
    weight = [math.exp(-(min(c - mu, 0.0) ** 2) / (2 * var / 4)) for c in conf]
    pseudo = [argmax(p) for p in probs]
    assert pseudo[3] == 0 and argmax(aligned[3]) == 1  # alignment flips sample 3
    loss_u = sum(w * ce(logits(s), y) for w, s, y in zip(weight, STRONG, pseudo, strict=True)) / 4
    torch.testing.assert_close(m.align.p_model, torch.tensor(p_model), rtol=1e-5, atol=1e-7)
    assert m.weighting.mu.item() == pytest.approx(mu, rel=1e-6)
    assert m.weighting.var.item() == pytest.approx(var, rel=1e-6)
    assert out["weight_mean"].item() == pytest.approx(sum(weight) / 4, rel=1e-5)
    assert out["loss_unlabeled"].item() == pytest.approx(loss_u, rel=1e-5)
    assert out["loss"].item() == pytest.approx(LOSS_L + loss_u, rel=1e-5)


# ---------------------------------------------------------------------------------------
# CoMatch


def test_comatch_memory_stores_aligned_probabilities_not_smoothed_labels() -> None:
    """Issue 12 item 1: once the memory is full, q != p; the memory must receive p."""
    m = _method("comatch", memory_size=7)  # 4 unlabeled + 3 labeled per step
    dim = int(m.hp["proj_dim"])
    m.memory.push(torch.nn.functional.normalize(torch.ones(7, dim), dim=1),
                  torch.eye(C)[torch.zeros(7, dtype=torch.long)])  # full of class-0 labels
    assert m.memory.filled == m.memory.size
    with torch.no_grad():
        m.head.weight.zero_()  # uniform predictions: aligned p is uniform too
    m.step(_batch(m, [WEAK, STRONG, STRONG]), Progress(0, 10, 0))
    _, labels = m.memory.get()
    # q = 0.9 * (1/3, 1/3, 1/3) + 0.1 * (1, 0, 0) = (0.4, 0.3, 0.3) would be the old content
    torch.testing.assert_close(labels[:4], torch.full((4, C), 1 / 3))
    torch.testing.assert_close(labels[4:], torch.eye(C)[torch.tensor(Y)])


def test_comatch_graph_is_row_normalised_with_soft_labels() -> None:
    """Soft q make the graph's row sums differ, so row vs column normalisation differ.

    q = (½, ½), (1, 0), (0, 1): q qᵀ = [[½, ½, ½], [½, 1, 0], [½, 0, 1]]; self-loops 1,
    cut-off ½ keeps (0,1), (0,2) and their mirrors. Rows: (1, ½, ½)/2, (½, 1, 0)/1.5,
    (½, 0, 1)/1.5. Embeddings z = (1,0), (0,1), (−1,0), T = 1: similarity rows
    (1, 0, −1), (0, 1, 0), (−1, 0, 1).
    """
    q = torch.tensor([[0.5, 0.5], [1.0, 0.0], [0.0, 1.0]])
    z = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    sims = [[1.0, 0.0, -1.0], [0.0, 1.0, 0.0], [-1.0, 0.0, 1.0]]
    graph = [[1 / 2, 1 / 4, 1 / 4], [1 / 3, 2 / 3, 0.0], [1 / 3, 0.0, 2 / 3]]

    def loss(g: list[list[float]]) -> float:
        rows = []
        for gi, si in zip(g, sims, strict=True):
            lse = math.log(sum(math.exp(s) for s in si))
            rows.append(-sum(w * (s - lse) for w, s in zip(gi, si, strict=True)))
        return sum(rows) / 3

    column = [[1 / 2, 1 / 3, 1 / 3], [1 / 4, 2 / 3, 0.0], [1 / 4, 0.0, 2 / 3]]
    assert abs(loss(graph) - loss(column)) > 1e-3  # the test can tell them apart
    got = graph_contrastive_loss(q, z, z, 1.0, 0.5).item()
    assert got == pytest.approx(loss(graph), rel=1e-6)


# ---------------------------------------------------------------------------------------
# DS3L


def test_ds3l_meta_learning_rate_is_the_authors() -> None:
    """Issue 12 item 4: ``--lr_wnet`` 6e-5 in the authors' train.py (f19f3d0)."""
    m = _method("ds3l")
    assert m.hp["wnet_lr"] == 6e-5 and m.hp["meta_lr"] == 1e-3
    assert m.wnet_opt.param_groups[0]["lr"] == 6e-5


def _mse(a: list[float], b: list[float]) -> float:
    return sum((x - y) ** 2 for x, y in zip(a, b, strict=True)) / len(a)


def test_ds3l_step_by_hand_weights_see_the_target_view() -> None:
    m = _method("ds3l", warmup=0.0, lambda_u=10.0)
    u1, u2 = WEAK, STRONG  # u1: prediction, u2: detached target
    out = m.step(_batch(m, [u1, u2]), Progress(0, 10, 0))
    per_sample = [_mse(softmax(logits(a)), softmax(logits(b)))
                  for a, b in zip(u1, u2, strict=True)]
    with torch.no_grad():  # the WNet after this step's meta update, on the target view
        w = m.wnet(torch.tensor([softmax(logits(b)) for b in u2])).squeeze(-1).tolist()
        w_other = m.wnet(torch.tensor([softmax(logits(a)) for a in u1])).squeeze(-1).tolist()
    loss_u = sum(a * b for a, b in zip(w, per_sample, strict=True)) / sum(w)
    assert out["weight_mean"].item() == pytest.approx(sum(w) / 4, rel=1e-5)
    assert abs(sum(w) - sum(w_other)) > 1e-4  # the views are distinguishable
    assert out["loss_unlabeled"].item() == pytest.approx(loss_u, rel=1e-4)
    # default: no labeled consistency (zero in the authors' code, see the module docstring)
    assert "loss_consistency_labeled" not in out
    assert out["loss"].item() == pytest.approx(LOSS_L + 10.0 * loss_u, rel=1e-4)


def test_ds3l_labeled_consistency_option_by_hand() -> None:
    m = _method("ds3l", warmup=0.0, lambda_u=10.0, labeled_consistency=True)
    assert m.labeled_views == ("weak", "weak")
    x2 = [0.5, 0.0, 0.3]
    b = _batch(m, [WEAK, STRONG])
    b.x[1] = _images(x2)
    out = m.step(b, Progress(0, 10, 0))
    lc = sum(_mse(softmax(logits(a)), softmax(logits(t)))
             for a, t in zip(x2, LABELED, strict=True)) / 3
    assert out["loss_consistency_labeled"].item() == pytest.approx(lc, rel=1e-5)
    assert out["loss"].item() == pytest.approx(
        LOSS_L + 10.0 * (out["loss_unlabeled"].item() + lc), rel=1e-5)
    assert get_method("ds3l")(MeanPixel(), C, dict(get_method("ds3l").defaults)
                              ).labeled_views == ("weak",)


# ---------------------------------------------------------------------------------------
# ties at the threshold


def test_confidence_exactly_at_the_threshold_passes() -> None:
    """``>=`` (FixMatch / USB ``ge``): logits (0, 0) give confidence exactly 0.5."""
    mask, pseudo, probs = confidence_mask(torch.zeros(1, 2), 0.5)
    assert probs[0, 0].item() == 0.5 and mask.item() == 1.0 and pseudo.item() == 0
    above = torch.nextafter(torch.tensor(0.5), torch.tensor(1.0)).item()  # next float32
    assert confidence_mask(torch.zeros(1, 2), above)[0].item() == 0.0
    st = LearningStatus(2, 2)
    st.update(torch.tensor([0, 1]), torch.tensor([1, 0]), torch.tensor([0.5, 0.4999]), 0.5)
    assert st.selected.tolist() == [1, -1]  # conf == tau is recorded, just below is not


def test_flexmatch_class_threshold_tie_passes() -> None:
    m = _method("flexmatch", n_unlabeled=2, threshold=0.5, threshold_warmup=False)
    m.status.selected.copy_(torch.tensor([0, 1]))  # sigma = 1 for both -> threshold 0.5
    with torch.no_grad():
        m.head.weight.zero_()
    _, _, mask, thr = m._targets(torch.tensor([[0.0, 0.0, -1e9]]))  # confidence 0.5
    assert thr[0].item() == 0.5 and mask.item() == 1.0


def test_comatch_pseudo_targets_are_the_memory_smoothed_labels() -> None:
    """Item 5: CoMatch's filter is max q ≥ τ on the smoothed q, read without pushing."""
    m = _method("comatch", memory_size=5, alpha=0.03)
    dim = int(m.hp["proj_dim"])
    m.memory.push(torch.nn.functional.normalize(torch.randn(5, dim), dim=1),
                  torch.eye(C)[torch.full((5,), 2)])
    before = {k: v.clone() for k, v in m.state_dict().items()}
    # identical images: the aligned p is uniform; q = 0.03/3 + 0.97 e_2 -> (.01, .01, .98)
    t = m.pseudo_targets(_images([1.0] * 4))
    assert t.labels.tolist() == [2] * 4 and t.weights.tolist() == [1.0] * 4
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())


# -- ds3l, fixmatch's weak_no_grad, mixmatch targets (mutation sample, docs/mutation.md) ---
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
# FlexMatch and SoftMatch coincide on a binary task early in training


class _Pixels(nn.Module):
    """A learnable linear feature map over the 16 pixels of a 1x4x4 image."""

    num_features = 3

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x.flatten(1)))


def _binary_run(name: str, steps: int) -> tuple[list[float], list[torch.Tensor]]:
    torch.manual_seed(0)
    cls = get_method(name)
    m = cls(_Pixels(), 2, dict(cls.defaults))
    m.on_train_start(DataInfo(n_labeled=4, n_unlabeled=32, num_classes=2,
                              labeled_class_counts=[2, 2]))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    weights = []
    for step in range(steps):
        idx = torch.randperm(32, generator=g)[:16]
        x = torch.randn(4, 1, 4, 4, generator=g)
        u = torch.randn(32, 1, 4, 4, generator=g)[idx]
        strong = u + 0.3 * torch.randn(u.shape, generator=g)
        out = m.step(Batch(x=[x], y=torch.tensor([0, 1, 0, 1]), u=[u, strong], u_index=idx),
                     Progress(step, steps, 0))
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        weights.append(float(out["mask_rate" if name == "flexmatch" else "weight_mean"]))
    return weights, [p.detach().clone() for p in m.parameters()]


def test_flexmatch_and_softmatch_weigh_every_sample_by_one_early_on_binary_tasks() -> None:
    """Why the ssl_vs_ssl page gives FlexMatch and SoftMatch the same breastmnist score
    (0.5774 ± 0.0368, issue 41): with two classes every confidence is ≥ 0.5, FlexMatch's
    warm-up thresholds τ·M(β) stay below 0.5 until a class holds ≥ 69 % of the pool's
    confident predictions (β/(2−β) > 0.5/0.95), and SoftMatch's Gaussian mean starts at
    μ₀ = 1/C = 0.5 and moves by 0.1 % a step (m = 0.999). Both then take hard pseudo-labels
    of the weak view with weight ≈ 1 on the strong view: the same loss, so the same
    trajectory from the same seed over the ≤ 34 steps those trials ran."""
    flex_w, flex_p = _binary_run("flexmatch", 30)
    soft_w, soft_p = _binary_run("softmatch", 30)
    assert flex_w == [1.0] * 30
    assert min(soft_w) > 0.999
    for a, b in zip(flex_p, soft_p, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-3)
