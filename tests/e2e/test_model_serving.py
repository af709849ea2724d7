"""``mlflow models serve`` on a scarcelab classifier (issue 39 item 7), as docs/own-images.md
has users start it (``--env-manager local`` in an environment with scarcelab): image paths
(files on the server) and JSON arrays of another size in, the same rows as
``mlflow.pyfunc`` in-process out."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
MLFLOW = Path(sys.executable).parent / "mlflow"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(port: int, body: dict) -> list[dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/invocations",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())["predictions"]


@pytest.mark.e2e
def test_served_model_takes_paths_and_arrays_like_pyfunc(tmp_path):
    import mlflow

    from scarcelab.models import create_model
    from scarcelab.models.classifier import ExportedClassifier, for_export
    from scarcelab.models.image_input import InputSpec
    from scarcelab.tracking import pyfunc_model
    from scarcelab.tracking.safe_io import export_model

    torch.manual_seed(0)
    bb = create_model("small_cnn", in_channels=1)
    net = for_export(ExportedClassifier(bb, torch.nn.Linear(bb.num_features, 2),
                                        ["malignant", "benign"]))
    ex = torch.rand(2, 1, 28, 28)
    export_model(net, ex, tmp_path / "net.pt2")
    pyfunc_model.save_model(tmp_path / "model", network=tmp_path / "net.pt2",
                            spec=InputSpec.of(net, ex), pip_requirements=["torch"])
    rng = np.random.default_rng(0)
    img = (rng.random((64, 80)) * 255).astype(np.uint8)
    Image.fromarray(img).save(tmp_path / "a.png")
    arrays = (rng.random((2, 40, 40, 1))).round(3)  # floats in [0, 1], (N, H, W, C)
    local = mlflow.pyfunc.load_model(str(tmp_path / "model"))
    want_path = local.predict([str(tmp_path / "a.png")]).to_dict("records")
    want_arr = local.predict(arrays).to_dict("records")

    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.Popen([str(MLFLOW), "models", "serve", "-m", str(tmp_path / "model"),
                             "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    out = proc.stdout.read().decode() if proc.stdout else ""
                    pytest.fail(f"mlflow models serve did not come up:\n{out[-3000:]}")
                time.sleep(1)
        got_path = _post(port, {"inputs": [str(tmp_path / "a.png")]})
        got_col = _post(port, {"dataframe_split": {"columns": ["image"],
                                                   "data": [[str(tmp_path / "a.png")]]}})
        got_arr = _post(port, {"inputs": arrays.tolist()})
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(30)
    for got, want in ((got_path, want_path), (got_col, want_path), (got_arr, want_arr)):
        assert [g["class"] for g in got] == [w["class"] for w in want]
        for g, w in zip(got, want, strict=True):
            assert g["p_malignant"] == pytest.approx(w["p_malignant"], abs=1e-6)
