"""The one optimiser of every method (``scarcelab.train.make_optimizer``) reads the
method's ``lr`` and ``weight_decay``: these two hyperparameters are declared by every method
(``CLASSIFIER_DEFAULTS``, ``SELFSUP_SPACE``, the Tune-It ``COMMON_SPACE``) and read nowhere
else, so this is the test that exercises them for all methods."""

from __future__ import annotations

import pytest
import torch

from scarcelab.methods import get_method
from scarcelab.train import make_optimizer
from tests.core.methods.test_tune_methods import _Feat  # a flattening "backbone" with num_features


@pytest.mark.parametrize(("name", "kind"), [("sup", torch.optim.Adam), ("ce", torch.optim.SGD)])
def test_lr_and_weight_decay_reach_the_optimiser(name: str, kind: type) -> None:
    """Adam (the semi / self-supervised studies) and SGD (Tune-It) alike start at the
    method's ``lr`` and decay parameters by its ``weight_decay``; two different settings
    give two different optimisers, so a key read under the wrong name would show."""
    for lr, wd in ((0.123, 0.045), (0.01, 0.0)):
        m = get_method(name)(_Feat(4), 3, {**get_method(name).defaults, "lr": lr,
                                          "weight_decay": wd})
        opt, _ = make_optimizer(m, 10)
        assert isinstance(opt, kind)
        assert opt.param_groups[0]["lr"] == pytest.approx(lr)  # cosine factor 1 at step 0
        assert opt.param_groups[0]["weight_decay"] == pytest.approx(wd)
