"""Run figures (tracking/plots.py): the numbers drawn are the right ones."""

from __future__ import annotations

import numpy as np
import optuna
from sklearn.metrics import confusion_matrix, roc_curve

from scarcelab.tracking import plots


def _data(n: int = 120, k: int = 3, seed: int = 0):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    p = rng.dirichlet(np.ones(k), n)
    p[np.arange(n), y] += 0.4
    return y, p / p.sum(1, keepdims=True)


def test_confusion_counts_match_sklearn():
    y, p = _data()
    assert (plots.confusion_counts(y, p.argmax(1), 3) ==
            confusion_matrix(y, p.argmax(1), labels=[0, 1, 2])).all()


def test_roc_points_match_sklearn():
    y, p = _data(k=2)
    fpr, tpr = plots._roc(y == 1, p[:, 1])
    ref_fpr, ref_tpr, _ = roc_curve(y, p[:, 1], drop_intermediate=False)
    assert np.allclose(fpr, ref_fpr) and np.allclose(tpr, ref_tpr)


def test_figures_render_and_degenerate_inputs_give_none():
    y, p = _data()
    for fig in (plots.confusion_figure(y, p, ["a", "b", "c"]),
                plots.roc_figure(y, p, ["a", "b", "c"]),
                plots.trials_profile_figure({0: [(5, .5, .4), (9, .6, .5)], 1: [(12, .7, .6)]}),
                plots.learning_curves_figure({0: [(10, .5), (20, .6)], 1: [(10, .4), (20, .7)]},
                                             "al")):
        assert plots.png(fig).startswith(b"\x89PNG")
    assert plots.roc_figure(np.zeros(5, int), np.full((5, 2), .5), ["a", "b"]) is None
    assert plots.trials_profile_figure({}) is None


def test_search_figures_need_two_completed_trials():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    s = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(0))
    s.optimize(lambda t: t.suggest_float("lr", 1e-4, 1e-1, log=True) + t.suggest_float("wd", 0,
                                                                                          1), 1)
    assert plots.search_figures(s.trials) == {}
    s.optimize(lambda t: t.suggest_float("lr", 1e-4, 1e-1, log=True) + t.suggest_float("wd", 0,
                                                                                          1), 4)
    assert set(plots.search_figures(s.trials)) == {"parallel_coordinate", "param_importances"}
