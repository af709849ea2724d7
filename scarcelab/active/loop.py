"""The pool-based AL loop (CDALBench Alg. 1) with three independent seeds.

Seeds: s_Ω drives the strategy (and its candidate subsample) and is the same in every
repetition; s_D + k drives repetition k's data (synthetic draw, validation split, seed set,
mini-batch order); s_θ + k drives its model (initial weights, dropout). Nothing reads a
global RNG, so one repetition is reproduced from (s_Ω, s_D + k, s_θ + k) alone, and two
strategies compared under the same k see the same data and the same initial model.

Score: AUC = mean test accuracy of the models that chose a query, from the seed-set model
to the one before the last query (CDALBench Alg. 1; :func:`curve_auc`); the whole curve is
logged with step = labeled-set size.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch

from scarcelab import tags as T
from scarcelab.accel import Accel
from scarcelab.active import STRATEGIES
from scarcelab.active.base import QueryState, Strategy
from scarcelab.active.batched import fit_many
from scarcelab.active.batched import supports as batch_supports
from scarcelab.active.classifier import (
    ALModel,
    FitConfig,
    TorchModelView,
    _autocast,
    _chunked,
    _optimizer,
    accuracy,
    al_accel,
    build_net,
    fit,
    resolve_device,
)
from scarcelab.active.datasets import (
    ALConfig,
    ALData,
    LoadContext,
    dataset_config,
    load_al_dataset,
    spec,
)
from scarcelab.data.own import dataset_label
from scarcelab.errors import ConfigError, DataError
from scarcelab.tracker import DatasetInfo, Tracker
from scarcelab.trials import COMPLETE, TrialRunner


@dataclass
class ALRunConfig:
    """One sweep: a strategy on a dataset at one query size, over several repetitions."""

    strategy: str
    dataset: str
    query_size: int = 1
    data_dir: str | None = None
    repetitions: int = 1
    seed_strategy: int = 0
    seed_data: int = 0
    seed_model: int = 0
    overrides: dict[str, Any] = field(default_factory=dict)  # ALConfig fields
    strategy_params: dict[str, Any] = field(default_factory=dict)
    max_candidates: int | None = None  # None = the strategy's own default
    device: str = "cpu"  # "auto" = cuda when available
    encoder: dict[str, Any] = field(default_factory=dict)  # encoded_* sets (EncoderConfig)
    # precision and kernels of the fits and of an encoded set's encoder (scarcelab.accel;
    # ``auto``: the fast path for image backbones on CUDA, the former fp32 path otherwise)
    accel: Accel = field(default_factory=Accel)
    data_options: Any = None  # a user's images: scarcelab.data.own.DataOptions

    def resolved(self) -> ALConfig:
        return dataset_config(self.dataset).replace(**self.overrides)

    def resolved_accel(self, cfg: ALConfig | None = None) -> Accel:
        """The fits' settings as they run (``cfg``: the resolved dataset config)."""
        cfg = cfg or self.resolved()
        return al_accel(self.accel, resolve_device(self.device), cfg.arch)

    def load_context(self, cache: Any = None, pretrained: Any = None,
                     pretrained_id: str = "") -> LoadContext:
        return LoadContext(self.device, dict(self.encoder), cache, pretrained, pretrained_id,
                           self.accel, self.data_options)


@dataclass
class RepetitionResult:
    repetition: int
    seeds: dict[str, int]
    sizes: list[int]  # labeled-set size at each recorded accuracy (first = seed set)
    accuracies: list[float]
    query_times: list[float]
    auc: float
    split_hash: str
    labeled: list[int] = field(default_factory=list)  # seed set, then queries in order
    #: recorded fits whose classifier predicts one class for every validation sample while
    #: the labeled set holds several: a collapsed (e.g. dead-ReLU) network, whose accuracy
    #: is the majority share and whose scores no strategy can rank by (docs/active.md,
    #: "Active learning at high learning rates")
    collapsed_fits: int = 0


@dataclass
class ALResult:
    config: ALRunConfig
    repetitions: list[RepetitionResult]
    failed: list[tuple[int, str]]

    @property
    def aucs(self) -> np.ndarray:
        return np.asarray([r.auc for r in self.repetitions])


