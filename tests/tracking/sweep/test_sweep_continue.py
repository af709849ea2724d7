"""A sweep re-run continues a killed ``tune`` cell instead of tuning and retraining it all
again, through the real driver, embedded Ray and a real MLflow sqlite store.

The killed sweep: its driver dies (nothing closes its runs) while the cell's study is in its
final phase, retrains 0-3 finished and 4 RUNNING — the cell process SIGKILLs itself when
retrain 4's run is created, and a driver whose loop raises right then stands in for the
driver killed with it. The re-run closes the dead attempt, then runs ``tune --resume <its
study run>`` (the real command, a real cell process) as the next attempt: the four finished
retrains are kept, the other six run under the same study run, the cell ends FINISHED with
that study as its run, and the results page, the sweep's report and a later re-run all see
one study of ten retrains. The page's wall time leaves out the time the sweep lay dead,
which the study run's own interval (re-opened and ended by the continuation) spans, and
counts the continuing attempt's CPU time.

A continuation that fails is retried from the start, and an entry point that declares no
continuation is run afresh: both with stand-in cells (a few lines of MLflow client) and
the same driver.
"""

from __future__ import annotations

import io
import shutil
import sys
import time
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from scarcelab import tags as T
from scarcelab.tracking.sweep import driver as driver_mod
from scarcelab.tracking.sweep.driver import CELL_CPU, CELL_END, Driver
from scarcelab.tracking.sweep.spec import parse_spec

REPO = Path(__file__).resolve().parents[3]
N_FINAL = 10
DIE_AT = 4  # retrains 0-3 finish; the cell dies when retrain 4's run exists
GAP_S = 4.0  # the sweep lies dead at least this long between the two invocations

TUNE_SPEC = f"""\
name: tunecut
retries: 0
grids:
  - entry: tune
    method: ole
    dataset: synthetic_tiny_rgb
    arch: small_cnn
    epochs: 2
    grace_period: 1
    n_trials: 1
    batch_sizes: "8"
    max_steps_per_epoch: 2
    n_final: {N_FINAL}
    seed: 0
    device: cpu
"""

# The real CLI, as the driver starts a cell, in a process that SIGKILLs itself right after
# the run of retrain DIE_AT is created (a local store writes every record at once): a
# deterministic point of the final phase, no timer.
KILL_CELL = f"""
import os, signal, sys
argv = sys.argv[sys.argv.index("-m") + 2:]
import torch
torch.set_num_threads(1)
from scarcelab.tracking import mlflow_tracker as mt
start = mt.MlflowTracker.start_trial


def start_trial(self, n, tags, params):
    start(self, n, tags, params)
    if tags.get("scarcelab.role") == "retrain" and n == {DIE_AT}:
        os.kill(os.getpid(), signal.SIGKILL)


mt.MlflowTracker.start_trial = start_trial
from scarcelab.entrypoints.cli import main
main(argv)
"""


class _DriverDied(BaseException):
    """The driver is killed: nothing after this point reaches the store."""


class _DyingDriver(Driver):
    """A driver killed with its cell: it starts the cells, waits for the first to end and
    dies, leaving its sweep run and the cell's run RUNNING, as ``kill -9`` of ``scarcelab
    sweep`` does (its cells die with it)."""

    def _schedule(self, exp, sweep_run, todo, result, earlier, finished,  # type: ignore[no-untyped-def]
                  resume=None):
        sched = driver_mod._Schedule(self, self._pool(), exp, sweep_run, todo, result,
                                     earlier, finished, *([resume] if resume else []))
        for cell in todo:
            sched.submit(cell)
        sched.pool.next_done()
        raise _DriverDied

    def _finish(self, *a, **k):  # type: ignore[no-untyped-def]
        pass  # a killed driver closes nothing


def _wrapper(tmp: Path, name: str, script: str) -> str:
    """An executable the driver runs as ``<python> -m scarcelab.entrypoints.cli …``."""
    (tmp / f"{name}.py").write_text(script)
    exe = tmp / name
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {tmp / name}.py \"$@\"\n")
    exe.chmod(0o755)
    return str(exe)


@pytest.fixture
def sweep_env(store, monkeypatch):  # type: ignore[no-untyped-def]
    """conftest's store, with what the cells need, and embedded Ray shut down after."""
    ray = pytest.importorskip("ray")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("SCARCELAB_SYSTEM_METRICS", "0")
    monkeypatch.delenv("OPTUNA_STORAGE", raising=False)
    try:
        yield store
    finally:
        if ray.is_initialized():
            ray.shutdown()


