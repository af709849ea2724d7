"""Leaderboard speed at scale: 10,000 trial runs with per-epoch metric histories.

    .venv/bin/python bench/leaderboard.py                      # sqlite (on /dev/shm if any)
    .venv/bin/python bench/leaderboard.py --trials 100000 --naive-sample 300 --skip-api
    .venv/bin/python bench/leaderboard.py --trials 100000 --db /dev/shm/lb100k.db  # fill once,
                                                                   # later calls reuse it
    .venv/bin/python bench/leaderboard.py --stack              # + PostgreSQL behind mlflow server
    .venv/bin/python bench/leaderboard.py --trials 2000 --naive-sample 300   # quicker

The store is filled in bulk straight into MLflow's tables (creating 10k runs through the
client would take ~20 min of logging on this machine, see ENV.md "Logging cost"): rows in
primary-key order, MLflow's secondary indexes (and on PostgreSQL its foreign keys) dropped
during the fill and re-created from their own definitions after, sqlite without journal or
fsync, PostgreSQL by COPY. The schema comes from MLflow itself and the result is checked
through the public API: one study's latest metrics against its metric history before
anything is timed, and the run count on the naive path's full ``search_runs`` (100,000
trials make 100,250 runs: 250 studies are the trials' parents). Per study: 40 trials (400
at 100k) x 15 epochs, each epoch logging val/test metrics and ``time/elapsed_s`` (time since
the study started), plus the study's own ``best/*`` series on a global epoch counter — what
``scarcelab.protocols.search`` writes.

Timed (wall clock, median of ``--repeat``, every wall printed; the 2 CPUs are shared, so
read ratios):
* ``ours``: ``tracking.query.load`` + ``leaderboard`` (auto: the studies' own series),
* ``ours_trials``: the same recomputed from every trial's history (``source="trials"``,
  median of ``--repeat-trials``),
* ``frame``: ``load`` + the whole tidy frame ``Tracked.runs`` (every run's rows),
* ``profile``: the accuracy-over-time view on top of a loaded store,
* ``api``: the same code through the public client API (``reader="api"``),
* ``naive``: ``mlflow.search_runs`` over the experiment + ``get_metric_history`` per trial
  run (val, test, elapsed) and the same selection in pandas. It is run on a random sample of
  ``--naive-sample`` trials and extrapolated linearly to all trials (``naive_extrapolated=1``)
  unless ``--naive-sample 0`` (all of them).

Memory: ``*_peak_mb`` is the Python-heap peak (tracemalloc, numpy/pandas buffers
included) of one load + leaderboard; ``max_rss_mb`` the whole process's peak RSS, which
the in-memory generation of the store dominates.

Last line: ``key=value`` summary.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from scarcelab.trials import trial_seed

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DATASETS = ("pathmnist", "tissuemnist", "bloodmnist", "dermamnist", "breastmnist")
METHODS = {"sup": "supervised", "mixup": "supervised", "supcon": "supervised",
           "fixmatch": "semi", "flexmatch": "semi", "freematch": "semi", "comatch": "semi",
           "simclr": "self", "byol": "self", "dino": "self"}
TEST_KEYS = ("balanced_accuracy", "accuracy", "auroc")
T0 = 1_750_000_000_000


def generate(n_trials: int, epochs: int, seeds: int, exp_id: int, rng: np.random.Generator
             ) -> dict[str, pd.DataFrame]:
    """Rows for runs, tags, params, metrics, latest_metrics, built with numpy (100k trials
    x 15 epochs are ~16M metric rows: a per-row Python loop would take minutes)."""
    combos = [(ds, m, f, sd) for ds in DATASETS for m, f in METHODS.items()
              for sd in range(seeds)]
    S, E = len(combos), epochs
    P = max(1, math.ceil(n_trials / S))
    sid = np.array([uuid.uuid4().hex for _ in range(S)], dtype=object)
    tid = np.array([uuid.uuid4().hex for _ in range(S * P)], dtype=object).reshape(S, P)
    start = T0 + np.arange(S, dtype=np.int64) * 10_000_000
    skill = np.array([0.05 * list(METHODS).index(m) / len(METHODS) for _, m, _, _ in combos])
    tr, ep = np.arange(P), np.arange(E)
    # time since the study started: 4 s per epoch, 2 s between trials
    t_ep = (tr[:, None] * (4.0 * E + 2.0) + 4.0 * (ep[None, :] + 1))  # (P, E)
    ts = start[:, None, None] + (t_ep[None] * 1000).astype(np.int64)  # (S, P, E)
    quality = rng.uniform(0.3, 0.8, (S, P)) + skill[:, None]
    val = np.round(np.minimum(0.99, quality[:, :, None] * (1 - np.exp(-(ep + 1) / 4))
                              + rng.normal(0, 0.02, (S, P, E))), 3)
    test = {k: np.round(val - 0.02 + rng.normal(0, 0.02, (S, P, E)), 4) for k in TEST_KEYS}
    # the study's best-so-far answer (strictly better val replaces it), per global epoch g
    vf = val.reshape(S, P * E)
    cm = np.maximum.accumulate(vf, axis=1)
    prev = np.concatenate([np.full((S, 1), -1.0), cm[:, :-1]], axis=1)
    at = np.maximum.accumulate(np.where(vf > prev, np.arange(P * E)[None], 0), axis=1)
    best_test = {k: np.take_along_axis(v.reshape(S, P * E), at, axis=1)
                 for k, v in test.items()}
    names = np.array([f"{m}-{ds}-s{sd}" for ds, m, _, sd in combos], dtype=object)
    tnames = np.array([f"trial-{i}" for i in range(P)], dtype=object)
    run_df = pd.DataFrame({
        "run_uuid": np.concatenate([sid, tid.ravel()]),
        "name": np.concatenate([names, np.tile(tnames, S)]),
        "start_time": np.concatenate([start, ts[:, :, 0].ravel() - 4000]),
        "end_time": np.concatenate([start + 9_000_000, ts[:, :, 0].ravel() - 4000 + E * 4000]),
    })
    run_df = run_df.assign(source_type="LOCAL", source_name="bench", entry_point_name="",
                           user_id="bench", status="FINISHED", source_version="",
                           lifecycle_stage="active", experiment_id=exp_id)
    run_df["artifact_uri"] = "file:///tmp/bench-artifacts/" + run_df["run_uuid"]
    tags, params = [], []
    base_cols = {"scarcelab.family": [c[2] for c in combos],
                 "scarcelab.method": [c[1] for c in combos],
                 "scarcelab.dataset": [c[0] for c in combos],
                 "scarcelab.seed": [str(c[3]) for c in combos]}
    for k, v in {**base_cols, "scarcelab.role": ["study"] * S, "mlflow.runName": names}.items():
        tags.append(pd.DataFrame({"key": k, "value": v, "run_uuid": sid}))
    trial_tags = {**{k: np.repeat(np.array(v, dtype=object), P) for k, v in base_cols.items()},
                  "scarcelab.role": "trial", "scarcelab.trial": np.tile(tr.astype(str), S),
                  "mlflow.parentRunId": np.repeat(sid, P), "mlflow.runName": np.tile(tnames, S)}
    for k, v in trial_tags.items():
        tags.append(pd.DataFrame({"key": k, "value": v, "run_uuid": tid.ravel()}))
    for k, v in (("n_labeled", "400"), ("budget_minutes", "60"), ("arch", "resnet18")):
        params.append(pd.DataFrame({"key": k, "value": v, "run_uuid": sid}))
    n = S * P
    fmt = np.vectorize(lambda x: f"{x:.6g}", otypes=[object])
    seed_of = np.repeat(np.array([c[3] for c in combos]), P)
    for k, v in (("lr", fmt(10 ** rng.uniform(-4, -1, n))),
                 ("weight_decay", fmt(10 ** rng.uniform(-6, -3, n))),
                 ("batch_size", "64"), ("arch", "resnet18"),
                 ("trial_seed", trial_seed(seed_of, np.tile(tr, S)).astype(str))):
        params.append(pd.DataFrame({"key": k, "value": v, "run_uuid": tid.ravel()}))
    trial_ids = np.repeat(tid.ravel(), E)
    steps_t = np.tile(ep, S * P)
    ts_flat = ts.ravel()
    study_ids = np.repeat(sid, P * E)
    steps_s = np.tile(np.arange(P * E), S)
    blocks = [("val/balanced_accuracy", val.ravel(), trial_ids, steps_t),
              ("time/elapsed_s", np.broadcast_to(t_ep, (S, P, E)).ravel(), trial_ids, steps_t),
              ("train/loss", np.tile(1.0 / (ep + 1), S * P), trial_ids, steps_t)]
    blocks += [(f"test/{k}", v.ravel(), trial_ids, steps_t) for k, v in test.items()]
    blocks += [("best/val_balanced_accuracy", cm.ravel(), study_ids, steps_s),
               ("time/elapsed_s", np.broadcast_to(t_ep, (S, P, E)).ravel(), study_ids, steps_s)]
    blocks += [(f"best/test_{k}", v.ravel(), study_ids, steps_s) for k, v in best_test.items()]
    m = pd.concat([pd.DataFrame({"key": k, "value": v, "timestamp": ts_flat, "run_uuid": r,
                                 "step": st}) for k, v, r, st in blocks], ignore_index=True)
    m["is_nan"] = False
    last = m["step"].to_numpy() == np.where(m["run_uuid"].isin(set(sid)), P * E - 1, E - 1)
    latest = m[last]
    return {"runs": run_df, "tags": pd.concat(tags, ignore_index=True),
            "params": pd.concat(params, ignore_index=True),
            "metrics": m, "latest_metrics": latest[["key", "value", "timestamp", "step",
                                                    "is_nan", "run_uuid"]]}


FILL_ORDER = ("runs", "tags", "params", "metrics", "latest_metrics")
PK_ORDER = {"metrics": ["key", "timestamp", "step", "run_uuid", "value"],
            "latest_metrics": ["key", "run_uuid"], "tags": ["key", "run_uuid"],
            "params": ["key", "run_uuid"], "runs": ["run_uuid"]}
BATCH = 500_000  # rows per executemany / COPY chunk: bounded memory for the row tuples


def _pk_sorted(table: str, df: pd.DataFrame) -> pd.DataFrame:
    """Rows in primary-key order, so that every insert appends to the PK B-tree instead of
    landing on a random page (the 100k store's first fill, unsorted with its secondary
    indexes live, took 36 min on a loaded machine)."""
    cols = PK_ORDER[table]
    # lexsort: last key is primary; strings compare like the databases' byte/C order
    codes = [pd.factorize(df[c], sort=True)[0] if df[c].dtype == object else df[c].to_numpy()
             for c in reversed(cols)]
    return df.iloc[np.lexsort(codes)]


def _rows(df: pd.DataFrame, start: int, stop: int) -> Iterable[tuple]:
    """Plain Python tuples of one chunk (numpy scalars are not sqlite3 parameters)."""
    return zip(*(df[c].iloc[start:stop].tolist() for c in df.columns), strict=True)


def _secondary_indexes(cur: Any, sqlite: bool, tables: Sequence[str]) -> list[tuple[str, str]]:
    """(name, CREATE statement) of the plain (non-constraint) indexes on ``tables``, exactly
    as MLflow's migrations created them: dropped for the fill, re-created after, so that the
    store ends with MLflow's own schema."""
    if sqlite:
        cur.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT "
                    f"NULL AND tbl_name IN ({', '.join('?' * len(tables))})", list(tables))
    else:
        cur.execute("SELECT i.indexname, i.indexdef FROM pg_indexes i WHERE i.schemaname = "
                    "current_schema() AND i.tablename = ANY(%s) AND NOT EXISTS (SELECT 1 FROM "
                    "pg_constraint c WHERE c.conname = i.indexname)", (list(tables),))
    return [(n, d) for n, d in cur.fetchall()]


