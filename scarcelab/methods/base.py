"""The method interface (DESIGN §2): every method is one small class with one ``step``.

Every classifier method optimises ``λL·ℓL(labeled) + λU·ℓU(unlabeled)``. A method says
which augmented views it needs, declares its search space and literature defaults, and
returns named loss terms from ``step``; the shared epoch loop (``scarcelab.train``) does
sampling, augmentation, optimisation, evaluation and early stopping for all of them.
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from scarcelab.errors import ConfigError
from scarcelab.methods._parts import soft_cross_entropy
from scarcelab.methods.space import Distribution
from scarcelab.models import num_features
from scarcelab.schedule import Horizon


@dataclass
class Batch:
    """One training step's inputs, already augmented and normalised.

    ``x`` holds the labeled views in the order of ``Method.labeled_views``; ``u`` the
    unlabeled views in the order of ``Method.views`` (several views of the *same*
    unlabeled samples); ``u_index`` their positions in the unlabeled pool, for methods
    that keep per-sample state (memory banks, class-wise thresholds). ``draws``: what
    the method's :meth:`Method.host_draws` drew for this step, already on the device
    (``None`` when the batch came from elsewhere: the method then draws in ``step``).
    """

    x: list[torch.Tensor]
    y: torch.Tensor
    u: list[torch.Tensor]
    u_index: torch.Tensor | None = None
    draws: dict[str, Any] | None = None


@dataclass
class Progress:
    """Where training stands, for warm-ups and schedules.

    ``fraction`` is the one progress every ramp reads: the trial's :class:`Horizon`'s
    (the epoch loop passes the one its learning-rate schedule follows, re-planned to the
    time budget under ``schedule_horizon=budget``), else ``step / total_steps``."""

    step: int
    total_steps: int
    epoch: int
    horizon: Horizon | None = None

    @property
    def fraction(self) -> float:
        plan = self.horizon if self.horizon is not None else Horizon(self.total_steps)
        return plan.fraction(self.step)


@dataclass
class DataInfo:
    """What a method may know about its data before training (never unlabeled labels).

    Methods with per-sample state (FlexMatch's learning status, CoMatch's memory) size
    it from ``n_unlabeled``; distribution alignment uses ``labeled_class_counts``.
    """

    n_labeled: int
    n_unlabeled: int
    num_classes: int
    labeled_class_counts: list[int]


Losses = dict[str, torch.Tensor]


@dataclass
class PseudoTargets:
    """What a semi-supervised method would train on for a batch of unlabeled images.

    ``logits`` (N, C) is the method's prediction the targets are derived from; ``labels``
    (N,) the hard pseudo-label (the arg-max of the target distribution: FixMatch's
    pseudo-label, CoMatch's memory-smoothed ``q``, SoftMatch's unaligned prediction);
    ``weights`` (N,) the per-sample weight the method gives the unlabeled term, in [0, 1]
    — a 0/1 mask for thresholding methods (FixMatch, FlexMatch's class-wise thresholds,
    CoMatch), SoftMatch's truncated-Gaussian weight, DS3L's learned weight, all ones for
    a method that filters nothing (MixMatch). Diagnostics (``diag/ood_ff``,
    ``diag/sem_drift``) read a method's own filter from here.
    """

    logits: torch.Tensor
    labels: torch.Tensor
    weights: torch.Tensor


class Method(nn.Module, metaclass=ABCMeta):
    """Base class. Subclasses register with ``@register("name")`` from ``scarcelab.methods``.

    Class attributes form the declarative part of a method:

    - ``family``: ``supervised`` | ``semi`` | ``self``; picks the entry point.
    - ``search_space``: hyperparameter -> distribution (SSL-vs-SSL App. F.1).
    - ``defaults``: literature defaults, used for fixed parameters and ``search=none``.
    - ``batch_sizes``: the paper's labeled / unlabeled batch sizes (overridable).
    - ``labeled_views`` / ``views``: augmentation names (``scarcelab.data.augment``).
    - ``linear_probe``: evaluate with a linear probe on frozen features every epoch
      instead of the method's own head (self-supervised methods, supcon).
    - ``has_pseudo_labels``: the method trains on pseudo-labels of its own (and implements
      ``_pseudo_targets``); diagnostics and contamination studies read its filter through
      :meth:`pseudo_targets`, and use a generic one for methods that declare none.
    """

    family: ClassVar[str] = ""
    registered_name: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    search_space: ClassVar[dict[str, Distribution]] = {}
    defaults: ClassVar[dict[str, Any]] = {}
    batch_sizes: ClassVar[dict[str, int]] = {"labeled": 64, "unlabeled": 0}
    # not a ClassVar: a method may pick its labeled views per instance from its
    # hyperparameters (DS3L's ``labeled_consistency``)
    labeled_views: tuple[str, ...] = ("weak",)
    views: ClassVar[tuple[str, ...]] = ()
    linear_probe: ClassVar[bool] = False
    has_pseudo_labels: ClassVar[bool] = False
    optimizer: ClassVar[str] = "adam"  # or "sgd" (momentum 0.9); see train.make_optimizer

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Declaration and implementation of pseudo-labels must agree: a method whose
        ``_pseudo_targets`` were silently skipped would have its diagnostics computed with
        the generic filter instead of its own."""
        super().__init_subclass__(**kwargs)
        implements = cls._pseudo_targets is not Method._pseudo_targets
        if implements != cls.has_pseudo_labels:
            raise TypeError(
                f"{cls.__name__}: has_pseudo_labels = {cls.has_pseudo_labels} but it "
                f"{'implements' if implements else 'does not implement'} _pseudo_targets; "
                "set has_pseudo_labels = True exactly when it does")

    def __init__(self, backbone: nn.Module, num_classes: int, hp: dict[str, Any]) -> None:
        super().__init__()
        self.backbone = backbone
        self.num_classes = num_classes
        self.hp = {**self.defaults, **hp}
        self.check_hparams(self.hp)
        # per-class weights of the labeled loss, (C,) on the model's device, or None
        # (unweighted); set by the trainer from the labeled set (TrainConfig.class_weights)
        self.class_weights: torch.Tensor | None = None
        if not self.linear_probe:
            self.head = nn.Linear(num_features(backbone), num_classes)

    @classmethod
    def check_hparams(cls, hp: dict[str, Any]) -> None:
        """Refuse, with a :class:`~scarcelab.errors.ConfigError` naming the key, values
        the mathematics cannot take (a search space only draws sound ones, but a user's
        override or given configuration may not): called before any data is loaded and
        again by every construction. Most methods take anything their types allow."""

    @staticmethod
    def _require(ok: bool, method: str, key: str, value: Any, why: str) -> None:
        if not ok:
            raise ConfigError(f"{method}: {key}={value!r} {why}")

    # -- what subclasses implement -------------------------------------------------
    @abstractmethod
    def step(self, batch: Batch, progress: Progress) -> Losses:
        """Return named loss terms; ``"loss"`` is the total that is back-propagated."""

    def on_train_start(self, info: DataInfo) -> None:
        """Hook called once before the first step (allocate per-sample state here)."""

    def after_optimizer_step(self, progress: Progress) -> None:
        """Hook for EMA teachers, queues and other post-update state."""

    def unlabeled_ramp(self, fraction: float) -> float | None:
        """The share in [0, 1] of the full unlabeled-loss weight this method's ramp gives
        at schedule progress ``fraction``; None for a method without such a ramp. A study
        reads it at its selected trial's end, to say when a budget stopped the ramp short
        of its full weight."""
        return None

    def host_draws(self, n_labeled: int, n_unlabeled: int) -> dict[str, Any] | None:
        """Random numbers the next ``step`` needs from the global RNG, drawn on the host
        *now* (by the batch source, just before the step, so nothing else draws in
        between and the global RNG's stream is the one ``step`` itself would draw) so that
        they reach the device in the step's one copy (``Batch.draws``), instead of each
        being a blocking copy of its own. ``n_labeled`` / ``n_unlabeled``: the batch's
        sizes. ``None`` (the default): the method draws nothing per step."""
        return None

    def _pseudo_targets(self, x: torch.Tensor, index: torch.Tensor | None
                        ) -> PseudoTargets | None:
        """Subclass part of :meth:`pseudo_targets`: the targets from the method's *current*
        state (thresholds, running statistics, memory) without updating any of it.
        Called only for a method that declares ``has_pseudo_labels``; ``None`` (the
        default) means the method has no pseudo-labels (supervised and self-supervised
        methods, Mean Teacher)."""
        return None

    # -- shared --------------------------------------------------------------------
    def labeled_loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of the labeled batch, class-weighted when the trainer set
        ``class_weights`` (SSL-vs-SSL: every method's labeled term; a weighted *mean*,
        ``Σ w_{y_i} ℓ_i / Σ w_{y_i}``, as ``F.cross_entropy(..., weight)``)."""
        return F.cross_entropy(logits, y, weight=self.class_weights)

    def labeled_soft_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of the labeled batch against mixed (soft) labels, class-weighted
        when ``class_weights`` is set (:func:`scarcelab.methods._parts.soft_cross_entropy`)."""
        return soft_cross_entropy(logits, targets, weight=self.class_weights)

    def pseudo_targets(self, x: torch.Tensor, index: torch.Tensor | None = None
                       ) -> PseudoTargets | None:
        """Pseudo-labels and per-sample weights the method would train on for the
        unlabeled images ``x`` (already normalised; ``index``: their positions in the
        unlabeled pool, if known), or ``None`` for a method without pseudo-labels.

        Not a training step: no gradient, no optimiser, and no state changes — the
        network runs in eval mode (so BatchNorm running statistics stay as they are)
        and subclasses read, never update, their thresholds, running statistics and
        memory banks. The training mode is restored afterwards.
        """
        if not self.has_pseudo_labels:
            return None
        was_training = self.training
        self.eval()
        try:
            with torch.no_grad():
                return self._pseudo_targets(x, index)
        finally:
            self.train(was_training)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Representation used by the linear probe and by diagnostics."""
        return self.backbone(x)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        if self.linear_probe:
            raise TypeError(f"{type(self).__name__} has no classifier head; use the probe")
        return self.head(self.backbone(x))

    def classifier_parts(self) -> tuple[nn.Module, nn.Module]:
        """(backbone, head) of the model used for prediction, for export."""
        return self.backbone, self.head

    @classmethod
    def describe(cls) -> str:
        return f"{cls.registered_name}\t{cls.family}"


class SupervisedMethod(Method):
    family = "supervised"


class SemiMethod(Method):
    family = "semi"
    batch_sizes = {"labeled": 64, "unlabeled": 448}


class SelfSupMethod(Method):
    family = "self"
    labeled_views = ()
    linear_probe = True
    batch_sizes = {"labeled": 0, "unlabeled": 256}
