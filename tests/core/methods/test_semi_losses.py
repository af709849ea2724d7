"""Hand-computable checks of the semi-supervised losses and their shared mechanics
(distribution alignment, EMA teacher, FlexMatch's learning status, SoftMatch's weights,
CoMatch's memory, DS3L's meta step). CoMatch's graph-contrastive loss has its reference
values beside the other losses' in tests/core/losses/test_losses.py."""

from __future__ import annotations

import math

import pytest
import torch

from scarcelab.methods import Batch, DataInfo, Progress, get_method
from scarcelab.methods._parts import (
    DistributionAlignment,
    LearningStatus,
    linear_rampup,
    sharpen,
    sigmoid_rampup,
    soft_cross_entropy,
)
from scarcelab.methods.semi.ds3l import weighted_mean
from scarcelab.methods.semi.softmatch import TruncatedGaussianWeight
from scarcelab.models import create_model

C = 3


def _method(name: str, **hp: object):
    torch.manual_seed(0)
    cls = get_method(name)
    m = cls(create_model("small_cnn", in_channels=1), C, {**cls.defaults, **hp})
    m.on_train_start(DataInfo(n_labeled=6, n_unlabeled=12, num_classes=C,
                              labeled_class_counts=[2, 2, 2]))
    return m


def _set_head(m, bias: list[float]) -> None:
    with torch.no_grad():
        m.head.weight.zero_()
        m.head.bias.copy_(torch.tensor(bias))


def _batch(m, n_x: int = 6, n_u: int = 12) -> Batch:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n_x, 1, 16, 16, generator=g)
    u = torch.rand(n_u, 1, 16, 16, generator=g)
    return Batch(x=[x for _ in m.labeled_views], y=torch.arange(n_x) % C,
                 u=[u for _ in m.views], u_index=torch.arange(n_u))


def _ce(bias: list[float], label: int) -> float:
    return math.log(sum(math.exp(b) for b in bias)) - bias[label]


# ---------------------------------------------------------------------------------------
# shared parts


def test_ramps() -> None:
    assert linear_rampup(0.2, 0.4) == pytest.approx(0.5)
    assert linear_rampup(0.9, 0.4) == 1.0 and linear_rampup(0.1, 0.0) == 1.0
    assert sigmoid_rampup(0.0, 1.0) == pytest.approx(math.exp(-5))
    assert sigmoid_rampup(0.5, 1.0) == pytest.approx(math.exp(-5 * 0.25), rel=1e-6)
    assert sigmoid_rampup(1.0, 1.0) == 1.0


def test_sharpen_by_hand() -> None:
    got = sharpen(torch.tensor([[0.6, 0.4]]), 0.5)
    torch.testing.assert_close(got, torch.tensor([[0.36 / 0.52, 0.16 / 0.52]]))


def test_distribution_alignment_window_and_ema() -> None:
    da = DistributionAlignment(2, window=2)
    p = torch.tensor([[0.8, 0.2], [0.8, 0.2]])
    torch.testing.assert_close(da(p), torch.full((2, 2), 0.5))  # mean [.8,.2] -> uniform
    da(torch.tensor([[0.4, 0.6]]))
    torch.testing.assert_close(da.p_model, torch.tensor([0.6, 0.4]))  # mean of 2 batches
    da(torch.tensor([[0.5, 0.5]]))  # window 2: first batch dropped
    torch.testing.assert_close(da.p_model, torch.tensor([0.45, 0.55]))

    ema = DistributionAlignment(2, momentum=0.5)
    out = ema(torch.tensor([[0.9, 0.1]]))
    # the first batch *initialises* the running marginal (USB DistAlignEMAHook), so a
    # one-sample batch is aligned to uniform at once
    torch.testing.assert_close(ema.p_model, torch.tensor([0.9, 0.1]))
    torch.testing.assert_close(out, torch.tensor([[0.5, 0.5]]), atol=1e-5, rtol=1e-5)
    out = ema(torch.tensor([[0.5, 0.5]]))  # then EMA: 0.5 * (.9, .1) + 0.5 * (.5, .5)
    torch.testing.assert_close(ema.p_model, torch.tensor([0.7, 0.3]))
    a, b = 0.5 / 0.7, 0.5 / 0.3
    torch.testing.assert_close(out, torch.tensor([[a / (a + b), b / (a + b)]]), atol=1e-5,
                               rtol=1e-5)
    # neither or both estimators: the message names the two arguments to choose between
    for kwargs in ({}, {"momentum": 0.9, "window": 2}):
        with pytest.raises(ValueError, match=r"exactly one of momentum .* or window"):
            DistributionAlignment(2, **kwargs)


