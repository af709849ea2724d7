"""Continuing a killed final phase (``scarcelab tune --resume <study run id>``, also
``mlflow run . -e tune -P resume=<id>``): a study dies mid-retrain on a real sqlite MLflow
store (its tracker stops writing, as a killed process does), then the resume runs exactly
the missing retrains, with the seeds they would have had, under the same study run, and the
study's mean/std cover all of them."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from mlflow.tracking import MlflowClient

from scarcelab.entrypoints.cli import main
from scarcelab.protocols.tune import FinalResume, TuneConfig, retrain_seed, run_tune
from scarcelab.tracker import InMemoryTracker

REPO = Path(__file__).resolve().parents[2]
N_FINAL = 10
DIE_AT = 4  # retrains 0-3 finish, 4 is left RUNNING by the killed process

TINY = dict(method="ole", dataset="synthetic_tiny_rgb", arch="small_cnn", epochs=2,
            grace_period=1, n_trials=1, batch_sizes=(8,), max_steps_per_epoch=2,
            n_final=N_FINAL)

class _Killed(BaseException):
    """The process dies (SIGKILL): nothing after this point reaches the store."""


def _killed_tracker():  # type: ignore[no-untyped-def]
    from scarcelab.tracking.mlflow_tracker import MlflowTracker

    class Killed(MlflowTracker):
        """Dies right after retrain DIE_AT's run is created: that run and the study stay
        RUNNING, as a killed process leaves them (the local store wrote every earlier
        record synchronously). Its owner tag names this test's pid, which a resume in the
        same process treats as no longer running the study."""

        dead = False

        def start_trial(self, number, tags, params):  # type: ignore[no-untyped-def]
            super().start_trial(number, tags, params)
            if tags.get("scarcelab.role") == "retrain" and number == DIE_AT:
                self.dead = True
                raise _Killed

        def end_trial(self, status, error=None):  # type: ignore[no-untyped-def]
            if not self.dead:
                super().end_trial(status, error)

        def end_study(self, status):  # type: ignore[no-untyped-def]
            if not self.dead:
                super().end_study(status)

    return Killed(experiment="tune-resume")


@pytest.fixture
def store(store, monkeypatch):  # type: ignore[no-untyped-def]
    """conftest's store with the system-metrics monitor off, as this module's own copy had:
    the studies here are killed mid-run, and no monitor thread may be left behind."""
    monkeypatch.setenv("SCARCELAB_SYSTEM_METRICS", "0")
    return store


def _killed_study() -> str:
    with pytest.raises(_Killed):
        run_tune(TuneConfig(**TINY), _killed_tracker())
    c = MlflowClient()
    exp = c.get_experiment_by_name("tune-resume").experiment_id
    studies = c.search_runs([exp], "tags.`scarcelab.role` = 'study'")
    assert len(studies) == 1 and studies[0].info.status == "RUNNING"
    return studies[0].info.run_id


def _retrains(study_id: str) -> list:  # type: ignore[type-arg]
    c = MlflowClient()
    exp = c.get_run(study_id).info.experiment_id
    return c.search_runs([exp], f"tags.`mlflow.parentRunId` = '{study_id}' and "
                         "tags.`scarcelab.role` = 'retrain'", max_results=1000)


def _project_argv(params: dict[str, str]) -> list[str]:
    from mlflow.projects import _project_spec

    ep = _project_spec.load_project(str(REPO)).get_entry_point("tune")
    argv = shlex.split(ep.compute_command(params, storage_dir=None))
    assert argv[:4] == ["python", "-m", "scarcelab.entrypoints.cli", "tune"]
    return argv[3:]


def test_resume_after_a_killed_run_finishes_exactly_the_missing_retrains(tmp_path, store,
                                                                         monkeypatch):
    study_id = _killed_study()
    c = MlflowClient()
    before = {r.info.run_id: r for r in _retrains(study_id)}
    finished = {int(r.data.tags["scarcelab.retrain"]): r for r in before.values()
                if r.info.status == "FINISHED"}
    assert sorted(finished) == list(range(DIE_AT))
    stale = [r for r in before.values() if r.info.status == "RUNNING"]
    assert [r.data.tags["scarcelab.retrain"] for r in stale] == [str(DIE_AT)]

    # resumed as MLflow Projects runs it: `mlflow run . -e tune -P resume=<id>` (MLflow's
    # own code renders the command; the command runs under the run it created)
    launcher = c.create_run(c.create_experiment("launch")).info.run_id
    monkeypatch.setenv("MLFLOW_RUN_ID", launcher)
    r = CliRunner().invoke(main, _project_argv({"resume": study_id, "device": "cpu"}))
    monkeypatch.delenv("MLFLOW_RUN_ID")
    assert r.exit_code == 0, r.output
    assert f"kept retrains {list(range(DIE_AT))}, ran {list(range(DIE_AT, N_FINAL))}" \
        in r.output

    after = _retrains(study_id)
    done = [x for x in after if x.info.status == "FINISHED"]
    idx = sorted(int(x.data.tags["scarcelab.retrain"]) for x in done)
    assert idx == list(range(N_FINAL))  # every index once: no duplicates
    for x in done:  # each with the seed the uninterrupted run would have used
        i = int(x.data.tags["scarcelab.retrain"])
        assert x.data.params["retrain_seed"] == str(retrain_seed(0, i))
        if i < DIE_AT:  # the earlier ones are kept, not rerun
            assert x.info.run_id == finished[i].info.run_id
        else:
            assert x.data.tags["scarcelab.resumed"] == "true"
    closed = c.get_run(stale[0].info.run_id)
    assert closed.info.status == "FAILED" and "died" in closed.data.tags["scarcelab.error"]
    assert len(after) == N_FINAL + 1  # the ten, and the closed stale one

    study = c.get_run(study_id)
    assert study.info.status == "FINISHED"
    assert study.data.tags["scarcelab.final_kept"] == "0,1,2,3"
    assert study.data.tags["scarcelab.final_resumed"] == "4,5,6,7,8,9"
    scores = {int(x.data.tags["scarcelab.retrain"]): x.data.metrics["test/balanced_accuracy"]
              for x in done}
    vals = np.array([scores[i] for i in range(N_FINAL)])
    m = study.data.metrics
    assert m["final/test_balanced_accuracy_mean"] == pytest.approx(vals.mean())
    assert m["final/test_balanced_accuracy_std"] == pytest.approx(vals.std(ddof=1))
    assert m["final/n_runs"] == N_FINAL
    hist = c.get_metric_history(study_id, "final/test_balanced_accuracy")
    assert sorted(h.step for h in hist) == list(range(N_FINAL))  # each step once
    assert {h.step: h.value for h in hist} == pytest.approx(scores)
    # the run MLflow Projects made is a launcher linked to the study both ways
    lrun = c.get_run(launcher)
    assert lrun.data.tags["scarcelab.role"] == "tune_resume"
    assert lrun.data.tags["scarcelab.resumes"] == study_id
    assert study.data.tags["scarcelab.resumed_by"] == launcher

    # a resumed retrain i is exactly the one an uninterrupted final phase runs as i
    best = FinalResume(best_params=json.loads(
        study.data.tags["scarcelab.best_params"]))
    ref = run_tune(TuneConfig(**TINY), InMemoryTracker(), resume=best)
    assert ref.final_test == pytest.approx(list(vals), abs=0)

    # resuming a complete study runs nothing and records nothing twice
    r2 = CliRunner().invoke(main, ["tune", "--resume", study_id, "--device", "cpu"])
    assert r2.exit_code == 0, r2.output
    assert f"kept retrains {list(range(N_FINAL))}, ran []" in r2.output
    assert len(_retrains(study_id)) == N_FINAL + 1
    hist = c.get_metric_history(study_id, "final/test_balanced_accuracy")
    assert sorted(h.step for h in hist) == list(range(N_FINAL))

    # a retrain run's id is not a study's: one line that names the parent
    r3 = CliRunner().invoke(main, ["tune", "--resume", done[0].info.run_id])
    err = [ln for ln in r3.output.splitlines() if ln.startswith("Error")]
    assert r3.exit_code == 1 and len(err) == 1 and study_id in err[0], r3.output
    assert "not a tune study run" in err[0]


def test_a_bad_run_id_is_a_one_line_error(tmp_path, store):
    for args, code, words in (
            (["--resume", "0123456789abcdef0123456789abcdef"], 1, "no run"),
            (["--resume", "not a run id"], 2, "'--resume'")):
        r = CliRunner().invoke(main, ["tune", *args])
        err = [ln for ln in r.output.splitlines() if ln.startswith("Error")]
        assert r.exit_code == code and len(err) == 1 and words in err[0], r.output
        assert "Traceback" not in r.output


@pytest.mark.parametrize("option,value", [
    ("--n-trials", "-3"), ("--n-trials", "0"), ("--epochs", "0"), ("--epochs", "-1"),
    ("--grace-period", "0"), ("--grace-period", "-2"), ("--n-final", "0"),
    ("--max-steps-per-epoch", "0")])
def test_tune_range_errors_name_the_option(option, value, tmp_path, monkeypatch):
    """Issue 16's leftover: these were "not published" (n_trials < 0) or silently the
    dataset's default (0). The error comes while parsing: nothing is trained, no store is
    made (a bad --dataset is refused while parsing too, so a valid one is given)."""
    db = tmp_path / "m.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    r = CliRunner().invoke(main, ["tune", "--method", "ce", "--dataset", "synthetic_tiny",
                                  option, value])
    err = [ln for ln in r.output.splitlines() if ln.startswith("Error")]
    assert r.exit_code == 2 and len(err) == 1, r.output
    assert f"'{option}'" in err[0] and "must be >= 1" in err[0]
    assert "not published" not in r.output and not db.exists()


def test_resume_reads_the_final_epoch_count_and_old_studies_keep_theirs():
    """A study records ``epochs_final``; one recorded before it existed retrained for
    ``epochs`` (gem's default), and resuming it must not switch to a dataset default."""
    from types import SimpleNamespace

    from scarcelab.tracking.tune_resume import _fields

    params = {"resolved.method": "ce", "resolved.dataset": "imagenet50", "arch": "small_cnn",
              "seed": "0", "epochs": "12", "grace_period": "2", "n_trials": "4",
              "batch_sizes": "[8]", "n_final": "3", "phase": "all",
              "max_steps_per_epoch": "null", "data_dir": "null"}
    run = SimpleNamespace(data=SimpleNamespace(params=params, tags={}),
                          info=SimpleNamespace(run_id="r"))
    assert _fields(run)["epochs_final"] == 12
    params["resolved.epochs_final"] = "30"
    assert _fields(run)["epochs_final"] == 30


# -- issue 25 item 13: kill -9 in the ASHA search and in the final phase, then resume ----
ASHA = dict(method="ole", dataset="synthetic_tiny_rgb", arch="small_cnn", epochs=2,
            grace_period=1, n_trials=4, batch_sizes=(8, 16), max_steps_per_epoch=2,
            n_final=3)
ASHA_ARGV = ["--method", "ole", "--dataset", "synthetic_tiny_rgb", "--arch", "small_cnn",
             "--epochs", "2", "--grace-period", "1", "--n-trials", "4", "--batch-sizes",
             "8,16", "--max-steps-per-epoch", "2", "--n-final", "3", "--device", "cpu",
             "--experiment", "tune-resume"]

# The CLI in a process that SIGKILLs itself right after run ROLE NUMBER logged the metrics
# of epoch EPOCH: a deterministic point, no timer. One thread, as the reference run here.
_KILL_AT = r"""
import os, signal, sys
import torch
torch.set_num_threads(1)
from scarcelab.tracking import mlflow_tracker as mt
role, number, epoch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
start, log = mt.MlflowTracker.start_trial, mt.MlflowTracker.log_metrics
cur = {}


def start_trial(self, n, tags, params):
    start(self, n, tags, params)
    cur["run"] = (tags.get("scarcelab.role"), n)


def log_metrics(self, metrics, step, scope="trial"):
    log(self, metrics, step, scope)
    if scope == "trial" and cur.get("run") == (role, number) and step == epoch:
        os.kill(os.getpid(), signal.SIGKILL)


mt.MlflowTracker.start_trial, mt.MlflowTracker.log_metrics = start_trial, log_metrics
from scarcelab.entrypoints.cli import main
main(sys.argv[4:])
"""


def _killed_at(role: str, number: int, epoch: int, argv: list[str]) -> None:
    import os
    import signal
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", _KILL_AT, role, str(number), str(epoch),
                        "tune", *argv], env={**os.environ, "PYTHONPATH": str(REPO)},
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == -signal.SIGKILL, (p.stdout + p.stderr)[-3000:]


