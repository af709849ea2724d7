"""The positive class of a binary task is the disease (issue 23 item 20): the metrics read
the positive class's curve, each dataset names it (BreastMNIST: malignant = label 0), a
study logs it and computes its test metrics and ROC figure with it, and it can be chosen.

References: brute force over every threshold (``tests/core/metrics/test_metrics.py``'s helpers) and
sklearn's ``roc_curve(pos_label=...)``; the label meanings from MedMNIST's ``INFO``
(github.com/MedMNIST/MedMNIST, ``medmnist/info.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn import metrics as skm
from test_metrics import _brute_partial_area, _brute_sensitivity

from scarcelab.data.bundle import RawDataset
from scarcelab.errors import ConfigError
from scarcelab.metrics import (
    auroc,
    classification_metrics,
    partial_auroc,
    sensitivity_at_specificity,
)


def _binary(seed: int = 0, n: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """Imbalanced labels (class 0 the rare one, as malignant in BreastMNIST) and softmax
    scores whose two columns are complementary; class 1's scores are tight and class 0's
    spread out, so the two ends of the ROC curve differ (as real scores do)."""
    rng = np.random.default_rng(seed)
    y = (rng.random(n) > 0.27).astype(np.int64)
    s1 = np.clip(np.where(y == 1, rng.normal(0.6, 0.08, n), rng.normal(0.4, 0.25, n)),
                 0.0, 1.0)
    return y, np.column_stack([1.0 - s1, s1])


# -- metrics ----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("pos", [0, 1])
def test_binary_metrics_read_the_positive_class_curve(seed, pos):
    y, p = _binary(seed)
    is_pos, score = y == pos, p[:, pos]
    want_sens = _brute_sensitivity(is_pos, score, 0.95)
    want_pa = _brute_partial_area(is_pos, score, 0.1) / 0.1
    assert sensitivity_at_specificity(y, p, 0.95, positive_class=pos) == pytest.approx(
        want_sens, abs=1e-12)
    assert partial_auroc(y, p, 0.9, positive_class=pos) == pytest.approx(want_pa, abs=1e-12)
    fpr, tpr, _ = skm.roc_curve(y, score, pos_label=pos)
    assert auroc(y, p, positive_class=pos) == pytest.approx(skm.auc(fpr, tpr), abs=1e-12)
    m = classification_metrics(y, p, positive_class=pos)
    assert m["sensitivity_at_spec95"] == pytest.approx(want_sens, abs=1e-12)
    assert m["pauroc_spec90"] == pytest.approx(want_pa, abs=1e-12)


def test_the_choice_changes_sensitivity_and_pauroc_but_not_auroc():
    y, p = _binary(0)
    m0, m1 = (classification_metrics(y, p, positive_class=k) for k in (0, 1))
    assert m0["auroc"] == pytest.approx(m1["auroc"], abs=1e-12)  # complementary columns
    assert m0["balanced_accuracy"] == m1["balanced_accuracy"]
    assert m0["sensitivity_at_spec95"] - m1["sensitivity_at_spec95"] > 0.5  # 0.625 vs 0.026
    assert m0["pauroc_spec90"] - m1["pauroc_spec90"] > 0.5  # 0.562 vs 0.030
    assert classification_metrics(y, p) == m1  # the default stays class 1


def test_positive_class_is_refused_for_multi_class_scores_and_out_of_range():
    y = np.array([0, 1, 2, 1])
    p = np.full((4, 3), 1 / 3)
    with pytest.raises(ValueError, match="positive_class=0 applies to binary tasks"):
        classification_metrics(y, p, positive_class=0)
    with pytest.raises(ValueError, match="must be 0 or 1"):
        auroc(np.array([0, 1]), np.array([[0.4, 0.6], [0.7, 0.3]]), positive_class=2)


# -- datasets ---------------------------------------------------------------------------------


def test_medmnist_binary_sets_name_the_disease(medmnist_dir):
    from scarcelab.data import load_raw
    from scarcelab.data.bundle import resolve_positive_class

    breast = load_raw("breastmnist", str(medmnist_dir))
    assert breast.class_names[0] == "malignant" and breast.positive_class == 0
    pneu = load_raw("pneumoniamnist", str(medmnist_dir))
    assert pneu.class_names[pneu.positive_class] == "pneumonia" and pneu.positive_class == 1
    assert resolve_positive_class(breast) == 0
    assert resolve_positive_class(breast, "normal, benign") == 1
    assert resolve_positive_class(breast, "1") == 1 and resolve_positive_class(breast, 0) == 0


def test_the_table_and_the_other_binary_sources():
    from scarcelab.data.sources import mhist, pcam
    from scarcelab.data.sources.medmnist import MEDMNIST_INFO

    binary = {k: v for k, v in MEDMNIST_INFO.items() if v.official_task == "binary-class"}
    assert {k: v.class_names.index(v.positive) for k, v in binary.items() if v.positive} == {
        "breastmnist": 0, "pneumoniamnist": 1}
    assert set(binary) == {"breastmnist", "pneumoniamnist"}
    assert mhist.CLASSES.index("SSA") == 1 and "metastatic" in pcam.CLASSES[1]


def _raw(names: list[str], positive: int | None = None) -> RawDataset:
    x = np.zeros((2, 1, 2, 2), np.uint8)
    return RawDataset("toy", x, np.arange(2) % len(names), x, np.arange(2) % len(names),
                      len(names), names, positive_class=positive)


def test_resolution_and_its_errors():
    from scarcelab.data.bundle import resolve_positive_class

    assert resolve_positive_class(_raw(["a", "b"])) == 1  # not stated: class 1
    assert resolve_positive_class(_raw(["sick", "well"], 0), "default") == 0
    assert resolve_positive_class(_raw(["Sick", "well"], 0), "WELL") == 1
    assert resolve_positive_class(_raw(["a", "b", "c"])) is None
    with pytest.raises(ConfigError, match=r"positive_class='tumour': toy's classes are 0 "
                       r"'sick' and 1 'well'; give 0, 1 or one of those names"):
        resolve_positive_class(_raw(["sick", "well"], 0), "tumour")
    with pytest.raises(ConfigError, match="toy is not a binary task .3 classes"):
        resolve_positive_class(_raw(["a", "b", "c"]), "a")


# -- a study ----------------------------------------------------------------------------------


def test_a_breastmnist_study_reports_malignant_detection(medmnist_dir):
    """The study's test metrics, its tag and param and the figure's input are about
    malignant (label 0). On the old code the metric was class 1's ("normal, benign")."""
    from scarcelab.protocols.search import StudyConfig, run_study
    from scarcelab.tracker import InMemoryTracker

    cfg = StudyConfig(method="sup", dataset="breastmnist", data_dir=str(medmnist_dir),
                      budget_minutes=1.0, max_epochs=2, batch_size=32, max_steps_per_epoch=3,
                      max_trials=1, arch="small_cnn", device="cpu", seed=0)
    t = InMemoryTracker()
    res = run_study(cfg, t)
    assert t.study is not None
    from scarcelab.data import load_raw

    raw = load_raw("breastmnist", str(medmnist_dir))
    with torch.no_grad():
        proba = torch.softmax(t.model(torch.as_tensor(raw.test_x).float() / 255.0), 1).numpy()
    y = raw.test_y
    # brute force over every threshold, malignant (0) and "normal, benign" (1) positive
    mal = (_brute_sensitivity(y == 0, proba[:, 0], 0.95),
           _brute_partial_area(y == 0, proba[:, 0], 0.1) / 0.1)
    benign = _brute_partial_area(y == 1, proba[:, 1], 0.1) / 0.1
    assert res.best_test["sensitivity_at_spec95"] == pytest.approx(mal[0], abs=1e-6)
    assert res.best_test["pauroc_spec90"] == pytest.approx(mal[1], abs=1e-6)
    assert abs(mal[1] - benign) > 1e-3  # the two differ here: the test can fail
    assert t.study.tags["scarcelab.positive_class"] == "malignant"
    assert t.study.params["positive_class"] == 0
    assert t.evaluations == [("test", ["malignant", "normal, benign"], 0, 156)]


