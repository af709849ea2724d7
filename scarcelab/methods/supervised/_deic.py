"""Shared declarations of the "Tune It or Don't Use It" method set (Brigato et al., ICCV
2021 workshops; reference code: github.com/lorenzobrigato/gem, the authors' library).

Every method of that benchmark is trained the same way — SGD with momentum 0.9 and
cosine annealing of the learning rate per iteration (gem ``LearningMethod.get_optimizer``)
— and tuned over the same common space: ``lr ~ logU(1e-4, 0.1)`` and
``weight_decay ~ logU(1e-5, 0.1)`` (gem ``scripts/hpo.py`` defaults ``--min-lr`` …
``--max-decay``), plus the batch size from the dataset's set (searched by the protocol,
``scarcelab.protocols.tune``) and the method's own hyperparameters. The defaults
(``lr = 0.01``, ``weight_decay = 1e-3``) are gem's ``default_hparams``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from scarcelab.methods.base import SupervisedMethod
from scarcelab.methods.space import Distribution, LogUniform

LR = LogUniform(1e-4, 0.1)
WEIGHT_DECAY = LogUniform(1e-5, 0.1)
COMMON_SPACE: dict[str, Distribution] = {"lr": LR, "weight_decay": WEIGHT_DECAY}
COMMON_DEFAULTS: dict[str, Any] = {"lr": 0.01, "weight_decay": 1e-3}


class DEICMethod(SupervisedMethod):
    """Base of the benchmark's methods: SGD (momentum 0.9) + cosine annealing, the
    shift + flip augmentation for small images (the protocol replaces it per dataset),
    and the ``deic`` marker the ``tune`` entry point lists methods by."""

    optimizer = "sgd"
    deic: ClassVar[bool] = True
    search_space: ClassVar[dict[str, Distribution]] = dict(COMMON_SPACE)
    defaults: ClassVar[dict[str, Any]] = dict(COMMON_DEFAULTS)
    batch_sizes: ClassVar[dict[str, int]] = {"labeled": 25, "unlabeled": 0}
    labeled_views = ("weak",)