def test_distribution_alignment_first_batch_initialises_the_ema():
    """Issue 12 item 3: with m = 0.999 a uniform start would still weigh ~90 % after 100
    steps; the reference starts from the first batch's mean."""
    da = DistributionAlignment(3, momentum=0.999)
    p = torch.tensor([[0.7, 0.2, 0.1], [0.5, 0.4, 0.1]])
    fresh = da(p, update=False)  # before any update: the batch's own mean, nothing stored
    assert int(da.n_seen) == 0
    torch.testing.assert_close(da.p_model, torch.full((3,), 1 / 3))
    da(p)
    torch.testing.assert_close(da.p_model, torch.tensor([0.6, 0.3, 0.1]))
    torch.testing.assert_close(fresh, da(p, update=False))
    aligned = p / torch.tensor([0.6, 0.3, 0.1])  # target uniform: divide by the marginal
    torch.testing.assert_close(fresh, aligned / aligned.sum(1, keepdim=True), atol=1e-5,
                               rtol=1e-5)
    da(torch.tensor([[0.0, 0.0, 1.0]]))
    torch.testing.assert_close(da.p_model, 0.999 * torch.tensor([0.6, 0.3, 0.1])
                               + 0.001 * torch.tensor([0.0, 0.0, 1.0]))


def test_learning_status_thresholds_by_hand() -> None:
    st = LearningStatus(3, 6)
    assert torch.equal(st.thresholds(0.9, warmup=False), torch.zeros(3))  # nothing used
    st.selected.copy_(torch.tensor([0, 0, 1, -1, -1, -1]))
    # counts [2, 1, 0]; without warm-up sigma = [1, 1/2, 0]; M(x) = x / (2 - x)
    torch.testing.assert_close(st.thresholds(0.9, warmup=False),
                               torch.tensor([0.9, 0.9 / 3, 0.0]))
    # with warm-up the 3 unused samples are the normaliser: sigma = [2/3, 1/3, 0]
    torch.testing.assert_close(st.thresholds(0.9, warmup=True),
                               torch.tensor([0.9 * 0.5, 0.9 * 0.2, 0.0]))
    st.update(torch.tensor([3, 4]), torch.tensor([2, 2]), torch.tensor([0.95, 0.5]), 0.9)
    assert st.selected.tolist() == [0, 0, 1, 2, -1, -1]  # only the confident one recorded


def test_truncated_gaussian_weight_by_hand() -> None:
    w = TruncatedGaussianWeight(3, momentum=0.5, n_sigma=2.0)
    out = w(torch.tensor([0.9, 0.5]))
    mu = 0.5 / 3 + 0.5 * 0.7
    var = 0.5 * 1.0 + 0.5 * 0.08  # unbiased variance of (0.9, 0.5) is 0.08
    assert w.mu.item() == pytest.approx(mu) and w.var.item() == pytest.approx(var)
    expected = math.exp(-((0.5 - mu) ** 2) / (2 * var / 4))
    torch.testing.assert_close(out, torch.tensor([1.0, expected]))


def test_weighted_mean() -> None:
    assert weighted_mean(torch.tensor([1.0, 3.0]), torch.tensor([1.0, 3.0])).item() == 2.5
    assert weighted_mean(torch.tensor([1.0, 3.0]), torch.zeros(2)).item() == 0.0


