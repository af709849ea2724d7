"""Issue 12 item 16: the McClish-standardised pAUROC is logged beside the raw one."""

import numpy as np
import pytest
import sklearn.metrics as skm

from scarcelab.metrics import classification_metrics
from scarcelab.protocols.search import StudyConfig, run_study
from scarcelab.tracker import InMemoryTracker


@pytest.mark.parametrize("seed", [0, 1])
def test_pauroc_mcclish_matches_sklearn_max_fpr(seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 300)
    s = np.round(rng.random(300) + 0.6 * y, 2)  # ties on purpose
    out = classification_metrics(y, np.column_stack([1 - s, s]))
    assert out["pauroc_spec90_mcclish"] == pytest.approx(
        skm.roc_auc_score(y, s, max_fpr=0.1), abs=1e-12)
    # random = 0.5 for McClish, 0.05 for the mean-sensitivity form
    y = np.repeat([0, 1], 500)
    flat = classification_metrics(y, np.full((1000, 2), 0.5))
    assert flat["pauroc_spec90_mcclish"] == pytest.approx(0.5)
    assert flat["pauroc_spec90"] == pytest.approx(0.05)


def test_pauroc_mcclish_multiclass_is_the_ovr_macro_of_sklearn():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 3, 400)
    logits = rng.normal(size=(400, 3)) + 1.5 * np.eye(3)[y]
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    ref = np.mean([skm.roc_auc_score(y == k, p[:, k], max_fpr=0.1) for k in range(3)])
    assert classification_metrics(y, p)["pauroc_spec90_mcclish"] == pytest.approx(ref, abs=1e-12)


def test_training_loop_logs_the_mcclish_key():
    t = InMemoryTracker()
    cfg = StudyConfig(method="sup", dataset="synthetic_tiny", budget_minutes=0.5, max_epochs=1,
                      patience=1, batch_size=16, unlabeled_batch_size=32,
                      max_steps_per_epoch=2, max_trials=1, arch="small_cnn", device="cpu")
    run_study(cfg, t)
    trial = t.trials[0]
    raw = [v for _, v in trial.history("test/pauroc_spec90")]
    mc = [v for _, v in trial.history("test/pauroc_spec90_mcclish")]
    assert raw and len(mc) == len(raw)
    # McClish is the increasing affine map 0.5 * (1 + (0.1 r - 0.005) / 0.095) of r = pa / m
    # per curve; synthetic_tiny is multi-class, so check the range and order only
    assert all(0.0 <= v <= 1.0 for v in mc)


# -- mutation-testing survivors (bench/mutation.py): exact error messages ------------------

def test_fraction_errors_name_the_parameter_exactly():
    from scarcelab.metrics import partial_auroc, sensitivity_at_specificity

    y, p = np.array([0, 1]), np.eye(2)
    with pytest.raises(ValueError, match=r"^min_specificity must lie in \[0, 1\), got 1\.0$"):
        partial_auroc(y, p, min_specificity=1.0)
    with pytest.raises(ValueError, match=r"^specificity must lie in \[0, 1\], got 1\.5$"):
        sensitivity_at_specificity(y, p, 1.5)
    # 1.0 is allowed for a specificity, not for the partial-AUROC bound
    assert sensitivity_at_specificity(y, p, 1.0) == 1.0


def test_ranking_metric_errors_name_y_true():
    from scarcelab.metrics import auroc

    with pytest.raises(ValueError, match=r"^y_true must be 1-D \(one class index per sample\)"):
        auroc(np.zeros((2, 2), dtype=int), np.eye(2))
    with pytest.raises(ValueError, match=r"^y_true is empty"):
        auroc(np.zeros(0, dtype=int), np.zeros((0, 2)))
