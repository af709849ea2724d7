"""Many studies on one GPU (issue 40 item 5): fractional ``gpus_per_cell`` packs cells on a
card, each cell gets its CPU share as ``OMP_NUM_THREADS`` and a cap of its CUDA allocator,
and CUDA MPS is started or said to be missing.

The driver runs for real on a loopback Ray cluster that declares one *fake* GPU
(``ray.init(num_gpus=1)`` on a machine without one: Ray schedules on the number it is
told), against a real sqlite MLflow store. Cells are ``tests/sweep_fake_cell.py``, which
reports when it lived, how many cells it saw alive at once and the share it was given.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from scarcelab import tags as T  # noqa: E402
from scarcelab.tracking.sweep.driver import CELL_MODULE, Driver  # noqa: E402
from scarcelab.tracking.sweep.pool import embedded_init  # noqa: E402
from scarcelab.tracking.sweep.spec import parse_spec  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
SPEC = """\
name: pack-{name}
cpus_per_cell: 2
gpus_per_cell: {gpus}
env: {env}
{extra}
grids:
  - entry: semi
    method: fixmatch
    seed: [0, 1, 2, 3]
"""


@pytest.fixture(scope="module")
def fake_gpu_cluster():  # type: ignore[no-untyped-def]
    """A private Ray cluster on loopback with 8 CPUs and 1 (fake) GPU."""
    if ray.is_initialized():
        ray.shutdown()
    embedded_init(ray, num_cpus=8, num_gpus=1, log_to_driver=False, configure_logging=False)
    assert ray.cluster_resources().get("GPU") == 1.0
    yield
    ray.shutdown()


def _sweep(tmp_path: Path, monkeypatch, name: str, gpus: str, extra: str = "",  # type: ignore[no-untyped-def]
           barrier: int = 0, env: dict[str, str] | None = None
           ) -> tuple[list[dict], list[str], Driver]:
    """Run the 4-cell spec; returns each cell's report (in start order), the progress
    lines and the driver."""
    report = tmp_path / f"report-{name}"
    report.mkdir()
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {REPO / 'tests/sweep_fake_cell.py'} "
                      '"$@"\n')
    python.chmod(0o755)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "SCARCELAB_GPU_MEMORY_FRACTION"):
        monkeypatch.delenv(k, raising=False)  # the share is the driver's to set
    # through the spec: the Ray workers were started before this test set anything
    env = {"SCARCELAB_USER_FAKE_CELL_REPORT": str(report),
           "SCARCELAB_USER_FAKE_BARRIER": str(barrier),
           "SCARCELAB_USER_FAKE_BARRIER_S": "240" if barrier else "0", **(env or {})}
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    spec = parse_spec(SPEC.format(name=name, gpus=gpus, extra=extra, env=json.dumps(env)),
                      f"{name}.yaml")
    lines: list[str] = []
    drv = Driver(spec, echo=lines.append, cwd=str(tmp_path), python=str(python))
    res = drv.run()
    assert res.count("FINISHED") == 4, lines
    reports = sorted((json.loads(p.read_text()) for p in report.glob("*.json")),
                     key=lambda r: r["start"])
    assert len(reports) == 4
    return reports, lines, drv


def test_four_quarter_gpu_cells_run_at_once_on_one_gpu(fake_gpu_cluster, tmp_path,
                                                       monkeypatch):
    """gpus_per_cell 0.25: all four cells alive together on the one GPU (each waited until
    it saw the other three), each told the card, 2 threads and a quarter of its memory."""
    reports, lines, drv = _sweep(tmp_path, monkeypatch, "quarter", "0.25", barrier=4)
    assert all(r["saw"] == 4 for r in reports), reports
    assert max(r["start"] for r in reports) < min(r["end"] for r in reports)
    for r in reports:
        assert r["module"] == CELL_MODULE == "scarcelab.tracking.sweep.cell"
        assert r["env"] == {"CUDA_VISIBLE_DEVICES": "0", "OMP_NUM_THREADS": "2",
                            "MKL_NUM_THREADS": "2", "SCARCELAB_GPU_MEMORY_FRACTION": "0.25"}
    said = [ln for ln in lines if "each cell:" in ln]
    assert said == ["[sweep pack-quarter] each cell: 2 CPU, 0.25 GPU (4 per GPU, memory "
                    "capped at 0.25 of a GPU), OMP_NUM_THREADS=2; 4 at once"], lines
    sweep = drv.client.search_runs([drv._experiment_id()], "tags.`scarcelab.role` = 'sweep'")
    info = json.loads(sweep[0].data.tags[T.SWEEP_RESOURCES])
    assert info == {"cpus_per_cell": 2.0, "gpus_per_cell": 0.25, "cells_per_gpu": 4,
                    "gpu_memory_fraction": 0.25, "omp_num_threads": "2", "mps": False,
                    "slots": 4}


def test_whole_gpu_cells_run_one_after_another(fake_gpu_cluster, tmp_path, monkeypatch):
    """gpus_per_cell 1 on one GPU: one cell at a time (their lifetimes do not overlap), no
    memory cap unless one is given (here 0.5), the spec's OMP_NUM_THREADS kept."""
    reports, lines, _ = _sweep(tmp_path, monkeypatch, "whole", "1",
                               extra="gpu_memory_fraction: 0.5", env={"OMP_NUM_THREADS": "3"})
    for a, b in zip(reports, reports[1:], strict=False):
        assert a["end"] <= b["start"], reports
    for r in reports:
        assert r["env"] == {"CUDA_VISIBLE_DEVICES": "0", "OMP_NUM_THREADS": "3",
                            "MKL_NUM_THREADS": None, "SCARCELAB_GPU_MEMORY_FRACTION": "0.5"}
    assert any("1 GPU (1 per GPU, memory capped at 0.5 of a GPU), OMP_NUM_THREADS=3; 1 at "
               "once" in ln for ln in lines), lines