# ---------------------------------------------------------------------------------------
# methods


def test_pseudolabel_confident_case_by_hand() -> None:
    """Bias (5, 0, 0), zero weights: every unlabeled sample is predicted class 0 with
    confidence e^5/(e^5+2) > 0.95, so the mask is 1 and ℓU = CE of that prediction."""
    m = _method("pseudolabel", lambda_u=2.0, warmup=0.4)
    bias = [5.0, 0.0, 0.0]
    _set_head(m, bias)
    out = m.step(_batch(m), Progress(step=2, total_steps=10, epoch=0))  # fraction 0.2
    loss_l = sum(_ce(bias, i % C) for i in range(6)) / 6
    loss_u = _ce(bias, 0)
    assert out["mask_rate"].item() == 1.0
    assert out["rampup"].item() == pytest.approx(0.5)
    assert out["loss_labeled"].item() == pytest.approx(loss_l, rel=1e-5)
    assert out["loss_unlabeled"].item() == pytest.approx(loss_u, rel=1e-5)
    assert out["loss"].item() == pytest.approx(loss_l + 2.0 * 0.5 * loss_u, rel=1e-5)


def test_meanteacher_mse_by_hand_and_ema() -> None:
    m = _method("meanteacher", lambda_u=8.0, warmup=0.0)
    _set_head(m, [math.log(2.0), 0.0, 0.0])  # student: (1/2, 1/4, 1/4)
    with torch.no_grad():  # teacher: uniform
        m.teacher.model[1].weight.zero_()
        m.teacher.model[1].bias.zero_()
    out = m.step(_batch(m), Progress(0, 10, 0))
    mse = ((0.5 - 1 / 3) ** 2 + 2 * (0.25 - 1 / 3) ** 2) / 3  # = 1/72
    assert out["loss_unlabeled"].item() == pytest.approx(mse, rel=1e-5)
    m.after_optimizer_step(Progress(0, 10, 0))  # decay min(1 - 1/1, .999) = 0: a copy
    torch.testing.assert_close(m.teacher.model[1].bias, m.head.bias)
    before = m.teacher.model[1].bias.clone()
    with torch.no_grad():
        m.head.bias.add_(1.0)
    m.after_optimizer_step(Progress(9, 10, 0))  # decay min(1 - 1/10, .999) = 0.9
    torch.testing.assert_close(m.teacher.model[1].bias, before + 0.1)


def test_mixmatch_guess_and_uniform_losses() -> None:
    m = _method("mixmatch")
    _set_head(m, [math.log(3.0), math.log(2.0), 0.0])  # probabilities (1/2, 1/3, 1/6)
    b = _batch(m)
    q = m.guess_labels(b.u)
    p = torch.tensor([1 / 2, 1 / 3, 1 / 6]) ** 2
    torch.testing.assert_close(q, (p / p.sum()).expand(12, 3))
    _set_head(m, [0.0, 0.0, 0.0])
    out = m.step(b, Progress(0, 10, 0))
    # uniform predictions: CE against any distribution is ln C; guesses are uniform too
    assert out["loss_labeled"].item() == pytest.approx(math.log(3), rel=1e-6)
    assert out["mixup_lambda"].item() >= 0.5


def test_flexmatch_thresholds_follow_learning_status() -> None:
    m = _method("flexmatch")
    _set_head(m, [0.0, 0.0, 0.0])
    out = m.step(_batch(m), Progress(0, 10, 0))
    # fresh status: thresholds 0, every sample passes; uniform strong logits -> CE ln 3
    assert out["mask_rate"].item() == 1.0 and out["threshold"].item() == 0.0
    assert out["loss_unlabeled"].item() == pytest.approx(math.log(3), rel=1e-6)
    assert (m.status.selected == -1).all()  # confidence 1/3 < 0.95: nothing recorded
    m.status.selected.copy_(torch.arange(12) % C)  # every class equally well learned
    out = m.step(_batch(m), Progress(1, 10, 0))
    assert out["threshold"].item() == pytest.approx(0.95)
    assert out["mask_rate"].item() == 0.0 and out["loss_unlabeled"].item() == 0.0