def _children(study_id: str, role: str) -> list:  # type: ignore[type-arg]
    c = MlflowClient()
    exp = c.get_run(study_id).info.experiment_id
    return c.search_runs([exp], f"tags.`mlflow.parentRunId` = '{study_id}' and "
                         f"tags.`scarcelab.role` = '{role}'", max_results=1000)


def _reference() -> tuple:  # type: ignore[type-arg]
    """The uninterrupted study, in memory, on one thread (as the killed processes)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref_tracker = InMemoryTracker()
        ref = run_tune(TuneConfig(**ASHA), ref_tracker)
    finally:
        torch.set_num_threads(threads)
    ref_trials = {int(t.name.split("-")[1]): t for t in ref_tracker.trials
                  if t.tags["scarcelab.role"] == "trial"}
    assert ref.n_pruned >= 1 and ref_trials[2].status == "KILLED"  # ASHA pruned trial 2
    return ref, ref_trials


def _same_table(sid: str, ref, ref_trials, n_retrains: int) -> None:  # type: ignore[no-untyped-def]
    c = MlflowClient()
    trials = _children(sid, "trial")
    crashed = [t for t in trials if t.data.tags.get("scarcelab.crashed") == "true"]
    assert [t.data.tags["scarcelab.trial"] for t in crashed] == ["2"]
    assert crashed[0].info.status == "FAILED"
    counted = {int(t.data.tags["scarcelab.trial"]): t for t in trials if t not in crashed}
    assert sorted(counted) == [0, 1, 2, 3] and len(trials) == 5  # each once, no duplicate
    for n, t in counted.items():  # each ended as in the uninterrupted run, same seed
        assert t.info.status == ref_trials[n].status, n
        assert t.data.params["trial_seed"] == str(ref_trials[n].params["trial_seed"])
        assert (t.data.tags.get("scarcelab.resumed") == "true") == (n >= 2)
    retrains = _children(sid, "retrain")
    done = {int(x.data.tags["scarcelab.retrain"]): x for x in retrains
            if x.info.status == "FINISHED"}
    assert sorted(done) == [0, 1, 2] and len(retrains) == n_retrains
    s = c.get_run(sid)
    assert s.info.status == "FINISHED"
    t = s.data.tags
    assert (int(t["scarcelab.n_complete"]), int(t["scarcelab.n_pruned"]),
            int(t["scarcelab.n_failed"])) == (ref.n_complete, ref.n_pruned, ref.n_failed)
    assert json.loads(t["scarcelab.best_params"]) == ref.best_params
    assert t["scarcelab.search_kept"] == "0,1"
    assert s.data.metrics["best/val_balanced_accuracy_avg5"] == ref.best_value
    hist = c.get_metric_history(sid, "final/test_balanced_accuracy")
    assert sorted(h.step for h in hist) == [0, 1, 2]
    assert [v for _, v in sorted((h.step, h.value) for h in hist)] == ref.final_test
    assert s.data.metrics["final/test_balanced_accuracy_mean"] == pytest.approx(ref.mean,
                                                                                abs=1e-12)
    assert s.data.metrics["final/test_balanced_accuracy_std"] == pytest.approx(ref.std,
                                                                               abs=1e-12)


def _killed_study_run() -> str:
    c = MlflowClient()
    exp = c.get_experiment_by_name("tune-resume").experiment_id
    (study,) = c.search_runs([exp], "tags.`scarcelab.role` = 'study'")
    assert study.info.status == "RUNNING" and "scarcelab.best_params" not in study.data.tags
    assert sorted(r.info.status for r in _children(study.info.run_id, "trial")) == \
        ["FINISHED", "KILLED", "RUNNING"]  # trials 0, 1 (pruned), 2 (killed mid-epoch)
    return str(study.info.run_id)


def test_kill9_in_a_shared_optuna_storage_search_then_resume(tmp_path, store, monkeypatch):
    """The same with the trials in an Optuna RDB storage (what several workers share):
    the resume continues that study; the dead trial, failed there as crashed, runs again
    in its own place (number, seed, configuration), so the table is again the
    uninterrupted run's."""
    import optuna

    ref, ref_trials = _reference()
    storage = f"sqlite:///{tmp_path}/optuna.db"
    monkeypatch.setenv("OPTUNA_STORAGE", storage)
    _killed_at("trial", 2, 0, [*ASHA_ARGV, "--study-name", "shared-s1"])
    sid = _killed_study_run()
    monkeypatch.delenv("OPTUNA_STORAGE")
    r = CliRunner().invoke(main, ["tune", "--resume", sid, "--device", "cpu"])
    assert r.exit_code == 1 and "set OPTUNA_STORAGE" in r.output, r.output
    monkeypatch.setenv("OPTUNA_STORAGE", storage)
    r = CliRunner().invoke(main, ["tune", "--resume", sid, "--device", "cpu"])
    assert r.exit_code == 0, r.output
    _same_table(sid, ref, ref_trials, n_retrains=3)
    trials = optuna.load_study(study_name="shared-s1", storage=storage).get_trials()
    assert [(t.number, t.state.name, t.user_attrs.get("crashed"), t.user_attrs["slot"])
            for t in trials] == [(0, "COMPLETE", None, 0), (1, "PRUNED", None, 1),
                                 (2, "FAIL", True, 2), (3, "PRUNED", None, 2),
                                 (4, "COMPLETE", None, 3)]


