"""Load once, query many times: :func:`load` turns the runs of some experiments into one
tidy frame (one row per study / trial / AL run) plus, on demand, the *checkpoint record* of
every study that the leaderboard and the accuracy-over-time profile are computed from.

The checkpoint record of a study is the sequence of checkpoints that were, when they were
evaluated, the best on validation so far (a strict improvement of validation balanced
accuracy, in the order of ``time/elapsed_s`` since the study started — the same rule the
search protocol uses to keep ``checkpoints/best.pt``). Its last entry is the checkpoint the
study reports; the entry current at time t is the answer the study would have given had its
budget ended at t. Two sources give the same record:

* the study run's own ``best/val_balanced_accuracy``, ``best/test_*`` and ``time/elapsed_s``
  series (one point per epoch of any trial, on a global epoch counter): authoritative — it
  is what the protocol decided at every point, including the transfer mode that keeps the
  *last* epoch (so every point of it is kept, not only improvements);
* the trial runs' per-epoch ``val/balanced_accuracy``, ``test/*`` and ``time/elapsed_s``
  (step = epoch, time since the *study* started): used when a study has no series of its
  own, or on request (``source="trials"``) to recompute the choice independently.

Test metrics are read only for the entries of the record (a few per study), not for every
epoch of every trial: that second, narrow read is what keeps 10,000 trials interactive.

Reads are also scoped by role: :meth:`Tracked.role` reads the tags, params and latest
metrics of that role's runs only, and the full frame (:attr:`Tracked.runs`) is read on first
use. A leaderboard over 250 studies with 100,000 trials then reads 250 runs' rows, not
100,250 (see docs/performance.md for the measured difference).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from scarcelab import tags as T
from scarcelab.tracking.query.declared import BEFORE, NOT_ROW
from scarcelab.tracking.query.store import StoreReader, open_reader

NUMERIC_COLUMNS = ("seed", "trial", "query_size", "repetition", "n_labeled", "n_val",
                   "budget_minutes")
VAL = "val_balanced_accuracy"
SOURCES = ("auto", "study", "trials")
# (validation key, test key prefix) per source of the checkpoint record
STUDY_KEYS = ("best/val_balanced_accuracy", "best/test_")
TRIAL_KEYS = ("val/balanced_accuracy", "test/")
ELAPSED = "time/elapsed_s"


def _listify(x: str | Iterable[str]) -> list[str]:
    return [s for s in ([x] if isinstance(x, str) else list(x)) if s]


def _wide(long: pd.DataFrame, prefix: str) -> pd.DataFrame:
    """long (run_id, key, value) -> one column per key, named ``prefix + key`` (the last
    value wins). A scatter into a preallocated array: ~3x faster than ``pivot`` on 10k
    runs, which is most of the load time."""
    if long.empty:
        return pd.DataFrame(index=pd.Index([], name="run_id"))
    rows, run_ids = pd.factorize(long["run_id"])
    cols, keys = pd.factorize(long["key"])
    values = long["value"].to_numpy()
    numeric = values.dtype.kind == "f"
    arr = np.full((len(run_ids), len(keys)), np.nan if numeric else None,
                  dtype=float if numeric else object)
    arr[rows, cols] = values
    return pd.DataFrame(arr, index=pd.Index(run_ids, name="run_id"),
                        columns=[prefix + str(k) for k in keys])


class Tracked:
    """The runs of some experiments, loaded once. ``runs`` is the tidy frame; the views in
    :mod:`tracking.query.views` take this object.

    ``runs`` may be given (a frame built elsewhere) or left to be read from ``reader`` on
    first use; :meth:`role` reads only its role's runs unless the full frame is there."""

    def __init__(self, runs: pd.DataFrame | None, reader: StoreReader,
                 experiment_ids: Sequence[str], include_failed: bool = False,
                 experiments: dict[str, str] | None = None) -> None:
        self._runs = runs
        self.reader = reader
        self.experiment_ids = list(experiment_ids)
        # name -> id, for the ``experiment`` column of frames read later
        self.experiments = experiments or {i: i for i in self.experiment_ids}
        self.include_failed = include_failed
        self._roles: dict[str, pd.DataFrame] = {}
        self._records: dict[tuple, pd.DataFrame] = {}

    def with_runs(self, runs: pd.DataFrame) -> Tracked:
        """The same store and experiments seen through another frame (a filtered or
        relabelled copy of :attr:`runs`); views and caches start afresh on it."""
        return Tracked(runs, self.reader, self.experiment_ids, self.include_failed,
                       self.experiments)

    def __repr__(self) -> str:
        return (f"Tracked(experiments={list(self.experiments)}, "
                f"runs={'not read' if self._runs is None else len(self._runs)})")

    @property
    def runs(self) -> pd.DataFrame:
        """One row per run of the experiments (read on first use)."""
        if self._runs is None:
            self._runs = tidy_runs(self.reader, self.experiments)
        return self._runs

    # -- selections ---------------------------------------------------------------
    def role(self, role: str) -> pd.DataFrame:
        """The tidy rows of the runs with this ``scarcelab.role``, with the columns that
        those runs have (a column no run of the role has a value in is left out, so the
        frame is the same whether it was read alone or cut from :attr:`runs`)."""
        if role not in self._roles:
            if self._runs is None:
                part = tidy_runs(self.reader, self.experiments, role=role)
            elif "role" in self._runs:
                part = self._runs[self._runs["role"] == role]
            else:
                part = self._runs.iloc[0:0]
            if "role" not in part:  # no run has a role tag (read alone: no tag rows at all)
                part = part.assign(role=pd.Series(index=part.index, dtype=object))
            self._roles[role] = _drop_empty(part)
        return self._roles[role]

    def studies(self) -> pd.DataFrame:
        """Study runs that count: FINISHED ones unless ``include_failed``."""
        s = self.role("study")
        if not self.include_failed:
            s = s[s["status"] == "FINISHED"]
        return s

    def _split(self) -> tuple[list[str], list[str]]:
        """Counted study ids with their own ``best/*`` series, and those without."""
        s = self.studies()
        col = f"metrics.{STUDY_KEYS[0]}"
        has = s[col].notna() if col in s else pd.Series(False, index=s.index)
        return list(s.loc[has, "run_id"]), list(s.loc[~has, "run_id"])

    # -- checkpoint record ----------------------------------------------------------
    def record(self, source: str = "auto", tests: Sequence[str] | None = None
               ) -> pd.DataFrame:
        """One row per change of each counted study's answer: ``study_id``, ``run_id``,
        ``step``, ``elapsed_s``, ``val_balanced_accuracy``, ``test_*`` (all, or the names
        in ``tests``), ``source`` (``study`` or ``trial``), ``end_s`` (when the study
        evaluated its last checkpoint), in time order within each study.

        ``auto``: a study's own series where it has one, its trials otherwise; ``study``:
        own series only; ``trials``: recomputed from the trials for every study."""
        if source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
        with_series, without = self._split()
        if source == "trials":
            parts = [self._record_for("trial", with_series + without, tests)]
        elif source == "study":
            parts = [self._record_for("study", with_series, tests)]
        else:
            parts = [self._record_for("study", with_series, tests),
                     self._record_for("trial", without, tests)]
        parts = [p for p in parts if len(p)]
        if not parts:
            return pd.DataFrame(columns=["study_id", "run_id", "step", "elapsed_s", VAL,
                                         "source", "end_s"])
        return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]

    def _record_for(self, kind: str, study_ids: list[str], tests: Sequence[str] | None
                    ) -> pd.DataFrame:
        key = (kind, tuple(study_ids), None if tests is None else tuple(tests))
        if key not in self._records:
            self._records[key] = self._build_record(kind, study_ids, tests)
        return self._records[key]

    def _build_record(self, kind: str, study_ids: list[str], tests: Sequence[str] | None
                      ) -> pd.DataFrame:
        cand = pd.DataFrame()
        if study_ids and kind == "study":
            cand = self._candidates(study_ids, STUDY_KEYS[0], "study")
        elif study_ids:
            trials = self.role("trial")
            trials = trials[trials["parent_run_id"].isin(set(study_ids))]
            if len(trials):
                cand = self._candidates(list(trials["run_id"]), TRIAL_KEYS[0], "trial")
        if cand.empty:
            return pd.DataFrame(columns=["study_id", "run_id", "step", "elapsed_s", VAL,
                                         "source", "end_s"])
        rec = self._attach_tests(_record_rows(cand), tests)
        # when each study evaluated its last checkpoint: the end of its time axis
        rec["end_s"] = rec["study_id"].map(cand.groupby("study_id")["elapsed_s"].max())
        return rec

    def _candidates(self, run_ids: list[str], val_key: str, source: str) -> pd.DataFrame:
        """Every evaluated checkpoint (run, step) with its validation score and time."""
        # all trials of the experiments: one join instead of long IN (...) lists
        scope = None if source == "trial" and len(run_ids) == self._n_role("trial") else run_ids
        h = self.reader.histories(scope, self.experiment_ids, keys=[val_key, ELAPSED])
        h = h[h["run_id"].isin(set(run_ids))] if scope is None else h
        if h.empty:
            return pd.DataFrame()
        h = h.drop_duplicates(["run_id", "key", "step"], keep="last")
        w = h.pivot(index=["run_id", "step"], columns="key", values="value")
        w = w.reindex(columns=[val_key, ELAPSED]).reset_index()
        w.columns = ["run_id", "step", VAL, "elapsed_s"]
        w = w.dropna(subset=[VAL])
        meta = self.role(source).set_index("run_id")
        if source == "study":
            w["study_id"] = w["run_id"]
        else:
            w["study_id"] = w["run_id"].map(meta["parent_run_id"])
        w["start_time"] = w["run_id"].map(meta["start_time"])
        w["source"] = source
        return w

    def _n_role(self, role: str) -> int:
        return len(self.role(role))

    def _attach_tests(self, rec: pd.DataFrame, tests: Sequence[str] | None) -> pd.DataFrame:
        """Read the test metrics of the record's checkpoints only (see module doc)."""
        out = []
        for source, (_, prefix) in (("study", STUDY_KEYS), ("trial", TRIAL_KEYS)):
            part = rec[rec["source"] == source]
            if part.empty:
                continue
            ids = sorted(set(part["run_id"]))
            steps = sorted(set(part["step"]))
            if tests is None:
                h = self.reader.histories(ids, self.experiment_ids, prefixes=[prefix],
                                          steps=steps)
            else:
                keys = [prefix + t.removeprefix("test_") for t in tests]
                h = self.reader.histories(ids, self.experiment_ids, keys=keys, steps=steps)
            if len(h):
                h = h.drop_duplicates(["run_id", "key", "step"], keep="last")
                h = h.assign(key="test_" + h["key"].str.slice(len(prefix)))
                w = h.pivot(index=["run_id", "step"], columns="key", values="value")
                part = part.merge(w.reset_index(), on=["run_id", "step"], how="left")
            out.append(part)
        res = pd.concat(out, ignore_index=True) if out else rec
        res = res.sort_values(["study_id", "order"], kind="stable").drop(columns="order")
        test_cols = sorted(c for c in res.columns if c.startswith("test_"))
        # a study series repeats its answer at every epoch: keep the points where the answer
        # changed, so that elapsed_s says when it was first given
        vals = res[[VAL, *test_cols]]
        same = (vals.eq(vals.shift(1)) | (vals.isna() & vals.shift(1).isna())).all(axis=1)
        same &= res["study_id"].eq(res["study_id"].shift(1)) & res["source"].eq("study")
        res = res[~same.to_numpy()]
        return res[["study_id", "run_id", "step", "elapsed_s", VAL, *test_cols, "source"]
                   ].reset_index(drop=True)

    def selected(self, source: str = "auto") -> pd.DataFrame:
        """Per counted study: the reported checkpoint, with the study's tidy columns.

        A study with its own ``best/*`` series reports its last values, which MLflow keeps
        as the run's latest metrics: no history is read (``elapsed_s`` is then NaN). Other
        studies (and every study with ``source="trials"``) get the last entry of their
        trial record. Studies without any evaluated checkpoint are left out."""
        if source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
        studies = self.studies().set_index("run_id")
        with_series, without = self._split()
        meta_cols = [c for c in ("experiment", "family", "method", "dataset", "seed",
                                 "fold", "n_labeled", "n_val", "budget_minutes", "arch")
                     if c in studies]
        parts = []
        if source != "trials" and with_series:
            s = studies.loc[with_series]
            summary = pd.DataFrame({VAL: s[f"metrics.{STUDY_KEYS[0]}"], "elapsed_s": np.nan,
                                    "checkpoint_run_id": s.index, "source": "study"},
                                   index=s.index)
            for c in s.columns:
                if c.startswith(f"metrics.{STUDY_KEYS[1]}"):
                    summary["test_" + c[len(f"metrics.{STUDY_KEYS[1]}"):]] = s[c]
            parts.append(summary)
        trial_ids = with_series + without if source == "trials" else (
            without if source == "auto" else [])
        if trial_ids:
            rec = self._record_for("trial", trial_ids, None)
            last = rec.groupby("study_id", sort=False).tail(1).set_index("study_id")
            parts.append(last.drop(columns=["step", "end_s"]).rename(
                columns={"run_id": "checkpoint_run_id"}))
        if not parts:
            return pd.DataFrame(columns=["study_id", *meta_cols, VAL, "source"])
        last = pd.concat([p for p in parts if len(p)]) if any(len(p) for p in parts) \
            else parts[0]
        out = studies.loc[studies.index.intersection(last.index), meta_cols].join(last)
        return out.rename_axis("study_id").reset_index()


