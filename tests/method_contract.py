"""The contract every registered method inherits (scikit-activeml's template-test idea).

``tests/core/methods/test_method_contract.py`` creates one subclass per registered method, so a new
method file is covered without anyone writing a test class for it; per-method files add
loss checks on hand-computable cases.
"""

from __future__ import annotations

import copy
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


def fixed_batches(method: Method, bundle: Any, n: int = 4, seed: int = 123) -> list[Batch]:
    g = torch.Generator().manual_seed(seed)
    src = BatchSource(bundle, type(method), BATCH["labeled"], BATCH["unlabeled"],
                      torch.device("cpu"), g)
    return [src.next() for _ in range(n)]


def paired_objective(method: Method, batches: list[Batch], seed: int = 7) -> float:
    """Mean total loss over ``batches`` with the global RNG reset to ``seed`` first, on a
    deep copy (steps may update memory banks, statistics or meta-networks)."""
    m = copy.deepcopy(method).train()
    state = torch.get_rng_state()
    torch.manual_seed(seed)
    try:
        total = 0.0
        for i, b in enumerate(batches):
            total += float(m.step(b, Progress(step=i, total_steps=len(batches), epoch=0))
                           ["loss"].detach())
    finally:
        torch.set_rng_state(state)
    return total / len(batches)


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
        """Training lowers the method's own objective, by one of two measurements:

        - windowed: the mean of the last training losses is below that of the first;
        - paired: the same fixed batches with the same random draws, before and after
          training (on copies, so measuring leaves the trained state alone).

        Each alone is wrong for some valid method: per-step losses of objectives that
        draw their own randomness (mixup: a λ near 0 or 1 is easy at any stage) are not
        comparable across steps, which defeats the windowed check; objectives with
        growing state (MoCo's queue fills with negatives) get harder on a fixed batch,
        which defeats the paired one. Beating chance by a margin is required of all."""
        m = build(self.method, tiny_bundle, lr=self.lr)
        untrained = copy.deepcopy(m)
        losses = run_steps(m, tiny_bundle, self.steps)
        assert np.isfinite(losses).all()
        k = max(3, self.steps // 5)
        if not np.mean(losses[-k:]) < np.mean(losses[:k]):  # windowed failed: try paired
            probe_batches = fixed_batches(m, tiny_bundle)
            before = paired_objective(untrained, probe_batches)
            after = paired_objective(m, probe_batches)
            assert after < before, (before, after, losses)
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
        # every term is a finite scalar: the epoch loop logs each one as train/<name>
        for k, v in out.items():
            assert isinstance(v, torch.Tensor) and v.ndim == 0 and torch.isfinite(v), k
        if m.family == "semi":
            assert {"loss_labeled", "loss_unlabeled"} <= set(out)
        if m.family == "supervised":
            assert "loss_labeled" in out

    def test_pseudo_label_declaration_matches_behaviour(self, tiny_bundle):
        """``has_pseudo_labels`` is what diagnostics and contamination studies read to use
        the method's own filter: a declaring method returns targets of the right shapes
        with weights in [0, 1], any other returns ``None``; only semi methods declare."""
        m = build(self.method, tiny_bundle)
        u = to_float(torch.as_tensor(tiny_bundle.unlabeled_x[:8]))
        t = m.pseudo_targets(u, torch.arange(8))
        assert (t is not None) == self.cls.has_pseudo_labels
        if t is None:
            return
        assert self.cls.family == "semi"
        c = tiny_bundle.num_classes
        assert t.logits.shape == (8, c) and t.labels.shape == (8,) and t.weights.shape == (8,)
        assert bool(((t.weights >= 0) & (t.weights <= 1)).all())

    def test_nothing_passes_threshold(self, tiny_bundle):
        """Uniform predictions (confidence 1/C everywhere) must still give a finite loss
        with finite gradients everywhere (masked terms are zero, not NaN from dividing by
        zero), for every family. A method reporting ``mask_rate`` must agree with its
        threshold: with confidence 1/C, all samples pass iff the threshold in force
        (reported ``threshold`` term, else ``hp["threshold"]``) is at most 1/C — FlexMatch
        starts with zero class-wise thresholds, FixMatch with 0.95."""
        m = build(self.method, tiny_bundle)
        head = getattr(m, "head", None)
        if isinstance(head, torch.nn.Linear):
            with torch.no_grad():
                head.weight.zero_()
                head.bias.zero_()
        x = to_float(torch.as_tensor(tiny_bundle.labeled_x[:8]))
        u = to_float(torch.as_tensor(tiny_bundle.unlabeled_x[:16]))
        batch = Batch(x=[x for _ in m.labeled_views], y=torch.as_tensor(tiny_bundle.labeled_y[:8]),
                      u=[u for _ in m.views], u_index=torch.arange(16))
        out = m.step(batch, Progress(0, 10, 0))
        assert torch.isfinite(out["loss"])
        out["loss"].backward()
        for name, p in m.named_parameters():
            if p.grad is not None:
                assert torch.isfinite(p.grad).all(), name
        if "mask_rate" in out:
            threshold = float(out.get("threshold", m.hp.get("threshold", 1.0)))
            expected = 1.0 if 1.0 / tiny_bundle.num_classes >= threshold else 0.0
            assert float(out["mask_rate"]) == expected, (threshold, float(out["mask_rate"]))
