"""Self-supervised zoo beyond the inherited contract: no collapse, method-specific state,
and the search spaces of the SSL-vs-SSL table (App. F.1)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from method_contract import build, run_steps
from torch import nn

from scarcelab.data.augment import AUGMENTATIONS, to_float
from scarcelab.methods import Progress, get_method
from scarcelab.methods._ssl import embedding_std
from scarcelab.methods.space import (
    IntLogUniform,
    LogUniform,
    Uniform,
)
from scarcelab.models import create_model
from scarcelab.models.classifier import normalize
from scarcelab.train import BatchSource

SELFSUP = ["simclr", "moco", "swav", "byol", "simsiam", "dino", "barlowtwins"]
# Embedding std of the backbone features on held-out images (1 = spread over the sphere,
# 0 = one point). A random small_cnn starts near 0.22 on the tiny set; after 20 steps the
# methods measured 0.62-0.72 and the naive positive-only loss of the control below 0.20.
FLOOR = 0.4
STEPS = 20


def _feature_std(method: torch.nn.Module, images: np.ndarray) -> float:
    x = normalize(to_float(torch.as_tensor(images)))
    was_training = method.training
    method.eval()
    try:
        with torch.no_grad():
            return float(embedding_std(method.features(x)))
    finally:
        method.train(was_training)


@pytest.mark.parametrize("name", SELFSUP)
def test_no_collapse_after_a_few_steps(name, tiny_bundle):
    m = build(name, tiny_bundle, lr=3e-3)
    losses = run_steps(m, tiny_bundle, STEPS)
    assert np.isfinite(losses).all()
    assert _feature_std(m, tiny_bundle.test_x) > FLOOR


def test_collapse_floor_detects_a_collapsing_objective(tiny_bundle):
    """Control: pulling two views together with nothing against collapse (no negatives,
    predictor, stop-gradient, centring or decorrelation) stays below the floor."""
    torch.manual_seed(0)
    net = create_model("small_cnn", in_channels=tiny_bundle.channels)
    g = torch.Generator().manual_seed(0)
    aug = AUGMENTATIONS.get("simclr")
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    for s in range(STEPS):
        u = to_float(torch.as_tensor(tiny_bundle.unlabeled_x[(s * 48) % 400:][:48]))
        f1, f2 = net(torch.cat([normalize(aug(u, g)), normalize(aug(u, g))])).split(len(u))
        loss = -F.cosine_similarity(f1, f2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    x = normalize(to_float(torch.as_tensor(tiny_bundle.test_x)))
    with torch.no_grad():
        assert float(embedding_std(net(x))) < FLOOR


def test_moco_queue_is_capped_filled_and_restored(tiny_bundle):
    m = build("moco", tiny_bundle)
    assert m.queue.size == min(4096, len(tiny_bundle.unlabeled_x) // 2)
    run_steps(m, tiny_bundle, 2)  # 2 steps x 48 samples x 2 views of keys
    assert m.queue.filled == min(m.queue.size, 2 * 2 * 48)
    keys, _ = m.queue.get()
    assert torch.allclose(keys.norm(dim=1), torch.ones(len(keys)), atol=1e-5)
    clone = build("moco", tiny_bundle, seed=3)
    clone.load_state_dict(m.state_dict())  # queue and key encoder are in the checkpoint
    assert torch.equal(clone.queue.feats, m.queue.feats)


@pytest.mark.parametrize("name,target,online", [
    ("byol", "target_backbone", "backbone"),
    ("moco", "key_backbone", "backbone"),
    ("dino", "teacher_backbone", "backbone"),
])
def test_momentum_target_moves_by_base_momentum_on_first_step(name, target, online,
                                                               tiny_bundle):
    m = build(name, tiny_bundle, momentum=0.99)
    before = copy.deepcopy(getattr(m, target).state_dict())
    g = torch.Generator().manual_seed(0)
    src = BatchSource(tiny_bundle, type(m), 0, 16, torch.device("cpu"), g)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    out = m.step(src.next(), Progress(0, 100, 0))
    opt.zero_grad()
    out["loss"].backward()
    opt.step()
    m.after_optimizer_step(Progress(0, 100, 0))  # fraction 0: cosine schedule = base
    tgt, onl = getattr(m, target), getattr(m, online)
    for (k, p), q in zip(tgt.named_parameters(), onl.parameters(), strict=True):
        assert not p.requires_grad
        assert torch.allclose(p, 0.99 * before[k] + 0.01 * q.detach(), atol=1e-6), k


def test_search_spaces_follow_the_study_table():
    has = {n: set(get_method(n).search_space) for n in SELFSUP}
    for n in SELFSUP:
        space = get_method(n).search_space
        assert isinstance(space["lr"], LogUniform) and space["lr"].low == pytest.approx(10**-4.5)
        assert space["weight_decay"].high == pytest.approx(10**-3.5)
        assert get_method(n).views == ("simclr", "simclr")
    assert {n for n in SELFSUP if "temperature" in has[n]} == {"simclr", "moco", "swav", "dino"}
    assert {n for n in SELFSUP if "momentum" in has[n]} == {"moco", "byol", "dino"}
    protos = get_method("swav").search_space["n_prototypes"]
    assert isinstance(protos, IntLogUniform) and (protos.low, protos.high) == (10, 1000)
    for n in ("moco", "byol", "dino"):
        mom = get_method(n).search_space["momentum"]
        assert isinstance(mom, Uniform) and (mom.low, mom.high) == (0.99, 0.9999)


# -- BYOL's head width (mutation sample, docs/mutation.md) -----------------------------
C = 3  # classes of the hand-built case


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