def _cell_runs(experiment: str) -> list:  # type: ignore[type-arg]
    c = MlflowClient()
    exp = c.get_experiment_by_name(experiment).experiment_id
    return [r for r in c.search_runs([exp], "", max_results=1000,
                                     order_by=["attributes.start_time ASC"])
            if T.CELL in r.data.tags]


def _retrains(study_id: str) -> list:  # type: ignore[type-arg]
    c = MlflowClient()
    exp = c.get_run(study_id).info.experiment_id
    return c.search_runs([exp], f"tags.`mlflow.parentRunId` = '{study_id}' and "
                         "tags.`scarcelab.role` = 'retrain'", max_results=1000)


def test_a_rerun_continues_the_killed_tune_cell_and_every_reader_sees_one_study(
        sweep_env, tmp_path):
    from scarcelab.tracking.results.page import build_page

    spec = parse_spec(TUNE_SPEC, "tunecut.yaml")
    lines: list[str] = []
    dying = _DyingDriver(spec, jobs=1, echo=lines.append, cwd=str(tmp_path),
                         python=_wrapper(tmp_path, "killcell", KILL_CELL))
    dying.owner = "ghost-host:1"  # another process, dead: the re-run closes its runs
    with pytest.raises(_DriverDied):
        dying.run()
    (first,) = _cell_runs(spec.experiment)
    study_id = first.info.run_id
    assert first.info.status == "RUNNING" and first.data.tags["scarcelab.role"] == "study"
    before = {int(r.data.tags["scarcelab.retrain"]): r for r in _retrains(study_id)}
    assert sorted(before) == list(range(DIE_AT + 1))
    assert before[DIE_AT].info.status == "RUNNING"
    kept = {i: r.info.run_id for i, r in before.items() if r.info.status == "FINISHED"}
    assert sorted(kept) == list(range(DIE_AT))

    time.sleep(GAP_S)  # the sweep lies dead
    lines.clear()
    res = Driver(spec, jobs=1, echo=lines.append, cwd=str(tmp_path)).run()
    (out,) = res.outcomes
    assert out.status == "FINISHED", (out.error, lines)
    assert out.run_id == study_id  # the cell's run is the study it continued
    assert any(f"resuming the study of an earlier attempt, run {study_id}" in ln
               and f"tune --resume {study_id} --device cpu" in ln for ln in lines), lines

    c = MlflowClient()
    runs = _cell_runs(spec.experiment)
    assert [r.info.run_id for r in runs][0] == study_id and len(runs) == 2
    study, launcher = c.get_run(study_id), c.get_run(runs[1].info.run_id)
    assert study.info.status == "FINISHED" and launcher.info.status == "FINISHED"
    assert launcher.data.tags["scarcelab.role"] == "tune_resume"
    assert launcher.data.tags["scarcelab.resumes"] == study_id
    assert study.data.tags["scarcelab.resumed_by"] == launcher.info.run_id
    assert study.data.tags["scarcelab.final_kept"] == "0,1,2,3"

    # the finished retrains are kept, not run again: one finished run per index, the
    # first four the killed attempt's own, and the dead retrain 4 closed
    after = _retrains(study_id)
    done = {int(r.data.tags["scarcelab.retrain"]): r for r in after
            if r.info.status == "FINISHED"}
    assert sorted(done) == list(range(N_FINAL)) and len(after) == N_FINAL + 1
    assert all(done[i].info.run_id == kept[i] for i in kept)
    assert c.get_run(before[DIE_AT].info.run_id).info.status == "FAILED"

    # the sweep's report: Table 3 of one study of ten retrains
    t3 = pd.read_csv(mlflow.artifacts.download_artifacts(
        run_id=res.sweep_run_id, artifact_path="report/table3.csv",
        dst_path=str(tmp_path / "report")))
    assert t3[["method", "n", "n_studies", "study_id"]].values.tolist() == \
        [["ole", N_FINAL, 1, study_id]]

    # the results page: the same numbers once, and what the cell cost
    (tmp_path / "papers").mkdir()
    shutil.copy(REPO / "suites/papers/tune_it.yaml", tmp_path / "papers")
    page = build_page(tmp_path / "tune_it.yaml", spec=spec)  # its paper file
    assert page.counts["finished"] == 1 and page.counts["failed"] == 0
    (sec,) = [s for s in page.sections if s.title.startswith("Table 3")]
    p3 = pd.read_csv(io.StringIO(sec.csv["table3"]))
    assert p3[["method", "n", "n_studies", "study_id"]].values.tolist() == \
        [["ole", N_FINAL, 1, study_id]]
    # wall time: the killed attempt up to where it ended, then the continuation; the
    # study run's own interval, re-opened by the continuation, spans the dead time too
    own_end = study.data.metrics[CELL_END] * 1000
    assert own_end <= launcher.info.start_time - GAP_S * 1000
    want = (own_end - study.info.start_time + launcher.info.end_time
            - launcher.info.start_time) / 1000
    assert page.wall_s == pytest.approx(want, abs=0.01)
    # what the union of the two runs' own intervals was: the dead time inside
    span = (max(study.info.end_time, launcher.info.end_time) - study.info.start_time) / 1000
    assert page.wall_s <= span - GAP_S
    # CPU time: the continuing attempt's (the dead driver recorded none for the first)
    assert launcher.data.metrics[CELL_CPU] > 0
    assert page.cpu_s == pytest.approx(launcher.data.metrics[CELL_CPU])
    assert "1 attempt(s) without a record" in page.provenance["CPU time"]
    # the machine: the continuing attempt's (the dead driver recorded none for the first)
    assert "? cores" not in page.provenance["machine"]

    # `scarcelab results` (the page's file) and `scarcelab leaderboard --view table3`
    from click.testing import CliRunner

    from scarcelab.entrypoints.cli import main

    (tmp_path / "tune_it.yaml").write_text(TUNE_SPEC)
    r = CliRunner().invoke(main, ["results", str(tmp_path / "tune_it.yaml"), "--out",
                                  str(tmp_path / "pages")])
    assert r.exit_code == 0, r.output
    csv = pd.read_csv(tmp_path / "pages" / "tune_it" / "table3.csv")
    assert csv[["method", "n", "n_studies", "study_id"]].values.tolist() == \
        [["ole", N_FINAL, 1, study_id]]
    r = CliRunner().invoke(main, ["leaderboard", "--experiment", spec.experiment, "--view",
                                  "table3", "--format", "csv"])
    assert r.exit_code == 0, r.output
    lb = pd.read_csv(io.StringIO(r.output))
    assert lb[["method", "n", "n_studies", "study_id"]].values.tolist() == \
        [["ole", N_FINAL, 1, study_id]]

    # a third run of the sweep finds the cell finished, with the study as its run
    res3 = Driver(spec, jobs=1, echo=lines.append, cwd=str(tmp_path)).run()
    assert [(o.status, o.run_id) for o in res3.outcomes] == [("SKIPPED", study_id)]
    assert len(_cell_runs(spec.experiment)) == 2


