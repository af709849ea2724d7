"""Speed levers of issue 18 that must not change the mathematics (docs/performance.md).

Each lever is run against the plain path from the same seed on the same batches for a few
optimiser steps through the training loop's own ``optimizer_step``; losses and weights
must agree within float tolerance. Levers that do change results (FixMatch's
``weak_no_grad`` with BatchNorm) are off by default, which is checked too.
"""

from __future__ import annotations

import torch
from torch import nn

from scarcelab.methods import Batch, Progress, get_method
from scarcelab.models import create_model
from scarcelab.train import make_optimizer, optimizer_step


def _batches(n: int, labeled: int, unlabeled: int, views: int) -> list[Batch]:
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        out.append(Batch(x=[torch.randn(labeled, 3, 8, 8, generator=g)] if labeled else [],
                         y=torch.randint(0, 3, (labeled,), generator=g),
                         u=[torch.randn(unlabeled, 3, 8, 8, generator=g) for _ in range(views)]))
    return out


def _train(method: str, arch: str, hp: dict, batches: list[Batch], fused: bool | None = None
           ) -> tuple[list[float], dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    m = get_method(method)(create_model(arch, in_channels=3), 3,
                           {"lr": 1e-2, "threshold": 0.0, **hp}).train()
    opt, sched = make_optimizer(m, len(batches), fused=fused)
    losses = [float(optimizer_step(m, opt, sched, b, Progress(i, len(batches), 0))["loss"].detach())
              for i, b in enumerate(batches)]
    return losses, {k: v.detach().clone() for k, v in m.state_dict().items()}


def _same(a: tuple[list[float], dict], b: tuple[list[float], dict], tol: float) -> None:
    torch.testing.assert_close(torch.tensor(a[0]), torch.tensor(b[0]), rtol=tol, atol=tol)
    assert a[1].keys() == b[1].keys()
    for k in a[1]:
        torch.testing.assert_close(a[1][k].float(), b[1][k].float(), rtol=tol, atol=tol,
                                   msg=f"state {k} differs")


def test_fused_adam_gives_the_same_training() -> None:
    """torch's fused Adam kernel is the same update rule as the default one: 5 FixMatch
    steps of a small CNN agree in losses and every weight/BN statistic."""
    batches = _batches(5, 4, 6, 2)
    plain = _train("fixmatch", "small_cnn", {}, batches, fused=None)
    fused = _train("fixmatch", "small_cnn", {}, batches, fused=True)
    assert plain[0][0] != plain[0][-1]  # it trained
    _same(plain, fused, 1e-5)


def test_fixmatch_weak_no_grad_is_exact_without_batchnorm() -> None:
    """Without BatchNorm the weak view's logits do not depend on the rest of the batch and
    carry no gradient (pseudo-labels are detached), so forwarding it under no_grad must
    give the very same training."""
    batches = [Batch(x=[b.x[0].flatten(1)[:, :64].reshape(-1, 1, 8, 8)], y=b.y,
                     u=[v.flatten(1)[:, :64].reshape(-1, 1, 8, 8) for v in b.u])
               for b in _batches(4, 4, 6, 2)]

    def run(flag: bool) -> tuple[list[float], dict[str, torch.Tensor]]:
        torch.manual_seed(0)
        m = get_method("fixmatch")(create_model("mlp", in_channels=64), 3,
                                   {"lr": 1e-2, "threshold": 0.3, "weak_no_grad": flag})
        m.train()
        opt, sched = make_optimizer(m, 4)
        ls = [float(optimizer_step(m, opt, sched, b, Progress(i, 4, 0))["loss"].detach())
              for i, b in enumerate(batches)]
        return ls, {k: v.detach().clone() for k, v in m.state_dict().items()}

    _same(run(False), run(True), 1e-6)


def test_fixmatch_weak_no_grad_is_off_by_default_and_changes_batchnorm() -> None:
    """The default keeps the papers' joint labeled+weak+strong forward; with BatchNorm the
    no_grad weak forward is a different computation (separate batch statistics), which
    is why it is an opt-in lever and not the default."""
    assert get_method("fixmatch").defaults["weak_no_grad"] is False
    batches = _batches(2, 4, 6, 2)
    joint = _train("fixmatch", "small_cnn", {}, batches)
    split = _train("fixmatch", "small_cnn", {"weak_no_grad": True}, batches)
    bn = [k for k in joint[1] if k.endswith("running_mean")]
    assert bn and any(not torch.allclose(joint[1][k], split[1][k]) for k in bn)


def test_channels_last_gives_the_same_losses_and_gradients() -> None:
    """channels_last is a memory layout, not a different computation: the loss and every
    gradient of a SimCLR step agree with the default layout to float rounding. (Weights
    after several Adam steps are not compared: Adam's first steps move each weight by
    ~lr whatever the gradient's size, so rounding noise on near-zero gradients shows up
    at the scale of lr.)"""
    b = _batches(1, 0, 8, 2)[0]

    def run(cl: bool) -> tuple[float, dict[str, torch.Tensor]]:
        torch.manual_seed(0)
        m = get_method("simclr")(create_model("small_cnn", in_channels=3), 3, {}).train()
        u = b.u
        if cl:
            m.to(memory_format=torch.channels_last)
            u = [v.contiguous(memory_format=torch.channels_last) for v in u]
        loss = m.step(Batch(x=[], y=b.y, u=u), Progress(0, 1, 0))["loss"]
        loss.backward()
        return float(loss.detach()), {n: p.grad.clone() for n, p in m.named_parameters()}

    (l0, g0), (l1, g1) = run(False), run(True)
    assert abs(l0 - l1) < 1e-5
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], rtol=1e-3, atol=1e-5, msg=f"grad {n}")


def test_module_has_no_batchnorm_in_mlp() -> None:
    """Guard for the exactness test above: the MLP backbone must stay BatchNorm-free."""
    net = create_model("mlp", in_channels=64)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in net.modules())


def test_train_trial_applies_the_layout_and_optimizer_options() -> None:
    """TrainConfig's channels_last reaches the model of the study's own loop, and a trial
    with channels_last + fused Adam still trains and evaluates."""
    import time

    import numpy as np

    from scarcelab.data.bundle import DatasetBundle
    from scarcelab.train import TrainConfig, train_trial

    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, (96, 3, 12, 12), dtype=np.uint8)
    y = np.arange(96) % 2
    b = DatasetBundle(x[:32], y[:32], x[32:64], x[64:80], y[64:80], x[80:], y[80:],
                      meta={"num_classes": 2, "name": "noise"})
    torch.manual_seed(0)
    m = get_method("fixmatch")(create_model("small_cnn", in_channels=3), 2, {})
    cfg = TrainConfig(max_epochs=1, patience=1, max_steps_per_epoch=2, batch_labeled=8,
                      batch_unlabeled=8, channels_last=True, fused_optimizer=True)
    res = train_trial(m, b, cfg, deadline=time.time() + 600,
                      generator=torch.Generator().manual_seed(0),
                      probe_rng=np.random.default_rng(0))
    assert res.steps == 2 and 0.0 <= res.best_val <= 1.0
    conv = next(p for p in m.parameters() if p.ndim == 4)
    assert conv.is_contiguous(memory_format=torch.channels_last)
    assert not conv.is_contiguous()
