"""Packed cells on one GPU, measured: the memory cap a sweep cell applies, and the
aggregate throughput of 1 vs N small training processes sharing the card, with time
slicing and (where it starts) CUDA MPS.

    python bench/gpu_share.py [--procs 8] [--seconds 12] [--batch 64]

Needs only torch (no Ray, no MLflow: it runs on a bare GPU machine from a source checkout).
Each worker process is what a packed sweep cell is (``tracking/sweep/gpu.py``): it reads
``SCARCELAB_GPU_MEMORY_FRACTION`` as ``python -m scarcelab.tracking.sweep.cell`` does and
caps its allocator with ``tracking.sweep.cell.cap_gpu_memory`` before touching CUDA, then
trains a small CNN on random 28-px batches (forward, backward, SGD step) for
``--seconds`` after a warm-up, and reports its steps. The cap check allocates just under
and just over the share. Ends with one ``key=value`` summary line. Without CUDA it says so
and prints the summary with ``cuda=0``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def worker(seconds: float, batch: int, out: str, go: str) -> None:
    """One packed cell: cap (from the environment), warm up, wait for ``go``, count steps."""
    from scarcelab.tracking.sweep.cell import cap_gpu_memory, memory_fraction

    f = memory_fraction(os.environ)
    if f is not None:
        cap_gpu_memory(f)
    import torch
    from torch import nn

    dev = torch.device("cuda")
    net = nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.BatchNorm2d(128), nn.ReLU(),
        nn.Conv2d(128, 256, 3, stride=2, padding=1), nn.BatchNorm2d(256), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10)).to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, 28, 28, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()

    for _ in range(20):
        step()
    torch.cuda.synchronize()
    Path(out + ".ready").touch()
    while not Path(go).exists():
        time.sleep(0.005)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            step()
        n += 10
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    cap = torch.cuda.get_per_process_memory_fraction(0) \
        if hasattr(torch.cuda, "get_per_process_memory_fraction") else None
    Path(out).write_text(json.dumps({"steps": n, "seconds": dt, "cap": cap,
                                     "peak_mb": torch.cuda.max_memory_allocated() / 2**20}))


def cap_check(fraction: float) -> dict[str, object]:
    """In a child: the cap is not applied before CUDA starts, and then holds: a block of
    0.9x the share fits, one of 1.1x raises CUDA's out-of-memory error."""
    code = f"""
import json, os
os.environ["SCARCELAB_GPU_MEMORY_FRACTION"] = "{fraction}"
from scarcelab.tracking.sweep.cell import cap_gpu_memory, memory_fraction
cap_gpu_memory(memory_fraction(os.environ))
import torch
lazy = not torch.cuda.is_initialized()
total = torch.cuda.get_device_properties(0).total_memory
a = torch.empty(int(0.9 * {fraction} * total), dtype=torch.uint8, device="cuda")
del a
torch.cuda.empty_cache()
try:
    b = torch.empty(int(1.1 * {fraction} * total), dtype=torch.uint8, device="cuda")
    over = "allocated"
except torch.cuda.OutOfMemoryError:
    over = "OutOfMemoryError"
print(json.dumps({{"lazy": lazy, "under": "allocated", "over": over,
                  "total_gb": total / 2**30}}))
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    if p.returncode != 0:
        return {"error": p.stderr.strip().splitlines()[-1:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def run(procs: int, seconds: float, batch: int, fraction: float | None) -> dict[str, float]:
    d = Path(tempfile.mkdtemp(prefix="gpushare-"))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    if fraction is not None:
        env["SCARCELAB_GPU_MEMORY_FRACTION"] = str(fraction)
    ps = [subprocess.Popen([sys.executable, __file__, "--worker", str(seconds), str(batch),
                            str(d / f"w{i}.json"), str(d / "go")], env=env)
          for i in range(procs)]
    end = time.time() + 300
    while len(list(d.glob("*.ready"))) < procs and time.time() < end:
        if any(p.poll() not in (None, 0) for p in ps):
            break
        time.sleep(0.05)
    (d / "go").touch()
    for p in ps:
        p.wait(timeout=600)
    outs = [json.loads(f.read_text()) for f in sorted(d.glob("w*.json"))]
    shutil.rmtree(d, ignore_errors=True)
    if len(outs) < procs:
        return {"failed": float(procs - len(outs))}
    rate = sum(o["steps"] / o["seconds"] for o in outs)
    return {"steps_per_s": rate, "peak_mb": max(o["peak_mb"] for o in outs),
            "cap": outs[0]["cap"] if outs[0]["cap"] is not None else float("nan")}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--procs", type=int, default=8)
    p.add_argument("--seconds", type=float, default=12.0)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        worker(float(a.worker[0]), int(a.worker[1]), a.worker[2], a.worker[3])
        return
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        print("cuda=0")
        return
    from scarcelab.tracking.sweep.gpu import start_mps

    share = 1.0 / a.procs
    res: dict[str, object] = {"gpu": torch.cuda.get_device_name(0).replace(" ", "_")}
    cap = cap_check(share)
    print(f"memory cap {share:g}: {cap}", flush=True)
    res.update({f"cap_{k}": v for k, v in cap.items()})
    one = run(1, a.seconds, a.batch, None)
    print(f"1 process: {one}", flush=True)
    packed = run(a.procs, a.seconds, a.batch, share)
    print(f"{a.procs} processes, time slicing, each capped at {share:g}: {packed}", flush=True)
    res.update(one_steps_per_s=one.get("steps_per_s"),
               packed_steps_per_s=packed.get("steps_per_s"))
    if "steps_per_s" in one and "steps_per_s" in packed:
        res["packed_vs_one"] = packed["steps_per_s"] / one["steps_per_s"]
    said: list[str] = []
    mps = start_mps(said.append, embedded=True)
    print("\n".join(said), flush=True)
    res["mps"] = int(mps.running)
    if mps.running:
        try:
            with_mps = run(a.procs, a.seconds, a.batch, share)
            print(f"{a.procs} processes, MPS, each capped at {share:g}: {with_mps}",
                  flush=True)
            res["mps_steps_per_s"] = with_mps.get("steps_per_s")
            if "steps_per_s" in with_mps and "steps_per_s" in one:
                res["mps_vs_one"] = with_mps["steps_per_s"] / one["steps_per_s"]
        finally:
            mps.stop(print)
    print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                   for k, v in res.items()))


if __name__ == "__main__":
    main()
