"""Behaviour guard for ``tracking.results.page.build_page``: the whole page (its markdown
and every field of the ``SuitePage``) built from small synthetic stores, recorded on the
implementation before it was split into helpers (issue 26: no function over ~60 lines).
``tests/reference/results_page_guard.json`` is that implementation's output, not values
derived from a contract: a refactor of the page must reproduce it exactly; a deliberate
change of behaviour re-records it (``python tests/tracking/results/test_results_page_guard.py``).

What varies from run to run is normalised before the comparison, so that only what the code
decides is recorded: run ids become the names the scenario gave the runs, the temporary
store's path becomes ``<tmp>``, the checkout's ``<repo>``, and the generation time is fixed.

The scenarios: a tune_it sweep with cells in every state (finished with and without a CPU
record, failed with a long error, an attempt a dead driver left, running while the sweep
is live and failed once it is not, not run), built by the real section code; every entry
kind at once, whose section builders are stand-ins that record what they were given (the
dispatch, its order and the runs each builder sees); cell runs without a sweep run; the
spec read from its file; and the two errors."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
REF_PATH = Path(__file__).resolve().parents[2] / "reference" / "results_page_guard.json"
T0 = 1_700_000_000_000  # ms: every synthetic run starts at or after this


class _FixedClock(datetime):
    """``datetime`` with a fixed ``now``: the page's generation time is not behaviour."""

    @classmethod
    def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
        return datetime(2030, 1, 2, 3, 4, tzinfo=tz)


