"""Reading a tracking store in bulk: one small adapter, two implementations.

Why not only the public API: ``mlflow.search_runs`` builds one ``Run`` object per run and
``MlflowClient.get_metric_history`` is one query (one HTTP request through a server) per run
and key. For 10,000 trials that is tens of thousands of round trips (mlflow#8277 reports
45 s just to count runs), far from an interactive leaderboard. A SQL store (sqlite,
PostgreSQL, MySQL) can answer the same questions with a handful of set-oriented queries on
MLflow's own tables (``experiments``, ``runs``, ``tags``, ``params``, ``latest_metrics``,
``metrics``), so :class:`SqlReader` does that. It reads, never writes, and only columns
that have been stable across MLflow's schema migrations; a store behind a server or a file
store goes through :class:`ApiReader`, which gives the same frames through the public API.

Every method returns a long pandas frame keyed by ``run_id`` so that the caller never
depends on which reader produced it (the tests check both agree).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Protocol

import numpy as np
import pandas as pd

from scarcelab import tags as T

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

SQL_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
RUN_COLUMNS = ["run_id", "experiment_id", "run_name", "status", "start_time", "end_time"]
CHUNK = 900  # ids per IN (...) list: below every backend's bound-parameter limit
#: a second name of ``T.ROLE``, kept ONLY for tracking/query/frame.py's re-export (that file
#: belongs to another change of issue 44): delete with it (tests/project/test_tag_literals.py)
# a role with more runs than this is read with the experiments' whole tables and filtered
# here: beyond a few chunks, IN (...) lists cost more than one scan
SCOPED_MAX = 20 * CHUNK
METRIC = {"value": float, "step": "int64"}


class StoreReader(Protocol):
    """What the query layer needs from a store. ``keys`` are exact metric keys and
    ``prefixes`` select every key starting with one of them. ``role`` keeps only the runs
    whose ``scarcelab.role`` tag has that value (a leaderboard needs the 250 studies of a
    store, not its 100,000 trials)."""

    uri: str

    def experiment_ids(self, names: Sequence[str]) -> dict[str, str]: ...

    def runs(self, experiment_ids: Sequence[str], role: str | None = None
             ) -> pd.DataFrame: ...

    def tags(self, experiment_ids: Sequence[str], role: str | None = None
             ) -> pd.DataFrame: ...

    def params(self, experiment_ids: Sequence[str], role: str | None = None
               ) -> pd.DataFrame: ...

    def latest_metrics(self, experiment_ids: Sequence[str], role: str | None = None
                       ) -> pd.DataFrame: ...

    def histories(self, run_ids: Sequence[str] | None, experiment_ids: Sequence[str],
                  keys: Sequence[str] = (), prefixes: Sequence[str] = (),
                  steps: Sequence[int] | None = None) -> pd.DataFrame:
        """Long frame ``run_id, key, step, value`` (NaN for NaN), in logging order within
        each (run, key); ``steps`` keeps only those steps."""
        ...


def _missing(name: str, uri: str) -> ValueError:
    return ValueError(f"no MLflow experiment named {name!r} at {uri} (check the name, or pass "
                      "--tracking-uri / set MLFLOW_TRACKING_URI to the store that holds it)")


def _chunks(items: Sequence[str], n: int = CHUNK) -> Iterable[list[str]]:
    for i in range(0, len(items), n):
        yield list(items[i:i + n])


def _empty_history() -> pd.DataFrame:
    return pd.DataFrame({"run_id": pd.Series(dtype=object), "key": pd.Series(dtype=object),
                         "step": pd.Series(dtype="int64"), "value": pd.Series(dtype=float)})


class SqlReader:
    """Set-oriented reads straight from MLflow's SQL tables (read-only)."""

    def __init__(self, uri: str) -> None:
        import sqlalchemy as sa

        self.uri = uri
        self._sa = sa
        kwargs = {"connect_args": {"check_same_thread": False}} if uri.startswith(
            "sqlite") else {}
        self.engine = sa.create_engine(uri, **kwargs)
        self._runs: dict[tuple[tuple[str, ...], str | None], pd.DataFrame] = {}

    def _read(self, sql: str, numeric: Mapping[str, DTypeLike] | None = None,
              **params: object) -> pd.DataFrame:
        """Run one read; ``numeric`` names the columns to convert (column -> dtype)."""
        stmt = self._sa.text(sql)
        expanding = [k for k, v in params.items() if isinstance(v, list | tuple)]
        if expanding:
            stmt = stmt.bindparams(*(self._sa.bindparam(k, expanding=True) for k in expanding))
        with self.engine.connect() as conn:
            res = conn.execute(stmt, params)
            cols = list(res.keys())
            # plain DB-API tuples into one object array: building a frame from SQLAlchemy
            # Row objects is ~10x slower (pandas probes every Row for attributes), and
            # from_records infers a type per cell
            rows = res.cursor.fetchall() if res.cursor is not None else []
        if not rows:
            return pd.DataFrame({c: pd.Series(dtype=object) for c in cols})
        arr = np.array(rows, dtype=object)
        numeric = numeric or {}
        # object columns stay object: pandas' default string inference costs ~1 s per
        # million cells and the values are only compared and factorized
        return pd.DataFrame({c: pd.to_numeric(arr[:, i]).astype(numeric[c]) if c in numeric
                             else pd.Series(arr[:, i], dtype=object)
                             for i, c in enumerate(cols)})

    def experiment_ids(self, names: Sequence[str]) -> dict[str, str]:
        df = self._read("SELECT experiment_id, name FROM experiments WHERE name IN :names "
                        "AND lifecycle_stage = 'active'", names=list(names))
        found = {str(n): str(i) for i, n in zip(df.experiment_id, df.name, strict=True)}
        for n in names:
            if n not in found:
                raise _missing(n, self.uri)
        return {n: found[n] for n in names}

    def _ids(self, experiment_ids: Sequence[str]) -> list[int]:
        return [int(e) for e in experiment_ids]

    def runs(self, experiment_ids: Sequence[str], role: str | None = None) -> pd.DataFrame:
        key = (tuple(experiment_ids), role)
        if key not in self._runs:
            self._runs[key] = self._read_runs(experiment_ids, role)
        return self._runs[key]

    def _read_runs(self, experiment_ids: Sequence[str], role: str | None) -> pd.DataFrame:
        params: dict[str, object] = {"e": self._ids(experiment_ids)}
        scope = ""
        if role is not None:
            # the role tag's rows come from the tags primary key (key, run_uuid)
            scope = (" AND run_uuid IN (SELECT run_uuid FROM tags WHERE key = :rk "
                     "AND value = :rv)")
            params.update(rk=T.ROLE, rv=role)
        df = self._read(
            "SELECT run_uuid AS run_id, experiment_id, name AS run_name, status, start_time, "
            "end_time FROM runs WHERE experiment_id IN :e AND lifecycle_stage = 'active'"
            + scope, numeric={"start_time": float, "end_time": float}, **params)
        df["experiment_id"] = df["experiment_id"].astype(str)
        return df.reindex(columns=RUN_COLUMNS)

    def _scoped(self, sql: str, experiment_ids: Sequence[str], role: str | None,
                numeric: Mapping[str, DTypeLike] | None = None) -> pd.DataFrame:
        """``sql`` (aliases: ``t`` for the keyed table, ``r`` for runs) for every active run
        of the experiments, or for the runs of one role: by their ids (index lookups) when
        the role has few runs, else the whole read filtered here."""
        whole = sql + " JOIN runs r ON t.run_uuid = r.run_uuid WHERE r.experiment_id IN :e " \
            "AND r.lifecycle_stage = 'active'"
        if role is None:
            return self._read(whole, numeric, e=self._ids(experiment_ids))
        ids = list(self.runs(experiment_ids, role)["run_id"])
        if len(ids) > SCOPED_MAX:
            df = self._read(whole, numeric, e=self._ids(experiment_ids))
            return df[df["run_id"].isin(set(ids))].reset_index(drop=True)
        frames = [self._read(sql + " WHERE t.run_uuid IN :ids", numeric, ids=chunk)
                  for chunk in _chunks(ids)]
        frames = [f for f in frames if len(f)]
        if not frames:
            return self._read(sql + " WHERE 1 = 0", numeric)
        return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]

    def _kv(self, table: str, experiment_ids: Sequence[str], role: str | None
            ) -> pd.DataFrame:
        return self._scoped(f"SELECT t.run_uuid AS run_id, t.key, t.value FROM {table} t",  # noqa: S608
                            experiment_ids, role)

    def tags(self, experiment_ids: Sequence[str], role: str | None = None) -> pd.DataFrame:
        return self._kv("tags", experiment_ids, role)

    def params(self, experiment_ids: Sequence[str], role: str | None = None) -> pd.DataFrame:
        return self._kv("params", experiment_ids, role)

    def latest_metrics(self, experiment_ids: Sequence[str], role: str | None = None
                       ) -> pd.DataFrame:
        return self._scoped(
            "SELECT t.run_uuid AS run_id, t.key, CASE WHEN t.is_nan THEN NULL ELSE t.value "
            "END AS value, t.step FROM latest_metrics t", experiment_ids, role, METRIC)

    def histories(self, run_ids: Sequence[str] | None, experiment_ids: Sequence[str],
                  keys: Sequence[str] = (), prefixes: Sequence[str] = (),
                  steps: Sequence[int] | None = None) -> pd.DataFrame:
        conds, params = [], {}
        if keys:
            conds.append("m.key IN :keys")
            params["keys"] = list(keys)
        for i, p in enumerate(prefixes):
            # LIKE ... ESCAPE so that '_' and '%' in a prefix are literal
            conds.append(f"m.key LIKE :p{i} ESCAPE '\\'")
            params[f"p{i}"] = p.replace("%", r"\%").replace("_", r"\_") + "%"
        if not conds:
            return _empty_history()
        where = "(" + " OR ".join(conds) + ")"
        if steps is not None:
            where += " AND m.step IN :steps"
            params["steps"] = sorted({int(x) for x in steps})
        # NaN comes back as NULL; rows in logging order so that a step logged twice keeps
        # its last value (sqlite reads them in this order from its (key, timestamp) index)
        cols = ("m.run_uuid AS run_id, m.key, m.step, "
                "CASE WHEN m.is_nan THEN NULL ELSE m.value END AS value")
        if run_ids is None:
            # every run of the experiments: scan by key (covering index), keep the runs of
            # these experiments here; cheaper than joining every metric row to its run
            df = self._read(f"SELECT {cols} FROM metrics m WHERE {where} "  # noqa: S608
                            "ORDER BY m.timestamp", numeric=METRIC, **params)
            active = set(self.runs(experiment_ids)["run_id"])
            frames = [df[df["run_id"].isin(active)]]
        else:
            frames = [self._read(
                f"SELECT {cols} FROM metrics m WHERE m.run_uuid IN :ids "  # noqa: S608
                f"AND {where} ORDER BY m.timestamp", numeric=METRIC, ids=chunk, **params)
                for chunk in _chunks(list(run_ids))]
        frames = [f for f in frames if len(f)]
        if not frames:
            return _empty_history()
        return pd.concat(frames, ignore_index=True)