def test_the_option_overrides_the_default_and_bad_values_are_refused(medmnist_dir):
    from scarcelab.protocols.search import StudyConfig, prepare_data

    cfg = StudyConfig(method="sup", dataset="breastmnist", data_dir=str(medmnist_dir),
                      positive_class="normal, benign")
    bundle, _ = prepare_data(cfg)
    assert (bundle.meta["positive_class"], bundle.meta["positive_class_name"]) == (
        1, "normal, benign")
    with pytest.raises(ConfigError, match="positive_class='benign'"):
        prepare_data(StudyConfig(method="sup", dataset="breastmnist",
                                 data_dir=str(medmnist_dir), positive_class="benign"))


def test_cli_option_reaches_the_study_config(monkeypatch):
    import importlib

    from click.testing import CliRunner

    from scarcelab.entrypoints.cli import main

    # after the group, which imports every command (study first is an import cycle)
    study = importlib.import_module("scarcelab.entrypoints.study")
    seen = {}
    monkeypatch.setattr(study, "_run", lambda family, kw, ctx: seen.update(
        cfg=study.study_config(family, kw)))
    for given, want in (("default", None), ("malignant", "malignant"), ("0", "0")):
        res = CliRunner().invoke(main, ["supervised", "--method", "sup",
                                        "--positive-class", given])
        assert res.exit_code == 0, res.output
        assert seen["cfg"].positive_class == want


