"""Wall time of one grid run sequentially (one `scarcelab` command after another) vs
through the sweep driver (embedded Ray, ``--jobs`` cells at once), same cells, each in a
fresh embedded MLflow store.

    .venv/bin/python bench/sweep.py                       # the 2 x 2 x 2 tiny grid, 2 jobs
    .venv/bin/python bench/sweep.py --spec suites/cdalbench.yaml --jobs 2

The sweep pays Ray's start (~10 s) and wins by running cells side by side; on a 2-core
machine two cells at once is the most that can help. Ends with a key=value summary line.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this folder has no tracking.py, but be explicit

TINY = """\
name: bench-sweep
grids:
  - entry: supervised
    method: [sup, mixup]
    dataset: [synthetic_tiny, synthetic_tiny_rgb]
    seed: [0, 1]
    arch: small_cnn
    device: cpu
    max_epochs: 2
    patience: 2
    batch_size: 16
    max_steps_per_epoch: 3
    max_trials: 1
    budget_minutes: 2
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default="", help="grid spec (default: the tiny 8-cell grid)")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    import scarcelab.entrypoints.cli  # noqa: F401 - fills the command table specs are read against
    from scarcelab.tracking.sweep.spec import load_spec, parse_spec

    spec = load_spec(args.spec) if args.spec else parse_spec(TINY, "<tiny>")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_RUN_ID", None)

    with tempfile.TemporaryDirectory() as d:
        env_seq = {**env, "MLFLOW_TRACKING_URI": f"sqlite:///{d}/seq.db"}
        t0 = time.time()
        for c in spec.cells:
            subprocess.run([sys.executable, "-m", "scarcelab.entrypoints.cli", *c.argv(),
                            "--experiment", spec.experiment], env=env_seq, cwd=d, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        seq = time.time() - t0
        print(f"sequential: {len(spec.cells)} cells in {seq:.1f} s")

        p = Path(d) / "spec.yaml"
        p.write_text(spec.text)
        env_sw = {**env, "MLFLOW_TRACKING_URI": f"sqlite:///{d}/sweep.db"}
        t0 = time.time()
        out = subprocess.run([sys.executable, "-m", "scarcelab.entrypoints.cli", "sweep", str(p),
                              "--jobs", str(args.jobs)], env=env_sw, cwd=d,
                             capture_output=True, text=True)
        sw = time.time() - t0
        if out.returncode:
            sys.exit(f"the sweep failed:\n{out.stdout}\n{out.stderr}")
        print(f"sweep driver ({args.jobs} jobs): {len(spec.cells)} cells in {sw:.1f} s")
    print(f"cells={len(spec.cells)} jobs={args.jobs} sequential_s={seq:.1f} sweep_s={sw:.1f} "
          f"speedup={seq / sw:.2f}")


if __name__ == "__main__":
    main()