def _record_rows(cand: pd.DataFrame) -> pd.DataFrame:
    """Order the candidates in time and keep those that make up the record.

    Trial checkpoints: the strict running-max improvements of validation per study, in time
    order (elapsed, then run start, then step) — the protocol's ``>`` rule. A study's own
    series already *is* its answer at each global epoch (a running max in search mode, the
    latest epoch in transfer mode), so every point of it is kept, in step order.
    """
    c = cand.assign(_e=cand["elapsed_s"].fillna(np.inf))
    is_study = (c["source"] == "study").to_numpy()
    # study series in step order; trial checkpoints in time order
    c["_k"] = np.where(is_study, c["step"].astype(float), c["_e"])
    c = c.sort_values(["study_id", "_k", "start_time", "step"], kind="stable")
    prev = c.groupby("study_id", sort=False)[VAL].cummax()
    prev = prev.groupby(c["study_id"], sort=False).shift(1)
    keep = (c["source"] == "study") | prev.isna() | (c[VAL] > prev)
    c = c[keep.to_numpy()].drop(columns=["_e", "_k", "start_time"])
    c["order"] = np.arange(len(c))
    return c


# columns every role frame keeps, even when empty for that role
BASE_COLUMNS = ("run_id", "experiment_id", "experiment", "run_name", "status", "start_time",
                "end_time", "parent_run_id", "role")


