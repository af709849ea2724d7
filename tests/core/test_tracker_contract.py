"""The Tracker contract (``tests/tracker_contract.py``) over every Tracker class of the
product code, and the guards that keep it so: a scan of the product code that fails on a
Tracker class without a contract test here, the interface against what the contract
exercises, and :class:`~scarcelab.tracker.DelegatingTracker` against the interface."""

from __future__ import annotations

import ast
import io
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlflow
import pytest
from conftest import REPO
from mlflow.tracking import MlflowClient
from tracker_contract import (
    EXERCISED,
    RecordingSupplier,
    Seen,
    SeenTrial,
    Supplier,
    TrackerContract,
    seen_in_memory,
)

from scarcelab.entrypoints._progress import QUIET, Display, ProgressTracker
from scarcelab.entrypoints.contamination import ChildStudyTracker
from scarcelab.protocols.contamination import TaggingTracker, _ParamsAfterTransform
from scarcelab.tracker import DelegatingTracker, InMemoryTracker, ResumeState, Tracker
from scarcelab.tracking import mlflow_tracker
from scarcelab.tracking.mlflow_tracker import MlflowTracker
from scarcelab.tracking.spool import Spool

# -- suppliers -------------------------------------------------------------------------------


class InMemorySupplier(Supplier):
    def __init__(self) -> None:
        self.tracker = InMemoryTracker()

    def seen(self) -> Seen:
        assert isinstance(self.tracker, InMemoryTracker)
        return seen_in_memory(self.tracker)


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


class MlflowSupplier(Supplier):
    """:class:`MlflowTracker` on a sqlite store, read back with the client API."""

    persistent = True
    # an exported model costs ~10 s per call (torch.export + log_model); it is checked,
    # end to end, in tests/tracking/test_mlflow_tracking.py::test_study_and_trials_land_in_mlflow
    checks_model = False

    def __init__(self, tmp_path: Path) -> None:
        self.experiment = f"contract-{tmp_path.name}"  # one store, an experiment per test
        self.tracker = MlflowTracker(experiment=self.experiment,
                                     spool_root=tmp_path / "spool")
        self.client = MlflowClient()
        self.killed: str | None = None

    def _history(self, run_id: str, keys: Any) -> dict[str, list[tuple[int, float]]]:
        return {k: [(m.step, m.value) for m in sorted(self.client.get_metric_history(
            run_id, k), key=lambda m: (m.timestamp, m.step))] for k in keys}

    def seen(self) -> Seen:
        assert isinstance(self.tracker, MlflowTracker)
        rid = self.tracker.study_run_id
        assert rid is not None
        run = self.client.get_run(rid)
        kids = self.client.search_runs([run.info.experiment_id],
                                       f"tags.`mlflow.parentRunId` = '{rid}'")
        trials = [SeenTrial(int(k.data.tags["scarcelab.trial"]), dict(k.data.tags),
                            dict(k.data.params), self._history(k.info.run_id, k.data.metrics),
                            k.info.status, k.data.tags.get("scarcelab.error")) for k in kids]

        def names(path: str | None) -> list[str]:
            return [a.path for a in self.client.list_artifacts(rid, path)]

        top = names(None)
        plots = names("plots") if "plots" in top else []
        ev = self.tracker._rv()["eval"]  # what the ROC figure was drawn with
        evaluations = [("test", ev[4])] if "plots/test_roc.png" in plots else []
        models = mlflow.search_logged_models(experiment_ids=[run.info.experiment_id],
                                             output_format="list")
        return Seen(dict(run.data.tags), dict(run.data.params),
                    self._history(rid, run.data.metrics), run.info.status, trials,
                    checkpoints=[p.rsplit("/", 1)[-1] for p in names("checkpoints")]
                    if "checkpoints" in top else [],
                    images=names("overlays") if "overlays" in top else [],
                    evaluations=evaluations,
                    searched=any(p.startswith("plots/search_") for p in plots),
                    model=any(m.source_run_id == rid for m in models),
                    artifacts=[p for p in top if p.endswith(".json")])

    def kill_study(self, key: str) -> ResumeState | None:
        from mlflow.entities import Metric

        exp = mlflow_tracker._experiment_id(self.experiment)
        tags = {"scarcelab.role": "study", "scarcelab.study_key": key,
                "scarcelab.optuna_study": f"optuna-{key}",
                "scarcelab.owner": f"{socket.gethostname()}:{_dead_pid()}"}
        run = self.client.create_run(exp, tags=tags, run_name="killed")
        self.killed = run.info.run_id
        ms = [Metric("time/elapsed_s", v, 0, s) for s, v in ((0, 5.0), (1, 12.5))]
        ms += [Metric("best/val_balanced_accuracy", 0.5, 0, s) for s in range(3)]
        self.client.log_batch(self.killed, metrics=ms)
        for n in (0, 1):
            self.client.create_run(exp, tags={
                **tags, "scarcelab.role": "trial", "scarcelab.trial": str(n),
                "mlflow.parentRunId": self.killed})
        return ResumeState(optuna_study=f"optuna-{key}", elapsed_s=12.5, global_epoch=3,
                           best_checkpoint=None)

    def orphan_statuses(self) -> dict[int, str] | None:
        assert self.killed is not None
        exp = self.client.get_run(self.killed).info.experiment_id
        kids = self.client.search_runs([exp], f"tags.`mlflow.parentRunId` = '{self.killed}'")
        return {int(k.data.tags["scarcelab.trial"]): k.info.status for k in kids}


