import math

import pytest
import torch

from scarcelab.losses import nt_xent
from scarcelab.methods._parts import confidence_mask, masked_cross_entropy


def test_nt_xent_hand_computed_two_pairs():
    # Two samples, orthogonal unit embeddings, views identical: z1 = z2 = [[1,0],[0,1]].
    # For each of the 4 anchors: positive similarity 1, negatives {0, 0} (self excluded),
    # so loss = -log(e^(1/t) / (e^(1/t) + 2)).
    z = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    t = 0.5
    expected = -math.log(math.exp(1 / t) / (math.exp(1 / t) + 2))
    assert abs(float(nt_xent(z, z.clone(), t)) - expected) < 1e-6


def test_nt_xent_brute_force_random():
    g = torch.Generator().manual_seed(0)
    z1, z2 = torch.randn(5, 8, generator=g), torch.randn(5, 8, generator=g)
    t = 0.1
    z = torch.nn.functional.normalize(torch.cat([z1, z2]), dim=1)
    total = 0.0
    for i in range(10):
        pos = (i + 5) % 10
        num = math.exp(float(z[i] @ z[pos]) / t)
        den = sum(math.exp(float(z[i] @ z[k]) / t) for k in range(10) if k != i)
        total += -math.log(num / den)
    assert abs(float(nt_xent(z1, z2, t)) - total / 10) < 1e-4


def test_confidence_mask_and_masked_ce():
    logits = torch.tensor([[4.0, 0.0], [0.1, 0.0]])
    mask, pseudo, probs = confidence_mask(logits, threshold=0.95)
    assert mask.tolist() == [1.0, 0.0] and pseudo.tolist() == [0, 0]
    # sample 0: CE of logits [4,0] vs 0 = log(1+e^-4); sample 1 masked; mean over 2.
    target_logits = torch.tensor([[4.0, 0.0], [0.0, 9.0]])
    val = masked_cross_entropy(target_logits, pseudo, mask)
    assert abs(float(val) - math.log(1 + math.exp(-4)) / 2) < 1e-6
    none = masked_cross_entropy(target_logits, pseudo, torch.zeros(2))
    assert float(none) == 0.0


def test_ema_update_and_sharpen():
    from scarcelab.methods._parts import ema_update, sharpen

    a, b = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    with torch.no_grad():
        a.weight.fill_(1.0)
        b.weight.fill_(3.0)
    ema_update(a, b, 0.75)
    assert torch.allclose(a.weight, torch.full((1, 2), 1.5))
    p = sharpen(torch.tensor([[0.6, 0.4]]), 0.5)  # squares: .36, .16 -> .6923, .3077
    assert torch.allclose(p, torch.tensor([[0.36 / 0.52, 0.16 / 0.52]]))


def test_feature_queue_fifo():
    from scarcelab.methods._parts import FeatureQueue

    q = FeatureQueue(4, 2, label_dim=1)
    q.push(torch.ones(3, 2), torch.tensor([1, 2, 3]))
    assert q.filled == 3
    q.push(torch.full((2, 2), 2.0), torch.tensor([4, 5]))
    feats, labels = q.get()
    assert q.filled == 4 and int(q.ptr) == 1
    assert sorted(labels.flatten().tolist()) == [2, 3, 4, 5]  # the oldest (1) overwritten
    q.push(torch.arange(20.0).reshape(10, 2))
    assert q.filled == 4 and set(q.get()[0][:, 0].tolist()) == {12.0, 14.0, 16.0, 18.0}


# -- classifier losses that used to live in method files (issue 26 item 5) --------------


