"""Hand-computable checks of the "Tune It or Don't Use It" methods' losses and layers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from scarcelab.methods import get_method
from scarcelab.methods.base import Batch, Progress
from scarcelab.methods.supervised.cosine import one_hot_cosine_loss
from scarcelab.methods.supervised.cosine_ce import CosineCEHead, cosine_ce_loss
from scarcelab.methods.supervised.gradl2 import grad_l2_penalty
from scarcelab.methods.supervised.ole import ole_loss
from scarcelab.methods.supervised.tvmf import TvMFHead, tvmf_similarity
from scarcelab.train import make_optimizer


class _Feat(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.num_features = d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1)


def test_ce_is_log_c_for_uniform_logits_and_uses_sgd_momentum():
    m = get_method("ce")(_Feat(4), 3, {})
    with torch.no_grad():
        m.head.weight.zero_()
        m.head.bias.zero_()
    out = m.step(Batch(x=[torch.randn(5, 4)], y=torch.tensor([0, 1, 2, 0, 1]), u=[]),
                 Progress(0, 1, 0))
    assert float(out["loss"]) == pytest.approx(math.log(3))
    opt, sched = make_optimizer(m, 10)
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["momentum"] == 0.9
    lrs = []
    for _ in range(10):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    lr0 = m.hp["lr"]
    assert lrs[5] == pytest.approx(lr0 * 0.5 * (1 + math.cos(math.pi * 5 / 10)))  # cosine


def test_ole_loss_hand_case():
    # class 0: rows (3,0), (0,4) -> singular values 4, 3 -> ||F_0||_* = 7
    # class 1: row (1,0) -> ||F_1||_* = 1 <= delta -> contributes delta = 1
    # all rows: F^T F = [[10, 0], [0, 16]] -> singular values sqrt(10), 4
    f = torch.tensor([[3.0, 0.0], [0.0, 4.0], [1.0, 0.0]], requires_grad=True)
    y = torch.tensor([0, 0, 1])
    loss = ole_loss(f, y)
    assert float(loss) == pytest.approx((7 + 1 - (4 + math.sqrt(10))) / 3, rel=1e-6)
    loss.backward()
    # d||F_0||_*/dF_0 = U V^T = I for this diagonal block; class 1 (below delta): 0;
    # d||F||_*/dF = F (F^T F)^{-1/2} = F diag(1/sqrt(10), 1/4)
    expect = (torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
              - torch.tensor([[3 / math.sqrt(10), 0.0], [0.0, 1.0], [1 / math.sqrt(10), 0.0]]))
    torch.testing.assert_close(f.grad, expect / 3, rtol=1e-5, atol=1e-6)


def test_ole_method_adds_weighted_term():
    m = get_method("ole")(_Feat(2), 2, {"lambda_ole": 0.5})
    x = torch.tensor([[3.0, 0.0], [0.0, 4.0], [1.0, 0.0]])
    y = torch.tensor([0, 0, 1])
    out = m.step(Batch(x=[x], y=y, u=[]), Progress(0, 1, 0))
    ce = F.cross_entropy(m.head(x), y)
    assert float(out["loss"]) == pytest.approx(float(ce + 0.5 * ole_loss(x, y)), rel=1e-6)


def test_grad_l2_penalty_hand_case():
    # logits = W x with W = I (2 classes), x = 0 -> p = (1/2, 1/2); y = 0:
    # dCE/dx = W^T (p - e_y) = (-1/2, 1/2) -> squared norm 1/2; second sample y = 1 same.
    w = torch.eye(2, requires_grad=True)
    x = torch.zeros(2, 2)
    ce, pen = grad_l2_penalty(lambda v: v @ w.t(), x, torch.tensor([0, 1]))
    assert float(ce) == pytest.approx(math.log(2))
    assert float(pen) == pytest.approx(0.5)
    pen.backward()  # differentiable in the weights (create_graph)
    assert w.grad is not None and torch.isfinite(w.grad).all()


def test_grad_l2_disables_weight_decay_and_keeps_bn():
    cls = get_method("gradl2")
    assert cls.defaults["weight_decay"] == 0.0
    assert cls.search_space["weight_decay"].options == (0.0,)


def test_cosine_loss_hand_case():
    out = torch.tensor([[3.0, 4.0], [1.0, 0.0]])
    loss = one_hot_cosine_loss(out, torch.tensor([1, 1]))
    assert float(loss) == pytest.approx(((1 - 4 / 5) + (1 - 0)) / 2)


def test_cosine_ce_head_and_loss():
    head = CosineCEHead(2, 2).eval()
    with torch.no_grad():
        head.embed.weight.copy_(torch.eye(2))
        head.embed.bias.zero_()
    emb = head.embedding(torch.tensor([[3.0, 4.0]]))
    torch.testing.assert_close(emb, torch.tensor([[0.6, 0.8]]))
    logits = torch.tensor([[0.0, 0.0]])
    total, cos, ce = cosine_ce_loss(emb, logits, torch.tensor([1]), 0.1)
    assert float(cos) == pytest.approx(0.2) and float(ce) == pytest.approx(math.log(2))
    assert float(total) == pytest.approx(0.2 + 0.1 * math.log(2))


def test_tvmf_similarity_and_head():
    c = torch.tensor([1.0, 0.5, 0.0, -1.0])
    torch.testing.assert_close(tvmf_similarity(c, 0.0), c)  # kappa 0: cosine
    # kappa 1: (1 + c)/(2 - c) - 1 -> 1, 0, -1/2, -1
    torch.testing.assert_close(tvmf_similarity(c, 1.0), torch.tensor([1.0, 0.0, -0.5, -1.0]))
    head = TvMFHead(2, 2, kappa=1.0)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[2.0, 0.0], [0.0, 5.0]]))
    sim = head(torch.tensor([[1.0, 1.0]]))  # cosines 1/sqrt(2) with both classes
    cs = 1 / math.sqrt(2)
    expect = (1 + cs) / (1 + (1 - cs)) - 1
    torch.testing.assert_close(sim, torch.tensor([[expect, expect]]))
    assert float(head.scale) == pytest.approx(1 + math.log(2))  # 1 + softplus(0)
    np.testing.assert_allclose(float(head.scale), 1.6931471805599454, rtol=1e-6)
