"""Shared fixtures. Tests run single-threaded torch for determinism and to leave the
second core to the test runner / tracking server on 2-core CI machines."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

# The sweep and compare layers read the entry points' commands through the table the command
# line installs when it is imported (tracking/commands.py); the product always starts through
# it, so the tests that call those layers directly install it the same way.
import scarcelab.entrypoints.cli  # noqa: E402,F401  (installs the command table)

# MLflow's log_model infers a model's pip requirements by re-importing it in a subprocess
# (torch + MLflow again: 5-50 s per logged model on a 2-core machine, a few minutes over the
# suite). No test reads the inferred requirements, and MLflow falls back to the flavor's
# defaults whenever inference fails, so bounding it at 1 s changes nothing a test checks.
# Set in os.environ so the studies the tests start as subprocesses inherit it.
os.environ.setdefault("MLFLOW_REQUIREMENTS_INFERENCE_TIMEOUT", "1")
# Computed encodings go to the cache folder (scarcelab.data.download.cache_root), not to
# $SCARCELAB_DATA: one throwaway folder per test session, never the user's ~/.cache.
if "SCARCELAB_CACHE" not in os.environ:
    import tempfile

    os.environ["SCARCELAB_CACHE"] = tempfile.mkdtemp(prefix="scarcelab-test-cache-")

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"

# The tests mirror the product code in folders (tests/README.md); a test module that reuses
# another's helpers imports it by its basename (``from test_segment import _synthetic_nuclei``),
# as when the tests were one flat folder. pytest's default import mode puts a test file's own
# folder on sys.path only when it collects a file there, so a run of one folder could not find
# a helper module in another. Every test folder goes on sys.path here (after what is there:
# basenames are unique, tests/project/test_test_layout.py checks it), so the helper module is
# the one pytest collects, never a second copy under another name.
for _folder in sorted({p.parent for p in TESTS.rglob("test_*.py")} - {TESTS}):
    if "__pycache__" not in _folder.parts and str(_folder) not in sys.path:
        sys.path.append(str(_folder))
SHARED_DATA = Path(os.environ.get("SCARCELAB_SHARED_DATA", REPO.parent / "shared" / "data"))
MEDMNIST_DIR = SHARED_DATA / "medmnist"

#: the strategies CDALBench compares (12 heuristics and the greedy oracle), which
#: the cdalbench suite runs; a newcomer's strategy is added beside them, never counted
CDALBENCH_STRATEGIES = {"random", "margin", "entropy", "least_confident", "bald", "badge",
                        "coreset", "typiclust", "coregcn", "dsa", "lsa", "galaxy", "oracle"}


@pytest.fixture(autouse=True)
def _fresh_provenance() -> None:
    """Each test starts with no recorded data files. Why: the record is process-wide
    (scarcelab.data.provenance) and only a logged run clears it, so a test that reads a file
    without logging a run (``_locate`` on a toy folder) left it in the next test's
    ``data_files.json`` — seen when mutmut ran test_active_loop before test_data_guards."""
    from scarcelab.data import provenance

    provenance.reset()


@pytest.fixture(autouse=True)
def _no_inherited_mlflow_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test inherits an experiment or run that an earlier test pointed the process at.
    Why: ``mlflow.set_experiment`` (and so every study run in-process) writes
    ``MLFLOW_EXPERIMENT_ID`` into ``os.environ``; an e2e test that copies the environment
    into ``mlflow run`` then got "Specify only one of 'experiment-name' or 'experiment-id'"
    or "No Experiment with id=1" from a store where that id never existed (CI of stop 47,
    test_param_parity after the in-process UI and serving tests)."""
    for name in ("MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def medmnist_dir() -> Path:
    if not (MEDMNIST_DIR / "breastmnist.npz").exists():
        pytest.skip(f"real MedMNIST copies not found at {MEDMNIST_DIR} (../shared/data is "
                    "only present on the project machines)")
    return MEDMNIST_DIR


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An empty sqlite MLflow store of the test's own, which every way of reaching MLflow
    sees: the process (``set_tracking_uri``), the CLI and any subprocess
    (``MLFLOW_TRACKING_URI``), and what writes relative to the current directory (it is
    ``tmp_path``). ``MLFLOW_RUN_ID`` is removed so that a run an outer ``mlflow run`` opened
    is never joined, and a run a failed test left active is ended so that it cannot become
    the next test's parent. A module whose store differs overrides this fixture (same name)
    and says why. MLflow is imported here, not at the top: most tests never use it."""
    import mlflow

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    # mlflow.set_experiment (which logging a model calls) exports MLFLOW_EXPERIMENT_ID to
    # the process: an earlier test's experiment id must not point into this new store
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    mlflow.set_tracking_uri(uri)
    yield uri
    while mlflow.active_run():
        mlflow.end_run()


@pytest.fixture
def tiny_bundle():  # type: ignore[no-untyped-def]
    from scarcelab.data import load_raw
    from scarcelab.data.splits import apply_split, make_split

    raw = load_raw("synthetic_tiny")
    return apply_split(raw, make_split(raw, 30, 30, seed=0))


# -- the suites' smoke (tests/tracking/results/test_results_smoke.py) --------------------
# Its five sweeps (~50 cell processes) start in the background when the session collects
# the test, one cell at a time beside the other tests (which leave a core idle most of the
# time), and the test itself runs last and waits for them (tests/smoke_runner.py).
SMOKE_FILE = "test_results_smoke.py"


def pytest_collection_modifyitems(session, config, items):  # type: ignore[no-untyped-def]
    smoke = [i for i in items if i.path.name == SMOKE_FILE]
    if smoke:
        items[:] = [i for i in items if i.path.name != SMOKE_FILE] + smoke


def pytest_collection_finish(session):  # type: ignore[no-untyped-def]
    items = session.items
    if not any(i.path.name == SMOKE_FILE for i in items) or session.config.option.collectonly:
        return
    import smoke_runner

    if not all((SHARED_DATA / n).exists() for n in smoke_runner.NEEDED):
        return  # the test skips, saying why
    alone = all(i.path.name == SMOKE_FILE for i in items)
    # SCARCELAB_SMOKE_DIR keeps the smoke's store (and its pages) for a look afterwards
    keep = os.environ.get("SCARCELAB_SMOKE_DIR")
    out = Path(keep) if keep else session.config._tmp_path_factory.mktemp("smoke")
    session.config._scarcelab_smoke = (smoke_runner.start(out, 2 if alone else 1, SHARED_DATA),
                                       out)


def pytest_sessionfinish(session, exitstatus):  # type: ignore[no-untyped-def]
    started = getattr(session.config, "_scarcelab_smoke", None)
    if started is not None and started[0].poll() is None:
        started[0].terminate()
        started[0].wait(60)