def test_graph_contrastive_loss_reference_value_and_cutoff() -> None:
    """q = (0.9, 0.1) for both samples: q·qᵀ off-diagonal 0.82; z orthonormal, T = 0.5,
    so every row of log softmax(z zᵀ / T) is (2 − L, −L) with L = ln(e² + 1).

    cut-off 0.8 keeps the edge: row target (1, 0.82) / 1.82 -> loss L − 2 / 1.82.
    cut-off 0.85 drops it: identity target -> loss L − 2."""
    from scarcelab.losses import graph_contrastive_loss

    q = torch.tensor([[0.9, 0.1], [0.9, 0.1]])
    z = torch.eye(2)
    big_l = math.log(math.exp(2) + 1)
    assert graph_contrastive_loss(q, z, z, 0.5, 0.8).item() == pytest.approx(
        big_l - 2 / 1.82, rel=1e-6)
    assert graph_contrastive_loss(q, z, z, 0.5, 0.85).item() == pytest.approx(
        big_l - 2, rel=1e-6)
    # the two views enter asymmetrically: z1 · z2ᵀ, so swapping z2's rows swaps the
    # positives and the loss becomes L − 2·0.82/1.82 (the edge now sits on the diagonal)
    swapped = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    assert graph_contrastive_loss(q, z, swapped, 0.5, 0.8).item() == pytest.approx(
        big_l - 2 * 0.82 / 1.82, rel=1e-6)


def test_ole_loss_reference_value_and_subgradient() -> None:
    """Nuclear norms by hand, labels (0, 1).

    F = [[1, 0], [1, 0]] (two classes on one line): each class has norm 1 (= Δ), the
    union √2 -> (1 + 1 − √2) / 2.
    F = 0.1·I: each class (norm 0.1) is clamped to Δ = 1 and gets no gradient; the union
    has singular values (0.1, 0.1) -> (2 − 0.2) / 2, and dL/dF = −U Vᵀ / N = −I / 2
    (the reference code's subgradient of −‖F‖_* / N)."""
    from scarcelab.losses import ole_loss

    y = torch.tensor([0, 1])
    line = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    assert ole_loss(line, y).item() == pytest.approx((2 - math.sqrt(2)) / 2, rel=1e-6)
    f = (0.1 * torch.eye(2)).requires_grad_(True)
    loss = ole_loss(f, y)
    assert loss.item() == pytest.approx(0.9, rel=1e-6)
    loss.backward()
    torch.testing.assert_close(f.grad, -torch.eye(2) / 2)


def test_cosine_ce_loss_reference_value() -> None:
    """e = (0.6, 0.8) and e = (1, 0), zero logits over 2 classes, labels (1, 0), λ = 0.5:
    cosine terms 1 − 0.8 and 1 − 1 -> mean 0.1; CE ln 2; total 0.1 + 0.5·ln 2."""
    from scarcelab.losses import cosine_ce_loss

    emb = torch.tensor([[0.6, 0.8], [1.0, 0.0]])
    total, cos, ce = cosine_ce_loss(emb, torch.zeros(2, 2), torch.tensor([1, 0]), 0.5)
    assert cos.item() == pytest.approx(0.1, rel=1e-6)
    assert ce.item() == pytest.approx(math.log(2), rel=1e-6)
    assert total.item() == pytest.approx(0.1 + 0.5 * math.log(2), rel=1e-6)


def test_joint_forward_normalises_the_parts_together() -> None:
    """The parts go through one pass (BatchNorm sees their joint statistics) and come back
    in order with their own lengths: BN of [0, 2] ∪ [4] is (x − 2) / √(8/3 + ε), ε = 1e-5."""
    from scarcelab.methods._parts import joint_forward

    bn = torch.nn.BatchNorm1d(1, affine=False).train()
    a, b = torch.tensor([[0.0], [2.0]]), torch.tensor([[4.0]])
    out_a, out_b = joint_forward(bn, a, b)
    sd = math.sqrt(8 / 3 + 1e-5)
    torch.testing.assert_close(out_a, torch.tensor([[-2 / sd], [0.0]]))
    torch.testing.assert_close(out_b, torch.tensor([[2 / sd]]))