class ApiReader:
    """The same frames through the public client API (file stores, tracking servers)."""

    def __init__(self, uri: str, threads: int = 8) -> None:
        from mlflow.tracking import MlflowClient

        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        self.threads = threads
        self._cache: dict[tuple[tuple[str, ...], str | None], list] = {}

    def experiment_ids(self, names: Sequence[str]) -> dict[str, str]:
        out = {}
        for n in names:
            exp = self.client.get_experiment_by_name(n)
            if exp is None or exp.lifecycle_stage != "active":
                raise _missing(n, self.uri)
            out[n] = exp.experiment_id
        return out

    def _runs(self, experiment_ids: Sequence[str], role: str | None = None) -> list:
        key = (tuple(experiment_ids), role)
        if key in self._cache:
            return self._cache[key]
        whole = self._cache.get((tuple(experiment_ids), None))
        if whole is not None:  # already read: select here
            self._cache[key] = [r for r in whole if r.data.tags.get(T.ROLE) == role]
            return self._cache[key]
        where = ""
        if role is not None:
            if "'" in role or "\\" in role:
                raise ValueError(f"role {role!r}: quotes and backslashes are not supported")
            where = f"tags.`{T.ROLE}` = '{role}'"
        runs, token = [], None
        while True:
            page = self.client.search_runs(list(experiment_ids), where, max_results=10_000,
                                           page_token=token)
            runs += list(page)
            token = page.token
            if not token:
                break
        self._cache[key] = runs
        return runs

    def runs(self, experiment_ids: Sequence[str], role: str | None = None) -> pd.DataFrame:
        rows = [(r.info.run_id, str(r.info.experiment_id), r.info.run_name, r.info.status,
                 r.info.start_time, r.info.end_time) for r in self._runs(experiment_ids, role)]
        return pd.DataFrame(rows, columns=RUN_COLUMNS)

    def tags(self, experiment_ids: Sequence[str], role: str | None = None) -> pd.DataFrame:
        rows = [(r.info.run_id, k, v) for r in self._runs(experiment_ids, role)
                for k, v in r.data.tags.items()]
        return pd.DataFrame(rows, columns=["run_id", "key", "value"])

    def params(self, experiment_ids: Sequence[str], role: str | None = None) -> pd.DataFrame:
        rows = [(r.info.run_id, k, v) for r in self._runs(experiment_ids, role)
                for k, v in r.data.params.items()]
        return pd.DataFrame(rows, columns=["run_id", "key", "value"])

    def latest_metrics(self, experiment_ids: Sequence[str], role: str | None = None
                       ) -> pd.DataFrame:
        rows = [(r.info.run_id, k, float(v), np.nan) for r in self._runs(experiment_ids, role)
                for k, v in r.data.metrics.items()]
        return pd.DataFrame(rows, columns=["run_id", "key", "value", "step"])

    def histories(self, run_ids: Sequence[str] | None, experiment_ids: Sequence[str],
                  keys: Sequence[str] = (), prefixes: Sequence[str] = (),
                  steps: Sequence[int] | None = None) -> pd.DataFrame:
        wanted = None if run_ids is None else set(run_ids)
        # runs already read for some role serve when they cover the wanted ones (a study's
        # history must not cost a search over every trial)
        seen = {r.info.run_id: r for (e, _), part in self._cache.items()
                if e == tuple(experiment_ids) for r in part}
        runs = list(seen.values()) if wanted is not None and wanted <= seen.keys() \
            else self._runs(experiment_ids)
        jobs = [(r.info.run_id, k) for r in runs
                if wanted is None or r.info.run_id in wanted
                for k in r.data.metrics
                if k in keys or any(k.startswith(p) for p in prefixes)]
        if not jobs:
            return _empty_history()

        def one(job: tuple[str, str]) -> list[tuple[str, str, int, float]]:
            hist = sorted(self.client.get_metric_history(*job), key=lambda m: m.timestamp)
            return [(job[0], m.key, m.step, m.value) for m in hist]

        with ThreadPoolExecutor(self.threads) as pool:
            rows = [row for part in pool.map(one, jobs) for row in part]
        df = pd.DataFrame(rows, columns=["run_id", "key", "step", "value"])
        df["run_id"] = df["run_id"].astype(object)
        df["key"] = df["key"].astype(object)
        if steps is not None:
            df = df[df["step"].isin(set(steps))]
        return df.reset_index(drop=True)


def open_reader(tracking_uri: str | None = None, reader: str = "auto") -> StoreReader:
    """``reader``: ``auto`` (SQL for a database URI, the API otherwise), ``sql`` or ``api``."""
    import mlflow

    uri = tracking_uri or mlflow.get_tracking_uri()
    scheme = uri.split(":", 1)[0].split("+", 1)[0].lower()
    if reader == "sql" or (reader == "auto" and scheme in SQL_SCHEMES):
        if scheme not in SQL_SCHEMES:
            raise ValueError(f"reader='sql' needs a database URI ({', '.join(SQL_SCHEMES)}), "
                             f"got {uri!r}")
        return SqlReader(uri)
    if reader not in ("auto", "api"):
        raise ValueError(f"reader must be auto, sql or api, got {reader!r}")
    return ApiReader(uri)