def test_mps_missing_is_said_in_one_line_and_the_sweep_goes_on(fake_gpu_cluster, tmp_path,
                                                               monkeypatch):
    """mps: true where nvidia-cuda-mps-control is not installed (this machine)."""
    import shutil

    if shutil.which("nvidia-cuda-mps-control"):
        pytest.skip("this machine has CUDA MPS: the missing case cannot be shown here")
    _, lines, _ = _sweep(tmp_path, monkeypatch, "mps", "0.5", extra="mps: true")
    mps = [ln for ln in lines if "MPS" in ln]
    assert len(mps) == 1 and "CUDA MPS (mps: true) is NOT on: nvidia-cuda-mps-control is " \
        "not installed here" in mps[0], lines


def test_mps_is_started_and_stopped_when_the_driver_started_it(tmp_path, monkeypatch):
    """A stand-in ``nvidia-cuda-mps-control`` on PATH records how it was called: no daemon
    answers, so the driver starts one (``-d``) and, at the end, stops it (``quit``)."""
    from scarcelab.tracking.sweep.gpu import start_mps

    log = tmp_path / "calls"
    fake = tmp_path / "bin" / "nvidia-cuda-mps-control"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\nread -r line || line=\"\"\necho \"$* $line\" >> {log}\n"
                    f"[ \"$*\" = \"-d\" ] && exit 0\n[ -f {tmp_path}/up ] || exit 1\n"
                    f"[ \"$line\" = quit ] && rm -f {tmp_path}/up\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    said: list[str] = []
    mps = start_mps(said.append, embedded=True)
    assert mps.started and said[-1].startswith("CUDA MPS: started the daemon")
    (tmp_path / "up").touch()
    mps.stop(said.append)
    calls = log.read_text().split("\n")
    assert calls[:2] == [" get_server_list", "-d "] and calls[2] == " quit", calls
    # a daemon that answers is used, and left running at the end
    (tmp_path / "up").touch()
    again = start_mps(said.append, embedded=True)
    assert not again.started and again.running and "already running" in said[-1]
    # on a cluster the driver does not start one: it says where it belongs
    assert not start_mps(said.append, embedded=False).running
    assert "start the daemon on every GPU node" in said[-1]


def test_the_cell_caps_cuda_memory_at_cuda_init(monkeypatch):
    """The cap is queued with torch's lazy CUDA init (no context is created for it) and,
    when CUDA starts, set on every visible device."""
    import torch

    from scarcelab.tracking.sweep import cell

    queued: list = []  # type: ignore[type-arg]
    got: list[tuple[float, int]] = []
    monkeypatch.setattr(torch.cuda, "_lazy_call", queued.append)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda f, device=None: got.append((f, device)))
    assert cell.memory_fraction({cell.MEMORY_FRACTION_ENV: "0.125"}) == 0.125
    assert cell.memory_fraction({}) is None
    with pytest.raises(SystemExit, match="must be a fraction"):
        cell.memory_fraction({cell.MEMORY_FRACTION_ENV: "1.5"})
    cell.cap_gpu_memory(0.125)
    assert got == [] and len(queued) == 1  # nothing until CUDA starts
    queued[0]()
    assert got == [(0.125, 0), (0.125, 1)]


def test_a_cell_process_runs_the_command_it_is_given(tmp_path):
    """``python -m scarcelab.tracking.sweep.cell`` is ``scarcelab``: same output and exit
    status, with and without a memory cap (torch then imported, CUDA untouched)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ok = subprocess.run([sys.executable, "-m", CELL_MODULE, "list", "methods"],
                        capture_output=True, text=True, env=env, timeout=300)
    assert ok.returncode == 0 and "fixmatch\tsemi" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", CELL_MODULE, "semi", "--method", "nope"],
                         capture_output=True, text=True, timeout=300,
                         env={**env, "SCARCELAB_GPU_MEMORY_FRACTION": "0.25"})
    assert bad.returncode == 2 and "Error: Invalid value for '--method'" in bad.stderr


def test_torch_takes_its_intra_op_threads_from_omp_num_threads():
    """What the driver relies on for a cell's threads (one thread fits any machine)."""
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.stdout.strip() == "1"