def curve_auc(accuracies: list[float]) -> float:
    """CDALBench Alg. 1's score: the mean test accuracy of the models that chose a query —
    the seed-set model first, the model after the last query excluded (it chooses nothing).
    With ``B / q`` queries that is ``B / q`` accuracies. A curve with no query (budget 0)
    scores its seed-set accuracy. (Their released evaluation code averages every row of
    ``accuracies.csv``, i.e. also the last model; see docs/active.md.)"""
    if not accuracies:
        raise ValueError("curve_auc: empty accuracy curve")
    return float(np.mean(accuracies[:-1])) if len(accuracies) > 1 else float(accuracies[0])


def _split(data: ALData, cfg: ALConfig, rng: np.random.Generator
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validation indices, pool indices, seed-set indices (into ``x_train``)."""
    n = len(data.y_train)
    perm = rng.permutation(n)
    n_val = max(1, int(round(cfg.val_fraction * n))) if cfg.val_fraction > 0 else 0
    val, pool = np.sort(perm[:n_val]), np.sort(perm[n_val:])
    seed_parts = []
    for c in range(data.num_classes):
        members = pool[data.y_train[pool] == c]
        if len(members) < cfg.seed_per_class:
            raise DataError(f"{data.name}: class {c} has {len(members)} pool samples, fewer than "
                            f"seed_per_class={cfg.seed_per_class}")
        seed_parts.append(rng.choice(members, cfg.seed_per_class, replace=False))
    return val, pool, np.sort(np.concatenate(seed_parts))


def _hash_split(*parts: np.ndarray) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(np.asarray(p, dtype=np.int64).tobytes())
        h.update(b"|")
    return h.hexdigest()[:16]


def make_strategy(name: str, params: dict[str, Any] | None = None,
                  max_candidates: int | None = None) -> Strategy:
    cls = STRATEGIES.get(name)
    strat: Strategy = cls(**(params or {}))
    if max_candidates is not None:
        strat.max_candidates = max_candidates  # type: ignore[misc]
    return strat


def _check_settings(cfg: ALConfig, query_size: int) -> None:
    """Refuse a repetition that could not run as asked before any RNG is drawn, so a bad
    sweep fails at once and identically for every repetition."""
    if query_size < 1:
        raise ConfigError(f"query_size must be >= 1, got {query_size}")
    if cfg.val_fraction <= 0 and cfg.stop_on != "test":
        raise ConfigError("val_fraction=0 leaves no validation split to stop on; only the "
                          "test-set stopping of --early-stop-on test runs without one")


@dataclass
class _DeviceData:
    """The repetition's arrays on its device, moved once: every fit indexes into them."""

    x_all: torch.Tensor
    y_all: torch.Tensor
    x_val: torch.Tensor  # what early stopping watches (the test set under stop_on="test")
    y_val: torch.Tensor
    x_te: torch.Tensor
    y_te: torch.Tensor


def _on_device(data: ALData, cfg: ALConfig, val: np.ndarray, dev: torch.device
               ) -> _DeviceData:
    x_all = torch.from_numpy(np.ascontiguousarray(data.x_train, dtype=np.float32)).to(dev)
    y_all = torch.from_numpy(data.y_train).to(dev)
    t_val = torch.from_numpy(val).to(dev)
    x_val, y_val = x_all[t_val], y_all[t_val]
    x_te = torch.from_numpy(np.ascontiguousarray(data.x_test, dtype=np.float32)).to(dev)
    y_te = torch.from_numpy(data.y_test).to(dev)
    if cfg.stop_on == "test":  # CDALBench's leak, for reproduction only (docs/active.md)
        x_val, y_val = x_te, y_te
    return _DeviceData(x_all, y_all, x_val, y_val, x_te, y_te)


def _candidates(unlabeled: np.ndarray, cap: int | None, rng_s: np.random.Generator
                ) -> np.ndarray:
    """The strategy's candidate subsample, drawn from s_Ω only when the pool exceeds it, so
    an uncapped strategy consumes no strategy randomness here."""
    return (np.sort(rng_s.choice(unlabeled, cap, replace=False))
            if cap is not None and len(unlabeled) > cap else unlabeled)


class _Learner:
    """One repetition's classifier and how it is fitted: its initial weights (for scratch
    fitting), the optimiser kept across fits, the data and model generators of the main
    trajectory, and the oracle's candidate fits, which must leave all of these untouched."""

    def __init__(self, data: ALData, cfg: ALConfig, dev: torch.device, arrays: _DeviceData,
                 data_gen: torch.Generator, model_gen: torch.Generator,
                 batched_oracle: bool, accel: Accel | None = None) -> None:
        self.data, self.cfg, self.dev, self.arrays = data, cfg, dev, arrays
        self.data_gen, self.model_gen = data_gen, model_gen
        # precision and kernels, resolved (the former fp32 path on CPU and for MLPs)
        self.accel = acc = al_accel(accel, dev, cfg.arch)
        acc.apply_globals(dev)
        self.net = build_net(cfg.arch, tuple(data.x_train.shape), data.num_classes,
                             cfg.hidden, cfg.dropout, model_gen).to(dev)
        acc.prepare(self.net, compiled=getattr(self.net, "backbone", self.net))
        self.init_state = copy.deepcopy(self.net.state_dict())
        self.fcfg = fcfg = cfg.fit_config()
        # The seed-set fit: a fixed number of epochs when first_fit_epochs > 0 (a patience
        # longer than the run never stops it).
        self.first_cfg = (dataclasses.replace(fcfg, max_epochs=cfg.first_fit_epochs,
                                              patience=cfg.first_fit_epochs + 1)
                          if cfg.first_fit_epochs > 0 else fcfg)
        self.main_opt = (_optimizer(fcfg, list(self.net.parameters()), acc)
                         if cfg.keep_optimizer else None)
        # The stacked fit mirrors the default fit only (fresh optimiser, best weights kept,
        # every batch); other settings use the sequential candidate fits.
        self.batched = (batched_oracle and batch_supports(self.net, cfg.dropout)
                        and fcfg.restore_best and not fcfg.drop_last and self.main_opt is None)
        self._spare: list[ALModel] = []

    def _fit(self, model: ALModel, idx: np.ndarray, dgen: torch.Generator,
             mgen: torch.Generator, fc: FitConfig, opt: torch.optim.Optimizer | None,
             score: bool = True) -> float:
        """Fit ``model`` on the rows ``idx``; its test accuracy (NaN when not ``score``:
        a fit inside a query, whose accuracy no curve records)."""
        if self.cfg.fitting == "scratch":
            model.load_state_dict(self.init_state)
        a, t = self.arrays, torch.from_numpy(idx).to(self.dev)
        fit(model, a.x_all[t], a.y_all[t], a.x_val, a.y_val, fc, dgen, mgen, opt, self.accel)
        return (accuracy(model, a.x_te, a.y_te, fc.eval_batch_size, self.accel) if score
                else math.nan)

    def fit_main(self, labeled: np.ndarray, fc: FitConfig | None = None,
                 score: bool = True) -> float:
        """A fit of the main trajectory (``fc``: the seed-set fit's settings), which draws on
        the repetition's own generators."""
        return self._fit(self.net, labeled, self.data_gen, self.model_gen,
                         fc if fc is not None else self.fcfg, self.main_opt, score)

    @torch.no_grad()
    def collapsed(self, labeled: np.ndarray) -> bool:
        """True when the current classifier predicts a single class for the whole split
        early stopping watches although the labeled set holds several classes. Reads no
        RNG, so the trajectory is unchanged."""
        if len(np.unique(self.data.y_train[labeled])) < 2:
            return False
        self.net.eval()
        x = self.accel.images(self.arrays.x_val)  # the layout the fits use
        with _autocast(self.accel, x.device):
            pred = _chunked(self.net, x, self.fcfg.eval_batch_size).argmax(1)
        return bool((pred == pred[0]).all())

    def add_labels(self, labeled: np.ndarray, picked: np.ndarray) -> np.ndarray:
        """``labeled`` plus the query; with fit_per_label under finetune, one fit per label
        but the last (the caller's fit follows), as CDALBench's ``ALGame.step`` does."""
        if self.cfg.fit_per_label and self.cfg.fitting == "finetune":
            for extra in picked[:-1]:
                labeled = np.concatenate([labeled, [extra]])
                self.fit_main(labeled, score=False)  # only the query's last fit is scored
            return np.concatenate([labeled, picked[-1:]])
        return np.concatenate([labeled, picked])

    def _scratch_net(self) -> ALModel:
        """One reusable module for the oracle's candidate fits (a deepcopy per candidate
        was a fifth of the oracle's time); its weights are overwritten before each fit."""
        if not self._spare:
            self._spare.append(copy.deepcopy(self.net))
        return self._spare[0]

    def oracle_score(self, labeled: np.ndarray, extra: np.ndarray) -> float:
        """One candidate's test accuracy after a fit on ``labeled`` plus it. Copies of the
        generators: every candidate is judged under the same batch order and dropout masks,
        and the main trajectory's streams are left untouched."""
        dg, mg = torch.Generator(), torch.Generator()
        dg.set_state(self.data_gen.get_state())
        mg.set_state(self.model_gen.get_state())
        trial = self._scratch_net()
        trial.load_state_dict(self.net.state_dict())
        topt = None
        if self.main_opt is not None:  # the candidate continues a copy of the optimiser state
            topt = _optimizer(self.fcfg, list(trial.parameters()), self.accel)
            topt.load_state_dict(copy.deepcopy(self.main_opt.state_dict()))
        return self._fit(trial, np.concatenate([labeled, np.asarray(extra, dtype=np.int64)]),
                         dg, mg, self.fcfg, topt)

    def oracle_scores(self, labeled: np.ndarray, extras: list[np.ndarray]) -> list[float]:
        """All τ candidate fits as one stacked fit (scarcelab.active.batched): the same
        batch order for every candidate, as the sequential copies above get."""
        dg = torch.Generator()
        dg.set_state(self.data_gen.get_state())
        start = self.init_state if self.cfg.fitting == "scratch" else self.net.state_dict()
        sets = [torch.from_numpy(np.concatenate([labeled, np.asarray(e, dtype=np.int64)]))
                .to(self.dev) for e in extras]
        a = self.arrays
        return fit_many(self.net, start, sets, a.x_all, a.y_all, a.x_val, a.y_val,  # type: ignore[arg-type]
                        a.x_te, a.y_te, self.fcfg, dg, self.accel)

    def query_state(self, strategy: Strategy, labeled: np.ndarray, cand: np.ndarray,
                    acc: float) -> QueryState:
        """What the strategy sees; the oracle's scorers are bound to this query's labeled
        set, and the stacked one offered only where it reproduces the sequential fits."""
        wants_oracle = getattr(strategy, "needs_oracle", False)
        return QueryState(
            x=self.data.x_train, labeled=labeled, y_labeled=self.data.y_train[labeled],
            candidates=cand, model=TorchModelView(self.net, accel=self.accel),
            num_classes=self.data.num_classes,
            oracle_score=partial(self.oracle_score, labeled) if wants_oracle else None,
            oracle_scores=(partial(self.oracle_scores, labeled)
                           if wants_oracle and self.batched else None),
            current_accuracy=acc)


def run_repetition(data: ALData, cfg: ALConfig, strategy: Strategy, query_size: int,
                   repetition: int, seed_strategy: int, seed_data: int, seed_model: int,
                   data_rng: np.random.Generator | None = None,
                   device: str | torch.device = "cpu",
                   batched_oracle: bool = True,
                   on_iteration: Callable[[int, int, float], None] | None = None,
                   accel: Accel | None = None) -> RepetitionResult:
    """One repetition of Alg. 1. ``data_rng`` continues the stream that generated ``data``
    (synthetic sets); otherwise it is created from ``seed_data + repetition``.
    ``on_iteration(repetition, labeled size, test accuracy)`` follows each fit (progress
    display only; it must not touch any RNG). ``accel``: the fits' precision and kernels
    (:func:`~scarcelab.active.classifier.al_accel`)."""
    _check_settings(cfg, query_size)
    s_d, s_t = seed_data + repetition, seed_model + repetition
    rng_d = data_rng if data_rng is not None else np.random.default_rng(s_d)
    rng_s = np.random.default_rng(seed_strategy)  # s_Ω: fixed across repetitions
    data_gen = torch.Generator().manual_seed(s_d)
    model_gen = torch.Generator().manual_seed(s_t)
    dev = resolve_device(str(device))
    val, pool, seed_idx = _split(data, cfg, rng_d)
    budget = min(cfg.budget, len(pool) - len(seed_idx))
    learner = _Learner(data, cfg, dev, _on_device(data, cfg, val, dev), data_gen, model_gen,
                       batched_oracle, accel)
    in_labeled = np.zeros(len(data.y_train), dtype=bool)
    in_labeled[seed_idx] = True
    in_pool = np.zeros(len(data.y_train), dtype=bool)
    in_pool[pool] = True
    labeled = seed_idx.copy()

    acc = learner.fit_main(labeled, learner.first_cfg)
    collapsed = int(learner.collapsed(labeled))
    if on_iteration is not None:
        on_iteration(repetition, len(labeled), acc)
    sizes, accs, qtimes = [len(labeled)], [acc], []
    added = 0
    while added < budget:
        q = min(query_size, budget - added)
        cand = _candidates(np.flatnonzero(in_pool & ~in_labeled), strategy.max_candidates,
                           rng_s)
        state = learner.query_state(strategy, labeled, cand, acc)
        t0 = time.perf_counter()
        picked = strategy.query(state, q, rng_s)
        qtimes.append(time.perf_counter() - t0)
        if picked.size == 0:
            break
        in_labeled[picked] = True
        labeled = learner.add_labels(labeled, picked)
        added += picked.size
        acc = learner.fit_main(labeled)
        collapsed += learner.collapsed(labeled)
        if on_iteration is not None:
            on_iteration(repetition, len(labeled), acc)
        sizes.append(len(labeled))
        accs.append(acc)
    auc = curve_auc(accs)
    return RepetitionResult(repetition, {"strategy": seed_strategy, "data": s_d, "model": s_t},
                            sizes, accs, qtimes, auc, _hash_split(val, pool, seed_idx),
                            labeled.tolist(), collapsed)


def _digest(data: ALData) -> str:
    h = hashlib.sha256()
    for a in (data.x_train, data.y_train, data.x_test, data.y_test):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def pool_capacity(data: ALData, cfg: ALConfig) -> int:
    """How many labels a repetition can acquire: the pool (train minus the validation
    split, as :func:`_split` draws it) less the seed set (``seed_per_class`` per class)."""
    n = len(data.y_train)
    n_val = max(1, int(round(cfg.val_fraction * n))) if cfg.val_fraction > 0 else 0
    return n - n_val - cfg.seed_per_class * data.num_classes


def check_budget(rc: ALRunConfig, cfg: ALConfig, first: ALData | None) -> None:
    """Refuse a budget the pool cannot give (issue 42 item 8: ``--budget 1000000`` on splice
    labelled the whole pool, 798, exited 0 and still logged ``budget=1000000``), rather than
    run a curve other than the one asked for. Synthetic sets are drawn once here for their
    size (every repetition's draw has the same)."""
    data = first if first is not None else load_al_dataset(
        rc.dataset, rc.data_dir, np.random.default_rng(rc.seed_data), rc.load_context())
    cap = pool_capacity(data, cfg)
    if cfg.budget > cap:
        raise ConfigError(
            f"--budget {cfg.budget} is more than {rc.dataset} can label: its pool holds "
            f"{cap} unlabeled samples ({len(data.y_train)} train, less the validation split "
            f"and the seed set of {cfg.seed_per_class} per class); give --budget {cap} or "
            "less")


def load_for_sweep(rc: ALRunConfig, ctx: LoadContext | None = None) -> ALData | None:
    """Real data is identical across repetitions: load it once (None for synthetic sets,
    which are regenerated per repetition)."""
    if spec(rc.dataset).synthetic:
        return None
    return load_al_dataset(rc.dataset, rc.data_dir, np.random.default_rng(rc.seed_data),
                           ctx or rc.load_context())


def run_one(rc: ALRunConfig, k: int, first: ALData | None,
            strategy: Strategy | None = None,
            on_iteration: Callable[[int, int, float], None] | None = None
            ) -> RepetitionResult:
    """Repetition ``k`` of a sweep, exactly as :func:`run_al` runs it (used by benches that
    spread repetitions over processes)."""
    cfg = rc.resolved()
    strategy = strategy or make_strategy(rc.strategy, rc.strategy_params, rc.max_candidates)
    rng_d = np.random.default_rng(rc.seed_data + k)
    data = first if first is not None else load_al_dataset(rc.dataset, rc.data_dir, rng_d,
                                                            rc.load_context())
    return run_repetition(data, cfg, strategy, rc.query_size, k, rc.seed_strategy,
                          rc.seed_data, rc.seed_model,
                          data_rng=None if first is not None else rng_d, device=rc.device,
                          on_iteration=on_iteration, accel=rc.accel)


def _sweep_tags(rc: ALRunConfig, cfg: ALConfig, name: str) -> dict[str, str]:
    """The tags every record of the sweep carries, so a leaked stopping rule is visible on
    each repetition and not only on the parent."""
    base_tags = {T.FAMILY: "active", T.METHOD: name,
                 T.DATASET: rc.dataset, T.QUERY_SIZE: str(rc.query_size),
                 T.SEED_STRATEGY: str(rc.seed_strategy)}
    if cfg.stop_on == "test":
        base_tags[T.LEAK] = "test-set early stopping (CDALBench's earlier code)"
    return base_tags


def _sweep_params(rc: ALRunConfig, cfg: ALConfig, name: str, strategy: Strategy
                  ) -> dict[str, Any]:
    """Everything that decides the sweep's numbers, flattened with prefixes so the
    resolved dataset settings, strategy and encoder options cannot collide."""
    return {"strategy": name, "dataset": rc.dataset,
            "query_size": rc.query_size, "repetitions": rc.repetitions,
            "seed_strategy": rc.seed_strategy, "seed_data": rc.seed_data,
            "seed_model": rc.seed_model, "device": rc.device,
            "max_candidates": strategy.max_candidates,
            **rc.resolved_accel(cfg).params(),  # precision=..., as the CLI names them
            **{f"al.{k}": v for k, v in dataclasses.asdict(cfg).items()},
            **{f"strategy.{k}": v for k, v in rc.strategy_params.items()},
            **{f"encoder.{k}": v for k, v in rc.encoder.items()},
            **(rc.data_options.params() if rc.data_options is not None else {})}


def _start_sweep(tracker: Tracker, rc: ALRunConfig, name: str, base_tags: dict[str, str],
                 params: dict[str, Any], first: ALData | None) -> None:
    """Open the parent record; synthetic sets (``first`` None) have no single digest, as
    each repetition draws its own."""
    tracker.start_study(
        f"al-{dataset_label(rc.dataset)}-{name}-q{rc.query_size}",
        {**base_tags, T.ROLE: "al_sweep", **(first.tags if first else {})}, params,
        {"al_config.json": {**params, "note": first.note if first else ""}},
        DatasetInfo(rc.dataset, first.source if first else f"synthetic:{rc.dataset}",
                    _digest(first) if first else "regenerated-per-repetition"),
    )


def _repetition_rows(rep: RepetitionResult) -> list[tuple[dict[str, float], int]]:
    """The repetition's curve (step = labeled-set size; a query's time at the size it
    produced) and its summary at step 0, logged in one batch."""
    rows: list[tuple[dict[str, float], int]] = [
        ({"al/test_accuracy": a}, s) for s, a in zip(rep.sizes, rep.accuracies,
                                                     strict=True)]
    rows += [({"al/query_time_s": t}, s) for s, t in zip(rep.sizes[1:],
                                                        rep.query_times, strict=True)]
    rows.append(({"al/auc": rep.auc,
                  "al/query_time_mean_s": float(np.mean(rep.query_times))
                  if rep.query_times else 0.0,
                  "al/final_accuracy": rep.accuracies[-1],
                  "al/collapsed_fits": float(rep.collapsed_fits)}, 0))
    return rows


def _repetition_error(e: BaseException) -> str:
    """What a failed repetition's record keeps: one line (a configuration or data error
    is told in full by the sweep, which it ends)."""
    if isinstance(e, (ConfigError, DataError)):
        return "configuration or data error (see the sweep)"
    return f"{type(e).__name__}: {e}"


def repetition_runner(tracker: Tracker) -> TrialRunner:
    """The trial runner of an AL sweep: a configuration or data error (or ^C) would fail
    every repetition alike, so it ends the sweep; any other failure fails the repetition
    and the sweep goes on, however many come in a row (repetitions are independent)."""
    return TrialRunner(tracker, fatal=(ConfigError, DataError, KeyboardInterrupt),
                       max_consecutive_errors=None, error_text=_repetition_error)


def _run_trial(runner: TrialRunner, rc: ALRunConfig, k: int, first: ALData | None,
               strategy: Strategy, base_tags: dict[str, str], result: ALResult,
               on_iteration: Callable[[int, int, float], None] | None) -> None:
    """Repetition ``k`` as one child record, through the one trial lifecycle
    (:class:`~scarcelab.trials.TrialRunner`); a failure lands in ``result.failed``."""
    s_d, s_t = rc.seed_data + k, rc.seed_model + k
    runner.tracker.start_trial(k, {**base_tags, T.ROLE: "al",
                                   T.REPETITION: str(k),
                                   T.SEED_DATA: str(s_d),
                                   T.SEED_MODEL: str(s_t),
                                   T.SEED: str(s_d)},
                               {"repetition": k, "seed_data": s_d, "seed_model": s_t})
    outcome = runner.run(k, lambda: run_one(rc, k, first, strategy, on_iteration),
                         fail_fatal=False)
    if outcome.state != COMPLETE:
        result.failed.append((k, outcome.error or ""))
        return
    rep = outcome.value
    assert rep is not None
    runner.complete(rows=_repetition_rows(rep), tags={T.SPLIT_HASH: rep.split_hash})
    result.repetitions.append(rep)


def _log_sweep_summary(tracker: Tracker, rc: ALRunConfig, result: ALResult) -> None:
    """The sweep's score over the repetitions that finished; with none there is nothing
    to score, so the sweep fails."""
    if not result.repetitions:
        raise RuntimeError(f"all {rc.repetitions} repetitions failed: {result.failed}")
    aucs = result.aucs
    tracker.log_metrics({"al/auc_mean": float(aucs.mean()),
                         "al/auc_std": float(aucs.std(ddof=1)) if len(aucs) > 1 else 0.0,
                         "al/repetitions_finished": float(len(aucs))}, step=0,
                        scope="study")


def run_al(rc: ALRunConfig, tracker: Tracker, ctx: LoadContext | None = None,
           on_iteration: Callable[[int, int, float], None] | None = None) -> ALResult:
    """A sweep: one parent record, one child record (role ``al``) per repetition.

    A repetition that fails is recorded as failed and the sweep goes on; the sweep fails
    only if every repetition did. ``ctx`` lets the caller supply an encoding cache or a
    pretrained encoder (``encoded_*`` sets).
    """
    cfg = rc.resolved()
    strategy = make_strategy(rc.strategy, rc.strategy_params, rc.max_candidates)
    name = STRATEGIES.get(rc.strategy).registered_name
    base_tags = _sweep_tags(rc, cfg, name)
    params = _sweep_params(rc, cfg, name, strategy)
    first = load_for_sweep(rc, ctx)
    check_budget(rc, cfg, first)  # before the sweep's record exists
    _start_sweep(tracker, rc, name, base_tags, params, first)
    result = ALResult(rc, [], [])
    try:
        runner = repetition_runner(tracker)
        for k in range(rc.repetitions):
            _run_trial(runner, rc, k, first, strategy, base_tags, result, on_iteration)
        _log_sweep_summary(tracker, rc, result)
    except BaseException:
        tracker.end_study("FAILED")
        raise
    tracker.end_study("FINISHED")
    return result


def sweep_summary(result: ALResult) -> str:
    aucs = result.aucs
    spread = f" ± {aucs.std(ddof=1):.4f}" if len(aucs) > 1 else ""
    return (f"{result.config.strategy} on {result.config.dataset} q={result.config.query_size}: "
            f"AUC {aucs.mean():.4f}{spread} over {len(aucs)} repetition"
            f"{'s' if len(aucs) != 1 else ''}"
            + (f" ({len(result.failed)} failed)" if result.failed else "")
            + _collapse_note(result))


def _collapse_note(result: ALResult) -> str:
    """Said beside the AUC, since a repetition whose classifier collapsed to one class
    scores the majority share and its strategy ranked nothing (e.g. a learning rate too
    high for the carried optimiser state: docs/active.md)."""
    hit = [r for r in result.repetitions if r.collapsed_fits]
    if not hit:
        return ""
    fits = sum(r.collapsed_fits for r in hit)
    return (f"; {len(hit)} of {len(result.repetitions)} repetitions had fits that left a "
            f"one-class classifier ({fits} fits, al/collapsed_fits)")