def _foreign_keys(cur: Any, tables: Sequence[str]) -> list[tuple[str, str, str]]:
    """PostgreSQL: (table, name, definition) of the FOREIGN KEYs of ``tables``; re-adding one
    after the fill validates every row in one join instead of one trigger call per row."""
    cur.execute("SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid) "
                "FROM pg_constraint c WHERE c.contype = 'f' AND c.conrelid::regclass::text = "
                "ANY(%s)", (list(tables),))
    return list(cur.fetchall())


def bulk_insert(db_uri: str, rows: dict[str, pd.DataFrame]) -> dict[str, float]:
    """Fill MLflow's tables in bulk and return seconds per phase.

    sqlite: one transaction, no journal, no fsync (``PRAGMA journal_mode=OFF``,
    ``synchronous=OFF``: a crash mid-fill loses a store we would regenerate anyway),
    ``executemany`` per 500k rows. PostgreSQL: ``COPY`` per 500k-row CSV chunk, foreign keys
    dropped and re-added. Both: rows in primary-key order and the secondary indexes dropped
    during the fill and re-created from their own definitions afterwards, so the store
    ends with exactly the schema MLflow created (``check_store`` then reads it back)."""
    import sqlalchemy as sa

    sqlite = db_uri.startswith("sqlite")
    engine = sa.create_engine(db_uri)
    raw = engine.raw_connection()
    took: dict[str, float] = {}
    try:
        cur = raw.cursor()
        if sqlite:
            for pragma in ("journal_mode = OFF", "synchronous = OFF", "temp_store = MEMORY",
                           "cache_size = -262144", "locking_mode = EXCLUSIVE"):
                cur.execute(f"PRAGMA {pragma}")
        t = time.perf_counter()
        indexes = _secondary_indexes(cur, sqlite, FILL_ORDER)
        fks = [] if sqlite else _foreign_keys(cur, FILL_ORDER)
        for table, name, _ in fks:
            cur.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
        for name, _ in indexes:
            cur.execute(f'DROP INDEX "{name}"')
        took["fill_drop_s"] = time.perf_counter() - t
        for table in FILL_ORDER:
            t = time.perf_counter()
            df = _pk_sorted(table, rows[table])
            cols = ", ".join(f'"{c}"' if c == "key" else c for c in df.columns)
            for start in range(0, len(df), BATCH):
                if sqlite:
                    marks = ", ".join("?" * len(df.columns))
                    cur.executemany(f"INSERT INTO {table} ({cols}) VALUES ({marks})",  # noqa: S608
                                    _rows(df, start, start + BATCH))
                else:
                    buf = io.StringIO()
                    df.iloc[start:start + BATCH].to_csv(buf, index=False, header=False)
                    buf.seek(0)
                    cur.copy_expert(f"COPY {table} ({cols}) FROM STDIN WITH CSV", buf)
            took[f"fill_{table}_s"] = time.perf_counter() - t
        t = time.perf_counter()
        for _, ddl in indexes:
            cur.execute(ddl)
        for table, name, ddl in fks:
            cur.execute(f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {ddl}')
        took["fill_index_s"] = time.perf_counter() - t
        t = time.perf_counter()
        raw.commit()
        took["fill_commit_s"] = time.perf_counter() - t
    finally:
        raw.close()
        engine.dispose()
    return took


def naive(tracking_uri: str, experiment: str, sample: int, rng: np.random.Generator
          ) -> tuple[float, float, int, int, int, pd.DataFrame]:
    """search_runs + get_metric_history per trial; returns (search_s, histories_s, n_done,
    n_trials, n_runs the search returned, per-study selection of the sampled trials).

    The search is timed over the whole experiment; the histories on ``sample`` random trials
    of the full store (so each lookup pays the full-size index), and the caller scales that
    part linearly: every trial costs the same three ``get_metric_history`` calls of 15
    points."""
    import mlflow
    from mlflow.tracking import MlflowClient

    mlflow.set_tracking_uri(tracking_uri)
    client = MlflowClient()
    t = time.perf_counter()
    df = mlflow.search_runs(experiment_names=[experiment], max_results=10**7)
    search_s = time.perf_counter() - t
    trials = df[df["tags.scarcelab.role"] == "trial"]
    n_trials = len(trials)
    if 0 < sample < n_trials:
        trials = trials.iloc[rng.choice(n_trials, sample, replace=False)]
    t, c = time.perf_counter(), time.process_time()
    rows = []
    for run_id, parent in trials[["run_id", "tags.mlflow.parentRunId"]].itertuples(
            index=False):
        h = {k: {m.step: m.value for m in client.get_metric_history(run_id, k)}
             for k in ("val/balanced_accuracy", "test/balanced_accuracy", "time/elapsed_s")}
        rows += [(parent, val, h["test/balanced_accuracy"].get(step),
                  h["time/elapsed_s"].get(step))
                 for step, val in h["val/balanced_accuracy"].items()]
    hist_s = time.perf_counter() - t
    CPU["naive_hist"] = time.process_time() - c
    sel = pd.DataFrame(rows, columns=["study", "val", "test", "elapsed"]).sort_values(
        ["study", "elapsed"]).groupby("study").apply(
        lambda g: g.loc[g["val"].idxmax()], include_groups=False)
    return search_s, hist_s, len(trials), n_trials, len(df), sel


CPU: dict[str, float] = {}  # label -> median CPU seconds of this process
WALLS: dict[str, list[float]] = {}  # label -> every wall time, in order


def timed(fn, repeat: int, label: str = "") -> tuple[float, object]:  # type: ignore[no-untyped-def]
    """Median wall time of ``repeat`` calls (all of them kept in ``WALLS[label]``); the
    median CPU time goes to ``CPU[label]`` (on a shared machine CPU time is the steadier
    measure of work done in-process)."""
    walls, cpus, out = [], [], None
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    if label:
        WALLS[label], CPU[label] = walls, float(np.median(cpus))
    return float(np.median(walls)), out


def calibrate() -> float:
    """Seconds for a fixed pure-Python loop (~0.15 s on an idle modern core): divide a
    timing by calib_s/0.15 to estimate it on an idle machine."""
    t = time.perf_counter()
    sum(range(10**7))
    return time.perf_counter() - t


def _peak_mb(fn) -> float:  # type: ignore[no-untyped-def]
    """Python-heap peak (tracemalloc: numpy/pandas buffers included) of one call, in MiB."""
    import tracemalloc

    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def time_ours(uri: str, experiment: str, repeat: int, repeat_trials: int,
              reader: str = "auto", lean: bool = False) -> dict[str, float]:
    from scarcelab.tracking import query

    res: dict[str, float] = {}
    res["ours_s"], lb = timed(lambda: query.leaderboard(query.load(experiment, uri,
                                                                   reader=reader)), repeat,
                              "ours")
    res["ours_min_s"] = min(WALLS["ours"])
    print(f"  load + leaderboard: walls {[round(w, 3) for w in WALLS['ours']]}", flush=True)
    res["ours_trials_s"], lbt = timed(lambda: query.leaderboard(
        query.load(experiment, uri, reader=reader), source="trials"), repeat_trials,
        "ours_trials")
    print(f"  load + leaderboard(source=trials): walls "
          f"{[round(w, 3) for w in WALLS['ours_trials']]}", flush=True)
    cols = ["dataset", "method", "n", "test_balanced_accuracy_mean"]
    pd.testing.assert_frame_equal(lb[cols], lbt[cols])  # both sources agree
    res["ours_cpu_s"], res["ours_trials_cpu_s"] = CPU["ours"], CPU["ours_trials"]
    # the whole tidy frame (every run's tags, params, latest metrics): what `t.runs` costs
    res["frame_s"], n = timed(lambda: len(query.load(experiment, uri, reader=reader).runs), 1)
    res["n_runs"] = int(n)  # type: ignore[arg-type]
    res["ours_peak_mb"] = _peak_mb(lambda: query.leaderboard(query.load(experiment, uri,
                                                                        reader=reader)))
    res["profile_s"] = res["frame_peak_mb"] = math.nan
    if not lean:  # each reads millions of rows: a minute or more at 100k on a busy machine
        t = query.load(experiment, uri, reader=reader)
        query.leaderboard(t)
        res["profile_s"], _ = timed(lambda: query.profile(t), 1, "profile")
        res["frame_peak_mb"] = _peak_mb(lambda: query.load(experiment, uri,
                                                           reader=reader).runs)
    return res


def check_store(uri: str, experiment: str) -> None:
    """The bulk-filled store reads back through MLflow's public API: a study run, its
    latest metrics and one metric history. The run count is checked on the naive path's
    full ``search_runs`` (one pass over 100k runs through the API costs minutes; doing it
    twice would double that)."""
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=uri)
    exp = c.get_experiment_by_name(experiment)
    page = c.search_runs([exp.experiment_id], "tags.`scarcelab.role` = 'study'",
                         max_results=1)
    run = page[0]
    h = c.get_metric_history(run.info.run_id, "best/val_balanced_accuracy")
    assert len(h) > 1 and h[-1].value == run.data.metrics["best/val_balanced_accuracy"]