class Outage:
    """``deliver_op`` behind a server that is down for the first ``n`` deliveries after
    the study run exists: every record of those goes through the spool's journal."""

    def __init__(self, n: int) -> None:
        self.left, self.failed, self.journaled = n, 0, 0
        self.deliver = mlflow_tracker.deliver_op

    def __call__(self, op: dict[str, Any], ids: dict[str, str]) -> str | None:
        if self.left > 0:
            self.left -= 1
            self.failed += 1
            raise ConnectionError("connection refused (a simulated outage)")
        self.journaled += bool(op.get("_replay"))
        return self.deliver(op, ids)


class SpoolSupplier(MlflowSupplier):
    """:class:`MlflowTracker` whose records go through its spool's journal: the store is
    treated as remote and is down for the first deliveries (tracking/spool.py)."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.outage = Outage(3)
        monkeypatch.setattr("scarcelab.tracking.spool.RETRY_INTERVAL_S", 0.0)
        monkeypatch.setattr(mlflow_tracker, "deliver_op", self.outage)
        monkeypatch.setattr(mlflow_tracker, "Spool",
                            lambda uri, deliver, root=None, **kw: Spool(
                                uri, deliver, root=root, remote=True))
        super().__init__(tmp_path)

    def seen(self) -> Seen:
        assert self.outage.failed == 3 and self.outage.journaled > 0, "no outage happened"
        return super().seen()


# -- the contract, per implementation ------------------------------------------------------


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One sqlite store for the module (creating one costs seconds of migrations)."""
    return f"sqlite:///{tmp_path_factory.mktemp('contract')}/mlflow.db"


@pytest.fixture
def store(database: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    uri = database
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("SCARCELAB_SYSTEM_METRICS", "0")
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    mlflow.set_tracking_uri(uri)
    yield uri


class TestInMemoryTracker(TrackerContract):
    tracker_class = InMemoryTracker

    @pytest.fixture
    def supplier(self) -> Supplier:
        return InMemorySupplier()


class TestMlflowTracker(TrackerContract):
    tracker_class = MlflowTracker

    @pytest.fixture
    def supplier(self, store: str, tmp_path: Path) -> Supplier:
        return MlflowSupplier(tmp_path)


class TestSpoolBackedMlflowTracker(TrackerContract):
    tracker_class = MlflowTracker

    @pytest.fixture
    def supplier(self, store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                 ) -> Supplier:
        return SpoolSupplier(tmp_path, monkeypatch)


class TestDelegatingTracker(TrackerContract):
    tracker_class = DelegatingTracker

    @pytest.fixture
    def supplier(self) -> Supplier:
        return RecordingSupplier(DelegatingTracker)


class TestTaggingTracker(TrackerContract):
    tracker_class = TaggingTracker

    @pytest.fixture
    def supplier(self) -> Supplier:
        return RecordingSupplier(lambda inner: TaggingTracker(
            inner, {"scarcelab.ood": "mnist", "scarcelab.ratio": "0.5"}, {"extra": 1}))

    def test_adds_its_tags_and_params(self, supplier: Supplier) -> None:
        self.test_study_with_trials_tags_and_statuses_is_recorded(supplier)
        s = supplier.seen()
        assert s.study_tags["scarcelab.ratio"] == "0.5" and s.study_params["extra"] == "1"
        assert all(t.tags["scarcelab.ood"] == "mnist" for t in s.trials)


def _bench_gpu() -> Any:
    """bench/gpu.py as the module ``bench.gpu`` (the name the product scan gives it)."""
    import importlib.util
    import sys

    if "bench.gpu" not in sys.modules:
        spec = importlib.util.spec_from_file_location("bench.gpu", REPO / "bench" / "gpu.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules["bench.gpu"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["bench.gpu"]


class TestBenchTimedTracker(TrackerContract):
    """The GPU bench's wrapper that times a study's tracking calls (bench/gpu.py)."""

    tracker_class = _bench_gpu().TimedTracker

    @pytest.fixture
    def supplier(self) -> Supplier:
        return RecordingSupplier(lambda inner: _bench_gpu().TimedTracker(inner))

    def test_times_the_trial_and_its_tracking_calls(self, supplier: Supplier) -> None:
        self.test_study_with_trials_tags_and_statuses_is_recorded(supplier)
        t = supplier.tracker  # type: ignore[attr-defined]
        assert t.trial_s > 0 and t.track_s >= 0 and t.window[1] >= t.window[0] > 0


class TestParamsAfterTransform(TrackerContract):
    tracker_class = _ParamsAfterTransform

    @pytest.fixture
    def supplier(self) -> Supplier:
        return RecordingSupplier(lambda inner: _ParamsAfterTransform(
            inner, {"scarcelab.ood": "mnist", "scarcelab.ratio": "0.5"}, {"n_ood": 3}))

    def test_logs_the_counts_known_at_start(self, supplier: Supplier) -> None:
        self.test_metrics_batch_equals_the_rows(supplier)
        assert supplier.seen().study_params["contamination.n_ood"] == "3"


class TestProgressTracker(TrackerContract):
    tracker_class = ProgressTracker

    @pytest.fixture
    def supplier(self) -> Supplier:
        return RecordingSupplier(lambda inner: ProgressTracker(
            inner, Display(QUIET, stream=io.StringIO()), budget_s=60.0))


class TestChildStudyTracker(TrackerContract):
    tracker_class = ChildStudyTracker

    @pytest.fixture
    def supplier(self) -> Supplier:
        return RecordingSupplier(lambda inner: ChildStudyTracker("parent-run", inner))

    def test_links_the_study_to_the_parent(self, supplier: Supplier) -> None:
        self.test_metrics_batch_equals_the_rows(supplier)
        assert supplier.seen().study_tags["mlflow.parentRunId"] == "parent-run"


# -- the guards ---------------------------------------------------------------------------


def _public(cls: type) -> set[str]:
    return {n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n))}


