"""A suite's tracked runs as a small file in the repository, so that its page outlives the
machine (and the tracking store) that ran it.

    scarcelab results suites/cdalbench.yaml --export docs/results/exports   # page + export
    scarcelab results suites/cdalbench.yaml --from-export docs/results/exports  # no store

Why a recording and not a list of columns: the page reads the store through two doors, the
MLflow client (the sweep's runs, a cell's attempts, the runs nested under one, a few metric
histories) and the query layer's :class:`~scarcelab.tracking.query.store.StoreReader` (the
tidy frame the views compute on, and the histories of the study records). :func:`export`
builds the page from the store through :class:`_Recorder`, which keeps exactly what those
doors answered for this page (the runs of the sweep and what they nested, the metric
histories read); :func:`load_export` gives the same answers back from the file through
:class:`ExportSource` (a client and a reader that only read it). Both sources feed the one
page builder (``tracking/results/page.py::build_page``), so an export holds only what the
page needs and everything it needs: a page that read something else would differ from its
store's, and ``tests/tracking/results/test_results_export.py`` compares the two.

The file (``<suite>.json.gz``, or ``.json``; docs/results/README.md has the format): one
JSON object, keys sorted, gzip without a timestamp, so the same store gives the same bytes.

- ``schema``: :data:`SCHEMA`; a file of another schema is refused.
- ``suite``, ``scale``, ``experiment``, ``sweep`` (the sweep's name), ``spec`` (the spec
  file as the page names it), ``store`` (the tracking URI without credentials),
  ``exported`` (UTC).
- ``cells``: the cells of the sweep as run, in the spec's order, each ``{"id", "entry",
  "grid", "options": [[name, value], ...], "refs": [[option, cell id], ...]}`` (the id is
  recomputed on reading and must match): the page of an export is the page of those
  cells, even after the spec file has changed.
- ``runs``: one object per run, sorted by (start time, run id): ``run_id``,
  ``experiment_id``, ``run_name``, ``status``, ``start_time``, ``end_time`` (ms),
  ``tags``, ``params`` (strings) and ``metrics`` (each key's latest value).
- ``histories``: ``{run_id: {key: [[step, value], ...]}}`` in logging order, only the
  series the page read.

Numbers that JSON cannot hold (NaN, ±inf) are the strings ``"nan"``, ``"inf"`` and
``"-inf"``. The reader parses JSON only (nothing is unpickled or evaluated) and a file it
cannot read is one line naming it (:class:`ExportError`).
"""

from __future__ import annotations

import gzip
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd

from scarcelab import tags as T

SCHEMA = "scarcelab.results-export/1"


def dropped_tags() -> frozenset[str]:
    """Tags no page reads that can be long: a model's logging history, the run's notes.
    MLflow's own constants, imported here rather than at the top: reading an export needs
    no MLflow, and importing it costs most of a second."""
    from mlflow.utils.mlflow_tags import MLFLOW_LOGGED_MODELS, MLFLOW_RUN_NOTE

    return frozenset({MLFLOW_LOGGED_MODELS, MLFLOW_RUN_NOTE})


class ExportError(ValueError):
    """An export that cannot be read or does not fit the request: one line, naming the
    file."""


# -- numbers JSON can hold -------------------------------------------------------------------
def _num_out(v: Any) -> Any:
    if v is None:
        return None
    f = float(v)
    if math.isnan(f):
        return "nan"
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    return int(f) if isinstance(v, int | np.integer) else f