def _naive_part(a: argparse.Namespace, uri: str, sample: int, n_runs: int,
                rng: np.random.Generator) -> dict[str, float]:
    s_s, h_s, done, n_tr, seen, _ = naive(uri, "bench", sample, rng)
    # every run the fill wrote (studies + trials) comes back through MLflow's own search
    assert seen == n_runs, f"search_runs returned {seen} runs, the fill wrote {n_runs}"
    return {"naive_search_s": s_s, "naive_hist_s": h_s, "naive_done": done, "n_trials": n_tr,
            "naive_s": s_s + h_s * n_tr / max(done, 1),
            "naive_hist_cpu_s": CPU["naive_hist"] * n_tr / max(done, 1)}


def run_sqlite(a: argparse.Namespace, rng: np.random.Generator) -> dict[str, float]:
    from mlflow.tracking import MlflowClient

    if a.db:
        folder, reuse = Path(a.db).resolve().parent, Path(a.db).exists()
        uri = f"sqlite:///{Path(a.db).resolve()}"
    else:
        folder, reuse = Path(tempfile.mkdtemp(prefix="bench-lb-", dir="/dev/shm" if Path(
            "/dev/shm").is_dir() else None)), False
        uri = f"sqlite:///{folder}/mlflow.db"
    res: dict[str, float] = {}
    try:
        if reuse:
            n_runs = -1
            print(f"[sqlite] reusing {uri}", flush=True)
        else:
            t = time.perf_counter()
            exp_id = MlflowClient(tracking_uri=uri).create_experiment("bench")
            rows = generate(a.trials, a.epochs, a.seeds, int(exp_id), rng)
            res["generate_s"] = time.perf_counter() - t
            t = time.perf_counter()
            res.update(bulk_insert(uri, rows))
            res["fill_s"] = time.perf_counter() - t
            n_runs, res["metric_rows"] = len(rows["runs"]), len(rows["metrics"])
            del rows
            print(f"[sqlite] {n_runs} runs, {res['metric_rows']} metric rows: generated in "
                  f"{res['generate_s']:.1f}s, filled in {res['fill_s']:.1f}s at {uri} "
                  f"{ {k: round(v, 1) for k, v in res.items() if k.startswith('fill_')} }",
                  flush=True)
        check_store(uri, "bench")
        res.update(time_ours(uri, "bench", a.repeat, a.repeat_trials, lean=a.lean))
        print(f"[sqlite] ours: {res}", flush=True)
        from scarcelab.tracking import query

        res["api_s"] = math.nan
        if not a.skip_api:
            res["api_s"], _ = timed(lambda: query.leaderboard(
                query.load("bench", uri, reader="api")), 1)
        res.update(_naive_part(a, uri, a.naive_sample,
                               n_runs if n_runs > 0 else int(res["n_runs"]), rng))
        return res
    finally:
        if not a.keep and not a.db:
            shutil.rmtree(folder, ignore_errors=True)