class _Store:
    """A sqlite store made the tracking URI, with named runs (names replace run ids in what
    is recorded)."""

    def __init__(self, tmp: Path) -> None:
        import mlflow
        from mlflow.tracking import MlflowClient

        self.tmp = tmp
        self.prev = mlflow.get_tracking_uri()
        self.uri = f"sqlite:///{tmp / 'm.db'}"
        mlflow.set_tracking_uri(self.uri)
        self.client = MlflowClient()
        self.names: dict[str, str] = {}

    def run(self, exp: str, name: str, start: int, tags: dict[str, str],
            status: str | None = None, end: int | None = None,
            metrics: dict[str, float] | None = None) -> Any:
        r = self.client.create_run(exp, start_time=T0 + start, tags=tags)
        rid = r.info.run_id
        self.names[rid] = name
        for k, v in (metrics or {}).items():
            self.client.log_metric(rid, k, v, timestamp=T0 + start, step=0)
        if status is not None:
            self.client.set_terminated(rid, status, end_time=None if end is None else T0 + end)
        return r

    def normalise(self, value: Any) -> Any:
        if isinstance(value, str):
            for rid, name in self.names.items():
                value = value.replace(rid, f"<run {name}>")
            return value.replace(str(self.tmp), "<tmp>").replace(str(REPO), "<repo>")
        if isinstance(value, dict):
            return {self.normalise(k): self.normalise(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.normalise(v) for v in value]
        return value


def _record(page: Any, store: _Store) -> dict[str, Any]:
    """Every field of a page that the store decides, normalised."""
    import hashlib

    out = {
        "suite": page.suite, "spec": [page.spec.name, page.spec.scale, page.spec.experiment,
                                      [c.id for c in page.spec.cells]],
        "paper": str(Path(page.paper.path).relative_to(REPO)),
        "experiment": page.experiment, "uri": page.uri, "sweep_run_id": page.sweep_run_id,
        "provenance": page.provenance, "counts": page.counts,
        "sections": [[s.title, s.text, sorted(s.figures), s.csv] for s in page.sections],
        "figure_bytes": {k: len(v) > 0 and v[:4] == b"\x89PNG" for k, v in
                         page.figures.items()},
        "comparisons": [[s.title, s.text, s.figures, s.csv] for s in page.comparisons],
        "verdicts": [dataclasses.asdict(v) for v in page.verdicts],
        "rows_per_method": page.rows_per_method, "missing": page.missing,
        "wall_s": page.wall_s, "cpu_s": page.cpu_s, "commits": page.commits,
        "generated": page.generated, "markdown": page.markdown,
    }
    out = store.normalise(out)
    out["markdown_sha256"] = hashlib.sha256(out["markdown"].encode()).hexdigest()
    return out


def _tags(spec: Any, cell: Any, **extra: str) -> dict[str, str]:
    from scarcelab import tags as T

    return {T.SWEEP: spec.name, T.CELL: cell.id, **extra}


def _machine(cores: str, host: str) -> dict[str, str]:
    from scarcelab import tags as T

    return {f"{T.MACHINE}.cores": cores, f"{T.MACHINE}.cpu": "Fake CPU",
            f"{T.MACHINE}.ram_gb": "15.6", f"{T.MACHINE}.gpu": "none",
            f"{T.MACHINE}.host": host}


def _states(st: _Store) -> Iterator[tuple[str, Any]]:
    """tune_it's smoke, its first 7 cells in every state a cell can be in; yields the page
    while the sweep runs and once it has ended."""
    from scarcelab import tags as T
    from scarcelab.tracking.results import page as P
    from scarcelab.tracking.sweep.driver import CELL_CPU, INVOCATION_WALL, STALE_MARK
    from scarcelab.tracking.sweep.spec import load_spec

    path = REPO / "suites" / "tune_it.yaml"
    spec = load_spec(path, smoke=True)
    spec = dataclasses.replace(spec, cells=spec.cells[:7])
    c = st.client
    try:
        exp = c.create_experiment(spec.experiment)
        sweep = st.run(exp, "sweep", 0, {T.SWEEP: spec.name, "scarcelab.role": "sweep",
                                          T.SWEEP_COMMAND: "scarcelab sweep suites/tune_it.yaml "
                                          "--smoke --jobs 2", T.SWEEP_INVOCATIONS: "2"})
        for step, v in enumerate((100.0, 250.5)):
            c.log_metric(sweep.info.run_id, INVOCATION_WALL, v, timestamp=T0, step=step)
        cl = spec.cells
        commit = "0123456789abcdef0123456789abcdef01234567"
        # cell 0: a failed attempt, then a finished one (dirty tree, with its CPU time)
        st.run(exp, "c0-failed", 1_000, _tags(spec, cl[0], **{"scarcelab.error": "boom"}),
               "FAILED", 5_000, {CELL_CPU: 2.5})
        st.run(exp, "c0", 10_000, _tags(spec, cl[0], **{
            "mlflow.source.git.commit": commit + "+dirty", **_machine("4", "a")}),
               "FINISHED", 70_000, {CELL_CPU: 40.25})
        # cell 1: finished on another commit and machine, without a CPU record
        done1 = st.run(exp, "c1", 20_000, _tags(spec, cl[1], **{
            "mlflow.source.git.commit": "fedcba9876543210", **_machine("8", "b")}),
               "FINISHED", 3_800_000)
        st.run(exp, "c1-trial", 21_000, {"mlflow.parentRunId": done1.info.run_id,
                                         "scarcelab.role": "trial"}, "FINISHED", 30_000)
        # cell 2: finished on the first commit and machine again
        st.run(exp, "c2", 30_000, _tags(spec, cl[2], **{
            "mlflow.source.git.commit": commit + "+dirty", **_machine("4", "a")}),
               "FINISHED", 90_000, {CELL_CPU: 7.0})
        # cell 3: two failed attempts, the last with an error longer than the page shows
        st.run(exp, "c3-a", 40_000, _tags(spec, cl[3], **{"scarcelab.error": "first"}),
               "FAILED", 41_000, {CELL_CPU: 1.0})
        st.run(exp, "c3-b", 42_000, _tags(spec, cl[3], **{
            "scarcelab.error": "Traceback | line\n" + "x" * 400}), "FAILED", 50_000)
        # cell 4: left RUNNING by a dead driver, closed hours later at takeover
        dead = st.run(exp, "c4", 60_000, _tags(spec, cl[4], **{
            "scarcelab.error": f"the sweep driver d {STALE_MARK}; run again"}))
        st.run(exp, "c4-study", 61_000, {"mlflow.parentRunId": dead.info.run_id},
               "FINISHED", 65_000)
        c.set_terminated(dead.info.run_id, "FAILED", end_time=T0 + 4 * 3_600_000)
        # cell 5: its attempt RUNNING (queued or running while the sweep is live)
        st.run(exp, "c5", 80_000, _tags(spec, cl[5]))
        # cell 6: not run
        yield "states_live", _record(P.build_page(path, "smoke", spec=spec), st)
        c.set_terminated(sweep.info.run_id, "FAILED", end_time=T0 + 5_000_000)
        yield "states_ended", _record(P.build_page(path, "smoke", spec=spec), st)
        # the spec read from the file (all smoke cells), and the URI passed explicitly
        import mlflow

        mlflow.set_tracking_uri(st.prev)
        yield "spec_from_file", _record(P.build_page(path, "smoke", tracking_uri=st.uri),
                                        st)
    finally:
        import mlflow

        mlflow.set_tracking_uri(st.uri)


def _all_entries(st: _Store, monkeypatch: pytest.MonkeyPatch
                 ) -> Iterator[tuple[str, Any]]:
    """A spec with a cell of every entry kind, every one finished: which section builders
    run, in which order, with which runs (the builders are stand-ins that say so)."""
    from scarcelab import tags as T
    from scarcelab.tracking.results import claims as C
    from scarcelab.tracking.results import page as P
    from scarcelab.tracking.sweep.spec import load_spec

    cells = []
    for suite in ("ssl_vs_ssl", "cdalbench", "cscore", "tune_it", "pathology"):
        sp = load_spec(REPO / "suites" / f"{suite}.yaml", smoke=True)
        seen: set[str] = set()
        for cell in sp.cells:
            if cell.entry not in seen:
                seen.add(cell.entry)
                cells.append(cell)
    calls: list[str] = []

    def ids(t: Any) -> str:
        return ",".join(sorted(st.names.get(r, r) for r in t.runs["run_id"]))

    def names(rs: Any) -> str:
        return ",".join(st.names[r.info.run_id] for r in rs)

    def stub(kind: str) -> Any:
        def make(*args: Any, **kw: Any) -> list[Any]:
            data = next(a for a in args if isinstance(a, C.SuiteData))
            if kind == "tune":
                data.retrains = pd.DataFrame({"dataset": ["cifair10"] * 2,
                                              "method": ["ce"] * 2, "study_id": "s",
                                              "score": [0.5, 0.6]})
            shown = []
            for a in args:
                if hasattr(a, "runs") and hasattr(a, "with_runs"):
                    shown.append(f"t={ids(a)}")
                elif isinstance(a, list):
                    shown.append(f"cells={names(a)}")
                elif isinstance(a, str):
                    shown.append(f"uri={a}")
            shown += [f"{k}={v}" for k, v in sorted(kw.items())]
            calls.append(kind)
            return [P.Section(f"{kind} section", "; ".join(shown),
                              {f"{kind}_fig": b"\x89PNG-" + kind.encode()},
                              {kind: "a,b\n1,2\n"})]
        return make

    for kind in ("study", "al", "contamination", "tune", "transfer"):
        monkeypatch.setattr(P, f"_{kind}_sections", stub(kind))
    spec = dataclasses.replace(load_spec(REPO / "suites" / "tune_it.yaml", smoke=True),
                               cells=cells, experiment="all-entries")
    c = st.client
    exp = c.create_experiment(spec.experiment)
    st.run(exp, "sweep", 0, {T.SWEEP: spec.name, "scarcelab.role": "sweep"},
           "FINISHED", 900_000)
    other = st.run(exp, "unrelated", 0, {"scarcelab.role": "study"}, "FINISHED", 10)
    st.run(exp, "unrelated-child", 0, {"mlflow.parentRunId": other.info.run_id},
           "FINISHED", 10)
    for i, cell in enumerate(cells):
        r = st.run(exp, f"{cell.entry}{i}", 1_000 * i, _tags(spec, cell), "FINISHED",
                   1_000 * i + 500)
        st.run(exp, f"{cell.entry}{i}-child", 1_000 * i, {
            "mlflow.parentRunId": r.info.run_id}, "FINISHED", 1_000 * i + 100)
    page = P.build_page(REPO / "suites" / "tune_it.yaml", "smoke", spec=spec)
    yield "all_entries", {**_record(page, st), "calls": list(calls)}
    # a transfer suite: the studies give the encoders only
    calls.clear()
    keep = [c for c in cells if c.entry in ("self", "probe")]
    page = P.build_page(REPO / "suites" / "tune_it.yaml", "smoke",
                        spec=dataclasses.replace(spec, cells=keep))
    yield "transfer_suite", {**_record(page, st), "calls": list(calls)}


def _no_sweep_run(st: _Store) -> Iterator[tuple[str, Any]]:
    """Cell runs but no sweep run (the sweep run deleted, say): no command, no invocation
    count, the sweep id '—'; the reference scale's flag-free command."""
    from scarcelab.tracking.results import page as P
    from scarcelab.tracking.sweep.spec import load_spec

    path = REPO / "suites" / "cdalbench.yaml"
    spec = load_spec(path)
    spec = dataclasses.replace(spec, cells=spec.cells[:3])
    exp = st.client.create_experiment(spec.experiment)
    st.run(exp, "only", 0, _tags(spec, spec.cells[0]), "FINISHED", 2_000)
    st.run(exp, "queued", 0, _tags(spec, spec.cells[1]))
    yield "no_sweep_run", _record(P.build_page(path, "reference", spec=spec), st)


def _errors(st: _Store) -> dict[str, str]:
    """The two errors, their type and message (the store's path normalised); first, while
    the store holds no experiment."""
    from scarcelab.tracking.results import page as P
    from scarcelab.tracking.sweep.spec import load_spec

    out = {}
    for scale in ("reference", "full", "smoke"):
        path = REPO / "suites" / "cscore.yaml"
        try:
            P.build_page(path, scale)
        except Exception as e:  # noqa: BLE001 - the type is what is recorded
            out[f"no_experiment_{scale}"] = f"{type(e).__name__}: {st.normalise(str(e))}"
    spec = load_spec(REPO / "suites" / "cscore.yaml", full=True)
    st.client.create_experiment(spec.experiment)
    try:
        P.build_page(REPO / "suites" / "cscore.yaml", "full", experiment=spec.experiment)
    except Exception as e:  # noqa: BLE001
        out["no_sweep"] = f"{type(e).__name__}: {st.normalise(str(e))}"
    return out


def _everything(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    from scarcelab.tracking.results import page as P

    monkeypatch.setattr(P, "datetime", _FixedClock)
    import mlflow

    out: dict[str, Any] = {}
    st = _Store(tmp)  # one store (each new sqlite store costs seconds of migrations)
    try:
        out["errors"] = _errors(st)
        out.update(_states(st))
        out.update(_no_sweep_run(st))
        out.update(_all_entries(st, monkeypatch))
    finally:
        mlflow.set_tracking_uri(st.prev)
    return out


def test_the_page_is_what_it_was_before_the_split(tmp_path, monkeypatch):
    got = json.loads(json.dumps(_everything(tmp_path, monkeypatch)))
    want = json.loads(REF_PATH.read_text())
    assert got.keys() == want.keys()
    for key in want:
        if isinstance(want[key], dict) and "markdown" in want[key]:
            assert got[key]["markdown"] == want[key]["markdown"], key
        assert got[key] == want[key], key


if __name__ == "__main__":  # re-record (a deliberate change of the page)
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        mp = pytest.MonkeyPatch()
        try:
            rec = _everything(Path(d), mp)
        finally:
            mp.undo()
    REF_PATH.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
    print(f"wrote {REF_PATH}", file=sys.stderr)


def test_machine_text_says_not_recorded_instead_of_question_marks() -> None:
    from scarcelab.tracking.results.page import _machine_text

    assert _machine_text(("2", "AMD EPYC", "23.5", "none", "vm"), 9) == (
        "2 cores, AMD EPYC, 23.5 GB RAM, GPU: none (host vm; 9 cells)")
    assert _machine_text(("?",) * 5, 1) == (
        "not recorded (1 cell: no attempt of it ended under the sweep driver)")
    # a partly tagged machine keeps its known fields
    assert _machine_text(("4", "?", "?", "?", "a"), 2).startswith("4 cores, ?, ? GB RAM")
