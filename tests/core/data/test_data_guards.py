"""Data that would give confident-looking nonsense is refused or flagged, "all labels" is a
working mode, and every run says which files it read (issue 13 §7–9)."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
import pytest

from scarcelab.errors import ConfigError, DataError

# -- item 7: all labels, and no empty validation set ----------------------------------------

def test_all_labels_holds_out_the_default_validation_set() -> None:
    from scarcelab.data import load_raw
    from scarcelab.data.splits import DEFAULT_BUDGETS, apply_split, make_split

    raw = load_raw("synthetic_tiny")
    split = make_split(raw, "all", None, seed=0, val_from="train")  # ConfigError before
    n_val = DEFAULT_BUDGETS["synthetic_tiny"][1]
    assert split["n_val"] == n_val and split["n_labeled"] == len(raw.train_y) - n_val
    assert split["unlabeled"] == []
    assert not set(split["labeled"]) & set(split["val"])
    b = apply_split(raw, split)
    assert len(b.labeled_y) + len(b.val_y) == len(raw.train_y)
    s2 = make_split(raw, "all", 50, seed=0, val_from="train")
    assert s2["n_val"] == 50 and s2["n_labeled"] == len(raw.train_y) - 50
    # validation from the official split (the default where it is large enough): every
    # train sample is labeled and none is held out
    s3 = make_split(raw, "all", None, seed=0)
    assert s3["val_from"] == "official" and s3["n_labeled"] == len(raw.train_y)
    assert s3["n_val"] == n_val and s3["unlabeled"] == []


def test_empty_validation_set_is_refused() -> None:
    from scarcelab.data import load_raw
    from scarcelab.data.splits import make_split

    raw = load_raw("synthetic_tiny")
    with pytest.raises(ConfigError, match="empty validation set"):
        make_split(raw, 30, 0, seed=0)


def test_all_labels_trains_a_supervised_study() -> None:
    from scarcelab.protocols.search import StudyConfig, run_study
    from scarcelab.tracker import InMemoryTracker

    cfg = StudyConfig(method="sup", dataset="synthetic_tiny", arch="small_cnn", device="cpu",
                      n_labeled="all", max_epochs=1, max_trials=1, budget_minutes=2,
                      batch_size=32, max_steps_per_epoch=2)
    t = InMemoryTracker()
    res = run_study(cfg, t)
    assert res.n_trials == 1
    assert t.study is not None and t.study.params["n_val"] == 30
    assert t.study.params["n_unlabeled"] == 0


# -- item 8: one class, NaN/inf, far indices, bad bytes -------------------------------------

def _raw(train_y: np.ndarray, test_y: np.ndarray):  # type: ignore[no-untyped-def]
    from scarcelab.data.bundle import RawDataset

    return RawDataset(name="toy", train_x=np.zeros((len(train_y), 1, 4, 4), np.uint8),
                      train_y=train_y, test_x=np.zeros((len(test_y), 1, 4, 4), np.uint8),
                      test_y=test_y, num_classes=2, class_names=["a", "b"])


def test_one_class_train_split_is_refused() -> None:
    from scarcelab.data.splits import make_split

    with pytest.raises(DataError, match="single class"):
        make_split(_raw(np.zeros(40, np.int64), np.array([0, 1] * 5)), 10, 10, seed=0)


def test_one_class_test_split_warns() -> None:
    from scarcelab.data.splits import make_split

    with pytest.warns(UserWarning, match="AUROC is undefined"):
        make_split(_raw(np.array([0, 1] * 20), np.zeros(10, np.int64)), 10, 10, seed=0)


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


@pytest.mark.parametrize(("line", "match"), [
    (b"1 1:0.5 2:nan\n", "non-finite"),
    (b"1 1:0.5 2:inf\n", "non-finite"),
    (b"nan 1:0.5\n", "not finite"),
])
def test_libsvm_refuses_non_finite_values_with_file_and_line(tmp_path, line, match) -> None:  # type: ignore[no-untyped-def]
    from scarcelab.data.libsvm import read_libsvm

    p = _write(tmp_path, "d", b"0 1:1 2:1\n" + line)
    with pytest.raises(DataError, match=match) as e:
        read_libsvm(p)
    assert f"{p}:2:" in str(e.value)


def test_libsvm_refuses_a_far_index_without_allocating(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import tracemalloc

    from scarcelab.data.libsvm import read_libsvm

    rows = b"".join(b"%d 1:1 2:0.5\n" % (i % 2) for i in range(1000))
    p = _write(tmp_path, "d", rows + b"1 1:1 900000000:1\n")
    tracemalloc.start()
    with pytest.raises(DataError, match="GiB") as e:
        read_libsvm(p)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert f"{p}:1001:" in str(e.value)
    assert peak < 100 * 1024**2  # the dense matrix would have been 3.4 TB


def test_libsvm_test_file_far_beyond_the_train_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from scarcelab.data.libsvm import read_libsvm_pair

    tr = _write(tmp_path, "tr", b"0 1:1 2:1\n1 1:0 3:1\n")
    te = _write(tmp_path, "te", b"0 1:1 5000:1\n")
    with pytest.raises(DataError, match="far beyond"):
        read_libsvm_pair(tr, te)


def test_libsvm_non_utf8_bytes_name_file_and_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from scarcelab.data.libsvm import read_libsvm

    p = _write(tmp_path, "d", b"0 1:1\n1 1:0.5 \xff2:1\n")
    with pytest.raises(DataError, match="not UTF-8") as e:
        read_libsvm(p)
    assert f"{p}:2:" in str(e.value)


def test_al_data_with_nan_features_or_one_class_is_refused() -> None:
    from scarcelab.active.datasets import ALData, _check

    x = np.ones((6, 2), np.float32)
    y = np.array([0, 1] * 3)
    _check(ALData("t", x, y, x, y, 2, "mem"))
    bad = x.copy()
    bad[3, 1] = np.nan
    with pytest.raises(DataError, match="NaN/inf"):
        _check(ALData("t", bad, y, x, y, 2, "mem"))
    with pytest.raises(DataError, match="single class"):
        _check(ALData("t", x, np.zeros(6, np.int64), x, y, 2, "mem"))
    with pytest.warns(UserWarning, match="single class"):
        _check(ALData("t", x, y, x, np.zeros(6, np.int64), 2, "mem"))


def test_undefined_metric_is_logged_as_missing_with_a_warning() -> None:
    from scarcelab.entrypoints._progress import Display, ProgressTracker
    from scarcelab.tracker import InMemoryTracker

    inner = InMemoryTracker()
    out = io.StringIO()
    t = ProgressTracker(inner, Display(0, out))  # quiet: warnings still shown
    t.start_study("s", {}, {}, {})
    t.start_trial(0, {}, {})
    t.log_metrics({"test/auroc": float("nan"), "test/balanced_accuracy": 0.5}, 0)
    t.log_metrics({"test/auroc": float("nan")}, 1)
    t.end_trial("FINISHED")
    assert [k for k, _, _ in inner.trials[0].metrics] == ["test/balanced_accuracy"]
    assert out.getvalue().count("test/auroc is undefined") == 1


# -- item 9: provenance, no silent fallback, no mixed folders --------------------------------

def _splice_files(d: Path, which: tuple[str, ...] = ("splice", "splice.t")) -> None:
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name in which:
        lines = [f"{'+1' if i % 2 else '-1'} 1:{rng.random():.3f} 2:{rng.random():.3f}"
                 for i in range(40)]
        (d / name).write_text("\n".join(lines) + "\n")


def test_explicit_folder_is_never_mixed_with_another(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import scarcelab.active.datasets as ds

    shared = tmp_path / "shared"
    _splice_files(shared)
    mine = tmp_path / "mine"
    _splice_files(mine, ("splice",))  # a partial folder: train only
    monkeypatch.setattr(ds, "SHARED_DATA", shared)
    monkeypatch.setenv("SCARCELAB_DATA", str(tmp_path / "root"))
    with pytest.raises(DataError, match="must come from one folder"):
        ds.load_al_dataset("splice", mine, np.random.default_rng(0))
    with pytest.raises(DataError, match="not found"):
        ds.load_al_dataset("splice", tmp_path / "nonexistent", np.random.default_rng(0))


def test_default_root_falls_back_to_shared_data_loudly(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    import scarcelab.active.datasets as ds
    from scarcelab.data import provenance

    shared = tmp_path / "shared"
    _splice_files(shared)
    root = tmp_path / "root"
    _splice_files(root, ("splice",))  # partial default root: both files come from shared
    monkeypatch.setattr(ds, "SHARED_DATA", shared)
    monkeypatch.setenv("SCARCELAB_DATA", str(root))
    provenance.reset()
    ds.load_al_dataset("splice", None, np.random.default_rng(0))
    assert "not found in" in capsys.readouterr().err
    files = provenance.used()
    assert {f["path"] for f in files} == {str((shared / n).resolve())
                                          for n in ("splice", "splice.t")}
    for f in files:
        assert f["sha256"] == hashlib.sha256(Path(f["path"]).read_bytes()).hexdigest()
        assert f["note"].startswith("fallback")
    provenance.reset()


def test_al_sweep_logs_its_data_files(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import mlflow
    from click.testing import CliRunner

    from scarcelab.entrypoints.cli import main

    data = tmp_path / "data"
    _splice_files(data)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/m.db")
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.chdir(tmp_path)
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/m.db")
    r = CliRunner().invoke(main, ["al", "--strategy", "random", "--dataset", "splice",
                                  "--data-dir", str(data), "--budget", "2", "--set",
                                  "max_epochs=1,val_fraction=0.25", "--experiment", "prov"])
    assert r.exit_code == 0, r.output
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/m.db")
    runs = mlflow.search_runs(experiment_names=["prov"])
    sweep = runs[runs["tags.scarcelab.role"] == "al_sweep"].iloc[0]
    got = mlflow.artifacts.load_dict(f"runs:/{sweep.run_id}/data_files.json")["files"]
    want = {str((data / n).resolve()): hashlib.sha256((data / n).read_bytes()).hexdigest()
            for n in ("splice", "splice.t")}
    assert {f["path"]: f["sha256"] for f in got} == want
    assert str((data / "splice").resolve()) in sweep["tags.scarcelab.data_files"]
    assert "sweep run: " + sweep.run_id in r.output and "mlflow ui" in r.output


def test_medmnist_loader_records_its_file(medmnist_dir) -> None:  # type: ignore[no-untyped-def]
    from scarcelab.data import load_raw, provenance

    provenance.reset()
    load_raw("breastmnist", medmnist_dir)
    (f,) = provenance.used()
    p = (medmnist_dir / "breastmnist.npz").resolve()
    assert f["path"] == str(p) and f["sha256"] == hashlib.sha256(p.read_bytes()).hexdigest()
    provenance.reset()
