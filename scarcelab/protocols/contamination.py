"""Open-world contamination sweeps: one study per (OOD source, ratio) on a fixed ID pool.

Definition of the ratio (used everywhere in scarcelab): the in-distribution unlabeled
pool of the realistic split is kept *fixed* (``n_id`` images, the same for every ratio),
and ``n_ood = round(r / (1 − r) · n_id)`` OOD images are added, so that OOD images make up
the fraction ``r`` of the *contaminated* pool: ``n_ood / (n_id + n_ood) ≈ r`` (exact up to
rounding). ``r = 0`` is the clean run; ``0 ≤ r < 1``. Keeping the ID pool fixed (rather
than replacing ID images) means every ratio sees the same in-distribution information, so
a change in accuracy or dynamics is caused by the added OOD images alone. With one seed the
OOD sets are nested: the images added at r = 0.1 are among those added at r = 0.3.

The contaminated pool is shuffled with a seeded permutation (so the position of an image
says nothing about its origin); ``unlabeled_ood`` carries the oracle ID/OOD flags and
``unlabeled_y`` gets −1 for OOD images. Neither reaches training: ``BatchSource`` reads
``unlabeled_x`` only, and only the diagnostics hook reads the flags (``diag/ood_ff``).

Tuning is held fixed across ratios (``tuning="once"``, the default), so that the effect
of r is not mixed with the effect of a different search outcome at each r: a *tuning
study* (the budgeted random search, on the clean r = 0 pool) picks one configuration, then
every ratio — r = 0 included — trains exactly that configuration once (``search="fixed"``:
validation early stopping and checkpoint selection as in a search trial) with the same
seeds (trial 0 of every child, hence the same model initialisation and batch-order seed).
With ``search="none"`` (transfer: defaults or a configuration from ``hparams_from``) or a
given configuration, no tuning study runs and that configuration is used at every ratio.
``tuning="per_ratio"`` restores the old protocol (each ratio runs its own search). Each
child says where its configuration came from (tag ``scarcelab.hparams_source``); the tuning
study is tagged ``scarcelab.sweep_role=tuning`` and carries no ``scarcelab.ratio``, so the
Table A1 view does not take it for a sweep point.

The core stays free of MLflow: :func:`run_contamination` takes a factory of
:class:`~scarcelab.tracker.Tracker` objects (one per child study) and tags each child
through :class:`TaggingTracker`, a :class:`~scarcelab.tracker.DelegatingTracker`: every
call it does not change — the figures' ``log_evaluation`` / ``log_search``, a killed
child's ``resume_state``, images, batches — reaches the child's tracker.

Resuming a killed sweep (the same command again, with shared Optuna storage): the caller
passes ``finished(point)``, the result of each child that already finished under the
killed sweep; those are not run again (the tuning study included, so the configuration
and the children's study keys stay the same), and the child that was running when the
process died continues its own study record through its tracker's ``resume_state``, as a
killed study does (docs/tracking.md §4).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from scarcelab import tags as T
from scarcelab.data.bundle import DatasetBundle
from scarcelab.data.ood import ImageFormat, SourceContext, draw_ood, get_source
from scarcelab.errors import ConfigError
from scarcelab.protocols.search import StudyConfig, StudyResult, run_study
from scarcelab.tracker import DatasetInfo, DelegatingTracker, Tracker

TUNINGS = ("once", "per_ratio")


def n_ood_for(ratio: float, n_id: int) -> int:
    """Number of OOD images that make up the fraction ``ratio`` of the contaminated pool."""
    if not 0.0 <= ratio < 1.0:
        raise ConfigError(f"contamination ratio must be in [0, 1), got {ratio}")
    return int(round(ratio / (1.0 - ratio) * n_id))


def parse_ratios(text: str) -> list[float]:
    """``"0,0.1,0.3"`` -> ``[0.0, 0.1, 0.3]`` (validated, order kept, duplicates dropped)."""
    out: list[float] = []
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        try:
            r = float(part)
        except ValueError:
            raise ConfigError(f"ratios: {part!r} is not a number") from None
        n_ood_for(r, 0)  # validates the range
        if r not in out:
            out.append(r)
    if not out:
        raise ConfigError("ratios: give at least one ratio, e.g. 0,0.1,0.3,0.5")
    return out


def contaminate(bundle: DatasetBundle, source: str, ratio: float, seed: int = 0,
                ctx: SourceContext | None = None) -> DatasetBundle:
    """A copy of ``bundle`` whose unlabeled pool holds OOD images at fraction ``ratio``."""
    ctx = ctx or SourceContext(id_dataset=str(bundle.meta.get("name", "")))
    src = get_source(source)
    n_id = len(bundle.unlabeled_x)
    n_ood = n_ood_for(ratio, n_id)
    fmt = ImageFormat.of(bundle.unlabeled_x)
    draw = draw_ood(source, n_ood, fmt, seed, bundle.unlabeled_x, ctx)
    x = np.concatenate([bundle.unlabeled_x, draw.images])
    y_id = bundle.unlabeled_y if bundle.unlabeled_y is not None else np.full(n_id, -1)
    y = np.concatenate([np.asarray(y_id, dtype=np.int64), np.full(n_ood, -1, np.int64)])
    flags = np.concatenate([np.zeros(n_id, bool), np.ones(n_ood, bool)])
    perm = np.random.default_rng([seed, 0xC0]).permutation(len(x))
    meta = {**bundle.meta, "contamination": {
        "source": source, "kind": src.kind, "ratio": ratio, "n_id": n_id, "n_ood": n_ood,
        "n_ood_unique": draw.n_unique, "realised_ratio": n_ood / max(1, n_id + n_ood)}}
    return dataclasses.replace(bundle, unlabeled_x=x[perm], unlabeled_y=y[perm],
                               unlabeled_ood=flags[perm], unlabeled_origin=perm, meta=meta)


class TaggingTracker(DelegatingTracker):
    """Delegates to ``inner``, adding fixed tags to the study and its trials and fixed
    params to the study: how a child study of a sweep says which (source, ratio) it is.
    Everything else — figures, resume, images, batches — goes through unchanged
    (:class:`~scarcelab.tracker.DelegatingTracker`)."""

    def __init__(self, inner: Tracker, tags: dict[str, str],
                 params: dict[str, Any] | None = None) -> None:
        super().__init__(inner)
        self.tags, self.params = dict(tags), dict(params or {})

    def start_study(self, name: str, tags: dict[str, str], params: dict[str, Any],
                    artifacts: dict[str, Any], dataset: DatasetInfo | None = None) -> None:
        ratio = self.tags.get(T.RATIO)
        suffix = f"{self.tags.get(T.OOD, 'ood')}-r{ratio}" if ratio is not None \
            else "tuning-r0"
        self.inner.start_study(f"{name}-{suffix}",
                               {**tags, **self.tags}, {**params, **self.params}, artifacts,
                               dataset)

    def start_trial(self, number: int, tags: dict[str, str], params: dict[str, Any]) -> None:
        self.inner.start_trial(number, {**tags, **self.tags}, params)


@dataclass
class SweepPoint:
    source: str
    kind: str
    ratio: float
    result: StudyResult
    contamination: dict[str, Any]
    reused: bool = False  # finished under an earlier (killed) run of this sweep


@dataclass
class FinishedChild:
    """A child study that finished under an earlier, killed run of the same sweep."""

    result: StudyResult
    contamination: dict[str, Any]  # its ``contamination.*`` counts
    run_id: str | None = None  # its study record, named in the children's hparams_source


#: the sweep point of the tuning study (``StudyConfig.sweep_point``, logged as a param)
TUNING_POINT = "tuning r=0"


def point_label(source: str, ratio: float) -> str:
    """The sweep point of a child: ``mnist r=0.3``; r = 0 is ``clean r=0`` for every
    source (it runs once)."""
    return f"{source if ratio > 0 else 'clean'} r={ratio:g}"


def run_contamination(
    cfg: StudyConfig,
    sources: Sequence[str],
    ratios: Sequence[float],
    tracker_for: Callable[[str, float], Tracker],
    ood_dir: str | None = None,
    tuning: str = "once",
    finished: Callable[[str], FinishedChild | None] | None = None,
) -> list[SweepPoint]:
    """One child study per (source, ratio), sources in order, ratios in order.

    ``r = 0`` is the same clean pool for every source, so it runs once, tagged with the
    first source (its ``scarcelab.ood_kind`` is ``none``); views use it as the baseline of
    every source. Every child uses the same seed, hence the same split, the same ID pool
    and the same diagnostic subsample of the ID part; with ``tuning="once"`` (see the module
    docstring) also the same configuration and training seeds. The tuning study, when one
    runs, gets its tracker from ``tracker_for(first source, 0.0)`` as well.

    ``finished(point)`` (a killed sweep run again): the child of that sweep point
    (:func:`point_label`, :data:`TUNING_POINT`) that already finished, or None; a finished
    child is not run again, and ``tracker_for`` is not called for it.
    """
    _check_sweep(cfg, sources, tuning)
    ctx = SourceContext(data_dir=cfg.data_dir, ood_dir=ood_dir, id_dataset=cfg.dataset)
    child_cfg, hp_source = _configuration(cfg, tuning, sources[0], tracker_for, ctx,
                                          finished)
    points: list[SweepPoint] = []
    done_clean = False
    for source in sources:
        kind = get_source(source).kind
        for r in ratios:
            if r == 0.0 and done_clean:
                continue
            point = point_label(source, r)
            done = finished(point) if finished is not None else None
            if done is not None:
                points.append(SweepPoint(source, kind if r > 0 else "none", r, done.result,
                                         dict(done.contamination), reused=True))
            else:
                tags = {T.OOD: source, T.RATIO: f"{r:g}",
                        T.OOD_KIND: kind if r > 0 else "none",
                        T.TUNING: tuning, T.HPARAMS_SOURCE: hp_source}
                points.append(_run_point(child_cfg, point, source, kind, r, cfg.seed, ctx,
                                         tags, tracker_for))
            done_clean = done_clean or r == 0.0
    return points


def _check_sweep(cfg: StudyConfig, sources: Sequence[str], tuning: str) -> None:
    """Reject a sweep that could not finish before any study (the tuning one included)
    spends its budget: an unknown tuning mode, a method without an unlabeled pool to
    contaminate, no or a misspelt OOD source."""
    from scarcelab.methods import get_method

    if tuning not in TUNINGS:
        raise ConfigError(f"tuning={tuning!r}: valid values are {', '.join(TUNINGS)}")
    if get_method(cfg.method).family != "semi":
        raise ConfigError(f"contamination sweeps need a semi-supervised method; {cfg.method!r} "
                          f"is {get_method(cfg.method).family}")
    if not sources:
        raise ConfigError("give at least one OOD source, e.g. ood=mnist")
    for s in sources:
        get_source(s)  # fail fast on a typo, before any training


def _run_point(child_cfg: StudyConfig, point: str, source: str, kind: str, r: float,
               seed: int, ctx: SourceContext, tags: dict[str, str],
               tracker_for: Callable[[str, float], Tracker]) -> SweepPoint:
    """Run one sweep point's child study on the pool contaminated at ``r``, tagged as that
    point, with the contamination counts the transform reports."""
    seen: dict[str, Any] = {}

    def transform(b: DatasetBundle) -> DatasetBundle:
        out = contaminate(b, source, r, seed, ctx)
        seen.update(out.meta["contamination"])
        return out

    tracker = tracker_for(source, r)
    # the contamination counts are known only after the transform ran; they are
    # logged as params of the child study through a lazily-filled dict
    child = _ParamsAfterTransform(tracker, tags, seen)
    res = run_study(_child(child_cfg, point), child, bundle_transform=transform)
    return SweepPoint(source, kind if r > 0 else "none", r, res, dict(seen))


def _child(cfg: StudyConfig, point: str) -> StudyConfig:
    """``cfg`` for one sweep point: its own study key (and Optuna study, if named)."""
    name = f"{cfg.study_name}-{point.replace(' ', '-')}" if cfg.study_name else None
    return dataclasses.replace(cfg, sweep_point=point, study_name=name)


def _configuration(cfg: StudyConfig, tuning: str, first_source: str,
                   tracker_for: Callable[[str, float], Tracker], ctx: SourceContext,
                   finished: Callable[[str], FinishedChild | None] | None = None
                   ) -> tuple[StudyConfig, str]:
    """The config every child runs and where its hyperparameters come from.

    ``once`` with a random search: run the tuning study on the clean pool (the very
    bundle the r = 0 child gets) and fix its best configuration — or, when it finished
    under a killed run of this sweep, take that study's configuration."""
    if tuning == "per_ratio":
        return cfg, ("a search at each ratio" if cfg.search == "random"
                     else cfg.hparams_source)
    if cfg.search != "random":  # transfer or a given configuration: already fixed
        return cfg, cfg.hparams_source
    done = finished(TUNING_POINT) if finished is not None else None
    if done is not None:
        res, run_id = done.result, done.run_id
        if res.best_checkpoint is None:
            raise ConfigError(f"the finished tuning study {run_id} of this sweep has no "
                              "readable best checkpoint (its configuration); run the sweep "
                              "afresh (another seed or experiment)")
    else:
        inner = tracker_for(first_source, 0.0)
        tuner = TaggingTracker(inner, {T.SWEEP_ROLE: "tuning",
                                       T.OOD: first_source,
                                       T.TUNING: tuning})
        res = run_study(_child(cfg, TUNING_POINT), tuner,
                        bundle_transform=lambda b: contaminate(b, first_source, 0.0,
                                                               cfg.seed, ctx))
        run_id = getattr(inner, "study_run_id", None)
    assert res.best_checkpoint is not None  # run_study raises when no trial completed
    hp = dict(res.best_checkpoint["hp"])
    where = f"tuning study {run_id}" if run_id else "the sweep's tuning study"
    label = f"{where} at r=0, trial {res.best_trial}"
    fixed = dataclasses.replace(cfg, search="fixed", hparams=hp, hparams_source=label,
                                max_trials=0)
    return fixed, label


class _ParamsAfterTransform(TaggingTracker):
    """Adds the contamination counts (filled by the transform, which runs before the study
    record is opened) as ``contamination.*`` params."""

    def __init__(self, inner: Tracker, tags: dict[str, str], seen: dict[str, Any]) -> None:
        super().__init__(inner, tags)
        self.seen = seen

    def start_study(self, name: str, tags: dict[str, str], params: dict[str, Any],
                    artifacts: dict[str, Any], dataset: DatasetInfo | None = None) -> None:
        self.params = {f"contamination.{k}": v for k, v in self.seen.items()}
        super().start_study(name, tags, params, artifacts, dataset)


__all__ = ["TUNING_POINT", "FinishedChild", "SweepPoint", "TaggingTracker", "contaminate",
           "n_ood_for", "parse_ratios", "point_label", "run_contamination"]
