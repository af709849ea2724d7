"""The one epoch loop every method shares (DESIGN §2).

Adam with a per-step cosine schedule; an epoch is enough steps to see |L ∪ U| once
(SSL-vs-SSL §4), optionally capped for small budgets; after every epoch (or, under
``TrainConfig.eval_every_steps``, every evaluation window) the validation balanced accuracy
decides early stopping (``patience``) and the best-so-far checkpoint, and test metrics of
the same epoch are recorded so that "test score of the checkpoint best on validation" is a
lookup, never a re-evaluation. Data lives on the device as uint8 tensors and is augmented
per batch, so the loop never waits on a DataLoader; the evaluated images stay there too,
and an evaluation reads the device once (its class probabilities).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import InitVar, dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np
import torch

from scarcelab.accel import Accel, resolve, step_autocast
from scarcelab.data.augment import AUGMENTATIONS, as_view, to_float, upload
from scarcelab.data.bundle import DatasetBundle
from scarcelab.errors import ConfigError, TrialFailed
from scarcelab.methods._parts import balanced_class_weights
from scarcelab.methods.base import Batch, DataInfo, Method, Progress
from scarcelab.metrics import classification_metrics
from scarcelab.models.classifier import ExportedClassifier, for_export, normalize
from scarcelab.probe import PROBE_SOLVERS, LinearProbe, Probe, make_probe
from scarcelab.schedule import SCHEDULE_HORIZONS, Horizon, cosine_factor, steps_that_fit

#: ``schedule_horizon=budget``: steps trained before the plan is first fitted to the budget
#: (the first steps pay one-off costs — allocation, autotuning — that would make the trial
#: look slower than it is); re-fitted after every step from then on
SCHEDULE_CALIBRATION_STEPS = 4

#: what a study's budget counts (``StudyConfig.budget_clock``)
BUDGET_CLOCKS = ("wall", "cpu")


class Budget:
    """A study's wall-clock budget, with the time spent on diagnostics left out.

    Diagnostics (``diag/*``) are computed for semi-supervised methods only; counting them
    would give those methods less training time than supervised and self-supervised ones
    under the same ``budget_minutes``. :meth:`paused` excludes a block
    from :meth:`elapsed`; ``spent_s`` is time already spent (by an earlier process on
    resume, by this process's start-up). ``reserve_s`` is kept at the end for what must
    follow the training (a study's final model logging): the budget counts as
    :meth:`expired` that much earlier. ``time.time`` is looked up at each call, so a test
    can drive the clock.

    ``clock="cpu"`` counts this process's CPU seconds (``time.process_time``: all its
    threads) instead of wall seconds. On a dedicated machine one study with one intra-op
    thread spends about one CPU second per wall second; on a shared one a wall budget
    shrinks with every other job's load, while a CPU budget buys the same training
    whatever runs beside it — what a benchmark grid on a shared CPU machine needs to be
    reproducible. (On a GPU the work is not CPU time: use the wall clock there.)
    """

    def __init__(self, seconds: float, spent_s: float = 0.0, reserve_s: float = 0.0,
                 clock: str = "wall") -> None:
        if clock not in BUDGET_CLOCKS:
            raise ValueError(f"budget clock {clock!r}; use one of {BUDGET_CLOCKS}")
        self.clock = clock
        self.seconds = float(seconds)
        self.reserve_s = float(reserve_s)
        self._start = self._now() - float(spent_s)
        self.excluded_s = 0.0

    def _now(self) -> float:
        return time.process_time() if self.clock == "cpu" else time.time()

    def now(self) -> float:
        """The budget's clock, for costs compared with :meth:`remaining` (a step, an
        evaluation): measured on another clock they would not be in the same seconds."""
        return self._now()

    def elapsed(self) -> float:
        """Seconds of the budget spent so far (diagnostics excluded)."""
        return self._now() - self._start - self.excluded_s

    def remaining(self) -> float:
        """Seconds left for training before the reserve."""
        return self.seconds - self.reserve_s - self.elapsed()

    def expired(self) -> bool:
        return self.remaining() <= 0.0

    @contextmanager
    def paused(self) -> Iterator[None]:
        t0 = self._now()
        try:
            yield
        finally:
            self.excluded_s += self._now() - t0


class _Deadline(Budget):
    """An absolute ``time.time()`` deadline in the :class:`Budget` interface (callers that
    pass a float: benches, encoders trained outside a study)."""

    def __init__(self, deadline: float) -> None:
        super().__init__(deadline - time.time())


@dataclass
class TrainConfig:
    max_epochs: int = 200
    patience: int = 20
    # "val": early stopping and the trial's answer follow validation balanced accuracy
    # (the search); "train_loss": stop after ``patience`` epochs without a lower mean train
    # loss and answer with the last epoch (the transfer strategy, SSL-vs-SSL App. D.2,
    # where validation is part of the training set).
    stop_on: str = "val"
    max_steps_per_epoch: int | None = None
    batch_labeled: int = 64
    batch_unlabeled: int = 0
    eval_batch_size: int = 512
    device: str = "cpu"
    # Protocols whose augmentation depends on the dataset (``scarcelab.protocols.tune``)
    # replace the method's ``labeled_views`` here; None keeps the method's own.
    labeled_views: tuple[str, ...] | None = None
    # the labeled loss: "balanced" weights each class by its inverse labeled frequency
    # (scarcelab.methods._parts.balanced_class_weights; the probe: sklearn's
    # class_weight="balanced"), as SSL-vs-SSL does for every method; "none" = unweighted
    class_weights: str = "none"
    # the self-supervised methods' per-epoch probe: "sklearn" (LinearProbe, on the host) or
    # "torch" (TorchLinearProbe, on the device); scarcelab.probe
    probe_solver: str = "sklearn"
    # evaluation cadence: after an epoch only once at least this many steps were trained
    # since the last evaluation (0 = after every epoch). For sets so small that an epoch
    # is a step or two, where evaluating (and logging, checkpointing, diagnosing) every
    # epoch costs more than training. Patience then counts evaluations, not epochs; the
    # last epoch, and one the budget ends, are always evaluated.
    eval_every_steps: int = 0
    # what the schedules (cosine learning rate, unlabeled-weight ramps, EMA momentum) are
    # planned over (scarcelab.schedule): "epochs" = steps_per_epoch x max_epochs (the
    # papers'); "budget" = that, shortened to the steps the trial's share of the time
    # budget buys (measured as it trains), so that they complete when the budget ends it
    schedule_horizon: str = "epochs"
    # "budget": the seconds of the budget this trial's schedules are planned over (a
    # search splitting its budget over --max-trials); None = all that is left at its start
    budget_share_s: float | None = None
    # precision and kernels (scarcelab.accel, docs/performance.md): bf16 autocast,
    # channels-last weights / inputs, cuDNN benchmarking, fused optimiser, TF32, compile;
    # ``auto`` resolved for ``device`` when the loop starts (on CPU: this loop's former
    # behaviour, NHWC weights — CPU_CHANNELS_LAST — and nothing else)
    accel: Accel = field(default_factory=Accel)
    # the two former levers, still accepted: True/False set accel.channels_last to
    # weights/off and accel.fused_optimizer to on/off (None: as accel says)
    channels_last: InitVar[bool | None] = None
    fused_optimizer: InitVar[bool | None] = None

    def __post_init__(self, channels_last: bool | None, fused_optimizer: bool | None) -> None:
        if channels_last is not None:
            self.accel = dataclasses.replace(
                self.accel, channels_last="weights" if channels_last else "off")
        if fused_optimizer is not None:
            self.accel = dataclasses.replace(
                self.accel, fused_optimizer="on" if fused_optimizer else "off")

    def resolved_accel(self) -> Accel:
        """:attr:`accel` resolved for :attr:`device` as this loop resolves it."""
        return resolve(self.accel, self.device, cpu_channels_last=CPU_CHANNELS_LAST)


#: the shared epoch loop's CPU layout under ``channels_last=auto``: NHWC weights, measured
#: 1.10x per FixMatch WRN-28-2 step on CPU (docs/performance.md); 2-D weights of MLPs stay
CPU_CHANNELS_LAST = "weights"


@dataclass
class EpochReport:
    epoch: int
    metrics: dict[str, float]
    val_balanced_accuracy: float
    test_metrics: dict[str, float]
    # the epoch's test-set class probabilities (N, C): kept with the selected checkpoint,
    # the study's figures need no second pass over the test set
    test_proba: np.ndarray | None = None


@dataclass
class TrialResult:
    best_val: float = -1.0
    best_epoch: int = -1
    best_test: dict[str, float] = field(default_factory=dict)
    epochs: int = 0
    steps: int = 0
    # "patience" | "max_epochs" | "budget" | "horizon" (schedule_horizon=budget: the plan
    # fitted to the trial's share of the budget is done)
    stopped: str = ""
    best_state: dict[str, Any] | None = None
    # seconds of the trial's last step and last evaluation: what one more step costs
    step_s: float = 0.0
    eval_s: float = 0.0
    # the schedules' progress (scarcelab.schedule) at the trial's last step: below 1.0 the
    # learning rate had not decayed to its end and the unlabeled-weight ramps had not run
    # their course (issue 43: a short budget under schedule_horizon=epochs said nothing)
    progress: float = 0.0


class BatchSource:
    """Draws and augments batches from a bundle held on the device as uint8 tensors.

    A step's random numbers (the batch indices, every view's parameters and the method's
    own :meth:`~scarcelab.methods.base.Method.host_draws`) are drawn first, on the host
    generator and in the generator's order, then reach the device in one copy
    (``scarcelab.data.augment.upload``); the augmentations then run on the device with
    nothing to wait for (docs/performance.md, "A step without a sync")."""

    def __init__(
        self,
        bundle: DatasetBundle,
        method: type[Method],
        batch_labeled: int,
        batch_unlabeled: int,
        device: torch.device,
        generator: torch.Generator,
        labeled_views: tuple[str, ...] | None = None,
        host_draws: Callable[[int, int], dict[str, Any] | None] | None = None,
    ) -> None:
        self.device = device
        self.g = generator
        self.xl = torch.as_tensor(bundle.labeled_x).to(device)
        self.yl = torch.as_tensor(bundle.labeled_y, dtype=torch.long).to(device)
        self.xu = torch.as_tensor(bundle.unlabeled_x).to(device)
        self.labeled_views = [as_view(AUGMENTATIONS.get(v)) for v in (
            method.labeled_views if labeled_views is None else labeled_views)]
        self.views = [as_view(AUGMENTATIONS.get(v)) for v in method.views]
        self.host_draws = host_draws
        # labeled images stored whole for a crop of the original (the tune protocol's
        # RandomResizedCrop sets): every labeled view must take their original sizes,
        # kept on the host, where the crop boxes are drawn
        geo = bundle.meta.get("labeled_geometry")
        self.sizes = self.out_size = None
        if geo is not None:
            bad = [v for v, f in zip(method.labeled_views if labeled_views is None
                                     else labeled_views, self.labeled_views, strict=True)
                   if not getattr(f, "takes_geometry", False)]
            if bad:
                raise ConfigError(f"the labeled images are stored whole at "
                                  f"{bundle.labeled_x.shape[-1]} px for a crop of the "
                                  f"original; view(s) {bad} cannot make "
                                  f"{geo['out_size']}-px crops of them")
            self.sizes = torch.as_tensor(geo["sizes"])
            self.out_size = int(geo["out_size"])
        self.bl = batch_labeled if self.labeled_views else 0
        self.bu = batch_unlabeled if self.views else 0
        if self.views and len(self.xu) == 0:
            raise TrialFailed("the method needs unlabeled data but the unlabeled pool is empty")
        self._perm_l = torch.empty(0, dtype=torch.long)
        self._perm_u = torch.empty(0, dtype=torch.long)

    def _take(self, which: str, n: int, size: int) -> torch.Tensor:
        """The next ``n`` indices of the pool's running permutation, on the host."""
        perm = getattr(self, f"_perm_{which}")
        while len(perm) < n:
            perm = torch.cat([perm, torch.randperm(size, generator=self.g)])
        setattr(self, f"_perm_{which}", perm[n:])
        return perm[:n]

    @property
    def samples_per_step(self) -> int:
        return self.bl + self.bu

    def draw(self) -> dict[str, Any]:
        """Every random number of the next batch, on the host: labeled indices and views,
        unlabeled indices and views (the generator's order since views were first drawn
        on it), then the method's own draws."""
        out: dict[str, Any] = {}
        if self.bl:
            idx = self._take("l", self.bl, len(self.xl))
            geo = ({} if self.sizes is None
                   else {"sizes": self.sizes[idx], "out_size": self.out_size})
            shape = self.xl.shape[1:]
            out["l"] = (idx, [v.draw(self.g, self.bl, shape, **geo) for v in self.labeled_views])
        if self.bu:
            idx = self._take("u", self.bu, len(self.xu))
            shape = self.xu.shape[1:]
            out["u"] = (idx, [v.draw(self.g, self.bu, shape) for v in self.views])
        if self.host_draws is not None:
            out["method"] = self.host_draws(self.bl, self.bu)
        return out

    def next(self) -> Batch:
        drawn = upload(self.draw(), self.device)  # the step's one host-to-device copy
        xs: list[torch.Tensor] = []
        y = torch.empty(0, dtype=torch.long, device=self.device)
        if self.bl:
            idx, params = drawn["l"]
            x = to_float(self.xl[idx])
            xs = [normalize(v.apply(x, p)) for v, p in zip(self.labeled_views, params,
                                                           strict=True)]
            y = self.yl[idx]
        us: list[torch.Tensor] = []
        u_idx = None
        if self.bu:
            u_idx, params = drawn["u"]
            u = to_float(self.xu[u_idx])
            us = [normalize(v.apply(u, p)) for v, p in zip(self.views, params, strict=True)]
        return Batch(x=xs, y=y, u=us, u_index=u_idx, draws=drawn.get("method"))


@torch.no_grad()
def forward_device(fn: Callable[[torch.Tensor], torch.Tensor], x: np.ndarray | torch.Tensor,
                   bs: int, device: torch.device, accel: Accel | None = None) -> torch.Tensor:
    """``fn`` over uint8 images (N, C, H, W), converted and normalised as in training, in
    chunks of ``bs`` on ``device``; float32 out, left on ``device`` (no host read). ``x``
    may be on the device already (:class:`EvalSets`): then nothing is copied. ``accel``
    (a resolved :class:`~scarcelab.accel.Accel`): the training's input layout and
    autocast, so that a bf16 model is evaluated as it trained."""
    out = []
    for i in range(0, len(x), bs):
        xb = normalize(to_float(torch.as_tensor(x[i : i + bs]).to(device)))
        if accel is None:
            out.append(fn(xb).float())
            continue
        with accel.autocast(device):
            out.append(fn(accel.images(xb)).float())
    return torch.cat(out) if out else torch.zeros((0, 0), device=device)


def forward_images(
    fn: Callable[[torch.Tensor], torch.Tensor], x: np.ndarray | torch.Tensor, bs: int,
    device: torch.device, accel: Accel | None = None
) -> np.ndarray:
    """:func:`forward_device` brought to the host in one copy: float32 numpy (features or
    logits)."""
    return forward_device(fn, x, bs, device, accel).cpu().numpy()


class EvalSets:
    """The uint8 images every epoch's evaluation reads, moved to the device once per trial
    (not once per epoch): validation, test (the same tensor when the bundle has one set in
    both slots, the tune protocol), and the labeled set when a probe is fitted on it."""

    def __init__(self, bundle: DatasetBundle, device: torch.device, labeled: bool) -> None:
        self.same = bundle.test_x is bundle.val_x
        self.val = torch.as_tensor(bundle.val_x).to(device)
        self.test = self.val if self.same else torch.as_tensor(bundle.test_x).to(device)
        self.labeled = torch.as_tensor(bundle.labeled_x).to(device) if labeled else None


class Evaluation(tuple):  # type: ignore[type-arg]
    """``(val balanced accuracy, test metrics, probe)`` — it unpacks as that triple — and
    ``test_proba``, the test-set class probabilities the metrics came from (kept with the
    selected checkpoint, so the study's figures need no second pass over the test set)."""

    test_proba: np.ndarray | None

    def __new__(cls, val: float, test: dict[str, float], probe: Probe | None,
                test_proba: np.ndarray | None = None) -> Evaluation:
        out = super().__new__(cls, (val, test, probe))
        out.test_proba = test_proba
        return out


def evaluate(
    method: Method, bundle: DatasetBundle, cfg: TrainConfig, rng: np.random.Generator,
    sets: EvalSets | None = None,
) -> Evaluation:
    """Validation balanced accuracy, test metrics, and the fitted probe if one is used
    (plus the test probabilities: :class:`Evaluation`). ``sets``: the trial's images on
    the device (moved here when not given).

    Everything up to the class probabilities runs on the device; they come to the host
    in one copy for validation and test together (the torch probe adds one read of its
    validation predictions), and the metrics are computed there in numpy as before."""
    device = torch.device(cfg.device)
    accel = cfg.resolved_accel()
    if sets is None:
        sets = EvalSets(bundle, device, method.linear_probe)
    method.eval()
    try:
        if method.linear_probe:
            probe, pv, pt = _probe_probabilities(method, bundle, cfg, rng, sets, accel)
        else:
            probe = None
            pv, pt = _head_probabilities(method, cfg, sets, accel)
            if not (np.isfinite(pv).all() and np.isfinite(pt).all()):
                raise TrialFailed("non-finite predictions")
    finally:
        method.train()
    val_bacc = classification_metrics(bundle.val_y, pv)["balanced_accuracy"]
    # binary tasks: sensitivity / pAUROC of the dataset's positive class (the disease)
    test = classification_metrics(bundle.test_y, pt, bundle.meta.get("positive_class"))
    return Evaluation(val_bacc, test, probe, pt)


def _split(both: np.ndarray, n_val: int, same: bool) -> tuple[np.ndarray, np.ndarray]:
    return (both, both) if same else (both[:n_val], both[n_val:])


def _head_probabilities(method: Method, cfg: TrainConfig, sets: EvalSets,
                        accel: Accel | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The method's own class probabilities for validation and test (one host copy)."""
    device, bs = torch.device(cfg.device), cfg.eval_batch_size
    parts = [torch.softmax(forward_device(method.logits, x, bs, device, accel), 1)
             for x in ([sets.val] if sets.same else [sets.val, sets.test])]
    return _split(torch.cat(parts).cpu().numpy(), len(sets.val), sets.same)


def _probe_probabilities(method: Method, bundle: DatasetBundle, cfg: TrainConfig,
                         rng: np.random.Generator, sets: EvalSets, accel: Accel | None = None
                         ) -> tuple[Probe, np.ndarray, np.ndarray]:
    """The probe fitted on the encoder's features, and its validation and test class
    probabilities. The torch probe fits where the features are (no copy of them to the
    host); scikit-learn's gets them in one copy."""
    device, bs = torch.device(cfg.device), cfg.eval_batch_size
    assert sets.labeled is not None
    feats = [forward_device(method.features, x, bs, device, accel) for x in
             ([sets.labeled, sets.val] if sets.same else [sets.labeled, sets.val, sets.test])]
    nl, nv = len(feats[0]), len(feats[1])
    probe = make_probe(cfg.probe_solver, bundle.num_classes,
                       balanced=cfg.class_weights == "balanced")
    if isinstance(probe, LinearProbe):
        host = torch.cat(feats).cpu().numpy()
        if not np.isfinite(host).all():
            raise TrialFailed("non-finite features from the encoder")
        fl, (fv, ft) = host[:nl], _split(host[nl:], nv, sets.same)
        probe.fit(fl, bundle.labeled_y, fv, bundle.val_y, rng)
        return probe, probe.predict_proba(fv), probe.predict_proba(ft)
    if not bool(torch.isfinite(torch.cat(feats)).all()):
        raise TrialFailed("non-finite features from the encoder")
    fl, fv = feats[0], feats[1]
    probe.fit(fl, bundle.labeled_y, fv, bundle.val_y, rng)
    both = torch.cat([probe.proba(f) for f in feats[1:]]).cpu().numpy()
    pv, pt = _split(both, nv, sets.same)
    return probe, pv, pt


CLASS_WEIGHTS = ("balanced", "none")


def class_weights_for(kind: str, counts: list[int], device: torch.device
                      ) -> torch.Tensor | None:
    """The labeled loss's class weights for ``TrainConfig.class_weights``."""
    if kind not in CLASS_WEIGHTS:
        raise ValueError(f"TrainConfig.class_weights={kind!r}: 'balanced' or 'none'")
    return balanced_class_weights(counts).to(device) if kind == "balanced" else None


def data_info(bundle: DatasetBundle) -> DataInfo:
    counts = np.bincount(bundle.labeled_y, minlength=bundle.num_classes)
    return DataInfo(n_labeled=len(bundle.labeled_y), n_unlabeled=len(bundle.unlabeled_x),
                    num_classes=bundle.num_classes, labeled_class_counts=counts.tolist())


def steps_per_epoch(bundle: DatasetBundle, per_step: int, cap: int | None) -> int:
    """Steps to see |L ∪ U| once; the cap keeps small CPU budgets from one endless epoch."""
    seen = len(bundle.labeled_y) + len(bundle.unlabeled_x)
    steps = max(1, math.ceil(seen / max(1, per_step)))
    return min(steps, cap) if cap else steps


def snapshot(method: Method, probe: Probe | None, extra: dict[str, Any]) -> dict[str, Any]:
    """A copy of everything needed to rebuild the predictor (encoder *and* probe), kept on
    the method's device: taking it is a device-side ``clone`` with no host read, and it
    reaches the host (:func:`checkpoint_to_host`) only when it is uploaded or exported —
    a new best checkpoint can be taken every epoch, its upload is rate-limited. It costs
    one more copy of the weights (and BatchNorm statistics) on the device while held.

    Tensors and plain types only: checkpoints go through the artifact store and are read
    back with ``torch.load(weights_only=True)``, so the probe is kept as the state of its
    equivalent linear head (``to_linear``), not as a pickled sklearn object."""
    state = {k: v.detach().clone() for k, v in method.state_dict().items()}
    head = None
    if probe is not None:
        head = {k: v.detach().clone() for k, v in probe.to_linear().state_dict().items()}
    return {"state_dict": state, "probe": head, **extra}


def checkpoint_to_host(ckpt: Any) -> Any:
    """``ckpt`` with every tensor in it (nested dicts and lists too) on the host; one
    already there is kept, not copied."""
    if isinstance(ckpt, torch.Tensor):
        return ckpt.cpu()
    if isinstance(ckpt, dict):
        return {k: checkpoint_to_host(v) for k, v in ckpt.items()}
    if isinstance(ckpt, (list, tuple)):
        return type(ckpt)(checkpoint_to_host(v) for v in ckpt)
    return ckpt


def export_classifier(
    method: Method, ckpt: dict[str, Any], class_names: list[str]
) -> ExportedClassifier:
    """Rebuild the best predictor from a checkpoint as an ``ExportedClassifier`` on CPU."""
    ckpt = checkpoint_to_host(ckpt)
    m = copy.deepcopy(method).to("cpu")
    m.load_state_dict(ckpt["state_dict"])
    if ckpt.get("probe") is not None:
        w = ckpt["probe"]["weight"]
        head = torch.nn.Linear(w.shape[1], w.shape[0])
        head.load_state_dict(ckpt["probe"])
        backbone = m.backbone
    else:
        backbone, head = m.classifier_parts()
    return for_export(ExportedClassifier(backbone, head, class_names))


def make_optimizer(method: Method, total_steps: int | Horizon, fused: bool | None = None, *,
                   accel: Accel | None = None
                   ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """Adam at the method's ``lr`` / ``weight_decay`` with a per-step cosine decay to 0 over
    ``total_steps`` — the one schedule of every method (SSL-vs-SSL §4), also for encoders
    trained outside a study (``scarcelab.active.encoded``). Given a :class:`Horizon`
    (the epoch loop's), the decay follows that plan's progress, re-planned or not, the
    same progress the methods' ramps read (``scarcelab.schedule``). The kernel: torch's fused one
    when the resolved ``accel`` says so and the optimiser has one on the parameters'
    device (same update up to float rounding); without ``accel``, ``fused`` picks it
    (``None``: torch's default).

    A method declaring ``optimizer = "sgd"`` gets SGD with momentum 0.9 under the same
    per-step cosine annealing instead: the common optimiser of every method in Brigato et
    al.'s "Tune It or Don't Use It" protocol (``scarcelab.protocols.tune``)."""
    kind = getattr(method, "optimizer", "adam")
    cls: type[torch.optim.Optimizer] = torch.optim.SGD if kind == "sgd" else torch.optim.Adam
    kernel: dict[str, Any]  # fused / foreach flags, passed through to the optimizer
    if accel is not None:
        kernel = accel.optimizer_kwargs(cls, next(method.parameters()).device)
    else:  # the former keyword: Adam's only (SGD never took it)
        kernel = {"fused": fused} if kind == "adam" else {}
    if kind == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(
            method.parameters(), lr=float(method.hp["lr"]), momentum=0.9,
            weight_decay=float(method.hp["weight_decay"]), **kernel)
    elif kind == "adam":
        opt = torch.optim.Adam(method.parameters(), lr=float(method.hp["lr"]),
                               weight_decay=float(method.hp["weight_decay"]), **kernel)
    else:
        raise ConfigError(f"{type(method).__name__}.optimizer = {kind!r}: valid are "
                          "'adam' and 'sgd'")
    plan = total_steps if isinstance(total_steps, Horizon) else Horizon(total_steps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: cosine_factor(plan.fraction(s)))
    return opt, sched


class NonFiniteWatch:
    """The first non-finite loss of a run of steps, recorded on the device.

    Checking ``isfinite(loss)`` on the host every step reads the device back, which on a
    GPU waits for the whole step to finish: the host could never queue the next step
    ahead. Here each step only adds a few kernels that keep the first bad step's index
    and loss value on the device; :meth:`check` reads them once (the epoch loop: at the
    end of each epoch) and raises the :class:`TrialFailed` the per-step check raised.
    The steps after the bad one still run (on NaN weights) until then."""

    def __init__(self) -> None:
        self._step: torch.Tensor | None = None  # float64: the first bad step, -1 if none
        self._value: torch.Tensor | None = None  # float64: its loss

    def observe(self, loss: torch.Tensor, step: int) -> None:
        loss = loss.detach()
        if self._step is None or self._value is None:
            self._step = torch.full((), -1.0, dtype=torch.float64, device=loss.device)
            self._value = torch.zeros((), dtype=torch.float64, device=loss.device)
        first = torch.isfinite(loss).logical_not_() & (self._step < 0)
        self._step = torch.where(first, float(step), self._step)
        self._value = torch.where(first, loss.to(torch.float64), self._value)

    def check(self, epoch: int) -> None:
        """Raise for a non-finite loss seen so far (one read of the device)."""
        if self._step is None or self._value is None:
            return
        step, value = torch.stack([self._step, self._value]).tolist()
        if step >= 0:
            raise TrialFailed(f"non-finite loss ({value}) at epoch {epoch}, step {int(step)}")


#: the epoch loop's watch; None: :func:`optimizer_step` checks each loss on the spot
_WATCH: ContextVar[NonFiniteWatch | None] = ContextVar("scarcelab_nonfinite_watch",
                                                       default=None)


@contextmanager
def deferred_finite_check(watch: NonFiniteWatch) -> Iterator[NonFiniteWatch]:
    """Within the block, :func:`optimizer_step` records non-finite losses in ``watch``
    instead of reading each loss back; the caller calls ``watch.check`` when it can
    afford one read (the epoch loop: at each epoch's end)."""
    token = _WATCH.set(watch)
    try:
        yield watch
    finally:
        _WATCH.reset(token)


def optimizer_step(method: Method, opt: torch.optim.Optimizer,
                   sched: torch.optim.lr_scheduler.LambdaLR, batch: Batch,
                   progress: Progress, accel: Accel | None = None) -> dict[str, torch.Tensor]:
    """One update: the method's losses, a finite check (a NaN trial fails loudly instead of
    training on garbage), backward, optimiser and schedule steps, then the method's
    post-update hook (EMA teachers, queues).

    With a resolved bf16 ``accel`` the method's step (forward passes and losses) runs under
    autocast and its losses come out in fp32; backward, the optimiser and the post-update
    hook run outside it, on the fp32 parameters.

    Inside :func:`deferred_finite_check` (the epoch loop) the check is recorded on the
    device and raised at the epoch's end, so a step never waits on the device; called on
    its own, it reads the loss and raises before the update, as it always did."""
    if accel is not None and accel.bf16:
        with step_autocast(accel, method):
            losses = method.step(batch, progress)
        losses = {k: v.float() for k, v in losses.items()}
    else:
        losses = method.step(batch, progress)
    loss = losses["loss"]
    watch = _WATCH.get()
    if watch is not None:
        watch.observe(loss, progress.step)
    elif not torch.isfinite(loss):
        raise TrialFailed(f"non-finite loss ({loss.item()}) at epoch {progress.epoch}, "
                          f"step {progress.step}")
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    sched.step()
    method.after_optimizer_step(progress)
    return losses


#: a checkpoint of the epoch just evaluated, taken only when called (copying a ResNet every
#: epoch is not free)
SnapshotFn = Callable[[], dict[str, Any]]


class EpochCallback(Protocol):
    """What a caller of :func:`train_trial` does at the end of each evaluated epoch: log
    it, keep a best-so-far checkpoint, report it to a pruner (which may stop the trial by
    raising). One protocol for every such concern, so that the loop calls them all in the
    order the caller listed them, and a new concern is one more object, not one more
    keyword argument of the loop.

    A callback that also measures the epoch defines ``diagnostics`` (see
    :class:`DiagnosticsCallback`)."""

    def on_epoch_end(self, report: EpochReport, improved: bool,
                     snapshot: SnapshotFn) -> None: ...


@runtime_checkable
class DiagnosticsCallback(EpochCallback, Protocol):
    """An :class:`EpochCallback` that also measures the model after the epoch's steps,
    before its evaluation: its metrics (``diag/*``, see ``scarcelab.metrics.diagnostics``)
    join the epoch's, and its time is paused out of the budget (see :class:`Budget`) and
    reported as ``time/diag_s``."""

    def diagnostics(self, method: Method, epoch: int) -> dict[str, float]: ...


@dataclass(frozen=True)
class OnEpochEnd:
    """A plain function ``(report, improved, snapshot)`` as an :class:`EpochCallback`: what
    a bench or a test that only collects reports needs, without a class of its own."""

    fn: Callable[[EpochReport, bool, SnapshotFn], None]

    def on_epoch_end(self, report: EpochReport, improved: bool,
                     snapshot: SnapshotFn) -> None:
        self.fn(report, improved, snapshot)


@dataclass(frozen=True)
class Diagnostics:
    """A ``(method, epoch) -> metrics`` measure (``EpochDiagnostics``) as a
    :class:`DiagnosticsCallback` that does nothing else at the epoch's end."""

    fn: Callable[[Method, int], dict[str, float]]

    def diagnostics(self, method: Method, epoch: int) -> dict[str, float]:
        return self.fn(method, epoch)

    def on_epoch_end(self, report: EpochReport, improved: bool,
                     snapshot: SnapshotFn) -> None:
        return None


def train_trial(
    method: Method,
    bundle: DatasetBundle,
    cfg: TrainConfig,
    *,
    deadline: float | Budget,
    generator: torch.Generator,
    probe_rng: np.random.Generator,
    callbacks: Sequence[EpochCallback] = (),
) -> TrialResult:
    """Train one configuration until early stop, ``max_epochs`` or the wall-clock deadline.

    After each epoch's steps, the ``diagnostics`` of the callbacks that have one run (in
    their order, timed together outside the budget); after its evaluation, every
    callback's ``on_epoch_end(report, improved, snapshot)``, in order; ``snapshot()``
    gives a checkpoint of this epoch. Raises :class:`TrialFailed` on a non-finite loss, at
    the end of the epoch it happened in (the epoch's remaining steps run first: the check
    is read from the device once per epoch, :class:`NonFiniteWatch`), before that epoch's
    diagnostics and evaluation. ``deadline`` is a :class:`Budget` (the diagnostics' time
    is then paused out of it) or an absolute ``time.time()`` value.
    """
    budget = deadline if isinstance(deadline, Budget) else _Deadline(deadline)
    if cfg.stop_on not in ("val", "train_loss"):
        raise ValueError(f"TrainConfig.stop_on={cfg.stop_on!r}: 'val' or 'train_loss'")
    if cfg.probe_solver not in PROBE_SOLVERS:
        raise ValueError(f"TrainConfig.probe_solver={cfg.probe_solver!r}: "
                         f"{' or '.join(map(repr, PROBE_SOLVERS))}")
    if cfg.eval_every_steps < 0:
        raise ValueError(f"TrainConfig.eval_every_steps={cfg.eval_every_steps}: >= 0")
    if cfg.schedule_horizon not in SCHEDULE_HORIZONS:
        raise ValueError(f"TrainConfig.schedule_horizon={cfg.schedule_horizon!r}: "
                         f"{' or '.join(map(repr, SCHEDULE_HORIZONS))}")
    loop = _EpochLoop(method, bundle, cfg, budget, generator, probe_rng)
    return loop.run(tuple(callbacks))


class _Steps(NamedTuple):
    """What one epoch's optimiser steps leave for its report."""

    sums: dict[str, torch.Tensor]  # each loss summed over the steps, still on the device
    n: int
    t_data: float  # seconds spent drawing and augmenting batches
    out_of_time: bool  # the budget ended the epoch before its last step


@dataclass
class _Window:
    """The steps since the last evaluation (one epoch's at the default cadence): what the
    next report averages and times."""

    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    n: int = 0
    t_data: float = 0.0
    t_train: float = 0.0
    epoch: int = -1  # the epoch of its last step

    def add(self, steps: _Steps, t_train: float, epoch: int) -> None:
        for k, v in steps.sums.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
        self.n += steps.n
        self.t_data += steps.t_data
        self.t_train += t_train
        if steps.n:
            self.epoch = epoch


class _EpochLoop:
    """One trial's training: the state its epochs share (the step count, the last step's
    and evaluation's cost that decide whether another step fits, the early-stopping
    counters, the steps not yet evaluated), kept on an object so that each phase of an
    epoch can be a method of its own.
    """

    def __init__(self, method: Method, bundle: DatasetBundle, cfg: TrainConfig,
                 budget: Budget, generator: torch.Generator,
                 probe_rng: np.random.Generator) -> None:
        self.method, self.bundle, self.cfg = method, bundle, cfg
        self.budget, self.probe_rng = budget, probe_rng
        device = torch.device(cfg.device)
        # precision and kernels, resolved once for the device; the process-wide flags set
        self.accel = cfg.resolved_accel()
        self.accel.apply_globals(device)
        _prepare_method(method, bundle, cfg, device, self.accel)
        self.source = BatchSource(bundle, type(method), cfg.batch_labeled,
                                  cfg.batch_unlabeled, device, generator,
                                  labeled_views=cfg.labeled_views,
                                  host_draws=method.host_draws)
        self.eval_sets = EvalSets(bundle, device, method.linear_probe)
        self.spe = steps_per_epoch(bundle, self.source.samples_per_step,
                                   cfg.max_steps_per_epoch)
        self.total = self.spe * cfg.max_epochs
        # the one plan the learning rate and every ramp follow (scarcelab.schedule)
        self.horizon = Horizon(self.total)
        self.opt, self.sched = make_optimizer(method, self.horizon, accel=self.accel)
        # schedule_horizon=budget: the plan ends where the trial's share of the budget
        # does (budget seconds, on the budget's elapsed() clock), re-planned every step
        self.fit_budget = cfg.schedule_horizon == "budget"
        self.plan_start = budget.elapsed()
        share = budget.remaining()
        if cfg.budget_share_s is not None:
            share = min(share, cfg.budget_share_s)
        self.plan_end = self.plan_start + share
        # a trial given a share stops when its plan is done, leaving the rest to the next
        # trial; one planned over all that is left runs until the budget check stops it
        # (steps past an early estimate's end train at progress 1.0, not a new trial of a
        # step or two in what is left)
        self.stop_at_horizon = self.fit_budget and cfg.budget_share_s is not None
        self.ended_by = "budget"  # or "horizon": the budget-fitted plan is done
        # what the plan is estimated from: the steps' own budget seconds, the evaluations
        # so far, and the steps between two evaluations (an epoch, or eval_every_steps
        # rounded up to whole epochs, as _due decides)
        self.steps_budget_s = 0.0
        self.n_evals = 0
        every = cfg.eval_every_steps
        self.eval_window = self.spe if every <= 0 else math.ceil(every / self.spe) * self.spe
        self.res = TrialResult()
        self.since_best = 0
        self.best_loss = math.inf
        self.step = 0
        self.window = _Window()
        # A step is started only if it and an evaluation fit in what is left of the
        # budget (at the speed of the last step and evaluation): the budget ends with an
        # evaluated epoch, not with a step or an evaluation that runs past it. Under an
        # evaluation cadence every step still leaves room for one, so that the steps not
        # yet evaluated when the budget ends are evaluated then.
        self.step_s = self.eval_s = 0.0

    def run(self, callbacks: tuple[EpochCallback, ...]) -> TrialResult:
        for epoch in range(self.cfg.max_epochs):
            stopped = self._epoch(epoch, callbacks)
            if stopped:
                self.res.stopped = stopped
                break
        else:
            self.res.stopped = "max_epochs"
        self.res.progress = self.horizon.fraction(self.step)
        return self.res

    def _due(self, epoch: int, steps: _Steps) -> bool:
        """Whether this epoch ends with an evaluation: every epoch by default; under
        ``eval_every_steps`` once that many steps are unevaluated, and always at the last
        epoch and when the budget ends training."""
        every = self.cfg.eval_every_steps
        return (every <= 0 or self.window.n >= every or steps.out_of_time
                or epoch == self.cfg.max_epochs - 1)

    def _epoch(self, epoch: int, callbacks: tuple[EpochCallback, ...]) -> str:
        """Train one epoch and, when due, diagnose, evaluate and report the steps since the
        last evaluation; why training stops after it ("" to go on). Nothing is evaluated
        when no step was trained since the last evaluation."""
        t0 = time.perf_counter()
        steps = self._steps(epoch)
        self.window.add(steps, time.perf_counter() - t0, epoch)
        win = self.window
        if win.n == 0:
            return "budget"
        if not self._due(epoch, steps):
            return ""
        self.window = _Window()
        epoch = win.epoch  # the report is the window's: the epoch of its last step
        diag = self._diagnostics(callbacks, epoch)
        te, tb = time.perf_counter(), self.budget.now()
        ev = evaluate(self.method, self.bundle, self.cfg, self.probe_rng, self.eval_sets)
        val_bacc, test_m, probe = ev
        test_proba = getattr(ev, "test_proba", None)  # a plain triple from a stand-in
        t_eval, self.eval_s = time.perf_counter() - te, self.budget.now() - tb
        self.n_evals += 1
        metrics = _epoch_metrics(win, val_bacc, test_m, float(self.sched.get_last_lr()[0]),
                                 t_eval)
        if self.fit_budget:  # where the budget-fitted plan stands (1.0: schedules done)
            metrics["train/progress"] = self.horizon.fraction(self.step)
            metrics["train/horizon_steps"] = float(self.horizon.total_steps)
        metrics.update(diag)
        if self.method.linear_probe and probe is not None:
            metrics["time/probe_s"] = t_eval
            metrics["probe/C"] = float(probe.C or 0.0)
        res = self.res
        res.epochs, res.steps = epoch + 1, self.step
        res.step_s, res.eval_s = self.step_s, self.eval_s
        improved = self._track_best(epoch, metrics, val_bacc, test_m)
        report = EpochReport(epoch, metrics, val_bacc, test_m, test_proba)
        if callbacks:
            method = self.method

            def snap(p: Probe | None = probe, e: int = epoch,
                     v: float = val_bacc) -> dict[str, Any]:
                return snapshot(method, p, {"epoch": e, "val_balanced_accuracy": v})

            for cb in callbacks:
                cb.on_epoch_end(report, improved, snap)
        if steps.out_of_time:
            return self.ended_by
        if self.since_best >= self.cfg.patience:
            return "patience"
        return ""

    def _steps(self, epoch: int) -> _Steps:
        """Up to an epoch of optimiser steps, each only if it and an evaluation still fit
        in the budget. A non-finite loss is recorded on the device and raises
        :class:`TrialFailed` once the epoch's steps are done (:class:`NonFiniteWatch`:
        the one read of the device per epoch, instead of one per step)."""
        now = self.budget.now
        sums: dict[str, torch.Tensor] = {}
        t_data = 0.0
        n = 0
        out_of_time = False
        with deferred_finite_check(NonFiniteWatch()) as watch:
            for _ in range(self.spe):
                if self.budget.remaining() <= self.step_s + self.eval_s:
                    out_of_time = True
                    break
                if self.stop_at_horizon and self.horizon.finished(self.step):
                    out_of_time, self.ended_by = True, "horizon"
                    break
                ts, td = now(), time.perf_counter()
                batch = self.accel.batch(self.source.next())  # the input layout (NHWC: on)
                t_data += time.perf_counter() - td
                progress = Progress(step=self.step, total_steps=self.horizon.total_steps,
                                    epoch=epoch, horizon=self.horizon)
                losses = optimizer_step(self.method, self.opt, self.sched, batch, progress,
                                        self.accel)
                for k, v in losses.items():
                    sums[k] = sums.get(k, 0.0) + v.detach()
                n += 1
                self.step += 1
                self.step_s = now() - ts
                self.steps_budget_s += self.step_s
                if self.fit_budget and self.step >= SCHEDULE_CALIBRATION_STEPS:
                    self._replan(self.window.n + n)
        watch.check(epoch)
        return _Steps(sums, n, t_data, out_of_time)

    def _replan(self, in_window: int) -> None:
        """``schedule_horizon=budget``: end the schedules' plan at the steps that still fit
        in the trial's share of the budget, never past the epoch plan. Counted as the loop
        will start them (``scarcelab.schedule.steps_that_fit``), from the trial's own costs
        so far: its mean step (data included), its last evaluation (what the loop keeps
        room for) and what each evaluation cost with the logging and checkpointing around
        it (the budget seconds not spent in steps, per evaluation). Called after every
        step (``in_window``: steps since the last evaluation), so the estimate follows the
        trial's speed and progress reaches 1.0 with the last step the budget allows."""
        now = self.budget.elapsed()
        step_s = self.steps_budget_s / self.step
        if not step_s > 0.0:  # a clock that did not move: nothing to estimate from
            return
        per_eval = ((now - self.plan_start - self.steps_budget_s) / self.n_evals
                    if self.n_evals else self.eval_s)
        left = min(self.plan_end - now, self.budget.remaining())
        fit = steps_that_fit(left, step_s, self.eval_s, self.eval_window, in_window,
                             max(per_eval, self.eval_s))
        self.horizon.replan(self.step, min(self.total, self.step + fit))
        # the next step's learning rate, computed by the scheduler's last step under the
        # plan before, follows this one (the same value, unless the plan just ended)
        for group, base, factor in zip(self.opt.param_groups, self.sched.base_lrs,
                                       self.sched.lr_lambdas, strict=True):
            group["lr"] = base * factor(self.sched.last_epoch)
        self.sched._last_lr = [group["lr"] for group in self.opt.param_groups]

    def _diagnostics(self, callbacks: tuple[EpochCallback, ...], epoch: int
                     ) -> dict[str, float]:
        """The epoch's diagnostics, timed outside the budget (see :class:`Budget`); none
        (and no ``time/diag_s``) when no callback measures."""
        measures = [cb for cb in callbacks if isinstance(cb, DiagnosticsCallback)]
        diag: dict[str, float] = {}
        if measures:
            before = self.budget.excluded_s
            with self.budget.paused():
                for cb in measures:
                    diag.update(cb.diagnostics(self.method, epoch))
            diag["time/diag_s"] = self.budget.excluded_s - before
        return diag

    def _track_best(self, epoch: int, metrics: dict[str, float], val_bacc: float,
                    test_m: dict[str, float]) -> bool:
        """Update the trial's answer and the early-stopping counter; whether this epoch
        is the new answer (the checkpoint a caller keeps)."""
        res = self.res
        if self.cfg.stop_on == "train_loss":
            loss = metrics.get("train/loss", math.inf)
            res.best_val, res.best_epoch, res.best_test = val_bacc, epoch, test_m
            if loss < self.best_loss:
                self.best_loss, self.since_best = loss, 0
            else:
                self.since_best += 1
            return True  # the last epoch is the answer
        improved = val_bacc > res.best_val  # strict: the first of tied epochs wins
        if improved:
            res.best_val, res.best_epoch, res.best_test = val_bacc, epoch, test_m
            self.since_best = 0
        else:
            self.since_best += 1
        return improved


def _prepare_method(method: Method, bundle: DatasetBundle, cfg: TrainConfig,
                    device: torch.device, accel: Accel | None = None) -> None:
    """Put the method on the device in training mode, in the configured memory format
    (its backbone compiled if asked), with the labeled loss's class weights, and let it
    see the data's sizes before the first step (a method's queues and schedules depend on
    them). ``accel``: resolved already (None: ``cfg``'s, resolved here)."""
    method.to(device).train()
    accel = accel or cfg.resolved_accel()
    accel.prepare(method, compiled=method.backbone)
    info = data_info(bundle)
    method.class_weights = class_weights_for(cfg.class_weights, info.labeled_class_counts,
                                             device)
    method.on_train_start(info)


def _epoch_metrics(win: _Window, val_bacc: float, test_m: dict[str, float], lr: float,
                   t_eval: float) -> dict[str, float]:
    """The window's mean train losses, its validation and test scores and its costs."""
    metrics = {f"train/{k}": float(v) / win.n for k, v in win.sums.items()}
    metrics.update({
        "val/balanced_accuracy": val_bacc,
        **{f"test/{k}": v for k, v in test_m.items()},
        "train/lr": lr,
        "time/epoch_s": win.t_train + t_eval,  # what the budget is charged (no diagnostics)
        "time/data_s": win.t_data,
        "time/eval_s": t_eval,
        "time/steps": float(win.n),
    })
    return metrics
