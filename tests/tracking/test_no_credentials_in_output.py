"""No credential in anything scarcelab prints or records (issue 42 item 3). With
``MLFLOW_TRACKING_URI=http://admin:<pw>@host`` a study printed MLflow's own line ``View run
… at: http://admin:<pw>@127.0.0.1:…`` (``TrackingServiceClient._log_url``, written to
stdout whatever the log level), and scarcelab's own messages named the URI as it was given.

The probe is real: an ``mlflow server --app-name basic-auth`` on loopback (sqlite stores,
an admin password made for the test), a ``scarcelab supervised`` study of one trial against
it with the password in the URI, then every line of the command's stdout and stderr and
every tag and param of every run it made are searched for the password.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STUDY = ["--method", "sup", "--dataset", "synthetic_tiny", "--arch", "small_cnn", "--device",
         "cpu", "--max-epochs", "2", "--patience", "2", "--batch-size", "16",
         "--max-steps-per-epoch", "3", "--max-trials", "1", "--budget-minutes", "0.5"]


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory):  # type: ignore[no-untyped-def]
    """A basic-auth MLflow server on a free loopback port; yields (port, password)."""
    from scarcelab.tracking.stack import free_port

    folder = tmp_path_factory.mktemp("auth-server")
    pw = "pw-" + secrets.token_hex(12)
    ini = folder / "auth.ini"
    ini.write_text("[mlflow]\ndefault_permission = READ\n"
                   f"database_uri = sqlite:///{folder}/auth.db\n"
                   f"admin_username = admin\nadmin_password = {pw}\n"
                   "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
    ini.chmod(0o600)
    port = free_port()
    env = {**os.environ, "MLFLOW_AUTH_CONFIG_PATH": str(ini),
           "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16),
           "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    env = {k: v for k, v in env.items() if not k.startswith("MLFLOW_TRACKING_")
           and k != "MLFLOW_RUN_ID"}
    log = (folder / "server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--app-name", "basic-auth", "--host",
         "127.0.0.1", "--port", str(port), "--workers", "1", "--backend-store-uri",
         f"sqlite:///{folder}/srv.db", "--artifacts-destination", str(folder / "artifacts")],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        end = time.time() + 240
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                if time.time() > end or proc.poll() is not None:
                    raise AssertionError("mlflow server did not start: " +
                                         (folder / "server.log").read_text()[-2000:]) from None
                time.sleep(0.5)
        yield port, pw
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()


def test_a_study_with_a_password_in_the_uri_prints_and_records_no_password(
        auth_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    port, pw = auth_server
    uri = f"http://admin:{pw}@127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", MLFLOW_TRACKING_URI=uri,
               SCARCELAB_SYSTEM_METRICS="0", SCARCELAB_SPOOL_DIR=str(tmp_path / "spool"))
    exp = "creds-" + secrets.token_hex(4)
    # -v: MLflow's INFO lines too, so the probe sees everything that can be printed
    p = subprocess.run([sys.executable, "-m", "scarcelab.entrypoints.cli", "-v", "supervised",
                        *STUDY, "--experiment", exp], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    leaked = [ln for ln in out.splitlines() if pw in ln]
    assert not leaked, leaked[:5]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    e = client.get_experiment_by_name(exp)
    assert e is not None
    runs = client.search_runs([e.experiment_id])
    assert len(runs) >= 2 and {r.info.status for r in runs} == {"FINISHED"}  # study + trial
    for r in runs:
        for kind, kv in (("tag", r.data.tags), ("param", r.data.params)):
            bad = {k: v for k, v in kv.items() if pw in str(v) or pw in k}
            assert not bad, (kind, r.info.run_id, bad)


def test_scarcelabs_own_messages_name_the_uri_without_its_password(tmp_path: Path,
                                                                   monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The refusal at start (a server that does not answer) and the closing summary's
    "browse" line name the tracking URI: without its password."""
    from types import SimpleNamespace

    import mlflow

    from scarcelab.entrypoints._progress import summary_lines
    from scarcelab.tracking.mlflow_tracker import TrackingUnavailable, check_tracking_server

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    uri = "http://admin:s3cret-pw@127.0.0.1:9"  # discard port: nothing answers
    with pytest.raises(TrackingUnavailable) as e:
        check_tracking_server(uri)
    assert "s3cret" not in str(e.value) and "admin:***@127.0.0.1:9" in str(e.value)
    monkeypatch.setattr(mlflow, "get_tracking_uri", lambda: uri)
    lines = summary_lines(SimpleNamespace(study_run_id=None), "study", 1.0, [])
    assert "  browse: open http://admin:***@127.0.0.1:9 in a browser" in lines
    assert not any("s3cret" in ln for ln in lines)
    pg = "postgresql://mlflow:s3cret-pw@db/mlflow"
    monkeypatch.setattr(mlflow, "get_tracking_uri", lambda: pg)
    lines = summary_lines(SimpleNamespace(study_run_id=None), "study", 1.0, [])
    assert not any("s3cret" in ln for ln in lines), lines
