"""Issue 42 item 9: runs end in a final state after a spool replay, and a refusal at start
prints the replay command.

Before: a study killed while the server was away (the probe: ``kill -9`` during the outage,
server back, ``python -m scarcelab.tracking.spool replay DIR``) had its records delivered,
but its study run (and the trial it was in) stayed RUNNING for ever unless the same command
was resumed; and a command refused because the server was down said nothing of the records
waiting for that server.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

import scarcelab.tracking.spool as spool_mod
from scarcelab.tracking.spool import Spool

REPO = Path(__file__).resolve().parents[2]


def _down(op, ids):  # type: ignore[no-untyped-def]
    """What a dead server raises."""
    from mlflow.exceptions import MlflowException

    raise MlflowException("API request failed: Max retries exceeded (Connection refused)")


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


@pytest.fixture
def killed_study(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """A local store holding a study run made before the outage, and the spool its killed
    process left: trial 0 created and finished during the outage, trial 1 created and
    still training when the process died (no end for it, nor for the study)."""
    monkeypatch.setattr(spool_mod, "RETRY_INTERVAL_S", 0.0)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    mlflow.set_tracking_uri(uri)
    c = MlflowClient()
    exp = c.create_experiment("replayed")
    pid = _dead_pid()
    study = c.create_run(exp, run_name="s", tags={
        "scarcelab.role": "study", "scarcelab.study_key": "study-k",
        "scarcelab.owner": f"{socket.gethostname()}:{pid}"}).info.run_id
    sp = Spool("http://away", _down, root=tmp_path / "spool", background=False)
    sp.ids["study"] = study
    for n, end in ((0, True), (1, False)):
        key = f"trial-{n}"
        sp.submit({"op": "create_run", "key": key, "parent": "study", "experiment_id": exp,
                   "run_name": f"s/t{n:02d}", "start_time": 1,
                   "tags": {"scarcelab.role": "trial", "scarcelab.trial": str(n),
                            "scarcelab.study_key": "study-k"}})
        sp.submit({"op": "log_batch", "key": key, "metrics": [["val", 0.5, 2, 0]]})
        if end:
            sp.submit({"op": "terminate", "key": key, "status": "FINISHED", "end_time": 3})
    sp.submit({"op": "log_batch", "key": "study", "metrics": [["best/val", 0.5, 2, 0]]})
    left = sp.close(0.0)
    assert left is not None
    st = json.loads((left / "state.json").read_text())
    st.update(pid=pid, tracking_uri=uri)  # the process is gone; its store is this one
    (left / "state.json").write_text(json.dumps(st))
    return {"uri": uri, "exp": exp, "study": study, "left": left, "client": c}


def _runs(c, exp):  # type: ignore[no-untyped-def]
    return {r.data.tags.get("scarcelab.trial", "study"): r for r in c.search_runs([exp])}


def test_the_replay_command_leaves_no_run_of_a_dead_process_running(killed_study):
    k = killed_study
    env = {**os.environ, "PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": k["uri"]}
    p = subprocess.run([sys.executable, "-m", "scarcelab.tracking.spool", "replay",
                        str(k["left"])], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "delivered" in p.stdout, p.stderr[-2000:]
    runs = _runs(k["client"], k["exp"])
    assert sorted(runs) == ["0", "1", "study"]
    assert {n: r.info.status for n, r in runs.items()} == {
        "0": "FINISHED", "1": "FAILED", "study": "FAILED"}
    for n in ("1", "study"):
        tags = runs[n].data.tags
        assert tags["scarcelab.ended_by_replay"] == "true"
        assert "ended before closing it" in tags["scarcelab.error"]
    assert "scarcelab.ended_by_replay" not in runs["0"].data.tags  # its end was delivered
    assert [m.value for m in k["client"].get_metric_history(runs["1"].info.run_id, "val")] \
        == [0.5]  # the records came first
    assert not k["left"].exists()


def test_a_resume_reopens_the_study_run_the_replay_closed(killed_study):
    """The replay at a resume's start closes the dead study's runs; the resume still finds
    its study run, makes it RUNNING again and closes the orphaned trial as before."""
    from scarcelab.tracking.mlflow_tracker import MlflowTracker

    k = killed_study
    t = MlflowTracker(experiment="replayed", spool_root=k["left"].parent)
    state = t.resume_state("study-k")  # replays the spool first
    assert state is not None and t._resume_run == k["study"]
    assert k["client"].get_run(k["study"]).info.status == "FAILED"  # by the replay
    t.start_study("s", {"scarcelab.role": "study", "scarcelab.study_key": "study-k"}, {}, {})
    study = k["client"].get_run(k["study"])
    assert study.info.status == "RUNNING"
    assert "scarcelab.ended_by_replay" not in study.data.tags
    assert "scarcelab.error" not in study.data.tags
    t.close_orphan_trials(completed={0})
    runs = _runs(k["client"], k["exp"])
    assert runs["1"].info.status == "FAILED"
    assert runs["1"].data.tags["scarcelab.error"] == "the process running this trial died"
    t.end_study("FINISHED")
    assert k["client"].get_run(k["study"]).info.status == "FINISHED"


def test_a_refusal_at_start_prints_the_replay_command_for_waiting_records(
        tmp_path, monkeypatch):
    from scarcelab.tracking.mlflow_tracker import TrackingUnavailable, check_tracking_server

    uri = "http://127.0.0.1:9"
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setattr(spool_mod, "DEFAULT_ROOT", tmp_path / "spool")
    with pytest.raises(TrackingUnavailable) as nothing:
        check_tracking_server(uri)
    assert "replay" not in str(nothing.value)  # nothing waits: nothing to say
    sp = Spool(uri, _down, root=tmp_path / "spool", background=False)
    sp.ids["study"] = "S"
    sp.submit({"op": "log_batch", "key": "study", "metrics": [["a", 1.0, 0, 0]]})
    left = sp.close(0.0)
    st = json.loads((left / "state.json").read_text())
    st["pid"] = _dead_pid()
    (left / "state.json").write_text(json.dumps(st))
    with pytest.raises(TrackingUnavailable) as e:
        check_tracking_server(uri)
    msg = str(e.value)
    assert "\n" not in msg
    assert f"`python -m scarcelab.tracking.spool replay {left}`" in msg, msg


def test_a_run_another_process_has_taken_over_is_left_to_it(killed_study):
    """The study run now owned by a live process (a resume that reattached it) is not
    closed by a late replay of the dead writer's folder; its orphaned trial is."""
    k = killed_study
    k["client"].set_tag(k["study"], "scarcelab.owner", f"{socket.gethostname()}:{os.getpid()}")
    from scarcelab.tracking.mlflow_tracker import replay_folder

    assert replay_folder(k["left"])
    runs = _runs(k["client"], k["exp"])
    assert runs["study"].info.status == "RUNNING" and runs["1"].info.status == "FAILED"
