"""Self-supervised losses and shared parts on hand-computable cases.

Each loss is checked against a value worked out by hand in the comment above it. The
reference-value tests at the end compare with numbers computed once by lightly 1.6.0's
implementations on fixed seeded tensors (lightly is not a dependency of scarcelab, see
docs/methods-self.md; the numbers are stored here so the comparison always runs).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from scarcelab.losses import (
    barlow_twins,
    dino_loss,
    info_nce,
    negative_cosine,
    nt_xent,
    swapped_prediction,
    update_center,
)
from scarcelab.methods._ssl import (
    CosinePrototypes,
    embedding_std,
    momentum_at,
    momentum_copy,
    momentum_update,
    prediction_head,
    sinkhorn_knopp,
)

E = math.exp


_E1_E2 = [[1.0, 0.0], [0.0, 1.0]]

#: (q, k, negatives, temperature, in_batch, expected); logits are cosines / T
INFO_NCE_CASES = [
    # q = k = e1, e2; one queued negative -e1; T = 0.5.
    # in batch: row 0 logits (2, 0, -2), row 1 (0, 2, 0); positives on the diagonal
    pytest.param(_E1_E2, _E1_E2, [[-1.0, 0.0]], 0.5, True,
                 (-math.log(E(2) / (E(2) + 1 + E(-2))) - math.log(E(2) / (E(2) + 2))) / 2,
                 id="in_batch_and_queue"),
    # queue only (MoCo layout): row 0 (pos 2, neg -2), row 1 (pos 2, neg 0)
    pytest.param(_E1_E2, _E1_E2, [[-1.0, 0.0]], 0.5, False,
                 (-math.log(E(2) / (E(2) + E(-2))) - math.log(E(2) / (E(2) + 1))) / 2,
                 id="queue_only"),
    # no negatives at all: each row picks among the 2 batch keys, logits (2, 0)
    pytest.param(_E1_E2, _E1_E2, None, 0.5, True, -math.log(E(2) / (E(2) + 1)),
                 id="empty_queue_in_batch"),
]


@pytest.mark.parametrize(("q", "k", "neg", "t", "in_batch", "expected"), INFO_NCE_CASES)
def test_info_nce_hand_computed(q: list[list[float]], k: list[list[float]],
                                neg: list[list[float]] | None, t: float, in_batch: bool,
                                expected: float) -> None:
    negatives = None if neg is None else torch.tensor(neg)
    loss = info_nce(torch.tensor(q), torch.tensor(k), negatives, t, in_batch=in_batch)
    assert abs(loss.item() - expected) < 1e-6


def test_info_nce_stops_the_gradient_at_the_keys():
    q = torch.tensor(_E1_E2, requires_grad=True)
    k = torch.tensor(_E1_E2, requires_grad=True)
    info_nce(q, k, torch.tensor([[-1.0, 0.0]]), 0.5).backward()
    assert q.grad is not None and k.grad is None  # keys come from the momentum encoder


def test_info_nce_refuses_keys_of_another_shape():
    q = torch.tensor(_E1_E2)
    with pytest.raises(ValueError, match="equal shape"):
        info_nce(q, q[:1], None, 0.5)


def test_negative_cosine_hand_computed_and_stop_gradient():
    p = torch.tensor([[2.0, 0.0], [1.0, 1.0]], requires_grad=True)
    z = torch.tensor([[1.0, 0.0], [0.0, 3.0]], requires_grad=True)
    loss = negative_cosine(p, z)  # cosines 1 and 1/sqrt(2)
    assert abs(loss.item() + (1 + 1 / math.sqrt(2)) / 2) < 1e-6
    loss.backward()
    assert p.grad is not None and z.grad is None


def test_swapped_prediction_hand_computed():
    # T = 1, one sample, K = 2. Scores: view 1 (0, 0) -> softmax (1/2, 1/2);
    # view 2 (ln 3, 0) -> (3/4, 1/4). Codes: q1 = (1, 0), q2 = (1/2, 1/2).
    # l(z2, q1) = -ln(3/4); l(z1, q2) = ln 2; loss = their mean.
    z1, z2 = torch.tensor([[0.0, 0.0]]), torch.tensor([[math.log(3), 0.0]])
    q1, q2 = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.5, 0.5]])
    loss = swapped_prediction([z1, z2], [q1, q2], 1.0)
    assert abs(float(loss) - (-math.log(0.75) + math.log(2)) / 2) < 1e-6
    # temperature divides the scores: T = 0.5 on (ln 3 / 2, 0) is the same as above
    half = swapped_prediction([z1, z2 / 2], [q1, q2], 0.5)
    assert abs(float(half) - float(loss)) < 1e-6


def test_sinkhorn_balances_a_batch_that_prefers_one_prototype():
    # Every sample prefers prototype 0; equipartition still splits the mass evenly: with
    # identical rows the only balanced answer is (1/2, 1/2) for each sample.
    codes = sinkhorn_knopp(torch.tensor([[1.0, 0.0]] * 4), epsilon=0.05, iterations=3)
    assert torch.allclose(codes, torch.full((4, 2), 0.5), atol=1e-6)
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(12, 3, generator=g)
    c = sinkhorn_knopp(scores, epsilon=0.5, iterations=200)
    assert torch.allclose(c.sum(1), torch.ones(12), atol=1e-5)  # a distribution per sample
    assert torch.allclose(c.sum(0), torch.full((3,), 4.0), atol=1e-3)  # N/K per prototype
    # huge scores / tiny epsilon must not overflow
    assert torch.isfinite(sinkhorn_knopp(scores * 100, epsilon=0.01)).all()


def test_dino_loss_hand_computed_with_centering():
    # K = 2, one sample, two views, tau_t = tau_s = 1, centre 0.
    # teacher: t1 = (0, 0) -> (1/2, 1/2); t2 = (ln 3, 0) -> (3/4, 1/4)
    # student: s1 = (ln 3, 0) -> log(3/4, 1/4); s2 = (0, 0) -> log(1/2, 1/2)
    # pairs: (t1, s2) = ln 2; (t2, s1) = H(3/4, 1/4)
    t1, t2 = torch.tensor([[0.0, 0.0]]), torch.tensor([[math.log(3), 0.0]])
    s1, s2 = torch.tensor([[math.log(3), 0.0]]), torch.tensor([[0.0, 0.0]])
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    loss = dino_loss([s1, s2], [t1, t2], torch.zeros(1, 2), 1.0, 1.0)
    assert abs(float(loss) - (math.log(2) + h) / 2) < 1e-6
    # centring on (ln 3, 0) turns t2 uniform and t1 into (1/4, 3/4):
    # (t1, s2) = ln 2 still; (t2, s1) = -(ln(3/4) + ln(1/4)) / 2
    centred = dino_loss([s1, s2], [t1, t2], torch.tensor([[math.log(3), 0.0]]), 1.0, 1.0)
    assert abs(float(centred) - (math.log(2) - (math.log(0.75) + math.log(0.25)) / 2) / 2) < 1e-6
    c = torch.zeros(1, 2)
    update_center(c, [torch.tensor([[2.0, 0.0]]), torch.tensor([[0.0, 2.0]])], 0.9)
    assert torch.allclose(c, torch.tensor([[0.1, 0.1]]))


_BT_Z = [[1.0, 1.0], [-1.0, -1.0]]

#: (z1, z2, λ, expected, tolerance): eps in the standardisation makes these approximate
BARLOW_CASES = [
    # Two samples. z1 = z2 = ((1, 1), (-1, -1)): both dimensions standardise to (1, -1), so
    # C = [[1, 1], [1, 1]] (up to eps): on-diagonal 0, off-diagonal 1 + 1 -> loss = 2λ.
    pytest.param(_BT_Z, _BT_Z, 0.5, 1.0, 1e-4, id="identical_views"),
    # z2 = ((1, -1), (-1, 1)): C = [[1, -1], [1, -1]]; on = 0 + 4, off = 1 + 1 -> 4 + 2λ
    pytest.param(_BT_Z, [[1.0, -1.0], [-1.0, 1.0]], 0.5, 5.0, 1e-3, id="anticorrelated_dim"),
]


@pytest.mark.parametrize(("z1", "z2", "lambd", "expected", "tol"), BARLOW_CASES)
def test_barlow_twins_hand_computed(z1: list[list[float]], z2: list[list[float]],
                                    lambd: float, expected: float, tol: float) -> None:
    assert abs(float(barlow_twins(torch.tensor(z1), torch.tensor(z2), lambd)) - expected) < tol


def test_barlow_twins_refuses_one_sample():
    z = torch.tensor(_BT_Z)
    with pytest.raises(ValueError, match="N >= 2"):
        barlow_twins(z[:1], z[:1], 0.5)


def test_momentum_schedule_and_update():
    assert momentum_at(0.99, 0.0) == pytest.approx(0.99)
    assert momentum_at(0.99, 0.5) == pytest.approx(0.995)
    assert momentum_at(0.99, 1.0) == pytest.approx(1.0)
    assert momentum_at(0.99, 0.7, "constant") == 0.99
    online = torch.nn.Linear(2, 1)
    target = momentum_copy(online)
    assert all(not p.requires_grad for p in target.parameters())
    with torch.no_grad():
        online.weight.fill_(1.0)
        target.weight.fill_(0.0)
    m = momentum_update(target, online, 0.5, 0.0)  # cosine at fraction 0: base momentum
    assert m == 0.5 and torch.allclose(target.weight, torch.full((1, 2), 0.5))


def test_prototypes_predictor_and_collapse_monitor():
    protos = CosinePrototypes(3, 4)
    out = protos(torch.randn(5, 3) * 10)
    assert out.shape == (5, 4) and out.abs().max() <= 1 + 1e-6
    assert prediction_head(8, 2)(torch.randn(4, 8)).shape == (4, 8)
    assert float(embedding_std(torch.ones(6, 4))) == 0.0  # collapsed to one point
    spread = embedding_std(torch.randn(4096, 16, generator=torch.Generator().manual_seed(0)))
    assert 0.9 < float(spread) < 1.1  # isotropic: about 1


# --- reference values from lightly 1.6.0 ----------------------------------------------
# Produced 2026-11-30 with lightly==1.6.0 (pip, in a throwaway venv sharing this project's
# torch 2.14.1) by running, on the tensors built by ``_rand`` below:
#   NTXentLoss(temperature=0.1)(z1, z2); NTXentLoss(0.1, memory_bank_size=(32, 8)) with
#   memory_bank.bank = bank; NegativeCosineSimilarity()(p, z);
#   BarlowTwinsLoss(lambda_param=5e-3)(p, z); lightly.loss.swav_loss.sinkhorn(s1, 3, 0.05);
#   SwaVLoss(temperature=0.1, sinkhorn_iterations=3, sinkhorn_epsilon=0.05)([s1, s2], []);
#   DINOLoss(output_dim=10, teacher_temp=0.04, student_temp=0.1,
#            warmup_teacher_temp_epochs=1) with center = ``center``, on ([t1, t2], [s1, s2]).
# float32 CPU; the tolerances cover summation-order differences between the two codes.
LIGHTLY_1_6_0 = {
    "ntxent": 7.4574761390686035,
    "moco": 7.7017903327941895,
    "negative_cosine": -0.05528086796402931,
    "barlow": 8.420568466186523,
    "sinkhorn_row0": [1.8360729533492543e-16, 0.14414286613464355, 1.2100544336676668e-15,
                      9.150361403916646e-16, 4.285777191036927e-13, 6.669562935712747e-06,
                      1.2055000297550578e-05, 1.5888912457739934e-05, 4.277054821422155e-10,
                      0.8558225631713867],
    "sinkhorn_col_sums": [2.263974189758301, 1.237789273262024, 1.0138945579528809,
                          1.557201623916626, 2.1570472717285156, 1.9154270887374878,
                          1.5569607019424438, 1.4702060222625732, 1.2623249292373657,
                          1.5651742219924927],
    "swav": 8.554899215698242,
    "dino": 10.353100776672363,
}


def _rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _close(got: torch.Tensor, ref: float | list[float], rtol: float = 1e-5,
           atol: float = 1e-6) -> bool:
    return torch.allclose(got.double().reshape(-1), torch.tensor(ref, dtype=torch.float64)
                          .reshape(-1), rtol=rtol, atol=atol)


def _lightly_inputs() -> dict[str, torch.Tensor]:
    s1, s2 = _rand(16, 10, seed=6).tanh(), _rand(16, 10, seed=7).tanh()
    return {"z1": _rand(16, 8, seed=1), "z2": _rand(16, 8, seed=2),
            "bank": torch.nn.functional.normalize(_rand(32, 8, seed=3), dim=1),
            "p": _rand(16, 8, seed=4), "z": _rand(16, 8, seed=5), "s1": s1, "s2": s2,
            "t1": _rand(16, 10, seed=8), "t2": _rand(16, 10, seed=9),
            "center": _rand(1, 10, seed=10)}


def _swav(d: dict[str, torch.Tensor]) -> torch.Tensor:
    codes = [sinkhorn_knopp(d["s1"], 0.05, 3), sinkhorn_knopp(d["s2"], 0.05, 3)]
    return swapped_prediction([d["s1"], d["s2"]], codes, 0.1)


#: (our computation on ``_lightly_inputs()``, key in LIGHTLY_1_6_0, atol); rtol 1e-5
LIGHTLY_CASES = [
    pytest.param(lambda d: nt_xent(d["z1"], d["z2"], 0.1), "ntxent", 1e-6, id="ntxent"),
    pytest.param(lambda d: info_nce(d["z1"], d["z2"], d["bank"], 0.1, in_batch=False),
                 "moco", 1e-6, id="moco"),
    pytest.param(lambda d: negative_cosine(d["p"], d["z"]), "negative_cosine", 1e-6,
                 id="negative_cosine"),
    pytest.param(lambda d: barlow_twins(d["p"], d["z"], 5e-3), "barlow", 1e-6, id="barlow"),
    pytest.param(lambda d: sinkhorn_knopp(d["s1"], 0.05, 3)[0], "sinkhorn_row0", 1e-12,
                 id="sinkhorn_row0"),
    pytest.param(lambda d: sinkhorn_knopp(d["s1"], 0.05, 3).sum(0), "sinkhorn_col_sums",
                 1e-6, id="sinkhorn_col_sums"),
    pytest.param(_swav, "swav", 1e-6, id="swav"),
    pytest.param(lambda d: dino_loss([d["s1"], d["s2"]], [d["t1"], d["t2"]], d["center"],
                                     0.1, 0.04), "dino", 1e-6, id="dino"),
]


@pytest.mark.parametrize(("compute", "key", "atol"), LIGHTLY_CASES)
def test_matches_lightly(compute: Callable[[dict[str, torch.Tensor]], torch.Tensor],
                         key: str, atol: float) -> None:
    assert _close(compute(_lightly_inputs()), LIGHTLY_1_6_0[key], atol=atol)