FALLBACK_SPEC = """\
name: tunefall
retries: 1
grids:
  - entry: tune
    method: ole
    dataset: synthetic_tiny_rgb
    n_final: 2
    device: cpu
  - entry: self
    method: simclr
    seed: 0
"""

# A stand-in cell. Under DIE=1 it tags its run a study (the record a real one leaves) and
# dies; otherwise a continuation (--resume) fails with an Error line, as an entry point's
# error does, and a fresh start records its argv and ends its run FINISHED.
STAND_IN = """
import os, sys
from mlflow.tracking import MlflowClient
argv = sys.argv[sys.argv.index("-m") + 2:]
c, rid = MlflowClient(), os.environ["MLFLOW_RUN_ID"]
c.log_param(rid, "cell_argv", " ".join(argv))
if os.environ.get("STAND_IN_DIE") == "1":
    c.set_tag(rid, "scarcelab.role", "study")
    print("Error: killed", flush=True)
    sys.exit(1)
if "--resume" in argv:
    print("Error: this continuation fails on purpose", flush=True)
    sys.exit(1)
c.set_terminated(rid, "FINISHED")
"""


def test_a_failed_continuation_falls_back_to_a_fresh_run(sweep_env, tmp_path, monkeypatch):
    spec = parse_spec(FALLBACK_SPEC, "tunefall.yaml")
    python = _wrapper(tmp_path, "standin", STAND_IN)
    lines: list[str] = []
    monkeypatch.setenv("STAND_IN_DIE", "1")
    first = Driver(spec, jobs=1, retries=0, echo=lines.append, cwd=str(tmp_path),
                   python=python).run()
    assert [o.status for o in first.outcomes] == ["FAILED", "FAILED"]
    studies = {o.cell.entry: o.run_id for o in first.outcomes}
    import ray

    ray.shutdown()  # the workers took STAND_IN_DIE with them
    monkeypatch.delenv("STAND_IN_DIE")
    lines.clear()
    res = Driver(spec, jobs=1, echo=lines.append, cwd=str(tmp_path), python=python).run()
    by = {o.cell.entry: o for o in res.outcomes}
    assert by["tune"].status == "FINISHED" and by["self"].status == "FINISHED", lines

    c = MlflowClient()
    runs = _cell_runs(spec.experiment)
    tune = [r for r in runs if r.data.tags["scarcelab.cell_label"].startswith("tune")]
    argvs = [c.get_run(r.info.run_id).data.params["cell_argv"] for r in tune]
    fresh = " ".join(spec.cells[0].argv())
    # attempt 1 died; attempt 2 continued its study and failed; attempt 3 started afresh
    assert argvs == [fresh, f"tune --resume {studies['tune']} --device cpu", fresh]
    assert [c.get_run(r.info.run_id).info.status for r in tune] == \
        ["FAILED", "FAILED", "FINISHED"]
    assert tune[1].data.tags["scarcelab.resumes"] == studies["tune"]
    assert by["tune"].run_id == tune[2].info.run_id
    assert any("resuming the study of an earlier attempt" in ln for ln in lines)
    assert any("tune" in ln and "failed (attempt 1), retrying" in ln for ln in lines), lines
    # an entry point that declares no continuation runs its killed cell afresh
    own = [r for r in runs if r.data.tags["scarcelab.cell_label"].startswith("self")]
    assert [c.get_run(r.info.run_id).data.params["cell_argv"] for r in own] == \
        [" ".join(spec.cells[1].argv())] * 2
    assert not any("self" in ln and "resuming" in ln for ln in lines)