def _drop_empty(df: pd.DataFrame) -> pd.DataFrame:
    """Leave out the columns without a single value (other than the base columns)."""
    empty = [c for c in df.columns if c not in BASE_COLUMNS and df[c].isna().all()]
    return df.drop(columns=empty) if empty else df


def tidy_runs(reader: StoreReader, experiments: dict[str, str], role: str | None = None
              ) -> pd.DataFrame:
    """One row per run: ids, status, times, ``scarcelab.*`` tags as short columns (role,
    family, method, dataset, seed, ...), other tags as ``tags.*``, params as ``params.*``
    and last metric values as ``metrics.*`` (MLflow's own naming). ``role``: only the runs
    with that ``scarcelab.role`` (read as such, not filtered afterwards)."""
    ids = list(experiments.values())
    runs = reader.runs(ids, role).copy()  # the reader caches its frame: never modify it
    names = {v: k for k, v in experiments.items()}
    runs.insert(2, "experiment", runs["experiment_id"].map(names))
    tags = reader.tags(ids, role)
    params = reader.params(ids, role)
    latest = reader.latest_metrics(ids, role)
    ours = tags[tags["key"].str.startswith(T.PREFIX)]
    ours = ours.assign(key=ours["key"].str.slice(len(T.PREFIX)))
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

    parent = tags[tags["key"] == MLFLOW_PARENT_RUN_ID].drop_duplicates("run_id", keep="last")
    other = tags[~tags["key"].str.startswith(T.PREFIX)]
    df = runs.set_index("run_id")
    df["parent_run_id"] = parent.set_index("run_id")["value"].reindex(df.index)
    short = _wide(ours, "")
    short = short.drop(columns=[c for c in short.columns if c in df.columns])
    df = df.join(short).join(_wide(other, "tags.")).join(_wide(params, "params."))
    df = df.join(_wide(latest[["run_id", "key", "value"]], "metrics."))
    # the label budget and compute budget are params; under `mlflow run` the raw entry point
    # string ("default") is the param and the value actually used is ``resolved.<name>``
    for name in ("n_labeled", "n_val", "budget_minutes"):
        for col in (f"params.resolved.{name}", f"params.{name}"):
            if col in df:
                val = pd.to_numeric(df[col], errors="coerce")
                df[name] = val if name not in df else df[name].fillna(val)
    for col in NUMERIC_COLUMNS:
        if col not in df:
            continue
        num = pd.to_numeric(df[col], errors="coerce")
        if num.notna().sum() != df[col].notna().sum():
            continue  # not numbers after all: leave the strings alone
        whole = num.dropna()
        df[col] = num.astype("Int64") if (whole == whole.round()).all() and \
            col != "budget_minutes" else num
    for col in ("start_time", "end_time"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    return df.reset_index()


def load(experiments: str | Iterable[str], tracking_uri: str | None = None, *,
         include_failed: bool = False, reader: str = "auto") -> Tracked:
    """Read the runs of the named experiments (comma-separated or a list) once.

    ``tracking_uri``: any MLflow tracking URI (default: the current one); database URIs are
    read through SQL, servers and file stores through the client API. ``include_failed``
    also counts studies that did not finish (FAILED, KILLED, RUNNING).
    """
    names = [n.strip() for e in _listify(experiments) for n in e.split(",") if n.strip()]
    if not names:
        raise ValueError("name at least one experiment")
    rd = open_reader(tracking_uri, reader)
    exps = rd.experiment_ids(names)
    return Tracked(runs=None, reader=rd, experiment_ids=list(exps.values()),
                   include_failed=include_failed, experiments=exps)


# -- what a study was run with -----------------------------------------------------------

#: params that do not change what a study computes: the study options declared
#: ``row=False`` (the sample ``seed``, where things live or are named, how the command was
#: spelled — ``set`` / ``hparams_from`` are logged resolved, as ``override.*`` /
#: ``hparams.*`` / ``hparams_source`` —, the console, the C-Score diagnostics' sample), and
#: the params no option declares: the storage, tune's resume, the final-phase reserve
#: (derived from budget_minutes) and the test set's size (it follows from the data: the k
#: folds of a user's images, tag scarcelab.fold, differ in it by an image)
NOT_SETTINGS = frozenset({"storage", "resume", "final_reserve_s", "n_test"}) | NOT_ROW
#: settings logged only since a change, with the value every study recorded before it ran
#: with (each option's ``before=``): a study without the param gets it, so that an older
#: study and a newer one of the same configuration stay one row. E.g. the precision and
#: kernel settings (issue 40) change a study's numbers — bf16 and fp32 studies are
#: different rows — and before them every study ran the CPU's fp32 path with channels-last
#: weights.
ADDED_SETTINGS: dict[str, str] = dict(BEFORE)
#: every param a study logged before ADDED_SETTINGS grew (the studies of the results pages
#: of 2026-12-02, commit d232f3f): a param outside this set, ADDED_SETTINGS and
#: NOT_SETTINGS is a new option nobody classified, and
#: tests/tracking/query/test_settings_classified.py fails until it is put in one of the
#: last two
SETTINGS_BEFORE_ADDED = frozenset({
    "allow_large_val", "arch", "batch_size", "budget_clock", "budget_minutes",
    "class_weights", "data_dir", "dataset", "description", "device", "family",
    "final_reserve_s", "hparams_from", "hparams_source", "label_fraction", "max_epochs",
    "max_steps_per_epoch", "max_trials", "method", "n_labeled", "n_test", "n_unlabeled",
    "n_val", "patience", "positive_class", "register_model", "search", "seed", "set",
    "study_name", "tags", "transfer_epochs", "transfer_patience", "unlabeled_batch_size",
    "val_from"})
#: ``scarcelab.*`` tags that say how a study was run (every other tag is bookkeeping that
#: differs between seeds or attempts: owner, split hash, trial counts, digests, ...)
SETTING_TAGS = ("family", "method", "dataset", "arch", "search", "val_from", "protocol",
                "tune_phase", "ood", "ratio", "ood_kind", "tuning", "sweep_role",
                "val_in_train", "positive_class", "encoder", "aggregation")
_MISSING = object()


def _canonical(v: object) -> object:
    """A param or tag value as one canonical string (NaN for unset): ``"3"``, ``"3.0"`` and
    ``3.0`` are the same budget, ``"null"`` is unset, JSON objects compare by content."""
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return np.nan
    text = str(v)
    try:
        parsed = json.loads(text)
    except ValueError:
        return text
    if parsed is None:
        return np.nan
    if isinstance(parsed, float) and parsed.is_integer():
        parsed = int(parsed)
    return json.dumps(parsed, sort_keys=True)


def study_settings(studies: pd.DataFrame) -> pd.DataFrame:
    """Everything a study was run with, one column per setting (index ``run_id``), values
    canonical strings (NaN: not set) — the key that keeps a leaderboard from pooling runs
    that differ (a leaderboard that averaged two label budgets or two batch sizes would
    report a method no run ever was).

    Settings are every param except :data:`NOT_SETTINGS` — so a new parameter separates
    rows without anyone listing it — with ``resolved.<name>`` (what ``mlflow run`` logs
    beside its raw entry-point string) taking precedence, plus the :data:`SETTING_TAGS`.
    ``device`` counts by kind (``cuda:1`` is ``cuda``: a budget in minutes buys different
    training on a GPU and a CPU). A contamination child's configuration (``hparams.*``,
    ``hparams_source``) is the output of its sweep's tuning study — the tag ``tuning`` and
    ``search`` say how it was chosen — so it is not a setting there. A setting of
    :data:`ADDED_SETTINGS` a study lacks is the value it ran with (recorded before the
    setting was logged)."""
    studies = studies.reset_index(drop=True)
    out: dict[str, pd.Series] = {}
    raw = {c[len("params."):]: c for c in studies.columns
           if c.startswith("params.") and not c.startswith("params.resolved.")}
    resolved = {c[len("params.resolved."):]: c for c in studies.columns
                if c.startswith("params.resolved.")}
    cache: dict[object, object] = {}

    def canon(col: pd.Series) -> pd.Series:
        vals = col.to_numpy(dtype=object)
        res = np.empty(len(vals), dtype=object)
        for i, v in enumerate(vals):
            key = v if isinstance(v, str) or v is None else repr(v)
            got = cache.get(key, _MISSING)
            if got is _MISSING:
                got = cache[key] = _canonical(v)
            res[i] = got
        return pd.Series(res, index=col.index, dtype=object)

    for name in sorted(set(raw) | set(resolved)):
        if name in NOT_SETTINGS:
            continue
        if name in raw and name in resolved:  # the resolved value, where it was logged
            col = canon(studies[resolved[name]]).where(studies[resolved[name]].notna(),
                                                       canon(studies[raw[name]]))
        else:
            col = canon(studies[resolved.get(name) or raw[name]])
        out[name] = col
    for name in SETTING_TAGS:
        if name in studies:
            tag = canon(studies[name])
            out[name] = tag if name not in out else out[name].where(out[name].notna(), tag)
    for name, former in ADDED_SETTINGS.items():
        if name in out:  # only where some study has it: otherwise all alike already
            out[name] = out[name].where(out[name].notna(), _canonical(former))
    if "device" in out:
        out["device"] = out["device"].map(
            lambda d: d.split(":", 1)[0] if isinstance(d, str) else d)
    df = pd.DataFrame(out) if out else pd.DataFrame(index=studies.index)
    df.index = pd.Index(studies["run_id"].to_numpy(), name="run_id")
    if "tuning" in df:  # a sweep child: its configuration came from the sweep's tuning
        derived = [c for c in df.columns if c.startswith("hparams.") or c == "hparams_source"]
        if derived:
            df.loc[df["tuning"].notna().to_numpy(), derived] = np.nan
    return df


__all__: Sequence[str] = ["ADDED_SETTINGS", "NOT_SETTINGS", "SETTINGS_BEFORE_ADDED",
                          "SETTING_TAGS", "Tracked", "load", "study_settings", "tidy_runs"]
