"""The per-epoch linear probe (SSL-vs-SSL §3): logistic regression on frozen features.

Refit after every epoch of self-supervised training: 10 random draws of the inverse L2
strength ``C`` (log-uniform on [1e-3, 1e3]), each fit on the labeled set, the one with the
best validation balanced accuracy kept; on equal validation scores the smaller ``C``
(stronger penalty) is kept. Features are standardised with the labeled-set statistics;
the scaler is folded into the exported ``nn.Linear`` so the final model is an ordinary
torch module. The probe never feeds back into the encoder.

Two solvers of one problem, picked by :func:`make_probe` (a study's ``probe_solver``):

``sklearn`` (:class:`LinearProbe`): scikit-learn's ``LogisticRegression`` (lbfgs), one
fit per penalty on the host. Cost measures (450 x 512 features, 9 classes, this 2-core
machine under load): BLAS is held to one thread while fitting — lbfgs on a few hundred
rows is latency-bound, and a multi-threaded BLAS competing with torch's threads made each
iteration ~25x slower (2.4 s -> 0.09 s for all 10 fits); and the 10 penalties are fitted
in increasing order of ``C``, each lbfgs run warm-started from the previous solution (a
regularisation path), which cuts the iterations from ~6-10 per fit to ~1-3 after the
first. The bound is in iterations (``max_iter``), never in seconds, so the chosen ``C``
stays deterministic under a seed. Its answer is lbfgs's iterate at ``tol`` = 1e-4 on
that path, close to the optimum but not at it.

``torch`` (:class:`TorchLinearProbe`): the same objective (:func:`fit_logistic`) solved
where the features are, all penalties at once as one batched problem, to the optimum
(gradient max-norm 1e-8; Newton's method for two classes, L-BFGS for more): no copy of
the features to the host, no host CPU work while a GPU waits, and two small host reads
per epoch (the validation predictions of every penalty, then the chosen probe's
probabilities). On real features it chooses what scikit-learn's optimum chooses
(bench/probe_solver.py, docs/performance.md "The probe on the device").

Why here and not in ``scarcelab/protocols/``: the epoch loop (``scarcelab/train.py``)
refits it, and protocols drive the loop, never the reverse (tests/project/test_layers.py); the
transfer protocol's linear probe uses it from above, like any protocol uses the loop.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from threadpoolctl import threadpool_limits
from torch import nn

from scarcelab.metrics import balanced_accuracy

C_RANGE = (1e-3, 1e3)
#: ``TrainConfig.probe_solver`` / a study's ``probe_solver``
PROBE_SOLVERS = ("torch", "sklearn")


def draw_penalties(rng: np.random.Generator, n_trials: int) -> np.ndarray:
    """The ``n_trials`` values of ``C`` one probe fit tries, in increasing order (both
    solvers draw them alike, so a seed picks the same candidates whichever solves)."""
    lo, hi = np.log10(C_RANGE[0]), np.log10(C_RANGE[1])
    return np.sort(10.0 ** rng.uniform(lo, hi, size=n_trials))


def _pick(scores: list[float]) -> int:
    """The first best score (the candidates are in increasing ``C``: the strongest
    penalty wins a tie)."""
    best, idx = -1.0, -1
    for i, s in enumerate(scores):
        if s > best:
            best, idx = s, i
    return idx


def _linear(coef: Any, icpt: Any, classes: np.ndarray, num_classes: int, mean: Any,
            std: Any) -> nn.Linear:
    """An ``nn.Linear`` on raw features whose softmax is the probe's probabilities:
    ``coef`` (k, d) / ``icpt`` (k,) on standardised features, over the labeled classes
    ``classes`` (binary, k = 1: the logit of ``classes[1]`` against ``classes[0]``). Built
    in float64 where ``coef`` is (arrays: the host; tensors: their device, no host read),
    stored as float32."""
    coef, icpt, mean, std = (torch.as_tensor(a, dtype=torch.float64) for a in
                             (coef, icpt, mean, std))
    d = len(mean)
    w = coef.new_zeros(num_classes, d)
    b = coef.new_zeros(num_classes)
    if len(classes) == 2 and coef.shape[0] == 1:
        w[int(classes[1])], b[int(classes[1])] = coef[0], icpt[0]
    else:
        idx = torch.as_tensor(classes, device=coef.device)
        w[idx], b[idx] = coef, icpt
    if len(classes) < num_classes:  # classes never seen: never predicted
        missing = np.setdiff1d(np.arange(num_classes), classes)
        b[torch.as_tensor(missing, device=coef.device)] = -1e4
    w_raw = w / std
    b_raw = b - w_raw @ mean
    lin = nn.Linear(d, num_classes).to(coef.device)
    with torch.no_grad():
        lin.weight.copy_(w_raw)
        lin.bias.copy_(b_raw)
    return lin


def _two_classes(classes: np.ndarray) -> None:
    if len(classes) < 2:  # sklearn's own check, for the torch solver alike
        raise ValueError("This solver needs samples of at least 2 classes in the data, but "
                         f"the data contains only one class: {classes[0]!r}")


class LinearProbe:
    """The probe fitted by scikit-learn, on host (numpy) features."""

    solver = "sklearn"

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
        best = -1.0
        clf = LogisticRegression(max_iter=self.max_iter, tol=self.tol, warm_start=True,
                                 class_weight="balanced" if self.balanced else None)
        for c in draw_penalties(rng, self.n_trials):  # each fit warm-starts the next
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
        return _linear(self.clf.coef_, self.clf.intercept_, self.clf.classes_,
                       self.num_classes, self.mean, self.std)


# -- the batched solver --------------------------------------------------------------------

#: two classes: Newton's method while a penalty's parameters number at most this (its
#: Hessian, one per penalty, is this squared), L-BFGS beyond. More classes: L-BFGS — the
#: multinomial Hessian costs n·(k(d+1))² to build, 0.81 s against lbfgs's 0.09 s per
#: epoch for 3 classes on 128 features here, 6.4 s against 0.19 s for 9
NEWTON_MAX_PARAMS = 1024
_ARMIJO = 1e-4


class _Objective:
    """scikit-learn's L2 logistic regression objective for B penalties at once.

    ``LogisticRegression`` minimises ``C · Σᵢ sᵢ ℓᵢ + ½‖W‖²`` with the intercept not
    penalised (scikit-learn user guide, "Logistic regression", the L2 objective; ``sᵢ``
    the sample weights, times ``class_weight``), ``ℓ`` the binomial loss with one weight
    vector for two classes, the multinomial cross-entropy over K weight vectors for more.
    Here it is divided by ``C · Σ sᵢ``, as scikit-learn's lbfgs solver does (its
    ``l2_reg_strength = 1 / (C · sw_sum)``), so that a gradient tolerance means the same
    at every ``C``. ``theta`` is (B, k, d + 1): weights, then the intercept.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, n_classes: int,
                 cs: torch.Tensor, sample_weight: torch.Tensor) -> None:
        n, d = x.shape
        self.binary = n_classes == 2
        self.k = 1 if self.binary else n_classes
        self.xa = torch.cat([x, x.new_ones(n, 1)], 1)
        self.sw = sample_weight / sample_weight.sum()
        self.l2 = 1.0 / (cs * sample_weight.sum())  # (B,)
        self.t = (y.to(x.dtype)[:, None] if self.binary
                  else F.one_hot(y, n_classes).to(x.dtype))  # (n, k)
        self.pen = x.new_ones(self.k, d + 1)
        self.pen[:, -1] = 0.0
        # the softmax is unchanged by adding one constant to every intercept: the last
        # class's is held at 0, which removes that flat direction (Newton needs a
        # positive definite Hessian) and changes no prediction
        self.free = torch.ones_like(self.pen)
        if not self.binary:
            self.free[-1, -1] = 0.0

    def __call__(self, theta: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Objective (B,), gradient (B, k, d + 1) and probabilities (B, n, k)."""
        z = torch.matmul(self.xa, theta.transpose(1, 2))  # (B, n, k)
        if self.binary:
            z1 = z[..., 0]
            # log(1 + e^z) without overflow, exact where softplus's linear cut-off is not
            loss = z1.clamp_min(0) + torch.log1p(torch.exp(-z1.abs())) - self.t[:, 0] * z1
            p = torch.sigmoid(z)
        else:
            lse = torch.logsumexp(z, -1, keepdim=True)
            loss = lse[..., 0] - (z * self.t).sum(-1)
            p = torch.exp(z - lse)
        w = theta * self.pen
        f = loss @ self.sw + 0.5 * self.l2 * (w * w).sum((1, 2))
        g = torch.matmul(((p - self.t) * self.sw[:, None]).transpose(1, 2), self.xa)
        g = (g + self.l2[:, None, None] * w) * self.free
        return f, g, p

    def hessian(self, p: torch.Tensor) -> torch.Tensor:
        """(B, k(d+1), k(d+1)) at the probabilities ``p``, the held intercept's row and
        column replaced by the identity's."""
        xa, sw = self.xa, self.sw
        b, n, k = p.shape
        m = xa.shape[1]
        if self.binary:
            w = p[..., 0] * (1.0 - p[..., 0]) * sw  # (B, n)
            h = torch.matmul(xa.T * w[:, None, :], xa)
        else:  # Σᵢ sᵢ (diag(pᵢ) − pᵢpᵢᵀ) ⊗ xᵢxᵢᵀ
            v = (p[..., :, None] * xa[None, :, None, :]).reshape(b, n, k * m)
            h = -torch.matmul(v.transpose(1, 2) * sw, v)
            hv = h.view(b, k, m, k, m)
            for j in range(k):
                hv[:, j, :, j, :] += torch.matmul(xa.T * (p[..., j] * sw)[:, None, :], xa)
        h.diagonal(dim1=1, dim2=2).add_(self.l2[:, None] * self.pen.flatten())
        held = (self.free.flatten() == 0).nonzero().flatten().tolist()
        for i in held:
            h[:, i, :] = 0.0
            h[:, :, i] = 0.0
            h[:, i, i] = 1.0
        return h


def _line_search(obj: _Objective, theta: torch.Tensor, f: torch.Tensor, g: torch.Tensor,
                 p: torch.Tensor, step: torch.Tensor, active: torch.Tensor,
                 t0: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Backtracking (Armijo) along ``step`` for every active penalty; returns the new
    ``theta, f, g, p`` and which penalties moved. A step that is no descent direction
    (rounding in a near-singular solve) is replaced by the steepest descent one."""
    gd = (g * step).sum((1, 2))
    bad = gd >= 0
    step = torch.where(bad[:, None, None], -g, step)
    gd = torch.where(bad, -(g * g).sum((1, 2)), gd)
    # f is known to a few ulps only: near the optimum a true decrease can read as none
    slack = 64 * torch.finfo(f.dtype).eps * f.abs()
    t = torch.where(active, t0, torch.zeros_like(t0))
    done = ~active
    moved = torch.zeros_like(active)
    out_t, out_f, out_g, out_p = theta, f, g, p
    for _ in range(60):
        cand = theta + t[:, None, None] * step
        fc, gc, pc = obj(cand)
        ok = (fc <= f + _ARMIJO * t * gd + slack) & ~done
        out_t = torch.where(ok[:, None, None], cand, out_t)
        out_f = torch.where(ok, fc, out_f)
        out_g = torch.where(ok[:, None, None], gc, out_g)
        out_p = torch.where(ok[:, None, None], pc, out_p)
        done, moved = done | ok, moved | ok
        if bool(done.all()):
            break
        t = torch.where(done, t, 0.5 * t)
    return out_t, out_f, out_g, out_p, moved


def _converging(g: torch.Tensor, tol: float, stalled: torch.Tensor) -> torch.Tensor:
    return (g.flatten(1).abs().amax(1) > tol) & ~stalled


def _newton(obj: _Objective, theta: torch.Tensor, tol: float, max_iter: int) -> torch.Tensor:
    """Damped Newton: quadratic convergence, so the optimum to ``tol`` in ~10-15 steps
    whatever ``C`` (lbfgs needs hundreds on the weakly penalised ones)."""
    f, g, p = obj(theta)
    stalled = torch.zeros(theta.shape[0], dtype=torch.bool, device=theta.device)
    one = torch.ones_like(f)
    shape = theta.shape
    for _ in range(max_iter):
        active = _converging(g, tol, stalled)
        if not bool(active.any()):
            break
        h = obj.hessian(p)
        chol, info = torch.linalg.cholesky_ex(h)
        step = -torch.cholesky_solve(g.flatten(1)[..., None], chol)[..., 0].view(shape)
        step = torch.where((info == 0)[:, None, None], step, -g)
        theta, f, g, p, moved = _line_search(obj, theta, f, g, p, step, active, one)
        stalled = stalled | (active & ~moved)
    return theta


def _lbfgs(obj: _Objective, theta: torch.Tensor, tol: float, max_iter: int,
           memory: int = 10) -> torch.Tensor:
    """L-BFGS (two-loop recursion, per-penalty curvature pairs) for problems too large
    for Newton's Hessian."""
    f, g, p = obj(theta)
    b = theta.shape[0]
    stalled = torch.zeros(b, dtype=torch.bool, device=theta.device)
    pairs: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    gamma = torch.ones_like(f)
    for _ in range(max_iter):
        active = _converging(g, tol, stalled)
        if not bool(active.any()):
            break
        q = g.clone()
        alphas = []
        for s, y, rho in reversed(pairs):
            a = rho * (s * q).sum((1, 2))
            q -= a[:, None, None] * y
            alphas.append(a)
        q *= gamma[:, None, None]
        for (s, y, rho), a in zip(pairs, reversed(alphas), strict=True):
            q += (a - rho * (y * q).sum((1, 2)))[:, None, None] * s
        t0 = (torch.ones_like(f) if pairs
              else 1.0 / g.flatten(1).norm(dim=1).clamp_min(1e-30))
        new, f_new, g_new, p, moved = _line_search(obj, theta, f, g, p, -q, active, t0)
        s, y = new - theta, g_new - g
        sy, yy = (s * y).sum((1, 2)), (y * y).sum((1, 2))
        good = moved & (sy > 1e-12 * yy.sqrt() * s.flatten(1).norm(dim=1))
        pairs.append((s, y, torch.where(good, 1.0 / sy.clamp_min(1e-300), 0.0)))
        pairs = pairs[-memory:]
        gamma = torch.where(good, sy / yy.clamp_min(1e-300), gamma)
        theta, f, g = new, f_new, g_new
        stalled = stalled | (active & ~moved)
    return theta


def fit_logistic(x: torch.Tensor, y: torch.Tensor, n_classes: int, cs: torch.Tensor,
                 sample_weight: torch.Tensor | None = None, *, tol: float = 1e-8,
                 max_iter: int | None = None, solver: str = "auto"
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """L2 logistic regressions of ``y`` (n,) in ``range(n_classes)`` (every class present)
    on ``x`` (n, d), one per inverse penalty in ``cs`` (B,), solved together on ``x``'s
    device in its dtype, to a gradient max-norm of ``tol`` on scikit-learn's scaled
    objective (:class:`_Objective`). Returns ``coef`` (B, k, d) and ``intercept`` (B, k),
    scikit-learn's shapes (k = 1 for two classes, else ``n_classes``; multinomial
    intercepts may differ from its by one constant per penalty, which no prediction sees).
    ``solver``: ``newton`` | ``lbfgs`` | ``auto`` (see ``NEWTON_MAX_PARAMS``)."""
    if solver not in ("auto", "newton", "lbfgs"):
        raise ValueError(f"fit_logistic: solver={solver!r}; auto, newton or lbfgs")
    sw = x.new_ones(len(x)) if sample_weight is None else sample_weight.to(x)
    obj = _Objective(x, y, n_classes, cs.to(x), sw)
    theta = x.new_zeros(len(cs), obj.k, x.shape[1] + 1)
    newton = solver == "newton" or (solver == "auto" and obj.k == 1
                                    and theta[0].numel() <= NEWTON_MAX_PARAMS)
    if newton:
        theta = _newton(obj, theta, tol, max_iter or 100)
    else:
        theta = _lbfgs(obj, theta, tol, max_iter or 3000)
    return theta[..., :-1], theta[..., -1]


class TorchLinearProbe:
    """The probe solved by :func:`fit_logistic` on the features' device: the same draws
    of ``C``, the same ``class_weight="balanced"`` option, the same selection on
    validation balanced accuracy as :class:`LinearProbe`, at the optimum of each fit.

    Float64 wherever it runs: the problem is tiny (a few hundred rows, ≤ 513 columns in
    a study), so its time is kernel launches and host reads, not arithmetic — float64
    costs nothing measurable on a GPU either — and float32 could neither reach the
    tolerance nor factor the Hessians of weak penalties (condition numbers up to ~1e6)
    without losing the digits that decide borderline validation images."""

    solver = "torch"

    def __init__(self, num_classes: int, n_trials: int = 10, balanced: bool = False,
                 tol: float = 1e-8, max_iter: int | None = None,
                 dtype: torch.dtype = torch.float64) -> None:
        self.num_classes = num_classes
        self.dtype = dtype  # float32 only to measure what it would change (bench)
        self.n_trials = n_trials
        self.balanced = balanced
        self.tol = tol
        self.max_iter = max_iter
        self.C: float | None = None
        self.val_balanced_accuracy = float("nan")
        self.classes: np.ndarray | None = None
        self.coef: torch.Tensor | None = None  # (k, d) on standardised features
        self.intercept: torch.Tensor | None = None
        self.mean: torch.Tensor | None = None
        self.std: torch.Tensor | None = None

    def _scale(self, f: Any) -> torch.Tensor:
        assert self.mean is not None and self.std is not None, "fit the probe first"
        return (torch.as_tensor(f).to(self.mean) - self.mean) / self.std

    def fit(self, f_lab: Any, y_lab: np.ndarray, f_val: Any, y_val: np.ndarray,
            rng: np.random.Generator) -> TorchLinearProbe:
        """``f_*``: features as tensors (on any device) or arrays; labels on the host."""
        x = torch.as_tensor(f_lab).to(self.dtype)
        self.mean = x.mean(0)
        self.std = x.std(0, unbiased=False) + 1e-6
        y_lab = np.asarray(y_lab)
        classes, y_enc = np.unique(y_lab, return_inverse=True)
        _two_classes(classes)
        cs = draw_penalties(rng, self.n_trials)
        sw = None
        if self.balanced:  # sklearn's compute_class_weight("balanced"): n / (k · n_c)
            w = len(y_lab) / (len(classes) * np.bincount(y_enc))
            sw = torch.as_tensor(w[y_enc], dtype=self.dtype, device=x.device)
        coef, icpt = fit_logistic(self._scale(x), torch.as_tensor(y_enc, device=x.device),
                                  len(classes), torch.as_tensor(cs, device=x.device),
                                  sw, tol=self.tol, max_iter=self.max_iter)
        z = torch.matmul(self._scale(f_val), coef.transpose(1, 2)) + icpt[:, None, :]
        pred = (z[..., 0] > 0).long() if len(classes) == 2 else z.argmax(-1)
        preds = classes[pred.cpu().numpy()]  # the one host read of the fit
        scores = [balanced_accuracy(y_val, p) for p in preds]
        i = _pick(scores)
        self.classes, self.C, self.val_balanced_accuracy = classes, float(cs[i]), scores[i]
        self.coef, self.intercept = coef[i], icpt[i]
        return self

    def proba(self, f: Any) -> torch.Tensor:
        """Probabilities over *all* classes (N, num_classes), float64, on the probe's
        device (no host read)."""
        assert self.coef is not None and self.intercept is not None and \
            self.classes is not None, "fit the probe first"
        z = self._scale(f) @ self.coef.T + self.intercept
        if len(self.classes) == 2:
            p1 = torch.sigmoid(z[:, 0])
            p = torch.stack([1.0 - p1, p1], 1)
        else:
            p = torch.softmax(z, 1)
        out = z.new_zeros(len(z), self.num_classes)
        out[:, torch.as_tensor(self.classes, device=z.device)] = p
        return out

    def predict_proba(self, f: Any) -> np.ndarray:
        return self.proba(f).cpu().numpy()

    def to_linear(self) -> nn.Linear:
        """An ``nn.Linear`` on raw features whose softmax equals ``predict_proba``, on the
        probe's device."""
        assert self.coef is not None and self.intercept is not None and \
            self.mean is not None and self.std is not None and self.classes is not None
        return _linear(self.coef, self.intercept, self.classes, self.num_classes, self.mean,
                       self.std)


Probe = LinearProbe | TorchLinearProbe


def make_probe(solver: str, num_classes: int, balanced: bool = False) -> Probe:
    """The per-epoch probe of ``solver`` (``PROBE_SOLVERS``)."""
    if solver == "torch":
        return TorchLinearProbe(num_classes, balanced=balanced)
    if solver == "sklearn":
        return LinearProbe(num_classes, balanced=balanced)
    raise ValueError(f"probe_solver={solver!r}: valid are {', '.join(PROBE_SOLVERS)}")