# -- the ROC figure ---------------------------------------------------------------------------


def test_roc_legend_names_the_positive_class():
    from scarcelab.tracking.plots import roc_figure

    y, p = _binary(1)
    fig = roc_figure(y, p, ["malignant", "normal, benign"], positive_class=0)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    fpr, tpr, _ = skm.roc_curve(y, p[:, 0], pos_label=0)
    assert labels[0] == f"malignant (AUC {skm.auc(fpr, tpr):.3f})"
    fig1 = roc_figure(y, p, ["malignant", "normal, benign"])
    assert fig1.axes[0].get_legend().get_texts()[0].get_text().startswith("normal, benign")


def test_a_breastmnist_linear_probe_reports_malignant_detection(medmnist_dir):
    """probe (linear) scores the dataset's positive class too, tags and logs it; before, it
    always read class 1's curve ("normal, benign" on BreastMNIST)."""
    from scarcelab.data import load_raw
    from scarcelab.models.encoder import build_encoder
    from scarcelab.protocols.transfer import ProbeConfig, run_linear
    from scarcelab.tracker import InMemoryTracker

    enc, info = build_encoder("random", "small_cnn", 1, seed=0)
    t = InMemoryTracker()
    res = run_linear(ProbeConfig(dataset="breastmnist", data_dir=str(medmnist_dir),
                                 encoder="random", device="cpu", probe_trials=3), enc, info, t)
    raw = load_raw("breastmnist", str(medmnist_dir))
    with torch.no_grad():
        proba = torch.softmax(t.model(torch.as_tensor(raw.test_x).float() / 255.0), 1).numpy()
    y = raw.test_y
    mal = _brute_partial_area(y == 0, proba[:, 0], 0.1) / 0.1
    benign = _brute_partial_area(y == 1, proba[:, 1], 0.1) / 0.1
    assert res.test["pauroc_spec90"] == pytest.approx(mal, abs=1e-4)
    assert res.test["sensitivity_at_spec95"] == pytest.approx(
        _brute_sensitivity(y == 0, proba[:, 0], 0.95), abs=1e-4)
    assert abs(mal - benign) > 1e-3  # the two differ here: the test can fail
    assert t.study is not None
    assert t.study.tags["scarcelab.positive_class"] == "malignant"
    assert t.study.params["positive_class"] == 0