def test_flexmatch_records_confident_samples_by_index() -> None:
    m = _method("flexmatch")
    _set_head(m, [0.0, 10.0, 0.0])
    b = _batch(m)
    b.u_index = torch.arange(12) + 0  # pool of 12, the batch is the whole pool here
    m.step(b, Progress(0, 10, 0))
    assert m.status.selected.tolist() == [1] * 12


def test_comatch_memory_smoothing_by_hand() -> None:
    m = _method("comatch", memory_size=2, alpha=0.9, temperature=1.0)
    feats = torch.eye(2, int(m.hp["proj_dim"]))
    m.memory.push(feats, torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]))
    p = torch.tensor([[0.2, 0.2, 0.6]])
    a = torch.softmax(torch.tensor([1.0, 0.0]), dim=0)  # z = first memory row
    expected = 0.9 * p + 0.1 * torch.tensor([[a[0], a[1], 0.0]])
    torch.testing.assert_close(m.smooth(p, feats[:1]), expected)
    empty = _method("comatch", memory_size=4)
    torch.testing.assert_close(empty.smooth(p, feats[:1]), p)  # not full yet: unchanged


def test_comatch_step_pushes_labeled_and_unlabeled_into_memory() -> None:
    m = _method("comatch", memory_size=64)
    _set_head(m, [0.0, 0.0, 0.0])
    out = m.step(_batch(m), Progress(0, 10, 0))
    assert m.memory.filled == 18  # 12 unlabeled + 6 labeled
    _, labels = m.memory.get()
    torch.testing.assert_close(labels[:12], torch.full((12, 3), 1 / 3))  # uniform q
    torch.testing.assert_close(labels[12:], torch.eye(3)[torch.arange(6) % 3])
    assert out["mask_rate"].item() == 0.0 and out["loss_unlabeled"].item() == 0.0
    assert out["loss_contrastive"].item() > 0


def test_softmatch_uniform_alignment_and_weights() -> None:
    m = _method("softmatch", ema=0.5)
    _set_head(m, [0.0, 0.0, 0.0])
    out = m.step(_batch(m), Progress(0, 10, 0))
    # uniform predictions stay uniform; confidence 1/3 equals μ (1/3) -> weight 1
    assert out["weight_mean"].item() == pytest.approx(1.0)
    assert out["loss_unlabeled"].item() == pytest.approx(math.log(3), rel=1e-6)
    torch.testing.assert_close(m.align.p_model, torch.full((3,), 1 / 3))


def test_ds3l_meta_step_moves_only_the_weight_net() -> None:
    m = _method("ds3l", warmup=0.0)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    b = _batch(m)
    b.u[1] = b.u[1].flip(-1)  # two different views, so the consistency terms are not 0
    out = m.step(b, Progress(0, 10, 0))
    after = m.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert any(k.startswith("wnet.") for k in changed)  # meta step updated WNet
    params = {k for k, _ in m.named_parameters() if not k.startswith("wnet.")}
    assert not changed & params  # the virtual step left the classifier alone
    assert all(p.grad is None for p in m.wnet.parameters())
    assert out["rampup"].item() == pytest.approx(10.0)
    out["loss"].backward()
    assert all(p.grad is None for p in m.wnet.parameters())  # weights are constants here


def test_ds3l_uniform_predictions_have_zero_consistency() -> None:
    m = _method("ds3l")
    _set_head(m, [0.0, 0.0, 0.0])
    out = m.step(_batch(m), Progress(0, 10, 0))
    assert out["loss_unlabeled"].item() == pytest.approx(0.0, abs=1e-12)
    assert out["loss"].item() == pytest.approx(math.log(3), rel=1e-6)


# -- soft cross-entropy on a 3-d batch (mutation sample, docs/mutation.md) -------------
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