def test_kill9_in_the_asha_search_and_in_the_final_phase_then_resume(tmp_path, store,
                                                                    monkeypatch):
    """Killed mid-trial 2 of the search (before ASHA judged it), resumed, killed again
    mid-retrain 1, resumed: every trial and retrain counted once, and the table is the
    uninterrupted run's to the last bit."""
    monkeypatch.delenv("OPTUNA_STORAGE", raising=False)
    ref, ref_trials = _reference()
    _killed_at("trial", 2, 0, ASHA_ARGV)
    sid = _killed_study_run()
    _killed_at("retrain", 1, 0, ["--resume", sid, "--device", "cpu"])  # search resumed
    r = CliRunner().invoke(main, ["tune", "--resume", sid, "--device", "cpu"])
    assert r.exit_code == 0, r.output
    assert "kept retrains [0], ran [1, 2]" in r.output
    _same_table(sid, ref, ref_trials, n_retrains=4)  # + the killed retrain 1


# -- issue 39: a study on a user's images resumes on exactly the images it was run on -------
def _own_folder(root: Path, medmnist_dir: Path) -> Path:
    """labeled/ and val/ class folders of real chest X-rays, half of them 28x28 and half
    36x24 (so the files' own size cannot serve: --image-size is needed), no test/ (a
    hold-out of --test-fraction is the test set)."""
    from PIL import Image

    d = np.load(medmnist_dir / "pneumoniamnist.npz")
    x, y = d["train_images"], d["train_labels"].reshape(-1)
    names = ("normal", "pneumonia")
    t = __import__("time").time() - 60
    for c in (0, 1):
        idx = np.flatnonzero(y == c)[:26]
        for j, i in enumerate(idx):
            part = "val" if j >= 20 else "labeled"
            im = Image.fromarray(x[i])
            if j % 2:
                im = im.resize((36, 24), Image.Resampling.BILINEAR)
            p = root / part / names[c] / f"{i:05d}.png"
            p.parent.mkdir(parents=True, exist_ok=True)
            im.save(p)
            __import__("os").utime(p, (t, t))
    return root


