"""Class-weighted labeled losses (SSL-vs-SSL trains every method with them).

SSL-vs-SSL (tufts-ml/SSL-vs-SSL-benchmark) passes ``dataset_configs[...]['class_weights']``
(inverse class frequencies scaled to sum 1, src/config.py) as ``weight`` to the labeled
``F.cross_entropy`` of every method (src/*/libml/utils/misc.py) and fits its linear probe
with ``class_weight='balanced'`` (Self/SimCLR/SimCLR_main.py). scarcelab's labeled losses
were unweighted. The hand cases below use the ``MeanPixel`` backbone of
``test_semi_steps.py``: an image of constant value ``m`` has logits ``(10m, 0, -10m)``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

from scarcelab.errors import ConfigError
from scarcelab.methods import Batch, DataInfo, Progress, get_method
from scarcelab.methods._parts import balanced_class_weights, soft_cross_entropy
from tests.core.methods.test_semi_steps import LABELED, MeanPixel, Y, _images

W = [0.2, 0.5, 0.3]
# per-sample CE of the labeled images (1, 0, -1) with labels (0, 1, 2), by hand
L_EDGE = math.log(1 + math.exp(-10) + math.exp(-20))  # m = ±1, the right class at 10
L_MID = math.log(3)  # m = 0: uniform
WEIGHTED = (W[0] * L_EDGE + W[1] * L_MID + W[2] * L_EDGE) / sum(W)
UNWEIGHTED = (2 * L_EDGE + L_MID) / 3


def test_balanced_weights_by_hand():
    assert balanced_class_weights([30, 10]).tolist() == pytest.approx([0.25, 0.75])
    # TissueMNIST's train counts give SSL-vs-SSL's config weights (src/config.py)
    tissue = [53075, 7814, 5866, 15406, 11789, 7705, 39203, 24608]
    ref = [0.029, 0.195, 0.247, 0.1, 0.132, 0.195, 0.039, 0.063]
    assert balanced_class_weights(tissue).tolist() == pytest.approx(ref, abs=0.012)
    assert balanced_class_weights([4, 0, 4]).tolist() == pytest.approx([0.5, 0.0, 0.5])
    with pytest.raises(ValueError, match="no sample"):
        balanced_class_weights([0, 0])


def test_soft_cross_entropy_weight_matches_torch():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 3, generator=g)
    t = torch.softmax(torch.randn(5, 3, generator=g), 1)
    w = torch.tensor(W)
    assert soft_cross_entropy(logits, t, weight=w).item() == pytest.approx(
        F.cross_entropy(logits, t, weight=w).item(), rel=1e-6)
    # by hand: zero logits, targets (1/2, 1/2, 0) -> (w0 + w1) / 2 * ln 3
    z = torch.zeros(1, 3)
    half = torch.tensor([[0.5, 0.5, 0.0]])
    assert soft_cross_entropy(z, half, weight=w).item() == pytest.approx(
        (W[0] + W[1]) / 2 * math.log(3))


HARD = ["sup", "pseudolabel", "meanteacher", "fixmatch", "flexmatch", "comatch",
        "softmatch", "ds3l"]


def _method(name: str, weights: list[float] | None):
    torch.manual_seed(0)
    cls = get_method(name)
    m = cls(MeanPixel(), 3, dict(cls.defaults))
    with torch.no_grad():
        m.head.weight.copy_(torch.tensor([[10.0, 0.0], [0.0, 0.0], [-10.0, 0.0]]))
        m.head.bias.zero_()
    m.on_train_start(DataInfo(n_labeled=3, n_unlabeled=4, num_classes=3,
                              labeled_class_counts=[1, 1, 1]))
    m.class_weights = None if weights is None else torch.tensor(weights)
    return m


@pytest.mark.parametrize("name", HARD)
@pytest.mark.parametrize("weighted", [True, False])
def test_every_labeled_term_is_the_weighted_mean(name, weighted):
    m = _method(name, W if weighted else None)
    u = [_images([1.0, 0.2, -1.0, 0.05]) for _ in m.views]
    batch = Batch(x=[_images(LABELED) for _ in m.labeled_views], y=torch.tensor(Y), u=u,
                  u_index=torch.arange(4))
    out = m.step(batch, Progress(step=0, total_steps=100, epoch=0))
    assert out["loss_labeled"].item() == pytest.approx(
        WEIGHTED if weighted else UNWEIGHTED, rel=1e-5)


@pytest.mark.parametrize("name", ["mixup", "mixmatch"])
def test_mixed_label_terms_use_the_weighted_soft_loss(name, monkeypatch):
    """MixUp / MixMatch: torch's CE with probability targets and ``weight`` (their
    reference's call); lambda = 1 (no mixing) makes it the hand value
    ``Σ_i w_{y_i} ℓ_i / N``."""
    import scarcelab.methods._parts as parts

    monkeypatch.setattr(parts.torch.distributions, "Beta",
                        lambda a, b: type("One", (), {"sample": lambda self: torch.tensor(1.0)})())
    m = _method(name, W)
    u = [_images([1.0, 0.2, -1.0, 0.05]) for _ in m.views]
    batch = Batch(x=[_images(LABELED) for _ in m.labeled_views], y=torch.tensor(Y), u=u)
    out = m.step(batch, Progress(step=0, total_steps=100, epoch=0))
    by_hand = (W[0] * L_EDGE + W[1] * L_MID + W[2] * L_EDGE) / 3
    assert out["loss_labeled"].item() == pytest.approx(by_hand, rel=1e-5)


def test_mixmatch_ramps_lambda_u_over_40_percent_of_training():
    """SSL-vs-SSL's MixMatch: Linear warm-up to 0.4 of train_epoch
    (runs/*/MixMatch/launch_experiment.sh); the paper's 1.6 % collapsed 2-minute studies."""
    m = _method("mixmatch", None)
    assert m.hp["warmup"] == 0.4
    u = [_images([1.0, 0.2, -1.0, 0.05]) for _ in m.views]
    batch = Batch(x=[_images(LABELED)], y=torch.tensor(Y), u=u)
    out = m.step(batch, Progress(step=20, total_steps=100, epoch=0))
    assert out["rampup"].item() == pytest.approx(0.5)


def _bundle(n_pos: int = 24, n_neg: int = 8):
    from scarcelab.data.bundle import DatasetBundle

    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, (96, 3, 12, 12), dtype=np.uint8)
    y = np.r_[np.zeros(n_pos, int), np.ones(n_neg, int)]
    yv = np.arange(16) % 2
    return DatasetBundle(x[:32], y, x[32:64], x[64:80], yv, x[80:], yv,
                         meta={"num_classes": 2, "name": "noise"})


@pytest.mark.parametrize("kind,expected", [("balanced", [0.25, 0.75]), ("none", None)])
def test_train_trial_sets_the_weights_from_the_labeled_counts(kind, expected):
    import time

    from scarcelab.models import create_model
    from scarcelab.train import TrainConfig, train_trial

    torch.manual_seed(0)
    m = get_method("sup")(create_model("small_cnn", in_channels=3), 2, {})
    cfg = TrainConfig(max_epochs=1, patience=1, max_steps_per_epoch=1, batch_labeled=8,
                      class_weights=kind)
    train_trial(m, _bundle(), cfg, deadline=time.time() + 600,
                generator=torch.Generator().manual_seed(0), probe_rng=np.random.default_rng(0))
    if expected is None:
        assert m.class_weights is None
    else:
        assert m.class_weights.tolist() == pytest.approx(expected)
    with pytest.raises(ValueError, match="'balanced' or 'none'"):
        train_trial(m, _bundle(), TrainConfig(class_weights="inverse"), deadline=time.time(),
                    generator=torch.Generator(), probe_rng=np.random.default_rng(0))


def test_probe_balanced_matches_sklearn():
    from sklearn.linear_model import LogisticRegression

    from scarcelab.probe import LinearProbe

    rng = np.random.default_rng(0)
    f = rng.normal(size=(60, 4))
    y = (f[:, 0] + 0.8 * rng.normal(size=60) > 0.9).astype(int)  # ~20 % positives
    probe = LinearProbe(2, n_trials=1, balanced=True).fit(f, y, f, y, np.random.default_rng(1))
    ref = LogisticRegression(C=probe.C, class_weight="balanced", max_iter=1000).fit(
        (f - probe.mean) / probe.std, y)
    assert probe.clf.class_weight == "balanced"
    np.testing.assert_allclose(probe.predict_proba(f)[:, 1],
                               ref.predict_proba((f - probe.mean) / probe.std)[:, 1], atol=1e-3)


def test_study_config_and_cli_take_class_weights():
    from scarcelab.entrypoints.cli import main
    from scarcelab.entrypoints.study import study_config
    from scarcelab.protocols.search import StudyConfig, run_study
    from scarcelab.tracker import InMemoryTracker

    assert StudyConfig(method="sup").class_weights == "balanced"
    args = ["--method", "sup", "--dataset", "synthetic_tiny", "--class-weights", "none"]
    kw = main.commands["supervised"].make_context("supervised", args).params
    assert study_config("supervised", kw).class_weights == "none"
    with pytest.raises(ConfigError, match="class_weights='inverse'"):
        run_study(StudyConfig(method="sup", dataset="synthetic_tiny", class_weights="inverse"),
                  InMemoryTracker())
    res = CliRunner().invoke(main, ["supervised", *args[:4], "--class-weights", "inverse"])
    assert res.exit_code == 2 and "--class-weights" in res.output
