"""``bench/gpu.py --dry-run``: every section of the GPU bench at toy sizes on the CPU (issue
40 item 6), so that the command prepared for a lent GPU machine is known to run before that
machine's minutes are spent on it. In tests/e2e because it is a handful of subprocesses
that mostly wait (the sections and the packed workers), beside the rest of the suite.

The ratios of the summary are checked on a hand-made result as well: they are what the
closing note of a GPU run quotes against issue 40's targets.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import gpu  # noqa: E402  (bench/gpu.py)

SHARED = REPO.parent / "shared" / "data" / "medmnist"


def test_summary_ratios_from_a_hand_made_result() -> None:
    r = {"model": {"fixmatch_bf16_cl": {"steps_per_s": 20.0}},
         "ours": {"fixmatch_cuda": {"steps_per_s": 16.0, "syncs_per_step": 0.2}},
         "usb_loader": {"fixmatch_usb_loader": {"steps_per_s": 4.0}},
         "study": {"fixmatch_pneumoniamnist": {"gpu_busy": 0.75, "share": {"train": 0.6}}},
         "pack": {"speedup": 4.5},
         "syncs": {"sup": {"per_step": 0.0}, "ole": {"per_step": 3.0}, "rules": {}}}
    s = gpu.summary(r)
    assert s["ours_vs_model_bf16"] == pytest.approx(0.8)  # target: >= 1/1.5
    assert s["ours_vs_usb_loader"] == pytest.approx(4.0)  # target: >= 2
    assert s["study_gpu_busy"] == 0.75 and s["pack_speedup"] == 4.5
    assert s["ours_syncs_per_step"] == 0.2 and s["methods_max_syncs_per_step"] == 3.0
    assert "ours_vs_usb_step" not in s  # a ratio whose peer is missing is left out


@pytest.mark.skipif(not (SHARED / "pneumoniamnist.npz").exists(),
                    reason=f"real MedMNIST files not found at {SHARED}")
def test_dry_run_runs_every_cpu_section(tmp_path: Path) -> None:
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu.py"), "--dry-run", "--data", str(SHARED),
         "--out", str(out), "--sections", "env,model,ours,usb,study,pack,syncs"],
        capture_output=True, text=True, cwd=REPO, timeout=900, check=False)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads((out / "gpu.json").read_text())
    assert r["env"]["device"] == "cpu"
    broken = {k: v for k, v in r.items() if isinstance(v, dict) and ("failed" in v or (
        v.get("skipped") == "deadline"))}
    assert not broken, (broken, p.stdout[-3000:])  # a section that timed out says so here
    for sec, keys in (("model", ("fixmatch_fp32", "fixmatch_bf16_cl", "simclr_fp32")),
                      ("ours", ("fixmatch_cpu", "fixmatch_cuda", "simclr_cpu"))):
        for k in keys:
            assert r[sec][k]["steps_per_s"] > 0, (sec, k)
    # the production step ran with the settings a study resolves on this device
    assert r["ours"]["fixmatch_cpu"]["accel"]["precision"] == "fp32"
    # without USB installed the section says why instead of failing
    assert "skipped" in r["usb"] or "fixmatch_usb_step" in r["usb"]
    st = r["study"]["fixmatch_pneumoniamnist"]
    assert st["epochs"] >= 1 and st["steps"] >= 1
    assert set(st["per_epoch_s"]) == {"train", "eval", "probe", "diag", "track", "rest"}
    assert r["study"]["simclr_pneumoniamnist"]["per_epoch_s"]["probe"] > 0  # its probe
    assert r["pack"]["n1"]["ok"] == 1 and r["pack"]["n2"]["ok"] == 2
    assert "fixmatch" in r["syncs"] and "rules" in r["syncs"]
    last = p.stdout.strip().splitlines()[-1]
    assert "failed_sections=0" in last and "ours_fixmatch_sps=" in last
