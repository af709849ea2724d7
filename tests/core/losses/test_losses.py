import math

import pytest
import torch

from scarcelab.losses import nt_xent
from scarcelab.methods._parts import confidence_mask, masked_cross_entropy


def _nt_xent_brute_force(z1: torch.Tensor, z2: torch.Tensor, t: float) -> float:
    """NT-Xent by its definition, one anchor at a time: anchor i's positive is its other
    view (i + n) mod 2n, its negatives every other embedding but itself."""
    n = len(z1)
    z = torch.nn.functional.normalize(torch.cat([z1, z2]), dim=1)
    total = 0.0
    for i in range(2 * n):
        pos = (i + n) % (2 * n)
        num = math.exp(float(z[i] @ z[pos]) / t)
        den = sum(math.exp(float(z[i] @ z[k]) / t) for k in range(2 * n) if k != i)
        total += -math.log(num / den)
    return total / (2 * n)


_ORTHO = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
_G = torch.Generator().manual_seed(0)
_Z1, _Z2 = torch.randn(5, 8, generator=_G), torch.randn(5, 8, generator=_G)

#: (z1, z2, temperature, expected, tolerance), lightly's parametrised loss tests
NT_XENT_CASES = [
    # Two samples, orthogonal unit embeddings, views identical: z1 = z2 = [[1,0],[0,1]].
    # For each of the 4 anchors: positive similarity 1, negatives {0, 0} (self excluded),
    # so loss = -log(e^(1/t) / (e^(1/t) + 2)).
    pytest.param(_ORTHO, _ORTHO.clone(), 0.5,
                 -math.log(math.exp(1 / 0.5) / (math.exp(1 / 0.5) + 2)), 1e-6,
                 id="hand_computed_two_pairs"),
    # five random pairs in 8-d, against the definition computed anchor by anchor
    pytest.param(_Z1, _Z2, 0.1, _nt_xent_brute_force(_Z1, _Z2, 0.1), 1e-4,
                 id="brute_force_random"),
]


@pytest.mark.parametrize(("z1", "z2", "t", "expected", "tol"), NT_XENT_CASES)
def test_nt_xent_reference_values(z1: torch.Tensor, z2: torch.Tensor, t: float,
                                  expected: float, tol: float) -> None:
    assert abs(float(nt_xent(z1, z2, t)) - expected) < tol


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


_BIG_L = math.log(math.exp(2) + 1)
_Q_082 = [[0.9, 0.1], [0.9, 0.1]]

#: (q, z1, z2, temperature, cut-off, expected): the graph target is q·qᵀ with entries
#: below the cut-off dropped (self-loops kept), rows normalised; the loss is the
#: cross-entropy of each row of softmax(z1·z2ᵀ / T) against it
GRAPH_CASES = [
    # q = (0.9, 0.1) for both samples: q·qᵀ off-diagonal 0.82; z orthonormal, T = 0.5,
    # so every row of log softmax(z zᵀ / T) is (2 − L, −L) with L = ln(e² + 1).
    # cut-off 0.8 keeps the edge: row target (1, 0.82) / 1.82 -> loss L − 2 / 1.82.
    pytest.param(_Q_082, [[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]], 0.5, 0.8,
                 _BIG_L - 2 / 1.82, id="edge_kept"),
    # cut-off 0.85 drops it: identity target -> loss L − 2.
    pytest.param(_Q_082, [[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]], 0.5, 0.85,
                 _BIG_L - 2, id="edge_cut"),
    # the two views enter asymmetrically: z1 · z2ᵀ, so swapping z2's rows swaps the
    # positives and the loss becomes L − 2·0.82/1.82 (the edge now sits on the diagonal)
    pytest.param(_Q_082, [[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]], 0.5, 0.8,
                 _BIG_L - 2 * 0.82 / 1.82, id="views_asymmetric"),
    # T = 1, z = I: every row of log softmax(z zᵀ) is (1 − l, −l) with l = ln(e + 1).
    # two confident, different classes: graph = identity -> l − 1 = ln(1 + e⁻¹)
    pytest.param([[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]],
                 [[1.0, 0.0], [0.0, 1.0]], 1.0, 0.8, math.log(1 + math.exp(-1)),
                 id="different_classes"),
    # same class: both edges, weight 1/2 -> l − 1/2
    pytest.param([[1.0, 0.0], [1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]],
                 [[1.0, 0.0], [0.0, 1.0]], 1.0, 0.8, math.log(math.e + 1) - 0.5,
                 id="same_class"),
    # q q^T = 0.5 < 0.8: only self-loops survive -> as for different classes
    pytest.param([[0.5, 0.5], [0.5, 0.5]], [[1.0, 0.0], [0.0, 1.0]],
                 [[1.0, 0.0], [0.0, 1.0]], 1.0, 0.8, math.log(1 + math.exp(-1)),
                 id="weak_edges_cut"),
]


@pytest.mark.parametrize(("q", "z1", "z2", "t", "cutoff", "expected"), GRAPH_CASES)
def test_graph_contrastive_loss_reference_values(q: list[list[float]], z1: list[list[float]],
                                                 z2: list[list[float]], t: float,
                                                 cutoff: float, expected: float) -> None:
    from scarcelab.losses import graph_contrastive_loss

    got = graph_contrastive_loss(torch.tensor(q), torch.tensor(z1), torch.tensor(z2), t, cutoff)
    assert got.item() == pytest.approx(expected, rel=1e-6)


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
