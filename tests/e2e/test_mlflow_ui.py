"""The MLflow UI as a newcomer meets it (issue 43 §3): the address a study prints at its end
opens, in headless Chromium against a real ``mlflow server``, on the experiment's runs —
not on MLflow 3's GenAI overview (traces, "Detect Issues"), which is what the plain
experiment address shows in MLflow 3.17 whatever the experiment's tags say."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

MLFLOW = Path(sys.executable).parent / "mlflow"
TINY = ["--dataset", "synthetic_tiny", "--arch", "small_cnn", "--device", "cpu",
        "--max-epochs", "1", "--batch-size", "16", "--max-steps-per-epoch", "2",
        "--max-trials", "1", "--budget-minutes", "1", "-q"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_up(url: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise AssertionError(f"mlflow server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(1)
    raise AssertionError(f"mlflow server not up at {url} after {timeout:.0f} s")


def _dom(chromium: str, url: str, tmp: Path) -> str:
    """The page's DOM after 20 s of (virtual) time: the single-page app has rendered."""
    r = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                        "--no-first-run", "--disable-background-networking",
                        f"--user-data-dir={tmp}", "--window-size=1400,900",
                        "--virtual-time-budget=20000", "--dump-dom", url],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


@pytest.mark.e2e
def test_the_printed_address_opens_the_experiment_on_its_runs(tmp_path, monkeypatch):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        pytest.skip("no headless Chromium on PATH (apt-get install chromium)")
    import mlflow
    from click.testing import CliRunner

    from scarcelab.entrypoints.cli import main

    port = _free_port()
    server = subprocess.Popen(
        [str(MLFLOW), "server", "--backend-store-uri", f"sqlite:///{tmp_path}/m.db",
         "--artifacts-destination", str(tmp_path / "art"), "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        uri = f"http://127.0.0.1:{port}"
        _wait_up(uri + "/health", server)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
        monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
        monkeypatch.chdir(tmp_path)
        mlflow.set_tracking_uri(uri)
        r = CliRunner().invoke(main, ["supervised", "--method", "sup", *TINY,
                                      "--experiment", "first-hour"])
        assert r.exit_code == 0, r.output
        m = re.search(r"browse: (http://\S+)", r.output)
        assert m, r.output
        dom = _dom(chromium, m.group(1), tmp_path / "chrome")
        assert "sup-synthetic_tiny-s0" in dom  # the study run, in the runs table
        assert "Detect Issues" not in dom and "Training runs" not in dom  # GenAI overview
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)
