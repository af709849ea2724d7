"""The contract every registered method inherits (scikit-activeml's template-test idea).

``tests/test_method_contract.py`` creates one subclass per registered method, so a new
method file is covered without anyone writing a test class for it; per-method files add
loss checks on hand-computable cases.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import optuna
import torch

from scarcelab.data.augment import to_float
from scarcelab.methods import Batch, Method, Progress, get_method
from scarcelab.methods.space import Distribution, contains
from scarcelab.models import create_model
from scarcelab.train import BatchSource, TrainConfig, data_info, evaluate

FAMILIES = {"supervised", "semi", "self"}
BATCH = {"labeled": 24, "unlabeled": 48}


def build(name: str, bundle: Any, seed: int = 0, **hp: Any) -> Method:
    torch.manual_seed(seed)
    cls = get_method(name)
    m = cls(create_model("small_cnn", in_channels=bundle.channels), bundle.num_classes,
            {**cls.defaults, **hp})
    m.on_train_start(data_info(bundle))
    return m


def run_steps(method: Method, bundle: Any, steps: int, seed: int = 0) -> list[float]:
    g = torch.Generator().manual_seed(seed)
    src = BatchSource(bundle, type(method), BATCH["labeled"], BATCH["unlabeled"],
                      torch.device("cpu"), g)
    opt = torch.optim.Adam(method.parameters(), lr=float(method.hp["lr"]))
    method.train()
    losses = []
    for s in range(steps):
        prog = Progress(step=s, total_steps=steps, epoch=0)
        out = method.step(src.next(), prog)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        method.after_optimizer_step(prog)
        losses.append(float(out["loss"].detach()))
    return losses


class MethodContract:
    method: ClassVar[str] = ""
    steps: ClassVar[int] = 40
    lr: ClassVar[float] = 3e-3

    @property
    def cls(self) -> type[Method]:
        return get_method(self.method)

    def test_registered_with_family(self):
        assert self.cls.registered_name == self.method
        assert self.cls.family in FAMILIES

    def test_search_space_declared_and_samples_inside(self):
        space = self.cls.search_space
        assert {"lr", "weight_decay"} <= set(space)
        assert all(isinstance(d, Distribution) for d in space.values())
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        for _ in range(20):
            trial = study.ask()
            for k, d in space.items():
                assert contains(d, d.suggest(trial, k)), (k, d)

    def test_defaults_cover_optimiser(self):
        assert {"lr", "weight_decay"} <= set(self.cls.defaults)

    def test_steps_lower_loss_and_beat_chance(self, tiny_bundle):
        m = build(self.method, tiny_bundle, lr=self.lr)
        losses = run_steps(m, tiny_bundle, self.steps)
        assert np.isfinite(losses).all()
        k = max(3, self.steps // 5)
        assert np.mean(losses[-k:]) < np.mean(losses[:k]), losses
        val_bacc, test, _ = evaluate(m, tiny_bundle, TrainConfig(), np.random.default_rng(0))
        chance = 1.0 / tiny_bundle.num_classes
        assert test["balanced_accuracy"] > chance + 0.2, test

    def test_deterministic_under_seed(self, tiny_bundle):
        a = run_steps(build(self.method, tiny_bundle, seed=1), tiny_bundle, 3, seed=5)
        b = run_steps(build(self.method, tiny_bundle, seed=1), tiny_bundle, 3, seed=5)
        c = run_steps(build(self.method, tiny_bundle, seed=1), tiny_bundle, 3, seed=6)
        assert a == b
        assert a != c

    def test_named_losses(self, tiny_bundle):
        m = build(self.method, tiny_bundle)
        g = torch.Generator().manual_seed(0)
        src = BatchSource(tiny_bundle, type(m), 8, 16, torch.device("cpu"), g)
        out = m.step(src.next(), Progress(0, 10, 0))
        assert "loss" in out and out["loss"].ndim == 0 and out["loss"].requires_grad
        if m.family == "semi":
            assert {"loss_labeled", "loss_unlabeled"} <= set(out)

    def test_nothing_passes_threshold(self, tiny_bundle):
        """A batch where no unlabeled prediction is confident must still give a finite,
        differentiable loss (the masked term is zero, not NaN from dividing by zero)."""
        m = build(self.method, tiny_bundle)
        if m.family != "semi":
            return
        with torch.no_grad():  # uniform predictions: confidence 1/C everywhere
            m.head.weight.zero_()
            m.head.bias.zero_()
        x = to_float(torch.as_tensor(tiny_bundle.labeled_x[:8]))
        u = to_float(torch.as_tensor(tiny_bundle.unlabeled_x[:16]))
        batch = Batch(x=[x for _ in m.labeled_views], y=torch.as_tensor(tiny_bundle.labeled_y[:8]),
                      u=[u for _ in m.views], u_index=torch.arange(16))
        out = m.step(batch, Progress(0, 10, 0))
        assert torch.isfinite(out["loss"])
        out["loss"].backward()
        if "mask_rate" in out:
            assert float(out["mask_rate"]) == 0.0