OWN_OPTIONS = ["--image-size", "16", "--fit", "pad", "--channels", "rgb", "--test-fraction",
               "0.3"]


def test_a_study_on_own_images_resumes_with_its_dataset_options(tmp_path, store, monkeypatch,
                                                                 medmnist_dir):
    """Killed in its final phase, a tune study on a folder resumes with the dataset options
    it was run with (read from its params: they used to be dropped, so the resume decoded
    the folder with the defaults — here refused for the mixed sizes — or silently at another
    size), on the same images (data.cache_key); a changed file is refused in one line, and
    options given beside --resume too."""
    from scarcelab.data.own import DataOptions
    from scarcelab.tracking.tune_resume import read_study

    monkeypatch.setenv("SCARCELAB_CACHE", str(tmp_path / "cache"))
    root = _own_folder(tmp_path / "chest", medmnist_dir)
    argv = ["--method", "ce", "--dataset", f"folder:{root}", "--arch", "small_cnn",
            "--epochs", "2", "--grace-period", "1", "--n-trials", "1", "--batch-sizes", "8",
            "--max-steps-per-epoch", "2", "--n-final", "3", "--device", "cpu",
            "--experiment", "tune-resume", *OWN_OPTIONS]
    _killed_at("retrain", 1, 0, argv)
    c = MlflowClient()
    exp = c.get_experiment_by_name("tune-resume").experiment_id
    (study,) = c.search_runs([exp], "tags.`scarcelab.role` = 'study'")
    sid = study.info.run_id
    p = study.data.params
    assert (p["image_size"], p["fit"], p["channels"], p["test_fraction"]) == \
        ("16", "pad", "rgb", "0.3")
    r = CliRunner().invoke(main, ["tune", "--resume", sid, "--device", "cpu"])
    assert r.exit_code == 0, r.output
    assert "kept retrains [0], ran [1, 2]" in r.output
    done = [x for x in _children(sid, "retrain") if x.info.status == "FINISHED"]
    assert sorted(int(x.data.tags["scarcelab.retrain"]) for x in done) == [0, 1, 2]
    s = c.get_run(sid)
    assert s.info.status == "FINISHED" and s.data.metrics["final/n_runs"] == 3
    assert s.data.params["n_test"] == p["n_test"] == "12"  # 30 % of 40, not 20 %
    fields, _, _ = read_study(sid)
    assert fields["data_options"] == DataOptions(image_size=16, channels="rgb", fit="pad",
                                                 test_fraction=0.3)

    # options beside --resume: the study's are used, so other ones are refused
    r = CliRunner().invoke(main, ["tune", "--resume", sid, "--image-size", "32"])
    err = [ln for ln in r.output.splitlines() if ln.startswith("Error")]
    assert r.exit_code == 2 and len(err) == 1 and "--image-size" in err[0], r.output
    assert "recorded" in err[0]

    # a file changed since the study ran: not its images, refused before anything runs
    f = sorted((root / "labeled" / "normal").glob("*.png"))[0]
    from PIL import Image

    Image.fromarray(255 - np.asarray(Image.open(f))).save(f)
    r = CliRunner().invoke(main, ["tune", "--resume", sid, "--device", "cpu"])
    err = [ln for ln in r.output.splitlines() if ln.startswith("Error")]
    assert r.exit_code == 1 and len(err) == 1, r.output
    assert "data.cache_key" in err[0] and f"folder:{root}" in err[0]
    assert len(_children(sid, "retrain")) == len(done) + 1  # nothing ran (+ the closed one)


