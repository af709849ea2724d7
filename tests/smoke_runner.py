"""Every suite's smoke scale through the real sweep driver into one sqlite store: the
background half of tests/tracking/results/test_results_smoke.py.

    python tests/smoke_runner.py OUT_DIR JOBS

Why a process of its own: the five smokes are ~50 cell processes, ~18 CPU-minutes (most of
it each cell's start: imports, its MLflow run, its figures), while the rest of the test
suite runs one test at a time and leaves a core idle most of the time.

Which cells: by default (``SCARCELAB_SMOKE_PER_GRID=2``) the first two methods (or AL
strategies) of every grid of each suite's smoke scale, every cell of a grid without a method
axis, and every cell a kept cell depends on: 20 of the 52 cells, what the pages need to build
every table (a labeled-only reference and another method, two strategies and the oracle,
two Tune-It methods for Welch's test). That every method still trains is the method,
strategy and Tune-It contract tests' job, in seconds each; the smoke checks the path from
the sweep driver through the store to the pages. ``SCARCELAB_SMOKE_PER_GRID=all`` runs every
cell, as ``scarcelab sweep suites/<suite>.yaml --smoke`` does. conftest.py starts
this runner when the session collects the smoke test — at the start of the session, with
``JOBS=1`` beside the other tests (``2`` when the smoke test runs alone) — and the smoke
test waits for it and then checks the pages. ``OUT_DIR/status.json`` says, per suite, how
each sweep ended; ``OUT_DIR/runner.log`` has the driver's progress lines.

After the suites, ``scarcelab compare`` runs its smoke (:data:`COMPARE_ARGS`: 3 methods x 2
seeds, one tiny trial each) into the same store, twice (the second a resume); its status is
``status.json``'s ``compare`` entry and its report ``OUT_DIR/compare/``.
``SCARCELAB_SMOKE_ONLY=compare`` (or a comma-separated list of suite names) runs only those.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUITES = sorted((REPO / "suites").glob("*.yaml"))
#: the real files the five smokes read, under ../shared/data
NEEDED = ["medmnist/breastmnist.npz", "medmnist/pneumoniamnist.npz", "tabular/splice",
          "pathology_crops", "consep_patches", "nuclei_cpm15", "cifar10_jpg", "ood"]


#: ``scarcelab compare``'s smoke (docs/compare.md): one method per family x two seeds, each
#: study one trial of 2 steps, through the real command (its sweep, its store, its report);
#: run twice, the second time a resume that runs nothing
COMPARE_ARGS = ["--methods", "sup,fixmatch,simclr", "--seeds", "0,1", "--cell-minutes", "0.5",
                "--min-cell-minutes", "0.1", "--retries", "1",
                *[a for kv in ("arch=small_cnn", "device=cpu", "max_epochs=1",
                               "max_steps_per_epoch=2", "max_trials=1", "batch_size=16",
                               "unlabeled_batch_size=32") for a in ("--option", kv)]]

#: the option that names what a grid compares (first found)
METHOD_KEYS = ("method", "strategy")


def per_grid() -> int | None:
    """How many methods of each grid the smoke runs (``None``: all)."""
    v = os.environ.get("SCARCELAB_SMOKE_PER_GRID", "2").strip().lower()
    return None if v in ("all", "0", "") else int(v)


def smoke_spec(path: Path, k: int | None = None) -> object:
    """The suite's smoke spec, cut to the first ``k`` methods of each grid (see the module
    docstring); ``k=None`` reads :func:`per_grid`."""
    import dataclasses

    from scarcelab.tracking.sweep.spec import load_spec

    spec = load_spec(path, smoke=True)
    k = per_grid() if k is None else k
    if k is None:
        return spec
    firsts: dict[int, list[str]] = {}
    keep: dict[str, object] = {}
    for c in spec.cells:
        o = dict(c.options)
        name = next((o[m] for m in METHOD_KEYS if m in o), None)
        if name is not None:
            seen = firsts.setdefault(c.grid, [])
            if name not in seen:
                if len(seen) >= k:
                    continue
                seen.append(name)
        keep[c.id] = c
    for c in list(keep.values()):  # what a kept cell depends on runs too
        for _, dep in c.refs:  # type: ignore[attr-defined]
            keep.setdefault(dep, spec.cell(dep))
    cells = [c for c in spec.cells if c.id in keep]
    return dataclasses.replace(spec, cells=cells)


def environment(out: Path, data: Path) -> dict[str, str]:
    """What the driver and its cells need: the store, the data, one thread per cell."""
    return {"MLFLOW_TRACKING_URI": f"sqlite:///{out / 'mlflow.db'}", "SCARCELAB_DATA": str(data),
            "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
            "MLFLOW_REQUIREMENTS_INFERENCE_TIMEOUT": "1"}


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001, S110 - not Linux: the runner outlives a killed pytest
        pass


def start(out: Path, jobs: int, data: Path) -> object:
    """Start the runner in the background (it dies with the process that started it)."""
    import subprocess

    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_RUN_ID"}
    env.update(environment(out, data))
    with open(out / "runner.out", "w") as sink:
        return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), str(out),
                                 str(jobs)], env=env, cwd=out, stdout=sink,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=_die_with_parent)


def compare_dataset(out: Path, data: Path) -> str:
    """The compare smoke's dataset: a folder of PNG files written from BreastMNIST
    (``labeled/<class>/``: 120 train images, ``unlabeled/``: the next 300, ``test/<class>/``:
    the test set), where the study commands take a user's folder (``folder:PATH``,
    docs/own-images.md); ``breastmnist`` itself where they do not."""
    import numpy as np
    from PIL import Image

    from scarcelab.tracking.compare.grid import GridError, check_dataset

    folder = out / "own_breast"
    z = np.load(data / "medmnist" / "breastmnist.npz")
    x, y = z["train_images"], np.asarray(z["train_labels"]).reshape(-1)
    names = {0: "malignant", 1: "normal_benign"}
    parts = [("labeled", x[:120], y[:120]), ("unlabeled", x[120:420], None),
             ("test", z["test_images"], np.asarray(z["test_labels"]).reshape(-1))]
    for part, imgs, labels in parts:
        for i, img in enumerate(imgs):
            sub = folder / part / (names[int(labels[i])] if labels is not None else "")
            sub.mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.asarray(img, dtype=np.uint8)).save(sub / f"{part}_{i:04d}.png")
    try:
        return check_dataset(f"folder:{folder}", "smoke")
    except GridError:
        return "breastmnist"


def run_compare(out: Path, jobs: int, data: Path) -> dict[str, object]:
    """The compare smoke: the command twice (the second a resume), into the suites' store."""
    import subprocess

    ds = compare_dataset(out, data)
    cmd = [sys.executable, "-m", "scarcelab.entrypoints.cli", "compare", "--dataset", ds,
           *COMPARE_ARGS, "--jobs", str(jobs), "--output", str(out / "compare")]
    res: dict[str, object] = {"dataset": ds, "command": cmd}
    for key in ("first", "resume"):
        t0 = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=out,
                           stdin=subprocess.DEVNULL, check=False)
        res[key] = {"rc": r.returncode, "seconds": time.time() - t0,
                    "output": (r.stdout + r.stderr)[-20_000:]}
    return res


