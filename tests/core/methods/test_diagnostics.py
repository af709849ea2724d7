"""C-Score diagnostics: each against a hand computation and its invariants, and the
per-epoch hook (generic over the method interface, free of side effects on training)."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import entropy

from scarcelab.methods import METHODS, get_method
from scarcelab.metrics.diagnostics import (
    DiagnosticsConfig,
    EpochDiagnostics,
    class_concentration_index,
    cosine,
    gradient_alignment,
    ood_filtration_failure,
    pseudo_label_entropy,
    semantic_drift,
)
from scarcelab.models import create_model
from scarcelab.protocols.search import StudyConfig, run_study
from scarcelab.tracker import InMemoryTracker
from scarcelab.train import Diagnostics, OnEpochEnd, TrainConfig, train_trial

# -- PLE ---------------------------------------------------------------------------------


def test_ple_hand_computed():
    probs = [[0.5, 0.5], [1.0, 0.0], [0.2, 0.8]]
    h = [math.log(2), 0.0, -(0.2 * math.log(0.2) + 0.8 * math.log(0.8))]
    assert pseudo_label_entropy(probs) == pytest.approx(sum(h) / 3, abs=1e-12)


@pytest.mark.parametrize("c", [2, 3, 10])
def test_ple_uniform_softmax_is_log_c(c):
    logits = torch.zeros(7, c)
    assert pseudo_label_entropy(torch.softmax(logits, 1)) == pytest.approx(math.log(c))


def test_ple_matches_scipy_on_random_rows():
    p = np.random.default_rng(0).dirichlet(np.ones(5), size=40)
    assert pseudo_label_entropy(p) == pytest.approx(entropy(p, axis=1).mean(), rel=1e-10)


# -- CCI ---------------------------------------------------------------------------------


def test_cci_uniform_mean_prediction_is_zero_even_if_each_row_is_one_hot():
    assert class_concentration_index([[1, 0, 0], [0, 1, 0], [0, 0, 1]]) == pytest.approx(0)
    assert class_concentration_index(np.full((4, 5), 0.2)) == pytest.approx(0)


def test_cci_hand_computed_and_collapse_is_log_c():
    # mean prediction (0.8, 0.2): KL to (0.5, 0.5) = 0.8 ln 1.6 + 0.2 ln 0.4
    expect = 0.8 * math.log(1.6) + 0.2 * math.log(0.4)
    assert class_concentration_index([[0.9, 0.1], [0.7, 0.3]]) == pytest.approx(expect)
    assert class_concentration_index([[0, 1, 0, 0]] * 6) == pytest.approx(math.log(4))


def test_cci_matches_scipy_kl():
    p = np.random.default_rng(1).dirichlet(np.ones(4) * 0.3, size=50)
    ref = entropy(p.mean(0), np.full(4, 0.25))
    assert class_concentration_index(p) == pytest.approx(ref, rel=1e-10)


def test_bad_shapes_are_rejected():
    with pytest.raises(ValueError):
        pseudo_label_entropy(np.zeros((0, 3)))
    with pytest.raises(ValueError):
        class_concentration_index(np.ones(3) / 3)


# -- Sem-Drift ---------------------------------------------------------------------------


def test_sem_drift_hand_computed():
    zl = [[0, 0], [2, 0], [5, 5]]          # class 0 centroid (1, 0); class 1 (5, 5)
    yl = [0, 0, 1]
    zu = [[1, 3], [1, 3], [9, 9], [4, 5]]  # pseudo 0, 0, 1(masked out), 1
    pseudo = [0, 0, 1, 1]
    mask = [1, 1, 0, 1]
    # class 0: |(1,0)-(1,3)| = 3; class 1: |(5,5)-(4,5)| = 1  -> mean 2
    assert semantic_drift(zl, yl, zu, pseudo, mask, 2) == pytest.approx(2.0)
    # a class with no passing unlabeled sample is skipped, not counted as 0
    assert semantic_drift(zl, yl, zu, pseudo, [1, 1, 0, 0], 2) == pytest.approx(3.0)


def test_sem_drift_nan_when_no_class_has_both_centroids():
    assert math.isnan(semantic_drift([[0.0, 1.0]], [0], [[1.0, 0.0]], [1], [1], 2))
    assert math.isnan(semantic_drift([[0.0, 1.0]], [0], [[1.0, 0.0]], [0], [0], 2))


# -- Grad-Align --------------------------------------------------------------------------


def _linear_losses(a, b):
    w = torch.nn.Parameter(torch.randn(2, 3, generator=torch.Generator().manual_seed(0)))
    return (w * torch.tensor(a)).sum(), (w * torch.tensor(b)).sum(), w


def test_grad_align_identical_losses_is_one():
    head = torch.nn.Linear(4, 3)
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    loss = torch.nn.functional.cross_entropy(head(x), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1]))
    assert gradient_alignment(loss, loss, head.weight) == pytest.approx(1.0)


def test_grad_align_hand_computed():
    # gradients of sum(W * A) are A: cos = <A,B> / (|A||B|)
    a = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    b = [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    la, lb, w = _linear_losses(a, b)
    assert gradient_alignment(la, lb, w) == pytest.approx(1 / (math.sqrt(2) * math.sqrt(2)))
    la, lb, w = _linear_losses(a, [[-2.0, 0, 0], [0, -2.0, 0]])
    assert gradient_alignment(la, lb, w) == pytest.approx(-1.0)


def test_grad_align_nan_when_a_gradient_is_zero():
    la, lb, w = _linear_losses([[1.0, 0, 0], [0, 0, 0]], [[0.0, 0, 0], [0, 0, 0]])
    assert math.isnan(gradient_alignment(la, lb, w))
    assert math.isnan(gradient_alignment(la, torch.tensor(0.0), w))
    assert math.isnan(cosine([0.0, 0.0], [1.0, 2.0]))


# -- OOD-FF ------------------------------------------------------------------------------


def test_ood_ff_hand_computed():
    mask = [1, 1, 0, 0, 1, 0, 0, 0]
    ood = [0, 0, 0, 0, 1, 1, 1, 1]
    # ID pass 2/4, OOD pass 1/4 -> 0.5
    assert ood_filtration_failure(mask, ood) == pytest.approx(0.5)
    assert ood_filtration_failure([1, 0, 1, 1], [0, 0, 1, 1]) == pytest.approx(2.0)


def test_ood_ff_zero_when_no_ood_passes_and_undefined_cases():
    assert ood_filtration_failure([1, 1, 0, 0], [0, 0, 1, 1]) == 0.0
    assert ood_filtration_failure([0, 0, 0, 0], [0, 0, 1, 1]) == 0.0
    assert math.isinf(ood_filtration_failure([0, 0, 1, 0], [0, 0, 1, 1]))
    assert math.isnan(ood_filtration_failure([1, 0], [0, 0]))  # no OOD sample
    with pytest.raises(ValueError):
        ood_filtration_failure([1, 0, 1], [0, 1])


# -- the per-epoch hook ------------------------------------------------------------------


def _fixmatch(bundle, seed=0):
    torch.manual_seed(seed)
    cls = get_method("fixmatch")
    return cls(create_model("small_cnn", in_channels=bundle.channels), bundle.num_classes,
               dict(cls.defaults))


def test_hook_values_match_a_direct_computation_and_leave_the_method_untouched(tiny_bundle):
    tiny_bundle.unlabeled_ood = np.arange(len(tiny_bundle.unlabeled_x)) % 3 == 0
    m = _fixmatch(tiny_bundle)
    m.hp["threshold"] = 0.0  # everything passes: every diagnostic is defined
    diag = EpochDiagnostics(tiny_bundle, "cpu", DiagnosticsConfig(n_unlabeled=100,
                                                                  n_labeled=20, seed=3))
    before = {k: v.clone() for k, v in m.state_dict().items()}
    torch.manual_seed(123)
    out = diag(m, 0)
    after_rng = torch.rand(1)
    torch.manual_seed(123)
    assert torch.equal(after_rng, torch.rand(1))  # the hook did not consume the global RNG
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    assert m.training and all(p.grad is None for p in m.parameters())
    assert {"diag/ple", "diag/cci", "diag/sem_drift", "diag/grad_align",
            "diag/ood_ff"} <= set(out)
    # PLE/CCI recomputed independently from the same subsample
    m.eval()
    with torch.no_grad():
        x = torch.as_tensor(tiny_bundle.unlabeled_x[diag.u_idx]).float() / 255
        from scarcelab.models.classifier import normalize

        p = torch.softmax(m.logits(normalize(x)).double(), 1).numpy()
    m.train()
    # 100 ID images plus OOD ones beside them in the pool's proportion (180 / 360)
    assert int((~diag.is_ood).sum()) == 100 and int(diag.is_ood.sum()) == 50
    assert out["diag/ple"] == pytest.approx(entropy(p, axis=1).mean(), rel=1e-6)
    assert out["diag/cci"] == pytest.approx(entropy(p.mean(0), np.full(3, 1 / 3)), rel=1e-6)
    assert -1.0 <= out["diag/grad_align"] <= 1.0 and out["diag/sem_drift"] > 0
    assert out["diag/ood_ff"] == pytest.approx(1.0)  # threshold 0: OOD passes like ID
    assert diag(m, 0) == pytest.approx(out, nan_ok=True)  # fixed subsample: deterministic


def test_hook_uses_threshold_hyperparameter(tiny_bundle):
    m = _fixmatch(tiny_bundle)
    diag = EpochDiagnostics(tiny_bundle, "cpu", DiagnosticsConfig(n_unlabeled=64))
    m.hp["threshold"] = 0.0
    assert diag(m, 0)["diag/mask_rate"] == 1.0
    m.hp["threshold"] = 1.01
    assert diag(m, 0)["diag/mask_rate"] == 0.0

    # fallback for a method without pseudo-labels of its own (Mean Teacher): the generic
    # mask with DEFAULT_THRESHOLD, flagged by diag/own_filter = 0
    torch.manual_seed(0)
    mt_cls = get_method("meanteacher")
    m2 = mt_cls(create_model("small_cnn", in_channels=1), 3, dict(mt_cls.defaults))
    assert "threshold" not in m2.hp
    m2.head.weight.data *= 100  # confident on some samples, not all
    m2.eval()
    with torch.no_grad():
        from scarcelab.models.classifier import normalize

        x = torch.as_tensor(tiny_bundle.unlabeled_x[diag.u_idx]).float() / 255
        conf = torch.softmax(m2.logits(normalize(x)), 1).max(1).values
    m2.train()
    out = diag(m2, 0)
    assert out["diag/own_filter"] == 0.0
    assert out["diag/mask_rate"] == pytest.approx(float((conf >= 0.95).float().mean()))
    assert 0.0 < out["diag/mask_rate"] < 1.0


def _train(bundle, diagnostics):
    m = _fixmatch(bundle, seed=5)
    cfg = TrainConfig(max_epochs=2, patience=5, max_steps_per_epoch=3, batch_labeled=8,
                      batch_unlabeled=16)
    reports = []
    train_trial(m, bundle, cfg, deadline=1e18, generator=torch.Generator().manual_seed(5),
                probe_rng=np.random.default_rng(5),
                callbacks=[*([] if diagnostics is None else [Diagnostics(diagnostics)]),
                           OnEpochEnd(lambda rep, imp, snap: reports.append(rep.metrics))])
    return m, reports


def test_train_trial_merges_diagnostics_without_changing_training(tiny_bundle):
    m0, plain = _train(tiny_bundle, None)
    diag = EpochDiagnostics(tiny_bundle, "cpu", DiagnosticsConfig(n_unlabeled=64))
    m1, with_diag = _train(tiny_bundle, diag)
    assert all("diag/ple" in r and r["time/diag_s"] > 0 for r in with_diag)
    assert not any(k.startswith("diag/") for r in plain for k in r)
    for a, b in zip(plain, with_diag, strict=True):
        assert a["train/loss"] == b["train/loss"]
        assert a["val/balanced_accuracy"] == b["val/balanced_accuracy"]
    s0, s1 = m0.state_dict(), m1.state_dict()
    assert all(torch.equal(s0[k], s1[k]) for k in s0)


def test_every_semi_study_logs_diagnostics_and_supervised_ones_do_not():
    base = dict(dataset="synthetic_tiny", budget_minutes=0.5, max_epochs=2, batch_size=8,
                unlabeled_batch_size=16, max_steps_per_epoch=2, max_trials=1,
                arch="small_cnn", device="cpu", diag_samples=64)
    t = InMemoryTracker()
    run_study(StudyConfig(method="fixmatch", **base), t)
    keys = {k for k, _, _ in t.trials[0].metrics}
    assert {"diag/ple", "diag/cci", "diag/sem_drift", "diag/grad_align", "time/diag_s"} <= keys
    assert "diag/ood_ff" not in keys  # no ID/OOD flags outside contamination runs
    assert len(t.trials[0].history("diag/cci")) == 2
    t = InMemoryTracker()
    run_study(StudyConfig(method="sup", **base), t)
    assert not any(k.startswith("diag/") for k, _, _ in t.trials[0].metrics)


def test_a_failing_diagnostic_gives_nan_not_a_failed_run(tiny_bundle, caplog):
    m = _fixmatch(tiny_bundle)
    diag = EpochDiagnostics(tiny_bundle, "cpu", DiagnosticsConfig(n_unlabeled=32))

    def broken(batch, progress):
        raise RuntimeError("boom")

    m.step = broken
    out = diag(m, 0)
    assert math.isnan(out["diag/grad_align"]) and "boom" in caplog.text
    assert math.isfinite(out["diag/ple"]) and math.isfinite(out["diag/cci"])
    m.logits = broken
    assert all(math.isnan(v) for v in diag(m, 0).values())


# -- the method's own filter (issue 12 item 5) --------------------------------------------


def test_sem_drift_weighted_hand_computed():
    zl = [[0, 0], [2, 0], [5, 5]]          # class 0 centroid (1, 0); class 1 (5, 5)
    yl = [0, 0, 1]
    zu = [[1, 3], [4, 0], [9, 9], [4, 5]]
    pseudo = [0, 0, 1, 1]
    w = [1.0, 0.5, 0.0, 0.25]
    # class 0: (1*(1,3) + .5*(4,0)) / 1.5 = (2, 2) -> |(1,0)-(2,2)| = sqrt 5; class 1: (4,5)
    assert semantic_drift(zl, yl, zu, pseudo, w, 2) == pytest.approx((math.sqrt(5) + 1) / 2)
    with pytest.raises(ValueError):
        semantic_drift(zl, yl, zu, pseudo, [1, -1, 0, 0], 2)


def test_ood_ff_with_soft_weights_is_the_ratio_of_mean_weights():
    assert ood_filtration_failure([0.8, 0.4, 0.2, 0.1], [0, 0, 1, 1]) == pytest.approx(0.25)
    assert ood_filtration_failure([0.8, 0.4, 0.0, 0.0], [0, 0, 1, 1]) == 0.0


def _semi(name, bundle, seed=0, **hp):
    torch.manual_seed(seed)
    cls = get_method(name)
    m = cls(create_model("small_cnn", in_channels=bundle.channels), bundle.num_classes,
            {**cls.defaults, **hp})
    from scarcelab.methods import DataInfo

    m.on_train_start(DataInfo(len(bundle.labeled_y), len(bundle.unlabeled_x),
                              bundle.num_classes, [10, 10, 10]))
    return m


def _eval_logits(m, x_uint8):
    from scarcelab.models.classifier import normalize

    m.eval()
    with torch.no_grad():
        z = m.logits(normalize(torch.as_tensor(x_uint8).float() / 255)).double()
    m.train()
    return z


def test_hook_uses_flexmatchs_class_wise_thresholds(tiny_bundle):
    """Fresh learning status: every class threshold is 0, so FlexMatch trains on every
    pseudo-label — the diagnostics must see that mask, not a generic τ = 0.95 one."""
    tiny_bundle.unlabeled_ood = np.arange(len(tiny_bundle.unlabeled_x)) % 4 == 0
    m = _semi("flexmatch", tiny_bundle)
    diag = EpochDiagnostics(tiny_bundle, "cpu", DiagnosticsConfig(n_unlabeled=64))
    conf = torch.softmax(_eval_logits(m, tiny_bundle.unlabeled_x[diag.u_idx]), 1).max(1).values
    assert float((conf >= 0.95).double().mean()) < 0.5  # the generic mask would differ
    out = diag(m, 0)
    assert out["diag/mask_rate"] == 1.0
    assert out["diag/ood_ff"] == pytest.approx(1.0)  # thresholds 0 filter nothing
    assert out["diag/own_filter"] == 1.0
    # once every class is learned the thresholds are tau for all: the generic mask again
    m.status.selected.copy_(torch.arange(len(m.status.selected)) % 3)
    assert diag(m, 0)["diag/mask_rate"] == pytest.approx(float((conf >= 0.95).double().mean()))


def test_hook_uses_softmatchs_weights_weight_averaged(tiny_bundle):
    tiny_bundle.unlabeled_ood = np.arange(len(tiny_bundle.unlabeled_x)) % 4 == 0
    m = _semi("softmatch", tiny_bundle)
    m.head.weight.data *= 30  # spread the confidences
    m.weighting.mu.fill_(0.9)  # so that weights are not all 1
    diag = EpochDiagnostics(tiny_bundle, "cpu", DiagnosticsConfig(n_unlabeled=64))
    z = _eval_logits(m, tiny_bundle.unlabeled_x[diag.u_idx])
    p = torch.softmax(z, 1)
    a = p * (1 / 3 + 1e-6) / (p.mean(0) + 1e-6)  # no update yet: the batch's own mean
    conf = (a / a.sum(1, keepdim=True)).max(1).values
    w = torch.exp(-((conf - 0.9).clamp(max=0) ** 2) / (2 * 1.0 / 4))
    assert 0.05 < float(w.std())  # genuinely soft weights
    out = diag(m, 0)
    assert out["diag/mask_rate"] == pytest.approx(float(w.mean()), rel=1e-5)
    o = diag.is_ood
    assert out["diag/ood_ff"] == pytest.approx(float(w[o].mean() / w[~o].mean()), rel=1e-5)
    zl = _eval_logits(m, tiny_bundle.labeled_x[diag.l_idx])
    assert out["diag/sem_drift"] == pytest.approx(
        semantic_drift(zl, diag.yl, z, p.argmax(1), w, 3), rel=1e-5)


def test_hook_uses_ds3ls_learned_weights(tiny_bundle):
    m = _semi("ds3l", tiny_bundle)
    diag = EpochDiagnostics(tiny_bundle, "cpu", DiagnosticsConfig(n_unlabeled=64))
    z = _eval_logits(m, tiny_bundle.unlabeled_x[diag.u_idx])
    with torch.no_grad():
        w = m.wnet(torch.softmax(z.float(), 1)).squeeze(-1)
    assert diag(m, 0)["diag/mask_rate"] == pytest.approx(float(w.mean()), rel=1e-5)


@pytest.mark.parametrize("name", [n for n in METHODS.names()
                                  if get_method(n).family == "semi"])
def test_pseudo_targets_leave_the_method_untouched(tiny_bundle, name):
    from scarcelab.methods import Batch, Progress

    m = _semi(name, tiny_bundle, memory_size=16) if name == "comatch" else _semi(
        name, tiny_bundle)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(8, 1, 16, 16, generator=g)
    u = torch.rand(8, 1, 16, 16, generator=g)
    m.step(Batch([x for _ in m.labeled_views], torch.arange(8) % 3, [u for _ in m.views],
                 torch.arange(8)), Progress(0, 10, 0))  # populate running state
    before = {k: v.clone() for k, v in m.state_dict().items()}
    t = m.pseudo_targets(u, torch.arange(8))
    assert m.training
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    if not m.has_pseudo_labels:  # Mean Teacher: diagnostics fall back to the generic mask
        assert t is None
        return
    assert t.logits.shape == (8, 3) and t.labels.shape == (8,) and t.weights.shape == (8,)
    assert not t.weights.requires_grad and not t.logits.requires_grad
    assert bool(((t.weights >= 0) & (t.weights <= 1)).all())


# -- the same subsample at every ratio (issue 12 item 7) ------------------------------------


def test_same_id_subsample_at_every_contamination_ratio(tiny_bundle):
    from scarcelab.protocols.contamination import contaminate

    cfg = DiagnosticsConfig(n_unlabeled=64, batch_unlabeled=16, seed=2)
    clean = EpochDiagnostics(tiny_bundle, "cpu", cfg)

    def images(a):
        return sorted(bytes(np.ascontiguousarray(x)) for x in a)

    ref = images(tiny_bundle.unlabeled_x[clean.u_idx])
    ref_grad = images(tiny_bundle.unlabeled_x[clean.u_idx[clean.gu.numpy()]])
    for r in (0.1, 0.3, 0.5):
        b = contaminate(tiny_bundle, "gaussian", r, seed=0)
        d = EpochDiagnostics(b, "cpu", cfg)
        ood = d.is_ood.numpy()
        xs = b.unlabeled_x[d.u_idx]
        assert images(xs[~ood]) == ref  # all 64 ID images shared, none replaced
        c = b.meta["contamination"]
        assert int(ood.sum()) == round(64 * c["n_ood"] / c["n_id"])  # added beside them
        gu = d.gu.numpy()
        assert images(xs[gu][~ood[gu]]) == ref_grad  # Grad-Align batch: same ID images
        assert np.array_equal(d.l_idx, clean.l_idx)


# -- a loss with no path to the weight (found by the mutation sample, docs/mutation.md) ---
def test_gradient_alignment_is_nan_when_a_loss_has_no_path_to_the_weight():
    w = torch.tensor([[1.0, 2.0]], requires_grad=True)
    other = torch.tensor([3.0], requires_grad=True)
    x = torch.tensor([1.0, -1.0])
    loss_l = (w @ x).sum() ** 2
    loss_u = (other * 2).sum()  # differentiable, but not through w
    assert math.isnan(gradient_alignment(loss_l, loss_u, w))
    # and a real pair: w.x = -1, so d/dw (w.x)^2 = 2 (w.x) x = (-2, 2) and d/dw (w.x) = x =
    # (1, -1): opposite directions, cosine -1
    loss_u2 = (w @ x).sum()
    assert gradient_alignment(loss_l, loss_u2, w) == pytest.approx(-1.0)


# -- found by the mutation sample (docs/mutation.md) ----------------------------------------
def test_int_ood_flags_give_the_same_subsample_as_bool_flags(tiny_bundle):
    """``unlabeled_ood`` may arrive as 0/1 integers (e.g. read back from a file); they mean
    the same as booleans, so the ID/OOD subsample must be the same."""
    flags = np.arange(len(tiny_bundle.unlabeled_x)) % 3 == 0
    cfg = DiagnosticsConfig(n_unlabeled=40, batch_unlabeled=8, seed=1)
    tiny_bundle.unlabeled_ood = flags
    ref = EpochDiagnostics(tiny_bundle, "cpu", cfg)
    tiny_bundle.unlabeled_ood = flags.astype(np.int64)
    d = EpochDiagnostics(tiny_bundle, "cpu", cfg)
    np.testing.assert_array_equal(d.u_idx, ref.u_idx)
    assert torch.equal(d.gu, ref.gu) and torch.equal(d.is_ood, ref.is_ood)
    assert not bool(d.is_ood[:40].any()) and bool(d.is_ood[40:].all())  # ID first, then OOD


def test_own_targets_passes_each_chunk_its_own_pool_positions(tiny_bundle):
    """Methods with per-sample state (FlexMatch) key it by pool position, so
    ``pseudo_targets`` must get, with each eval chunk, the pool indices of exactly its rows."""
    m = _fixmatch(tiny_bundle)
    diag = EpochDiagnostics(tiny_bundle, "cpu",
                            DiagnosticsConfig(n_unlabeled=40, eval_batch_size=16, seed=4))
    seen: list[tuple[int, torch.Tensor]] = []
    real = m.pseudo_targets

    def spy(x, idx):  # type: ignore[no-untyped-def]
        seen.append((len(x), idx.clone()))
        return real(x, idx)

    m.pseudo_targets = spy  # type: ignore[method-assign]
    t = diag.own_targets(m)
    assert t is not None and t.labels.shape == (40,)
    assert [n for n, _ in seen] == [16, 16, 8]
    assert all(len(idx) == n for n, idx in seen)
    np.testing.assert_array_equal(torch.cat([idx for _, idx in seen]).numpy(), diag.u_idx)


def test_sem_drift_reads_labels_and_pseudo_labels_with_the_same_integer_cast():
    """Class ids are the integer cast (toward zero, as numpy's ``astype(int64)``) of the given
    values, for the labels exactly as for the pseudo-labels: a float label column must select
    the class its cast names on both sides, not match no class and silently give NaN. The
    reference is the hand-computed case above with the labels cast by numpy."""
    zl = [[0, 0], [2, 0], [5, 5]]
    zu = [[1, 3], [1, 3], [9, 9], [4, 5]]
    mask = [1, 1, 0, 1]
    yl = np.array([0.25, 0.5, 1.75])
    pseudo = np.array([0.5, 0.0, 1.25, 1.5])
    ref = semantic_drift(zl, yl.astype(np.int64), zu, pseudo.astype(np.int64), mask, 2)
    assert ref == pytest.approx(2.0)  # as test_sem_drift_hand_computed
    assert semantic_drift(zl, yl, zu, pseudo, mask, 2) == pytest.approx(ref)
    assert semantic_drift(zl, yl.astype(np.float32), zu, pseudo, mask, 2) == pytest.approx(ref)


# -- one scratch copy per trial, refreshed each epoch (issue 40 item 3) ----------------------
SEMI = sorted(n for n, c in METHODS._entries.items() if c.family == "semi")


def _grad_align_on_a_fresh_deepcopy(diag, method, epoch):
    """The diagnostic step as it was before the scratch copy: a new deep copy per epoch."""
    import copy

    from scarcelab.methods.base import Progress

    probe = copy.deepcopy(method)
    probe.train()
    with torch.random.fork_rng(devices=[]):
        losses = probe.step(diag._batch(probe), Progress(step=0, total_steps=1, epoch=epoch))
    if "loss_labeled" not in losses or "loss_unlabeled" not in losses:
        return math.nan
    return gradient_alignment(losses["loss_labeled"], losses["loss_unlabeled"],
                              probe.head.weight)


@pytest.mark.parametrize("name", SEMI)
def test_the_refreshed_scratch_gives_what_a_fresh_deepcopy_gives(tiny_bundle, name):
    """Every semi-supervised method, trained three epochs on a fixed seed: each epoch's
    Grad-Align on the one scratch copy (refreshed in place, after its own diagnostic step
    changed its queues, statistics and per-sample state) equals, bit for bit, the old
    computation on a new deep copy; the scratch is made once and then reused; its state
    after the refresh is the method's."""
    cls = get_method(name)
    torch.manual_seed(0)
    m = cls(create_model("small_cnn", in_channels=1), 3, dict(cls.defaults))
    diag = EpochDiagnostics(tiny_bundle, "cpu", DiagnosticsConfig(n_unlabeled=64,
                                                                  n_labeled=16))
    seen: list[tuple[float, float]] = []
    copies: list[int] = []

    def measure(method, epoch):
        old = _grad_align_on_a_fresh_deepcopy(diag, method, epoch)
        new = diag.grad_align(method, epoch)
        scratch = diag._scratch
        copies.append(id(scratch))
        s0, s1 = method.state_dict(), diag.scratch(method).state_dict()
        assert all(torch.equal(s0[k], s1[k]) for k in s0)
        seen.append((old, new))
        return {}

    cfg = TrainConfig(max_epochs=3, patience=10, max_steps_per_epoch=1, batch_labeled=8,
                      batch_unlabeled=16)
    train_trial(m, tiny_bundle, cfg, deadline=1e18, generator=torch.Generator().manual_seed(1),
                probe_rng=np.random.default_rng(1), callbacks=[Diagnostics(measure)])
    assert len(seen) == 3 and len(set(copies)) == 1
    for old, new in seen:
        assert (math.isnan(old) and math.isnan(new)) or old == new


def test_a_new_method_gets_a_new_scratch_and_a_changed_tree_a_new_copy(tiny_bundle):
    m1, m2 = _fixmatch(tiny_bundle, seed=1), _fixmatch(tiny_bundle, seed=2)
    diag = EpochDiagnostics(tiny_bundle, "cpu", DiagnosticsConfig(n_unlabeled=32))
    a = diag.scratch(m1)
    assert diag.scratch(m1) is a
    b = diag.scratch(m2)
    assert b is not a and torch.equal(b.head.weight, m2.head.weight)
    m2.head = torch.nn.Linear(m2.head.in_features, 3)  # the same tree: refreshed
    assert diag.scratch(m2) is b and torch.equal(b.head.weight, m2.head.weight)
    m2.head = torch.nn.Linear(m2.head.in_features, 4)  # another shape: a fresh copy
    c = diag.scratch(m2)
    assert c is not b and torch.equal(c.head.weight, m2.head.weight)
    m2.extra = torch.nn.Linear(2, 2)  # another tree: a fresh copy
    d = diag.scratch(m2)
    assert d is not c and torch.equal(d.extra.weight, m2.extra.weight)