def test_which_earlier_attempt_a_continuation_takes(store):
    """Newest first: a study record is continued; a continuation that its dead (or
    interrupted) driver cut off is taken up again, with its study; one that failed by
    itself is not tried again across invocations either, the cell starts afresh; an entry
    point without a declared continuation always starts afresh. The study's own end is
    logged once, before the first continuation re-opens it."""
    from scarcelab.tracking.sweep.driver import STALE_MARK

    spec = parse_spec(FALLBACK_SPEC, "tunefall.yaml")
    tune, own = spec.cells
    drv = Driver(spec, echo=lambda _: None)
    c = MlflowClient()
    exp = c.create_experiment(spec.experiment)

    def attempt(n: int, status: str, **tags: str):  # type: ignore[no-untyped-def]
        rid = c.create_run(exp, tags={T.SWEEP_ATTEMPT: str(n), **tags}).info.run_id
        c.set_terminated(rid, status, end_time=1_000_000 * n)
        return c.get_run(rid)

    study = attempt(1, "FAILED", **{"scarcelab.role": "study"})
    assert drv._continued_study(own, [study]) is None  # `self` declares none
    assert drv._continued_study(tune, [study]) == study.info.run_id
    assert c.get_run(study.info.run_id).data.metrics[CELL_END] == 1_000.0
    for err, want in ((f"the sweep driver h:1 {STALE_MARK}; …", study.info.run_id),
                      ("the sweep driver was interrupted (KeyboardInterrupt) …",
                       study.info.run_id),
                      ("exit 1: Error: the continuation fails", None)):
        cut = attempt(2, "FAILED", **{"scarcelab.resumes": study.info.run_id,
                                      "scarcelab.error": err})
        assert drv._continued_study(tune, [study, cut]) == want, err
    # its end is the first continuation's reading, whatever the study run says since
    c.set_terminated(study.info.run_id, "FAILED", end_time=9_000_000)
    assert drv._continued_study(tune, [study]) == study.info.run_id
    assert c.get_run(study.info.run_id).data.metrics[CELL_END] == 1_000.0
    # a fresh attempt after a failed continuation left a study of its own: that one
    newer = attempt(3, "FAILED", **{"scarcelab.role": "study"})
    assert drv._continued_study(tune, [study, cut, newer]) == newer.info.run_id
    # a study of another cell is not this cell's to continue
    other = attempt(4, "FAILED", **{"scarcelab.resumes": "f" * 32,
                                    "scarcelab.error": f"the sweep driver h:1 {STALE_MARK}"})
    assert drv._continued_study(tune, [other]) is None


def test_a_continuation_must_name_options_the_command_has():
    """A declaration that names an option its command lacks is refused at import, not
    found out when a sweep's cell fails with a usage error."""
    import click

    from scarcelab.tracking.sweep.spec import continues_with, entry_continuation

    cmd = click.Command("x", params=[click.Option(["--resume"]), click.Option(["--device"])])
    with pytest.raises(ValueError, match="no option 'data_dir'"):
        continues_with("resume", carry=("data_dir",))(cmd)
    with pytest.raises(ValueError, match="no option 'restart'"):
        continues_with("restart")(cmd)
    cont = entry_continuation("tune")
    assert cont is not None and cont.argv("tune", "r1", {"device": "cpu", "seed": "0"}) == \
        ["tune", "--resume", "r1", "--device", "cpu"]