def main(out: Path, jobs: int) -> int:
    os.chdir(out)
    sys.path.insert(0, str(REPO))
    import scarcelab.entrypoints.cli  # noqa: F401 - fills the command table specs are read against
    from scarcelab.tracking.sweep.driver import run_sweep

    status: dict[str, dict[str, object]] = {}
    only = os.environ.get("SCARCELAB_SMOKE_ONLY", "").split(",")  # e.g. "compare"
    with open(out / "runner.log", "a", buffering=1) as log:
        for path in [p for p in SUITES if not only[0] or p.stem in only]:
            t0 = time.time()
            try:
                res = run_sweep(smoke_spec(path), jobs=jobs,  # type: ignore[arg-type]
                                echo=lambda s: print(s, file=log, flush=True))
                status[path.stem] = {
                    "finished": res.count("FINISHED") + res.count("SKIPPED"),
                    "failed": [[o.cell.label, o.error] for o in res.outcomes
                               if o.status == "FAILED"], "seconds": time.time() - t0}
            except Exception:  # noqa: BLE001 - recorded for the test to report
                status[path.stem] = {"error": traceback.format_exc(), "seconds": time.time() - t0}
            (out / "status.json").write_text(json.dumps(status, indent=1))
        if not only[0] or "compare" in only:
            t0 = time.time()
            try:
                data = Path(os.environ.get("SCARCELAB_DATA", REPO.parent / "shared" / "data"))
                status["compare"] = run_compare(out, jobs, data)
            except Exception:  # noqa: BLE001 - recorded for the test to report
                status["compare"] = {"error": traceback.format_exc()}
            status["compare"]["seconds"] = time.time() - t0
            print(f"compare smoke: {status['compare']['seconds']:.0f} s", file=log)
            (out / "status.json").write_text(json.dumps(status, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2])))