def _num_in(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        raise ExportError(f"{where}: not a number: {v!r}")
    if isinstance(v, str):
        if v not in ("nan", "inf", "-inf"):
            raise ExportError(f"{where}: not a number: {v!r}")
        return float(v)
    return float(v)


# -- run objects, as the MLflow client gives them -----------------------------------------
@dataclass
class RunInfo:
    run_id: str
    experiment_id: str
    run_name: str | None
    status: str
    start_time: int | None
    end_time: int | None
    lifecycle_stage: str = "active"


@dataclass
class RunData:
    tags: dict[str, str]
    params: dict[str, str]
    metrics: dict[str, float]


@dataclass
class Run:
    """What the page reads of an MLflow ``Run`` (``info`` and ``data``)."""

    info: RunInfo
    data: RunData


@dataclass
class Metric:
    key: str
    value: float
    step: int
    timestamp: int = 0


def _run_of(r: Any) -> Run:
    i, d = r.info, r.data
    dropped = dropped_tags()
    return Run(RunInfo(i.run_id, str(i.experiment_id), i.run_name, i.status, i.start_time,
                       i.end_time),
               RunData({k: v for k, v in d.tags.items() if k not in dropped},
                       dict(d.params), {k: float(v) for k, v in d.metrics.items()}))


# -- recording what the page reads from a store -----------------------------------------------
@dataclass
class _Record:
    runs: dict[str, Run] = field(default_factory=dict)
    #: (run id, key) -> [(step, value)] in logging order
    histories: dict[tuple[str, str], list[tuple[int, float]]] = field(default_factory=dict)


class _RecordingClient:
    """An MLflow client whose answers are also kept in ``rec``."""

    def __init__(self, client: Any, rec: _Record) -> None:
        self._c, self._rec = client, rec

    def get_experiment_by_name(self, name: str) -> Any:
        return self._c.get_experiment_by_name(name)

    def _keep(self, r: Any) -> Any:
        self._rec.runs.setdefault(r.info.run_id, _run_of(r))
        return r

    def search_runs(self, *args: Any, **kw: Any) -> list[Any]:
        return [self._keep(r) for r in self._c.search_runs(*args, **kw)]

    def get_run(self, run_id: str) -> Any:
        return self._keep(self._c.get_run(run_id))

    def get_metric_history(self, run_id: str, key: str) -> list[Any]:
        hist = self._c.get_metric_history(run_id, key)
        self._rec.histories[(run_id, key)] = [
            (int(m.step), float(m.value)) for m in sorted(hist, key=lambda m: m.timestamp)]
        return hist


class _RecordingReader:
    """A :class:`StoreReader` whose frames are also kept: the run frames whole (cut to the
    sweep's runs when the export is written), the histories as read."""

    def __init__(self, reader: Any, rec: _Record) -> None:
        self._r, self._rec = reader, rec
        self.uri = reader.uri
        self.frames: dict[str, pd.DataFrame] = {}

    def experiment_ids(self, names: Sequence[str]) -> dict[str, str]:
        return self._r.experiment_ids(names)

    def _keep(self, kind: str, df: pd.DataFrame) -> pd.DataFrame:
        old = self.frames.get(kind)
        self.frames[kind] = df if old is None else pd.concat([old, df], ignore_index=True)
        return df

    def runs(self, experiment_ids: Sequence[str], role: str | None = None) -> pd.DataFrame:
        return self._keep("runs", self._r.runs(experiment_ids, role))

    def tags(self, experiment_ids: Sequence[str], role: str | None = None) -> pd.DataFrame:
        return self._keep("tags", self._r.tags(experiment_ids, role))

    def params(self, experiment_ids: Sequence[str], role: str | None = None) -> pd.DataFrame:
        return self._keep("params", self._r.params(experiment_ids, role))

    def latest_metrics(self, experiment_ids: Sequence[str], role: str | None = None
                       ) -> pd.DataFrame:
        return self._keep("metrics", self._r.latest_metrics(experiment_ids, role))

    def histories(self, run_ids: Sequence[str] | None, experiment_ids: Sequence[str],
                  keys: Sequence[str] = (), prefixes: Sequence[str] = (),
                  steps: Sequence[int] | None = None) -> pd.DataFrame:
        h = self._r.histories(run_ids, experiment_ids, keys, prefixes, steps)
        for (rid, key), part in h.groupby(["run_id", "key"], sort=False):
            got = self._rec.histories.setdefault((str(rid), str(key)), [])
            have = set(got)
            got += [p for p in zip(part["step"].astype(int), part["value"].astype(float),
                                   strict=True) if p not in have]
        return h

    def runs_of(self, keep: set[str]) -> list[Run]:
        """The recorded frames' runs among ``keep``, as run objects."""
        runs = self.frames.get("runs")
        if runs is None:
            return []
        runs = runs[runs["run_id"].isin(keep)].drop_duplicates("run_id")
        kv: dict[str, dict[str, dict[str, Any]]] = {}
        dropped = dropped_tags()
        for kind in ("tags", "params", "metrics"):
            df = self.frames.get(kind)
            if df is None:
                continue
            df = df[df["run_id"].isin(keep)].drop_duplicates(["run_id", "key"])
            for rid, key, value in zip(df["run_id"], df["key"], df["value"], strict=True):
                if kind == "tags" and key in dropped:
                    continue
                kv.setdefault(kind, {}).setdefault(rid, {})[key] = (
                    float(value) if kind == "metrics" and value is not None else
                    (math.nan if kind == "metrics" else value))
        out = []
        for r in runs.itertuples(index=False):
            def ms(v: Any) -> int | None:
                return None if v is None or pd.isna(v) else int(v)

            # the runs frame's text columns (RUN_COLUMNS): ids, names and statuses
            rid, status = cast("str", r.run_id), cast("str", r.status)
            out.append(Run(RunInfo(rid, str(r.experiment_id), cast("str | None", r.run_name),
                                   status, ms(r.start_time), ms(r.end_time)),
                           RunData(kv.get("tags", {}).get(rid, {}),
                                   kv.get("params", {}).get(rid, {}),
                                   kv.get("metrics", {}).get(rid, {}))))
        return out


def _nested(runs: Iterable[Run], roots: set[str]) -> set[str]:
    """``roots`` and the runs nested under them at any depth."""
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

    kids: dict[str, list[str]] = {}
    for r in runs:
        p = r.data.tags.get(MLFLOW_PARENT_RUN_ID)
        if p:
            kids.setdefault(p, []).append(r.info.run_id)
    out, todo = set(), list(roots)
    while todo:
        rid = todo.pop()
        if rid not in out:
            out.add(rid)
            todo += kids.get(rid, [])
    return out


# -- the file ---------------------------------------------------------------------------------
def _run_json(r: Run) -> dict[str, Any]:
    i, d = r.info, r.data
    return {"run_id": i.run_id, "experiment_id": i.experiment_id, "run_name": i.run_name,
            "status": i.status, "start_time": i.start_time, "end_time": i.end_time,
            "tags": dict(d.tags), "params": dict(d.params),
            "metrics": {k: _num_out(v) for k, v in d.metrics.items()}}


def dumps(doc: dict[str, Any]) -> bytes:
    """The export as its file's bytes: keys sorted, compact, one run per line."""
    runs = doc.get("runs", [])
    head = {k: v for k, v in doc.items() if k != "runs"}
    lines = [json.dumps(r, sort_keys=True, separators=(",", ":"), allow_nan=False)
             for r in runs]
    body = json.dumps({**head, "runs": []}, sort_keys=True, separators=(",", ":"),
                      allow_nan=False)
    # the runs one per line (a diff of two exports reads per run)
    return body.replace('"runs":[]', '"runs":[\n' + ",\n".join(lines) + "\n]").encode() + b"\n"


def write_export(doc: dict[str, Any], path: str | Path) -> Path:
    """Write ``doc``; gzip (mtime 0: same bytes for the same runs) when ``path`` ends in
    ``.gz``."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    data = dumps(doc)
    if p.suffix == ".gz":
        data = gzip.compress(data, compresslevel=9, mtime=0)
    p.write_bytes(data)
    return p


def _cell_json(c: Any) -> dict[str, Any]:
    return {"id": c.id, "entry": c.entry, "grid": c.grid,
            "options": [list(o) for o in c.options], "refs": [list(r) for r in c.refs]}


def export_doc(rec: _Record, reader: _RecordingReader | None, *, suite: str, scale: str,
               experiment: str, sweep: str, spec_path: str, cells: Sequence[Any],
               store: str, exported: str) -> dict[str, Any]:
    """What a page read from the store (``rec``, ``reader``) as the export's object: the
    runs the client answered, and those of the reader's frames nested under them."""
    runs = dict(rec.runs)
    ids = {c.id for c in cells}
    roots = {rid for rid, r in runs.items() if r.data.tags.get(T.CELL) in ids
             or (r.data.tags.get(T.SWEEP) and r.data.tags.get(T.ROLE) == "sweep")}
    if reader is not None:
        framed = reader.runs_of(set(reader.frames["runs"]["run_id"])
                                if "runs" in reader.frames else set())
        for rid in _nested(framed, roots | set(runs)):
            r = next((x for x in framed if x.info.run_id == rid), None)
            if r is not None:
                # the reader's view of a run wins: it is the frame the views computed on
                runs[rid] = r if rid not in runs else Run(
                    runs[rid].info, RunData({**runs[rid].data.tags, **r.data.tags},
                                            {**runs[rid].data.params, **r.data.params},
                                            {**runs[rid].data.metrics, **r.data.metrics}))
    order = sorted(runs.values(), key=lambda r: (r.info.start_time or 0, r.info.run_id))
    hist: dict[str, dict[str, list[list[Any]]]] = {}
    for (rid, key), pts in sorted(rec.histories.items()):
        if rid in runs and pts:
            hist.setdefault(rid, {})[key] = [[s, _num_out(v)] for s, v in pts]
    return {"schema": SCHEMA, "suite": suite, "scale": scale, "experiment": experiment,
            "sweep": sweep, "spec": spec_path, "store": store, "exported": exported,
            "cells": [_cell_json(c) for c in cells],
            "runs": [_run_json(r) for r in order], "histories": hist}


# -- reading it back ----------------------------------------------------------------------------
def _need(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise ExportError(f"{where}: missing {key!r}")
    v = obj[key]
    if not isinstance(v, kind):
        raise ExportError(f"{where}: {key!r} is {type(v).__name__}, not "
                          f"{getattr(kind, '__name__', kind)}")
    return v


def _strs(d: Any, where: str) -> dict[str, str]:
    if not isinstance(d, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                          for k, v in d.items()):
        raise ExportError(f"{where}: must map strings to strings")
    return dict(d)


def _pairs(v: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(v, list) or not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)
            for p in v):
        raise ExportError(f"{where}: must be a list of [name, value] strings")
    return tuple((a, b) for a, b in v)


def _cell_of(c: Any, where: str) -> Any:
    from scarcelab.tracking.sweep.spec import Cell

    grid = _need(c, "grid", int, where)
    cell = Cell(_need(c, "entry", str, where), _pairs(_need(c, "options", list, where),
                                                      f"{where} options"),
                grid, _pairs(_need(c, "refs", list, where), f"{where} refs"))
    if cell.id != _need(c, "id", str, where):
        raise ExportError(f"{where}: its id {c['id']} is not that of its entry and options "
                          f"({cell.id}): the file was edited")
    return cell


def _parse(doc: Any, name: str) -> ExportSource:
    if not isinstance(doc, dict):
        raise ExportError(f"{name}: not a results export (a JSON object with "
                          f"schema {SCHEMA!r})")
    schema = doc.get("schema")
    if schema != SCHEMA:
        raise ExportError(f"{name}: schema {schema!r}, this checkout reads {SCHEMA!r} "
                          "(export the store again with this checkout)")
    meta = {k: _need(doc, k, str, name) for k in ("suite", "scale", "experiment", "sweep",
                                                  "spec", "store", "exported")}
    cells = [_cell_of(c, f"{name}: cells[{i}]")
             for i, c in enumerate(_need(doc, "cells", list, name))]
    runs = []
    for i, r in enumerate(_need(doc, "runs", list, name)):
        w = f"{name}: runs[{i}]"
        times = []
        for k in ("start_time", "end_time"):
            t = r.get(k) if isinstance(r, dict) else None
            if t is not None and (isinstance(t, bool) or not isinstance(t, int)):
                raise ExportError(f"{w}: {k!r} must be an integer (ms) or null")
            times.append(t)
        name_ = r.get("run_name") if isinstance(r, dict) else None
        if name_ is not None and not isinstance(name_, str):
            raise ExportError(f"{w}: 'run_name' must be a string or null")
        metrics = _need(r, "metrics", dict, w)
        runs.append(Run(
            RunInfo(_need(r, "run_id", str, w), _need(r, "experiment_id", str, w), name_,
                    _need(r, "status", str, w), times[0], times[1]),
            RunData(_strs(_need(r, "tags", dict, w), f"{w} tags"),
                    _strs(_need(r, "params", dict, w), f"{w} params"),
                    {str(k): _num_in(v, f"{w} metrics {k}") for k, v in metrics.items()})))
    hist: dict[tuple[str, str], list[Metric]] = {}
    for rid, series in _need(doc, "histories", dict, name).items():
        if not isinstance(series, dict):
            raise ExportError(f"{name}: histories[{rid!r}] must be an object")
        for key, pts in series.items():
            w = f"{name}: histories[{rid!r}][{key!r}]"
            if not isinstance(pts, list) or not all(
                    isinstance(p, list) and len(p) == 2 and isinstance(p[0], int)
                    and not isinstance(p[0], bool) for p in pts):
                raise ExportError(f"{w}: must be a list of [step, value]")
            hist[(rid, key)] = [Metric(key, _num_in(v, w), s, n)
                                for n, (s, v) in enumerate(pts)]
    return ExportSource(path=name, runs=runs, histories=hist, cells=list(cells), **meta)


def load_export(path: str | Path) -> ExportSource:
    """Read an export (``.json`` or ``.json.gz``): JSON only; an :class:`ExportError`
    naming the file when it is not one this checkout reads."""
    p = Path(path)
    try:
        raw = p.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        doc = json.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        raise ExportError(f"{p}: no such export file") from None
    except (OSError, EOFError, UnicodeDecodeError, ValueError, RecursionError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ExportError(f"{p}: not a readable results export (gzip'd JSON): {msg}"
                          ) from None
    return _parse(doc, str(p))


# -- slices of one design --------------------------------------------------------------------
def _raw(path: str | Path) -> dict[str, Any]:
    """An export's JSON object, checked by the reader first (a file the reader refuses is
    refused here, in the same words)."""
    load_export(path)
    raw = Path(path).read_bytes()
    return json.loads((gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode())


def merge_exports(paths: Sequence[str | Path]) -> dict[str, Any]:
    """One export of a design run in slices (``scarcelab sweep SPEC --only KEY=V...``, each
    slice into its own store, each exported): the union of the slices' cells, runs and
    histories, as if one store had held them. Why a merge and not a longer run: a design of
    several hours outlives the machine session that runs it, and a store does not travel
    between sessions, while an export does (docs/sweeps.md, "A design in slices").

    Refused, naming the files: slices of another suite, scale, experiment or sweep; a run
    id in two slices (the same store exported twice); a cell finished in two slices (which
    run holds its result would be a choice the page does not show: export again without
    it). Each slice's sweep run is kept, and the page's "How it was run" lists every
    slice's command and sums their invocations (tracking/results/page.py::_provenance).
    The runs of each slice's sweep experiment take the first slice's experiment id (each
    store numbered its own), so the page reads them as one experiment."""
    if len(paths) < 2:
        raise ExportError("merging needs two exports or more (the slices of one design)")
    docs = [(str(p), _raw(p)) for p in paths]
    first_name, first = docs[0]
    for name, d in docs[1:]:
        for k in ("suite", "scale", "experiment", "sweep"):
            if d[k] != first[k]:
                raise ExportError(f"{name}: {k} {d[k]!r}, but {first_name} has {first[k]!r}: "
                                  "only the slices of one sweep merge")
    main_exp = _main_experiment(first)
    cells: dict[str, dict[str, Any]] = {}
    runs: dict[str, dict[str, Any]] = {}
    hist: dict[str, dict[str, Any]] = {}
    finished_in: dict[str, str] = {}
    # the cells in the order of the slice that lists most of them (each slice's export
    # lists the spec's cells as it was exported), then any the others add
    for _, d in sorted(docs, key=lambda nd: -len(nd[1]["cells"])):
        for c in d["cells"]:
            cells.setdefault(c["id"], c)
    for name, d in docs:
        exp = _main_experiment(d)
        for r in d["runs"]:
            rid = r["run_id"]
            if rid in runs:
                raise ExportError(f"{name}: run {rid} is in another slice too (one store "
                                  "exported twice?): merge the slices of separate stores")
            cid = r["tags"].get(T.CELL)
            if cid and r["status"] == "FINISHED" and r["tags"].get(T.ROLE) != "sweep":
                if finished_in.get(cid, name) != name:
                    raise ExportError(
                        f"{name}: cell {cid} finished in {finished_in[cid]} too: a cell is "
                        "run by one slice (re-run that slice with --only leaving it out)")
                finished_in[cid] = name
            runs[rid] = {**r, "experiment_id": main_exp} if r["experiment_id"] == exp else r
        hist.update(d["histories"])
    order = sorted(runs.values(), key=lambda r: (r.get("start_time") or 0, r["run_id"]))
    return {**{k: first[k] for k in ("schema", "suite", "scale", "experiment", "sweep",
                                      "spec")},
            "store": " + ".join(dict.fromkeys(d["store"] for _, d in docs)),
            "exported": max(d["exported"] for _, d in docs),
            "cells": list(cells.values()), "runs": order, "histories": hist}


def _main_experiment(doc: dict[str, Any]) -> str:
    """The experiment id the export's client answers for its sweep experiment."""
    return sorted({r["experiment_id"] for r in doc["runs"]} or {"0"})[0]


# -- a store made of the export ------------------------------------------------------------
_COND = re.compile(r"^\s*(tags\.`([^`]+)`|attributes\.(\w+))\s*(=|!=)\s*'((?:[^'\\]|\\.)*)'\s*$")


def _matcher(flt: str) -> Any:
    """The filters the page's reads use: ``tags.`K` = 'v'`` / ``!= 'v'`` and
    ``attributes.status = 'v'``, joined by ``and``; anything else is a programming error
    (a read the export cannot answer must not pass silently)."""
    tests = []
    for part in re.split(r"\s+and\s+", flt.strip(), flags=re.I) if flt.strip() else []:
        m = _COND.match(part)
        if m is None:
            raise NotImplementedError(f"an export answers simple tag/status filters, not "
                                      f"{part!r}")
        tag, attr, op, val = m.group(2), m.group(3), m.group(4), m.group(5)
        tests.append((tag, attr, op == "=", val))

    def ok(r: Run) -> bool:
        for tag, attr, eq, val in tests:
            have = r.data.tags.get(tag) if tag else getattr(r.info, str(attr), None)
            # MLflow: a run without the tag matches neither = nor !=
            if have is None or (have == val) != eq:
                return False
        return True
    return ok


class ExportSource:
    """An export read back, answering as the store did: :meth:`client` gives what the
    MLflow client gave the page, :meth:`reader` what the query layer's reader gave it."""

    def __init__(self, path: str, runs: list[Run], histories: dict[tuple[str, str],
                 list[Metric]], cells: list[Any], suite: str, scale: str, experiment: str,
                 sweep: str, spec: str, store: str, exported: str) -> None:
        self.path, self.runs, self.histories, self.cells = path, runs, histories, cells
        self.suite, self.scale, self.experiment, self.sweep = suite, scale, experiment, sweep
        self.spec, self.store, self.exported = spec, store, exported
        self.by_id = {r.info.run_id: r for r in runs}
        self.uri = store
        self.origin = f"the export `{path}` of its tracking store"

    def client(self) -> _ExportClient:
        return _ExportClient(self)

    def reader(self) -> _ExportReader:
        return _ExportReader(self)


@dataclass
class _Experiment:
    experiment_id: str
    name: str
    lifecycle_stage: str = "active"


class _ExportClient:
    def __init__(self, src: ExportSource) -> None:
        self.src = src

    def get_experiment_by_name(self, name: str) -> _Experiment | None:
        if name != self.src.experiment:
            return None
        ids = sorted({r.info.experiment_id for r in self.src.runs}) or ["0"]
        return _Experiment(ids[0], name)

    def search_runs(self, experiment_ids: Sequence[str], filter_string: str = "",
                    max_results: int = 1000, order_by: Sequence[str] | None = None,
                    **_: Any) -> list[Run]:
        ok = _matcher(filter_string)
        exps = {str(e) for e in experiment_ids}
        hits = [r for r in self.src.runs if r.info.experiment_id in exps and ok(r)]
        # MLflow's order: start time, newest first, then run id (the only order the page
        # asks for, by name or by default)
        if order_by not in (None, [], ["attributes.start_time DESC"]):
            raise NotImplementedError(f"an export orders by start time only, not {order_by}")
        hits.sort(key=lambda r: r.info.run_id)
        hits.sort(key=lambda r: -(r.info.start_time or 0))
        return hits[:max_results]

    def get_run(self, run_id: str) -> Run:
        if run_id not in self.src.by_id:
            raise KeyError(f"{self.src.path}: no run {run_id}")
        return self.src.by_id[run_id]

    def get_metric_history(self, run_id: str, key: str) -> list[Metric]:
        return list(self.src.histories.get((run_id, key), []))


class _ExportReader:
    """The query layer's :class:`StoreReader` over the export."""

    def __init__(self, src: ExportSource) -> None:
        self.src = src
        self.uri = src.store

    def experiment_ids(self, names: Sequence[str]) -> dict[str, str]:
        exp = _ExportClient(self.src).get_experiment_by_name
        out = {}
        for n in names:
            e = exp(n)
            if e is None:
                raise ValueError(f"{self.src.path}: holds experiment "
                                 f"{self.src.experiment!r}, not {n!r}")
            out[n] = e.experiment_id
        return out

    def _runs(self, experiment_ids: Sequence[str], role: str | None) -> list[Run]:
        exps = {str(e) for e in experiment_ids}
        return [r for r in self.src.runs if r.info.experiment_id in exps
                and (role is None or r.data.tags.get(T.ROLE) == role)]

    def runs(self, experiment_ids: Sequence[str], role: str | None = None) -> pd.DataFrame:
        from scarcelab.tracking.query.store import RUN_COLUMNS

        rows = [(r.info.run_id, r.info.experiment_id, r.info.run_name, r.info.status,
                 r.info.start_time, r.info.end_time) for r in self._runs(experiment_ids, role)]
        df = pd.DataFrame(rows, columns=RUN_COLUMNS)
        for c in ("start_time", "end_time"):
            df[c] = pd.to_numeric(df[c], errors="coerce").astype(float)
        return df

    def _kv(self, what: str, experiment_ids: Sequence[str], role: str | None
            ) -> pd.DataFrame:
        rows = [(r.info.run_id, k, v) for r in self._runs(experiment_ids, role)
                for k, v in getattr(r.data, what).items()]
        return pd.DataFrame(rows, columns=["run_id", "key", "value"], dtype=object)

    def tags(self, experiment_ids: Sequence[str], role: str | None = None) -> pd.DataFrame:
        return self._kv("tags", experiment_ids, role)

    def params(self, experiment_ids: Sequence[str], role: str | None = None) -> pd.DataFrame:
        return self._kv("params", experiment_ids, role)

    def latest_metrics(self, experiment_ids: Sequence[str], role: str | None = None
                       ) -> pd.DataFrame:
        rows = [(r.info.run_id, k, float(v), np.nan) for r in self._runs(experiment_ids, role)
                for k, v in r.data.metrics.items()]
        df = pd.DataFrame(rows, columns=["run_id", "key", "value", "step"])
        df["run_id"] = df["run_id"].astype(object)
        df["key"] = df["key"].astype(object)
        return df

    def histories(self, run_ids: Sequence[str] | None, experiment_ids: Sequence[str],
                  keys: Sequence[str] = (), prefixes: Sequence[str] = (),
                  steps: Sequence[int] | None = None) -> pd.DataFrame:
        from scarcelab.tracking.query.store import _empty_history

        ids = {r.info.run_id for r in self._runs(experiment_ids, None)}
        if run_ids is not None:
            ids &= set(run_ids)
        want = set(steps) if steps is not None else None
        rows = [(rid, key, m.step, m.value) for (rid, key), hist in self.src.histories.items()
                if rid in ids and (key in keys or any(key.startswith(p) for p in prefixes))
                for m in hist if want is None or m.step in want]
        if not rows:
            return _empty_history()
        df = pd.DataFrame(rows, columns=["run_id", "key", "step", "value"])
        df["run_id"] = df["run_id"].astype(object)
        df["key"] = df["key"].astype(object)
        df["step"] = df["step"].astype("int64")
        return df


def now_utc() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")


# -- the two entry points ----------------------------------------------------------------------
class _StoreRecording:
    """A tracking store as a page source whose every answer is kept (:class:`_Record`)."""

    origin = "the tracking store"

    def __init__(self, tracking_uri: str | None) -> None:
        import mlflow
        from mlflow.tracking import MlflowClient

        from scarcelab.tracking.query.store import open_reader

        if tracking_uri:
            mlflow.set_tracking_uri(tracking_uri)
        self.uri = mlflow.get_tracking_uri()
        self.rec = _Record()
        self._client = _RecordingClient(MlflowClient(), self.rec)
        self._reader = _RecordingReader(open_reader(self.uri), self.rec)

    def client(self) -> _RecordingClient:
        return self._client

    def reader(self) -> _RecordingReader:
        return self._reader


def export_page(spec_path: str | Path, scale: str = "reference", experiment: str | None = None,
                tracking_uri: str | None = None, spec: Any = None,
                generated: str | None = None) -> tuple[Any, dict[str, Any]]:
    """The page of a suite's sweep from the store (as ``build_page`` makes it) and the
    export of what it read (:func:`write_export` writes it)."""
    from scarcelab.tracking.query.render import _safe_uri
    from scarcelab.tracking.results.page import build_page, rel

    src = _StoreRecording(tracking_uri)
    page = build_page(spec_path, scale, experiment, None, spec, source=src,
                      generated=generated)
    doc = export_doc(src.rec, src.reader(), suite=page.suite, scale=page.spec.scale,
                     experiment=page.experiment, sweep=page.spec.name,
                     spec_path=rel(page.spec.path), cells=page.spec.cells,
                     store=_safe_uri(src.uri),
                     exported=now_utc())
    return page, doc


def page_from_export(path: str | Path, spec_path: str | Path | None = None,
                     generated: str | None = None) -> Any:
    """The page of an export, by the page builder that reads a store: the cells the
    export's sweep ran, with the spec file's other settings and the paper file (its claims
    and their rules) of this checkout (``spec_path``, default the one the export names).
    :class:`ExportError` (one line, naming the file) when the export is unreadable or is
    not one of that suite."""
    import dataclasses

    from scarcelab.tracking.results.page import build_page, rel, render_markdown
    from scarcelab.tracking.sweep.spec import load_spec

    src = load_export(path)
    spec_file = Path(spec_path) if spec_path is not None else Path(src.spec)
    if spec_path is None and not spec_file.is_file():
        from scarcelab.tracking.results.page import REPO

        spec_file = REPO / src.spec  # the export names it relative to the checkout
    if not spec_file.is_file():
        raise ExportError(f"{path}: its spec {spec_file} is not in this checkout (pass the "
                          "suite's spec file)")
    if spec_file.stem != src.suite:
        raise ExportError(f"{path}: an export of suite {src.suite!r}, not of {spec_file}")
    spec = load_spec(spec_file, scale=src.scale)
    spec = dataclasses.replace(spec, cells=list(src.cells), name=src.sweep,
                               experiment=src.experiment)
    src.origin = (f"the export `{rel(path)}` of its tracking store (exported "
                  f"{src.exported})")
    page = build_page(spec_file, src.scale, src.experiment, None, spec, source=src,
                      generated=generated)
    page.command = f"scarcelab results --from-export {rel(path)}"
    page.markdown = render_markdown(page)
    return page