def run_stack(a: argparse.Namespace, rng: np.random.Generator) -> dict[str, float] | None:
    from mlflow.tracking import MlflowClient

    try:
        from scarcelab.tracking.stack import Stack, free_port
    except ImportError as e:
        print(f"[postgres] skipped: no tracking.stack ({e})")
        return None
    root = Path(tempfile.mkdtemp(prefix="bench-stack-"))
    os.chmod(root, 0o755)  # postgres (another user) must traverse it
    stack = Stack(root)
    stack.configure(ports={k: free_port() for k in ("pg_port", "s3_port", "mlflow_port")})
    res: dict[str, float] = {}
    try:
        took = stack.start()
        st = stack.state
        print(f"[postgres] stack up in {took:.1f}s: {st.tracking_uri}", flush=True)
        os.environ.update(st.client_env())
        # one search page over 10k runs can exceed the 20 s timeout that
        # tracking.mlflow_tracker sets, on a busy machine (cf. mlflow#8277): time it instead
        os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = "900"
        exp_id = MlflowClient(tracking_uri=st.tracking_uri).create_experiment("bench")
        rows = generate(a.trials, a.epochs, a.seeds, int(exp_id), rng)
        t = time.perf_counter()
        res.update(bulk_insert(st.db_uri("mlflow"), rows))
        res["fill_s"] = time.perf_counter() - t
        n_runs = len(rows["runs"])
        del rows
        print(f"[postgres] {n_runs} runs filled in {res['fill_s']:.1f}s "
              f"{ {k: round(v, 1) for k, v in res.items() if k.startswith('fill_')} }",
              flush=True)
        check_store(st.tracking_uri, "bench")
        res.update(time_ours(st.db_uri("mlflow"), "bench", a.repeat, a.repeat_trials,
                              lean=a.lean))
        print(f"[postgres] ours: {res}", flush=True)
        from scarcelab.tracking import query

        res["api_server_s"] = math.nan
        if not a.skip_api:
            res["api_server_s"], _ = timed(lambda: query.leaderboard(
                query.load("bench", st.tracking_uri)), 1)
        res.update(_naive_part(a, st.tracking_uri, min(a.naive_sample or 10**9, 500),
                               n_runs, rng))
        return res
    finally:
        stack.stop()
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=10_000)
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--repeat", type=int, default=3,
                   help="timed load + leaderboard calls (the median is reported)")
    p.add_argument("--repeat-trials", type=int, default=1,
                   help="timed calls of the recomputation from every trial's history")
    p.add_argument("--naive-sample", type=int, default=1000,
                   help="trials timed for the naive approach (0 = all), then extrapolated")
    p.add_argument("--stack", action="store_true", help="also PostgreSQL via scripts/stack")
    p.add_argument("--keep", action="store_true", help="keep the generated stores")
    p.add_argument("--db", default="",
                   help="sqlite file: filled (and kept) if absent, reused if present")
    p.add_argument("--skip-api", action="store_true",
                   help="do not time the client-API reader (minutes at 100k runs)")
    p.add_argument("--no-sqlite", action="store_true", help="only the PostgreSQL part")
    p.add_argument("--lean", action="store_true",
                   help="skip the profile view and the full frame's memory peak")
    a = p.parse_args()
    rng = np.random.default_rng(0)
    summary: dict[str, float | int] = {"calib_s": calibrate(), "load_avg_start": os.getloadavg()[0]}
    r = run_sqlite(a, rng) if not a.no_sqlite else {}
    if r:
        print(f"[sqlite] {r}", flush=True)
        summary.update(runs=int(r["n_runs"]), trials=int(r["n_trials"]),
                       metric_rows=int(r.get("metric_rows", -1)),
                       sqlite_fill_s=r.get("fill_s", math.nan),
                       sqlite_leaderboard_s=r["ours_s"], sqlite_leaderboard_min_s=r[
                           "ours_min_s"], sqlite_trials_leaderboard_s=r["ours_trials_s"],
                       sqlite_frame_s=r["frame_s"], sqlite_profile_s=r["profile_s"],
                       sqlite_leaderboard_peak_mb=r["ours_peak_mb"],
                       sqlite_frame_peak_mb=r["frame_peak_mb"],
                       sqlite_api_s=r["api_s"], sqlite_naive_s=r["naive_s"],
                       sqlite_naive_search_s=r["naive_search_s"],
                       sqlite_leaderboard_cpu_s=r["ours_cpu_s"],
                       sqlite_trials_cpu_s=r["ours_trials_cpu_s"],
                       naive_histories_cpu_s=r["naive_hist_cpu_s"],
                       naive_sampled=int(r["naive_done"]),
                       naive_extrapolated=int(r["naive_done"] < r["n_trials"]),
                       vs_naive=r["naive_s"] / r["ours_s"],
                       vs_naive_trials=r["naive_s"] / r["ours_trials_s"])
    if a.stack:
        try:
            s = run_stack(a, rng)
        except Exception as e:  # noqa: BLE001 - report it in the summary, keep the sqlite part
            print(f"[postgres] failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
            summary["pg_failed"] = 1
            s = None
        if s:
            print(f"[postgres] {s}", flush=True)
            summary.update(pg_fill_s=s["fill_s"], pg_leaderboard_s=s["ours_s"],
                           pg_leaderboard_min_s=s["ours_min_s"],
                           pg_trials_leaderboard_s=s["ours_trials_s"],
                           pg_frame_s=s["frame_s"], pg_server_api_s=s["api_server_s"],
                           pg_server_naive_s=s["naive_s"],
                           pg_server_naive_search_s=s["naive_search_s"],
                           pg_naive_sampled=int(s["naive_done"]),
                           pg_vs_naive=s["naive_s"] / s["ours_s"],
                           pg_leaderboard_peak_mb=s["ours_peak_mb"])
    summary["calib_end_s"] = calibrate()
    import resource

    summary["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    summary["load_avg"] = os.getloadavg()[0]
    print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                   for k, v in summary.items()))


if __name__ == "__main__":
    main()
