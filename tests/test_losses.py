import math

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
