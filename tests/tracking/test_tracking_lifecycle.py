"""How a command starts and ends around its tracking server (issue 13 items 4 and 5):
a dead server at start is refused in one line before any data is read; records left
undelivered at exit give a non-zero status naming the folder to replay; a process started
by ``mlflow run`` does not outlive it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STUDY = ["--method", "sup", "--dataset", "synthetic_tiny", "--arch", "small_cnn", "--device",
         "cpu", "--max-epochs", "2", "--patience", "2", "--batch-size", "16",
         "--max-steps-per-epoch", "3", "--max-trials", "1", "--budget-minutes", "0.5"]


def _env(**kw: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_RUN_ID", None)
    return {**env, **kw}


def test_dead_server_at_start_is_refused_in_one_line_before_loading_data(tmp_path):
    # an empty data folder (it passes the option check): had data been loaded first, the
    # missing breastmnist.npz (or its download) would be the error
    empty = tmp_path / "empty-data"
    empty.mkdir()
    cmd = [sys.executable, "-m", "scarcelab.entrypoints.cli", "semi", "--method", "fixmatch",
           "--dataset", "breastmnist", "--data-dir", str(empty)]
    t0 = time.time()
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env=_env(MLFLOW_TRACKING_URI="http://127.0.0.1:9"))
    took = time.time() - t0
    assert p.returncode != 0
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1 and "tracking server http://127.0.0.1:9 does not answer" in errors[0]
    assert "breastmnist.npz" not in p.stderr and not list(tmp_path.glob("mlruns"))
    assert took < 120


def _mlflow_server(tmp_path: Path, port: int) -> subprocess.Popen:
    mlflow_bin = Path(sys.executable).parent / "mlflow"
    proc = subprocess.Popen(
        [str(mlflow_bin), "server", "--host", "127.0.0.1", "--port", str(port), "--workers",
         "1", "--backend-store-uri", f"sqlite:///{tmp_path}/srv.db", "--artifacts-destination",
         str(tmp_path / "artifacts")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=_env(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"), start_new_session=True)
    import urllib.request

    end = time.time() + 180
    while time.time() < end:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc
        except OSError:
            time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError("mlflow server did not start")


def test_undelivered_records_at_exit_give_a_nonzero_status_and_the_replay_command(
        tmp_path, monkeypatch):
    """A real ``mlflow server`` goes away just before the study ends: the command trains to
    the end, then exits non-zero and says which folder to replay."""
    from click.testing import CliRunner

    import scarcelab.protocols.search as search
    import scarcelab.tracking.mlflow_tracker as mt
    from scarcelab.entrypoints.cli import main
    from scarcelab.tracking.stack import free_port

    port = free_port()
    srv = _mlflow_server(tmp_path, port)
    real_end = mt.MlflowTracker.end_study

    def end_after_outage(self, status):  # type: ignore[no-untyped-def]
        os.killpg(srv.pid, signal.SIGKILL)  # the server dies before the final records
        srv.wait()
        return real_end(self, status)

    monkeypatch.setattr(mt.MlflowTracker, "end_study", end_after_outage)
    monkeypatch.setattr(mt, "FLUSH_TIMEOUT_S", 1.0)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    import mlflow

    # an earlier test may have set MLflow's process-global URI, which wins over the variable
    monkeypatch.setattr(mlflow.tracking._tracking_service.utils, "_tracking_uri", None)
    monkeypatch.setenv("SCARCELAB_SPOOL_DIR", str(tmp_path / "spool"))
    monkeypatch.setattr("scarcelab.tracking.spool.DEFAULT_ROOT", tmp_path / "spool")
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.chdir(tmp_path)
    assert search.run_study  # the real study, only the server is taken away
    try:
        r = CliRunner().invoke(main, ["supervised", *STUDY, "--experiment", "exit"])
    finally:
        if srv.poll() is None:
            os.killpg(srv.pid, signal.SIGKILL)
    assert r.exit_code != 0, r.output
    assert "best val balanced accuracy" in r.output  # it trained to the end
    left = list((tmp_path / "spool").iterdir())
    assert len(left) == 1
    assert f"python -m scarcelab.tracking.spool replay {left[0]}" in r.output


# -- item 5: `mlflow run` killed --------------------------------------------------------

_LAUNCHER = """
import os, subprocess, sys, time
# stands in for `mlflow run` exactly as the watchdog sees it: a process whose command line
# is `.../mlflow run ...`, starting the entry point through `bash -c` like MLflow does
child = subprocess.Popen(["bash", "-c", sys.argv[2] + " ; echo bash-done"])
time.sleep(600)
"""


def test_training_child_dies_with_a_killed_mlflow_run(tmp_path):
    """The parent chain of ``mlflow run``'s local backend (``mlflow run`` → ``bash -c`` →
    python); SIGKILL to the ``mlflow run`` process ends the training process within seconds
    (before: it trained on to the end, orphaned)."""
    fake_mlflow = tmp_path / "bin" / "mlflow"
    fake_mlflow.parent.mkdir()
    fake_mlflow.write_text(_LAUNCHER)
    pidfile = tmp_path / "child.pid"
    # the pid file is written once the CLI has started (its watchdog is armed from then on)
    child_cmd = (f"{sys.executable} -c \"import os, time; "
                 "from scarcelab.entrypoints.cli import main; "
                 "main(['list', 'methods'], standalone_mode=False); "
                 f"open('{pidfile}', 'w').write(str(os.getpid())); time.sleep(120)\"")
    env = _env(MLFLOW_RUN_ID="0123456789abcdef", SCARCELAB_PARENT_POLL_S="0.2")
    launcher = subprocess.Popen([sys.executable, str(fake_mlflow), "run", child_cmd],
                                env=env, cwd=REPO)
    try:
        end = time.time() + 240
        while time.time() < end and not (pidfile.exists() and pidfile.read_text().strip()):
            time.sleep(0.2)
        pid = int(pidfile.read_text())
        assert Path(f"/proc/{pid}").exists()
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        end = time.time() + 20
        while time.time() < end and _alive(pid):
            time.sleep(0.2)
        assert not _alive(pid), "the training process outlived the killed `mlflow run`"
    finally:
        if launcher.poll() is None:
            launcher.kill()
        if pidfile.exists() and _alive(int(pidfile.read_text())):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("argv,expect", [
    (["/v/bin/python3.11", "/v/bin/mlflow", "run", "."], True),
    (["/v/bin/mlflow", "run", ".", "-e", "semi"], True),
    (["python", "-m", "mlflow", "run", "."], True),
    (["/v/bin/python3.11", "/v/bin/mlflow", "server"], False),
    (["python", "train.py", "run"], False),
])
def test_mlflow_run_is_recognised(argv, expect):
    from scarcelab.tracking.lifecycle import is_mlflow_run

    assert is_mlflow_run(argv) is expect