def test_resume_reads_dataset_options_as_mlflow_run_logged_them():
    """Under ``mlflow run`` the MLproject's raw strings are the plain params and the
    resolved values ``resolved.<name>``; a public dataset has no dataset options."""
    from types import SimpleNamespace

    from scarcelab.data.own import DataOptions
    from scarcelab.tracking.tune_resume import ResumeError, _fields

    params = {"method": "ce", "arch": "small_cnn", "seed": "0", "epochs": "2",
              "grace_period": "1", "n_trials": "1", "batch_sizes": "[8]", "n_final": "3",
              "phase": "all", "max_steps_per_epoch": "null", "data_dir": "null",
              "image_size": "default", "resolved.image_size": "native", "channels": "gray",
              "fit": "crop", "skip_bad_files": "True", "resolved.skip_bad_files": "true",
              "test_fraction": "0.25"}
    run = SimpleNamespace(data=SimpleNamespace(params=params,
                                               tags={"scarcelab.dataset": "folder:/d/x"}),
                          info=SimpleNamespace(run_id="r"))
    assert _fields(run)["data_options"] == DataOptions(None, "gray", "crop", True, 0.25)
    run.data.tags["scarcelab.dataset"] = "breastmnist"
    assert _fields(run)["data_options"] is None
    run.data.tags["scarcelab.dataset"] = "csv:/d/labels.csv"
    params["fit"] = "stretch"
    with pytest.raises(ResumeError, match="fit"):
        _fields(run)
