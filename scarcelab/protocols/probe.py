"""The per-epoch linear probe (SSL-vs-SSL §3): logistic regression on frozen features.

Refit after every epoch of self-supervised training: 10 random draws of the inverse L2
strength ``C`` (log-uniform on [1e-3, 1e3]), each fit on the labeled set, the one with the
best validation balanced accuracy kept. Features are standardised with the labeled-set
statistics; the scaler is folded into the exported ``nn.Linear`` so the final model is an
ordinary torch module. The probe never feeds back into the encoder.

Cost: the probe runs after *every* epoch, so it must stay a small share of the epoch.
Two measures (450 x 512 features, 9 classes, this 2-core machine under load): BLAS is held
to one thread while fitting — lbfgs on a few hundred rows is latency-bound, and a
multi-threaded BLAS competing with torch's threads made each iteration ~25x slower
(2.4 s -> 0.09 s for all 10 fits); and the 10 penalties (same RNG draws as before) are
fitted in increasing order of ``C``, each lbfgs run warm-started from the previous solution
(a regularisation path: neighbouring penalties have neighbouring optima), which cuts the
iterations from ~6-10 per fit to ~1-3 after the first. The bound is in iterations
(``max_iter``), never in seconds, so the chosen ``C`` stays deterministic under a seed. On
equal validation scores the smaller ``C`` (stronger penalty) is kept.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from threadpoolctl import threadpool_limits
from torch import nn

from scarcelab.metrics import balanced_accuracy

C_RANGE = (1e-3, 1e3)


class LinearProbe:
    def __init__(self, num_classes: int, n_trials: int = 10, max_iter: int = 100,
                 tol: float = 1e-4, balanced: bool = False) -> None:
        self.num_classes = num_classes
        # class_weight="balanced" (n / (C·n_c) per class): SSL-vs-SSL's probe
        # (tufts-ml/SSL-vs-SSL-benchmark Self/SimCLR/SimCLR_main.py,
        # ``LogisticRegression(random_state=0, class_weight='balanced', C=reg)``)
        self.balanced = balanced
        self.n_trials = n_trials
        self.max_iter = max_iter
        self.tol = tol
        self.clf: LogisticRegression | None = None
        self.C: float | None = None
        self.val_balanced_accuracy = float("nan")
        self.mean: np.ndarray | None = None
        self.std: np.ndarray | None = None

    def _scale(self, f: np.ndarray) -> np.ndarray:
        assert self.mean is not None and self.std is not None
        return (f - self.mean) / self.std

    def fit(
        self,
        f_lab: np.ndarray,
        y_lab: np.ndarray,
        f_val: np.ndarray,
        y_val: np.ndarray,
        rng: np.random.Generator,
    ) -> LinearProbe:
        with threadpool_limits(limits=1, user_api="blas"):
            return self._fit(f_lab, y_lab, f_val, y_val, rng)

    def _fit(
        self,
        f_lab: np.ndarray,
        y_lab: np.ndarray,
        f_val: np.ndarray,
        y_val: np.ndarray,
        rng: np.random.Generator,
    ) -> LinearProbe:
        self.mean = f_lab.mean(0)
        self.std = f_lab.std(0) + 1e-6
        xl, xv = self._scale(f_lab), self._scale(f_val)
        lo, hi = np.log10(C_RANGE[0]), np.log10(C_RANGE[1])
        best = -1.0
        cs = 10.0 ** rng.uniform(lo, hi, size=self.n_trials)
        clf = LogisticRegression(max_iter=self.max_iter, tol=self.tol, warm_start=True,
                                 class_weight="balanced" if self.balanced else None)
        for c in np.sort(cs):  # strongest penalty first: each fit warm-starts the next
            clf.set_params(C=float(c))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                clf.fit(xl, y_lab)
            score = balanced_accuracy(y_val, clf.predict(xv))
            if score > best:
                best, self.clf, self.C = score, copy.deepcopy(clf), float(c)
        self.val_balanced_accuracy = best
        return self

    def predict_proba(self, f: np.ndarray) -> np.ndarray:
        """Probabilities over *all* classes, even those absent from the labeled set."""
        assert self.clf is not None, "fit the probe first"
        p = self.clf.predict_proba(self._scale(f))
        out = np.zeros((len(f), self.num_classes))
        out[:, self.clf.classes_] = p
        return out

    def to_linear(self) -> nn.Linear:
        """An ``nn.Linear`` on raw features whose softmax equals ``predict_proba``."""
        assert self.clf is not None and self.mean is not None and self.std is not None
        d = len(self.mean)
        w = np.zeros((self.num_classes, d))
        b = np.zeros(self.num_classes)
        coef, icpt, classes = self.clf.coef_, self.clf.intercept_, self.clf.classes_
        if len(classes) == 2 and coef.shape[0] == 1:  # binary: logit of classes[1] vs [0]
            w[classes[1]], b[classes[1]] = coef[0], icpt[0]
        else:
            w[classes], b[classes] = coef, icpt
        if len(classes) < self.num_classes:  # classes never seen: never predicted
            missing = np.setdiff1d(np.arange(self.num_classes), classes)
            b[missing] = -1e4
        w_raw = w / self.std
        b_raw = b - w_raw @ self.mean
        lin = nn.Linear(d, self.num_classes)
        with torch.no_grad():
            lin.weight.copy_(torch.as_tensor(w_raw, dtype=torch.float32))
            lin.bias.copy_(torch.as_tensor(b_raw, dtype=torch.float32))
        return lin