def test_the_contract_exercises_every_method_of_the_interface() -> None:
    assert _public(Tracker) == EXERCISED


def test_delegating_tracker_defines_every_method_of_the_interface() -> None:
    """Forwarding is explicit: a method it did not define would fall back to Tracker's
    no-op default, not to the inner tracker."""
    missing = sorted(n for n in _public(Tracker) if n not in DelegatingTracker.__dict__)
    assert not missing, f"DelegatingTracker does not forward {missing}"


def test_delegating_tracker_forwards_attributes_outside_the_interface() -> None:
    inner = InMemoryTracker()
    inner.study_run_id = "abc"  # type: ignore[attr-defined]
    outer = ProgressTracker(TaggingTracker(DelegatingTracker(inner), {}),
                            Display(QUIET, stream=io.StringIO()))
    assert outer.study_run_id == "abc" and getattr(outer, "spool_left", None) is None
    with pytest.raises(AttributeError):
        outer.no_such_attribute  # noqa: B018


PRODUCT = ("scarcelab", "tracking", "entrypoints", "bench", "scripts")


def _tracker_classes() -> set[str]:
    """``module:Class`` of every class in the product code that derives from Tracker,
    directly or through another such class (by name, across files; nested classes too)."""
    classes: list[tuple[str, str, list[str]]] = []
    for folder in PRODUCT:
        for path in sorted((REPO / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            mod = path.relative_to(REPO).with_suffix("").as_posix().replace("/", ".")
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    bases = [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "")
                             for b in node.bases]
                    classes.append((mod, node.name, bases))
    trackers = {"Tracker"}
    while True:
        more = {name for _, name, bases in classes if set(bases) & trackers} - trackers
        if not more:
            break
        trackers |= more
    return {f"{mod}:{name}" for mod, name, bases in classes if set(bases) & trackers}


def _module(cls: type) -> str:
    """``scarcelab.tracking.x`` -> ``tracking.x``: the file the scan found it in."""
    m = cls.__module__
    for mapped in ("tracking", "entrypoints"):
        m = m.replace(f"scarcelab.{mapped}", mapped, 1) if m.startswith(
            f"scarcelab.{mapped}") else m
    return m


def test_every_tracker_class_of_the_product_code_has_a_contract_test() -> None:
    covered = {f"{_module(c.tracker_class)}:{c.tracker_class.__name__}"
               for c in globals().values()
               if isinstance(c, type) and issubclass(c, TrackerContract)
               and c is not TrackerContract}
    found = _tracker_classes()
    assert {"scarcelab.tracker:InMemoryTracker",
            "entrypoints.contamination:ChildStudyTracker"} <= found  # the scan works
    missing = sorted(found - covered)
    assert not missing, (f"Tracker classes without a contract test: {missing}; add a "
                         "TrackerContract subclass for each in tests/core/test_tracker_contract.py")
