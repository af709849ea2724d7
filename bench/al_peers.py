"""scarcelab's active learning side by side with scikit-activeml (issue 28, item 2).

Two parts, each system in its own fresh process, in alternating rounds (ours, theirs, then
theirs, ours, ...) so that a load change on the shared machine hits both alike; every
figure is the median over rounds, every ratio the median of the per-round ratios (paired),
as wall-clock time and as the worker's CPU time (``time.process_time``; on a loaded
machine the wall clock mostly measures the neighbours).

**Query time** (``--part query``). The same pool, the same model outputs and embeddings
for both: a fixture of ``pool`` unlabeled + ``--labeled`` labeled points (a 10-class
Gaussian mixture in ``dim`` dimensions as the embeddings, softmax probabilities of a linear
head on them, five MC-dropout passes of that head with rate 0.2), written once to ``.npy``
files. The "model" on both sides is a lookup into those arrays (a contiguous block of rows
comes back as a view, so neither side pays for producing outputs; a real model's forward
pass costs both the same). Timed: one ``query`` call of

==================  ====================================  ==================================
strategy            scarcelab                             scikit-activeml 1.0.1
==================  ====================================  ==================================
margin              ``margin``                            ``UncertaintySampling("margin_sampling")``
entropy             ``entropy``                           ``UncertaintySampling("entropy")``
least-confident     ``least_confident``                   ``UncertaintySampling("least_confident")``
BALD                ``bald`` (5 passes)                   ``GreedyBALD`` (the same 5 passes)
BADGE               ``badge``                             ``Badge``
core-set            ``coreset``                           ``CoreSet``
TypiClust           ``typiclust``                         ``TypiClust``, set to scarcelab's
                                                          mathematics: k = 20 neighbours,
                                                          ``KMeans(n_init=1, max_iter=100)``
                                                          with the same seed, float64 input
==================  ====================================  ==================================

on the whole pool (scarcelab's ``max_candidates=None``: no 5,000-point subsample), after
one untimed warm-up query per strategy and process; a query is called up to ``--repeat``
times while its calls' CPU time stays under ``--repeat-under-s`` and timed as the median
(a 1 ms call is otherwise at the mercy of the neighbours), and every call must return the
same picks. TypiClust runs on the 10k pools only (``--typiclust-max-pool``): its cost is
sklearn's ``KMeans``, the same call with the same arguments on both sides. The picks
are compared: where the mathematics is the same they must be the same points in the same
order (BADGE's picks after the first are k-means++ draws from each library's own RNG, so
only its first, deterministic pick is compared).

**A whole AL repetition** (``--part rep``) on splice with the settings ``scarcelab al``
uses (CDALBench's MLP: 60-24-24-12-2, NAdam, batch 43, the 50-epoch seed-set fit, then at
most 100 epochs stopping at the first epoch without a lower validation loss, one optimiser
carried across fits, one fit per new label; budget 400; docs/active.md). Ours:
``scarcelab.active.loop.run_one`` (what ``scarcelab al`` runs per repetition). Theirs:
scikit-activeml's pool loop (``UncertaintySampling(...).query(X, y, clf, fit_clf=False,
candidates=...)``, label, ``clf.fit(X, y)``, ``clf.score``) with :class:`TorchMLP`, an
sklearn-style estimator around the same torch MLP written here (skorch is not installed):
its own plain PyTorch training loop, the same initialisation draws, mini-batch order,
optimiser and stopping rule. Both load splice and split it with scarcelab's loader (so
the rows agree); everything after that is the system's own. Each worker first runs an
untimed warm-up repetition of budget 10 (imports, the optimiser's lazy ``torch._dynamo``
import, first-call allocations); the process's whole CPU time, imports included, is
reported beside the timed repetition. The two must give the same labeled sequence (as
rows: splice holds duplicate rows, whose equal scores scarcelab breaks by position and
scikit-activeml at random, so the indices may differ where the training data cannot) and
the same test-accuracy curve; the bench checks both. A third system (``ours_autograd``,
left out with ``--no-autograd``) is scarcelab with its fit's fast path off
(``SCARCELAB_AL_FASTFIT=0``: autograd and ``torch.optim``, scarcelab/active/fastfit.py), to
show what that path is worth; it must give the same curve and rows too.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/al_peers.py --rounds 3
    .venv/bin/python bench/al_peers.py --part query --pools 10000 --dims 64 --rounds 1

Ends with one ``key=value`` line (DESIGN §5).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
QUERY_STRATEGIES = ("margin", "entropy", "least_confident", "bald", "badge", "coreset",
                    "typiclust")
UNCERTAINTY = {"margin": "margin_sampling", "entropy": "entropy",
               "least_confident": "least_confident"}
CLASSES = 10
MC_PASSES, MC_RATE = 5, 0.2


# ----------------------------------------------------------------------------- fixtures
def make_fixture(folder: Path, pool: int, dim: int, labeled: int, seed: int = 0) -> Path:
    """Embeddings, probabilities and MC-dropout probabilities of one pool, as .npy files
    (loaded with ``np.load``: plain arrays, nothing unpickled)."""
    import torch

    out = folder / f"v2_pool{pool}_d{dim}_l{labeled}"
    if (out / "mc.npy").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    n = pool + labeled
    means = rng.normal(size=(CLASSES, dim)).astype(np.float32) * 1.5
    y = rng.integers(CLASSES, size=n)
    emb = (means[y] + rng.normal(size=(n, dim))).astype(np.float32)
    # logits ~ 4.5 for the true class, ~0 ± 0.4 for the others at any dim: confident but
    # not saturated (a 1/sqrt(d) head saturated float32 softmax at d = 512, and the
    # thousands of exact ties then were broken by position here, at random there)
    head = torch.from_numpy(means.T * (2.0 / dim)).float()
    e = torch.from_numpy(emb)
    proba = torch.softmax(e @ head, 1).numpy()
    g = torch.Generator().manual_seed(seed + 1)
    mc = np.stack([torch.softmax((e * (torch.rand(e.shape, generator=g) >= MC_RATE)
                                  / (1 - MC_RATE)) @ head, 1).numpy()
                   for _ in range(MC_PASSES)])
    np.save(out / "emb.npy", emb)
    np.save(out / "proba.npy", proba)
    np.save(out / "y.npy", y)
    np.save(out / "mc.npy", mc.astype(np.float32))
    return out


def _rows(idx: np.ndarray) -> slice | np.ndarray:
    """A contiguous ascending block of row indices as a slice (the lookup returns a view)."""
    idx = np.asarray(idx).reshape(-1).astype(np.int64, copy=False)
    if idx.size and idx[-1] - idx[0] + 1 == idx.size and bool((np.diff(idx) == 1).all()):
        return slice(int(idx[0]), int(idx[-1]) + 1)
    return idx


class Outputs:
    """The fixed model outputs of one fixture, looked up by row index."""

    def __init__(self, folder: Path | None = None, rows: int | None = None,
                 of: Outputs | None = None) -> None:
        if of is not None:  # the first ``rows`` rows of another fixture (warm-up)
            self.emb, self.proba = of.emb[:rows].copy(), of.proba[:rows].copy()
            self.mc, self.y = of.mc[:, :rows].copy(), of.y[:rows].copy()
            return
        assert folder is not None
        self.emb = np.load(folder / "emb.npy")
        self.proba = np.load(folder / "proba.npy")
        self.mc = np.load(folder / "mc.npy")
        self.y = np.load(folder / "y.npy")


# ----------------------------------------------------------------------- query workers
def _ours_query(out: Outputs, labeled: int) -> Any:
    from scarcelab.active.base import QueryState
    from scarcelab.active.loop import make_strategy

    class View:  # the ModelView contract, served from the fixture
        def predict_proba(self, x: np.ndarray) -> np.ndarray:
            return out.proba[_rows(x)]

        def embed(self, x: np.ndarray) -> np.ndarray:
            return out.emb[_rows(x)]

        def mc_predict_proba(self, x: np.ndarray, passes: int, generator: Any,
                             p: float | None = None) -> np.ndarray:
            return out.mc[:passes, _rows(x)]

    n = len(out.y)
    state = QueryState(x=np.arange(n, dtype=np.int64)[:, None], labeled=np.arange(labeled),
                       y_labeled=out.y[:labeled], candidates=np.arange(labeled, n),
                       model=View(), num_classes=CLASSES)
    strategies = {name: make_strategy(name, max_candidates=None) for name in QUERY_STRATEGIES}

    def query(name: str, q: int, seed: int) -> list[int]:
        return strategies[name].query(state, q, np.random.default_rng(seed)).tolist()
    return query


def _theirs_query(out: Outputs, labeled: int) -> Any:
    import skactiveml.pool as skpool
    from skactiveml.base import SkactivemlClassifier

    class Lookup(SkactivemlClassifier):
        """The fixture as a fitted scikit-activeml classifier; X holds row indices."""

        def fit(self, X: Any, y: Any, sample_weight: Any = None) -> Lookup:  # noqa: N803
            self.fitted_ = True
            return self

        def predict_proba(self, X: Any, return_embeddings: bool = False) -> Any:  # noqa: N803
            r = _rows(X[:, 0])
            return (out.proba[r], out.emb[r]) if return_embeddings else out.proba[r]

        def sample_proba(self, X: Any) -> np.ndarray:  # noqa: N803
            return out.mc[:, _rows(X[:, 0])]

    n = len(out.y)
    clf = Lookup(classes=np.arange(CLASSES)).fit(None, None)
    x_idx = np.arange(n, dtype=np.float64)[:, None]
    y = np.full(n, np.nan)
    y[:labeled] = out.y[:labeled]
    emb64 = out.emb.astype(np.float64)  # scarcelab's TypiClust clusters in float64

    def query(name: str, q: int, seed: int) -> list[int]:
        cand = None  # every unlabeled point, as scarcelab's max_candidates=None
        if name in UNCERTAINTY:
            qs = skpool.UncertaintySampling(method=UNCERTAINTY[name], random_state=seed)
            r = qs.query(x_idx, y, clf, fit_clf=False, candidates=cand, batch_size=q)
        elif name == "bald":
            qs = skpool.GreedyBALD(sample_predictions_method_name="sample_proba",
                                   random_state=seed)
            r = qs.query(x_idx, y, clf, fit_ensemble=False, candidates=cand, batch_size=q)
        elif name == "badge":
            qs = skpool.Badge(clf_embedding_flag_name="return_embeddings", random_state=seed)
            r = qs.query(x_idx, y, clf, fit_clf=False, candidates=cand, batch_size=q)
        elif name == "coreset":
            r = skpool.CoreSet(random_state=seed).query(out.emb, y, candidates=cand,
                                                        batch_size=q)
        elif name == "typiclust":
            # scarcelab draws the KMeans seed as the strategy RNG's first number
            km_seed = int(np.random.default_rng(seed).integers(2**31 - 1))
            qs = skpool.TypiClust(random_state=seed, k=20, cluster_algo_dict={
                "n_init": 1, "max_iter": 100, "random_state": km_seed})
            r = qs.query(emb64, y, candidates=cand, batch_size=q)
        else:
            raise ValueError(name)
        return [int(i) for i in r]
    return query


def query_worker(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(a.threads)
    rows = []
    make = _ours_query if a.system == "ours" else _theirs_query
    for folder in a.fixtures:
        out = Outputs(Path(folder))
        pool, dim = len(out.y) - a.labeled, out.emb.shape[1]
        warm = make(Outputs(rows=a.labeled + 2000, of=out), a.labeled)
        query = make(out, a.labeled)
        for name in a.strategies:
            warm(name, 2, 0)  # lazy imports, first-call allocations: untimed, 2,000 points
            if name == "typiclust" and pool > a.typiclust_max_pool:
                continue
            for q in a.qs:
                walls, cpus, picks = [], [], None
                # A query of a few ms is timed several times (median): one call is at the
                # mercy of the clock tick and the neighbours; slow ones run once.
                while len(cpus) < a.repeat and (not cpus or sum(cpus) < a.repeat_under_s):
                    t0, c0 = time.perf_counter(), time.process_time()
                    got = query(name, q, 0)
                    walls.append(time.perf_counter() - t0)
                    cpus.append(time.process_time() - c0)
                    if picks is not None and got != picks:
                        raise SystemExit(f"{a.system} {name}: the same query gave other picks")
                    picks = got
                wall, cpu = statistics.median(walls), statistics.median(cpus)
                rows.append({"pool": pool, "dim": dim, "strategy": name, "q": q,
                             "wall_s": wall, "cpu_s": cpu, "picks": picks,
                             "calls": len(cpus)})
                print(f"  [{a.system}] {name:15s} pool={pool} d={dim} q={q}: "
                      f"{wall:.4f} s wall, {cpu:.4f} s CPU (median of {len(cpus)})",
                      flush=True)
        del out, query, warm
    return {"rows": rows}


# ------------------------------------------------------------------ repetition workers
class TorchMLP:
    """An sklearn-style scikit-activeml classifier around a torch MLP, written the way a
    user without skorch would: ``fit(X, y)`` trains on the rows whose label is known
    (NaN = unlabeled), warm-starting from the previous fit with the same optimiser.

    Fitting as CDALBench's splice setting prescribes: the first fit a fixed
    ``first_epochs``; later fits at most ``max_epochs``, stopping once the validation loss
    has not improved for ``patience`` epochs, keeping the last epoch's weights; the
    incomplete last mini-batch dropped once the labeled set exceeds a batch. Weights start
    as PyTorch's default ``Linear`` init drawn from a generator seeded ``model_seed``
    (layer by layer, weight then bias), mini-batches are permutations from a generator
    seeded ``data_seed``. Newly labeled rows join the training set in the order they were
    labeled (one per fit in the one-fit-per-label loop; sorted within the first fit).
    """

    def __init__(self, n_features: int, hidden: tuple[int, ...], classes: np.ndarray,
                 x_val: np.ndarray, y_val: np.ndarray, lr: float, weight_decay: float,
                 batch_size: int, first_epochs: int, max_epochs: int, patience: int,
                 model_seed: int, data_seed: int) -> None:
        import torch
        from skactiveml.base import SkactivemlClassifier

        self.torch = torch
        self.base = SkactivemlClassifier
        dims = [n_features, *hidden, len(classes)]
        layers: list[Any] = []
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
            layers.append(torch.nn.Linear(a, b))
            if i < len(dims) - 2:
                layers.append(torch.nn.ReLU())
        self.net = torch.nn.Sequential(*layers)
        gen = torch.Generator().manual_seed(model_seed)
        with torch.no_grad():
            for lin in (m for m in self.net if isinstance(m, torch.nn.Linear)):
                bound = 1.0 / lin.in_features ** 0.5
                lin.weight.uniform_(-bound, bound, generator=gen)
                lin.bias.uniform_(-bound, bound, generator=gen)
        self.opt = torch.optim.NAdam(self.net.parameters(), lr=lr, weight_decay=weight_decay,
                                     foreach=True)
        self.data_gen = torch.Generator().manual_seed(data_seed)
        self.x_val = torch.as_tensor(x_val, dtype=torch.float32)
        self.y_val = torch.as_tensor(y_val, dtype=torch.long)
        self.batch_size, self.first_epochs = batch_size, first_epochs
        self.max_epochs, self.patience = max_epochs, patience
        self.classes = classes
        self.order: list[int] = []
        self.fits = 0

    def as_skactiveml(self) -> Any:
        """This estimator behind scikit-activeml's classifier interface."""
        owner = self

        class Wrapped(self.base):  # type: ignore[misc, name-defined]
            def fit(self, X: Any, y: Any, sample_weight: Any = None) -> Any:  # noqa: N803
                owner.fit(X, y)
                self.fitted_ = True
                return self

            def predict_proba(self, X: Any) -> np.ndarray:  # noqa: N803
                return owner.predict_proba(X)

        return Wrapped(classes=self.classes)

    def fit(self, X: np.ndarray, y: np.ndarray) -> None:  # noqa: N803
        torch = self.torch
        known = np.flatnonzero(~np.isnan(y))
        seen = set(self.order)
        self.order += [int(i) for i in known if int(i) not in seen]
        idx = np.asarray(self.order)
        x = torch.as_tensor(np.asarray(X[idx], dtype=np.float32))
        t = torch.as_tensor(y[idx].astype(np.int64))
        first = self.fits == 0
        epochs = self.first_epochs if first else self.max_epochs
        n, bs = len(idx), self.batch_size
        stop = n - n % bs if n > bs else n
        best, bad = float("inf"), 0
        for _ in range(epochs):
            self.net.train()
            perm = torch.randperm(n, generator=self.data_gen)
            for s in range(0, stop, bs):
                j = perm[s:s + bs]
                loss = torch.nn.functional.cross_entropy(self.net(x[j]), t[j])
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                self.opt.step()
            if first:
                continue  # the seed-set fit runs its epochs without early stopping
            self.net.eval()
            with torch.no_grad():
                val = float(torch.nn.functional.cross_entropy(self.net(self.x_val),
                                                              self.y_val))
            if val < best - 1e-12:
                best, bad = val, 0
            else:
                bad += 1
                if bad >= self.patience:
                    break
        self.net.eval()
        self.fits += 1

    def predict_proba(self, X: np.ndarray) -> np.ndarray:  # noqa: N803
        torch = self.torch
        x = torch.as_tensor(np.asarray(X, dtype=np.float32))
        with torch.no_grad():
            return torch.cat([torch.softmax(self.net(x[s:s + 1024]), 1)
                              for s in range(0, len(x), 1024)]).numpy()

    def score(self, X: np.ndarray, y: np.ndarray) -> float:  # noqa: N803
        """Accuracy from the logits' argmax, as a float32 mean (as scarcelab reports it)."""
        torch = self.torch
        x = torch.as_tensor(np.asarray(X, dtype=np.float32))
        with torch.no_grad():
            pred = torch.cat([self.net(x[s:s + 1024]).argmax(1)
                              for s in range(0, len(x), 1024)])
        return float((pred == torch.as_tensor(y)).float().mean())


def _splice(data_dir: str | None) -> tuple[Any, Any, np.ndarray, np.ndarray, np.ndarray]:
    from scarcelab.active.datasets import dataset_config, load_al_dataset
    from scarcelab.active.loop import _split

    cfg = dataset_config("splice")
    data = load_al_dataset("splice", data_dir, np.random.default_rng(0))
    val, pool, seed_idx = _split(data, cfg, np.random.default_rng(0))  # s_D + k = 0
    return data, cfg, val, pool, seed_idx


def _row_keys(x: np.ndarray, y: np.ndarray, idx: list[int]) -> list[str]:
    """What a labeled point *is* to the learner: its features and label. splice repeats
    rows; two copies score alike, and scarcelab breaks such ties by position while
    scikit-activeml breaks them at random (``rand_argmax``), so index sequences can differ
    where the training data cannot."""
    import hashlib

    return [hashlib.sha1(np.ascontiguousarray(x[i]).tobytes() + bytes([int(y[i])]))
            .hexdigest()[:12] for i in idx]


def _ours_rep(a: argparse.Namespace, budget: int) -> dict[str, Any]:
    from scarcelab.active.loop import ALRunConfig, load_for_sweep, run_one

    rc = ALRunConfig(strategy=a.rep_strategy, dataset="splice", query_size=a.q,
                     data_dir=a.data_dir, overrides={"budget": budget})
    data = load_for_sweep(rc)
    t0, c0 = time.perf_counter(), time.process_time()
    rep = run_one(rc, 0, data)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert data is not None
    return {"wall_s": wall, "cpu_s": cpu, "accuracies": rep.accuracies,
            "labeled": rep.labeled, "query_s": float(sum(rep.query_times)),
            "rows": _row_keys(data.x_train, data.y_train, rep.labeled)}


def _theirs_rep(a: argparse.Namespace, budget: int) -> dict[str, Any]:
    import skactiveml.pool as skpool

    if a.rep_strategy not in UNCERTAINTY:
        raise SystemExit(f"--rep-strategy {a.rep_strategy}: the peer loop is written for "
                         f"{sorted(UNCERTAINTY)}")
    data, cfg, val, pool, seed_idx = _splice(a.data_dir)
    x, y_true = data.x_train, data.y_train
    model = TorchMLP(x.shape[1], cfg.hidden, np.arange(data.num_classes), x[val],
                     y_true[val], cfg.lr, cfg.weight_decay, cfg.batch_size,
                     cfg.first_fit_epochs, cfg.max_epochs, cfg.patience, model_seed=0,
                     data_seed=0)
    clf = model.as_skactiveml()
    qs = skpool.UncertaintySampling(method=UNCERTAINTY[a.rep_strategy], random_state=0)
    in_pool = np.zeros(len(y_true), dtype=bool)
    in_pool[pool] = True
    t0, c0 = time.perf_counter(), time.process_time()
    y = np.full(len(y_true), np.nan)
    y[seed_idx] = y_true[seed_idx]
    clf.fit(x, y)
    accs = [model.score(data.x_test, data.y_test)]
    budget = min(budget, len(pool) - len(seed_idx))
    added, qtime = 0, 0.0
    while added < budget:
        q = min(a.q, budget - added)
        cand = np.flatnonzero(in_pool & np.isnan(y))
        tq = time.perf_counter()
        picked = qs.query(x, y, clf, fit_clf=False, candidates=cand, batch_size=q)
        qtime += time.perf_counter() - tq
        for i in picked:  # one fit per new label, as CDALBench's loop does
            y[i] = y_true[i]
            clf.fit(x, y)
        added += len(picked)
        accs.append(model.score(data.x_test, data.y_test))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"wall_s": wall, "cpu_s": cpu, "accuracies": accs, "labeled": model.order,
            "query_s": qtime, "rows": _row_keys(x, y_true, model.order)}


def rep_worker(a: argparse.Namespace) -> dict[str, Any]:
    """One untimed warm-up repetition (budget 10: imports, first-call allocations, the
    optimiser's lazy ``torch._dynamo`` import), then the timed one, on either side."""
    import torch

    torch.set_num_threads(a.threads)
    if a.system == "ours_autograd":  # scarcelab with its AL fit's fast path switched off
        os.environ["SCARCELAB_AL_FASTFIT"] = "0"
    run = _theirs_rep if a.system == "skactiveml" else _ours_rep
    c0 = time.process_time()
    run(a, 10)
    warm = time.process_time() - c0
    res = run(a, a.budget)
    res["warmup_cpu_s"] = warm
    return res


# ------------------------------------------------------------------------------ driver
def _spawn(args: list[str], threads: int) -> tuple[dict[str, Any], float]:
    """Run one worker; return its JSON and the CPU seconds of its whole process tree."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH",
                                                                              ""))
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[k] = str(threads)
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    proc = subprocess.Popen([sys.executable, __file__, "--worker", *args, "--json", out],
                            env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"worker {args[:4]} failed with exit code {proc.returncode}")
    res = json.loads(Path(out).read_text())
    Path(out).unlink()
    return res, usage.ru_utime + usage.ru_stime


#: The plain definitions (no fast kernels), for telling a tie apart from a difference.
PLAIN_SCORES = ("margin", "entropy", "least_confident", "bald")
_FIXTURES: dict[tuple[int, int], Path] = {}


def _plain_entropy(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-12, 1.0)
    return -(p * np.log(p)).sum(-1)


def scores_of(name: str, pool: int, dim: int) -> np.ndarray:
    """Every row's score (higher = picked first) from the fixture and the textbook formula:
    two pick lists whose scores agree as multisets differ only in how ties were broken."""
    out = Outputs(_FIXTURES[(pool, dim)])
    p = out.proba
    if name == "margin":
        srt = np.sort(p, axis=1)
        return -(srt[:, -1] - srt[:, -2])
    if name == "least_confident":
        return 1.0 - p.max(1)
    if name == "entropy":
        return _plain_entropy(p)
    return _plain_entropy(out.mc.mean(0)) - _plain_entropy(out.mc).mean(0)


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def run_query_part(a: argparse.Namespace, fixtures: list[Path]) -> dict[str, Any]:
    per: dict[tuple, dict[str, list]] = {}
    for r in range(a.rounds):
        order = ("ours", "skactiveml") if r % 2 == 0 else ("skactiveml", "ours")
        for system in order:
            print(f"round {r + 1}/{a.rounds}: {system} (load {os.getloadavg()[0]:.1f})",
                  flush=True)
            res, proc_cpu = _spawn(["query", "--system", system, "--fixtures",
                                    *map(str, fixtures), "--labeled", str(a.labeled),
                                    "--strategies", *a.strategies,
                                    "--qs", *map(str, a.qs), "--threads", str(a.threads),
                                    "--repeat", str(a.repeat),
                                    "--repeat-under-s", str(a.repeat_under_s),
                                    "--typiclust-max-pool", str(a.typiclust_max_pool)],
                                   a.threads)
            print(f"  {system} process: {proc_cpu:.1f} CPU-s in all", flush=True)
            for row in res["rows"]:
                key = (row["strategy"], row["pool"], row["dim"], row["q"])
                d = per.setdefault(key, {})
                for f in ("wall_s", "cpu_s", "picks"):
                    d.setdefault(f"{system}_{f}", []).append(row[f])
    table = []
    for (name, pool, dim, q), d in per.items():
        ow, oc, tw, tc = (d["ours_wall_s"], d["ours_cpu_s"], d["skactiveml_wall_s"],
                          d["skactiveml_cpu_s"])
        rw = [t / o for o, t in zip(ow, tw, strict=True)]
        rc = [t / o for o, t in zip(oc, tc, strict=True)]
        ours_p, theirs_p = d["ours_picks"], d["skactiveml_picks"]
        stable = all(p == ours_p[0] for p in ours_p) and all(p == theirs_p[0]
                                                             for p in theirs_p)
        if name == "badge":
            same = stable and ours_p[0][0] == theirs_p[0][0]
            compared = "first pick"
        else:
            same = stable and ours_p[0] == theirs_p[0]
            compared = "all picks, in order"
            if stable and not same and name in PLAIN_SCORES:
                sc = scores_of(name, pool, dim)
                if sorted(sc[ours_p[0]].tolist()) == sorted(sc[theirs_p[0]].tolist()):
                    same, compared = True, "picks' scores (tied scores, other points)"
        table.append({"strategy": name, "pool": pool, "dim": dim, "q": q,
                      "ours_wall_s": _median(ow), "ours_cpu_s": _median(oc),
                      "theirs_wall_s": _median(tw), "theirs_cpu_s": _median(tc),
                      "ratio_wall": _median(rw), "ratio_cpu": _median(rc),
                      "ratios_cpu": rc, "same": same, "compared": compared,
                      "ours_picks": ours_p[0][:10], "theirs_picks": theirs_p[0][:10]})
    print("\n| strategy | pool | d | q | ours wall / CPU (s) | skactiveml wall / CPU (s) | "
          "ratio wall | ratio CPU | same picks |")
    print("|---|---|---|---|---|---|---|---|---|")
    for t in table:
        print(f"| {t['strategy']} | {t['pool']} | {t['dim']} | {t['q']} | "
              f"{t['ours_wall_s']:.4f} / {t['ours_cpu_s']:.4f} | "
              f"{t['theirs_wall_s']:.4f} / {t['theirs_cpu_s']:.4f} | "
              f"{t['ratio_wall']:.1f}x | {t['ratio_cpu']:.1f}x | "
              f"{'yes' if t['same'] else 'NO'} ({t['compared']}) |")
    return {"table": table}


def run_rep_part(a: argparse.Namespace) -> dict[str, Any]:
    per: dict[int, dict[str, list]] = {}
    for r in range(a.rounds):
        for q in a.rep_qs:
            order = ["ours", "skactiveml"] if (r + q) % 2 == 0 else ["skactiveml", "ours"]
            if a.autograd:
                order.insert(r % 3, "ours_autograd")
            for system in order:
                print(f"round {r + 1}/{a.rounds} q={q}: {system} "
                      f"(load {os.getloadavg()[0]:.1f})", flush=True)
                args = ["rep", "--system", system, "--q", str(q), "--budget", str(a.budget),
                        "--rep-strategy", a.rep_strategy, "--threads", str(a.threads)]
                if a.data_dir:
                    args += ["--data-dir", a.data_dir]
                res, proc_cpu = _spawn(args, a.threads)
                print(f"  {system}: {res['wall_s']:.1f} s wall, {res['cpu_s']:.1f} s CPU "
                      f"(queries {res['query_s']:.2f} s; process {proc_cpu:.1f} CPU-s), "
                      f"final accuracy {res['accuracies'][-1]:.4f}", flush=True)
                d = per.setdefault(q, {})
                for f in ("wall_s", "cpu_s", "accuracies", "labeled", "query_s", "rows",
                          "warmup_cpu_s"):
                    d.setdefault(f"{system}_{f}", []).append(res[f])
                d.setdefault(f"{system}_proc_cpu_s", []).append(proc_cpu)
    rows = []
    for q, d in per.items():
        rw = [t / o for o, t in zip(d["ours_wall_s"], d["skactiveml_wall_s"], strict=True)]
        rc = [t / o for o, t in zip(d["ours_cpu_s"], d["skactiveml_cpu_s"], strict=True)]
        systems = [k[:-len("_wall_s")] for k in d if k.endswith("_wall_s")]
        same_acc = all(x == d["ours_accuracies"][0] for sy in systems
                       for x in d[f"{sy}_accuracies"])
        same_idx = all(x == d["ours_labeled"][0] for sy in systems
                       for x in d[f"{sy}_labeled"])
        same_lab = all(x == d["ours_rows"][0] for sy in systems for x in d[f"{sy}_rows"])
        # where each run's curve first leaves scarcelab's first round (None: nowhere)
        diverge = {f"{sys_}_{r + 1}": next((i for i, (u, v) in enumerate(zip(
            acc, d["ours_accuracies"][0], strict=False)) if u != v), None)
            for sys_ in systems
            for r, acc in enumerate(d[f"{sys_}_accuracies"])}
        rows.append({"q": q, "ours_wall_s": _median(d["ours_wall_s"]),
                     "ours_cpu_s": _median(d["ours_cpu_s"]),
                     "theirs_wall_s": _median(d["skactiveml_wall_s"]),
                     "theirs_cpu_s": _median(d["skactiveml_cpu_s"]),
                     "ours_query_s": _median(d["ours_query_s"]),
                     "theirs_query_s": _median(d["skactiveml_query_s"]),
                     "ratio_wall": _median(rw), "ratio_cpu": _median(rc),
                     "ours_proc_cpu_s": _median(d["ours_proc_cpu_s"]),
                     "theirs_proc_cpu_s": _median(d["skactiveml_proc_cpu_s"]),
                     "ratio_proc_cpu": _median([t / o for o, t in zip(
                         d["ours_proc_cpu_s"], d["skactiveml_proc_cpu_s"], strict=True)]),
                     "ratios_wall": rw, "ratios_cpu": rc, "same_accuracies": same_acc,
                     "same_labeled": same_lab, "same_indices": same_idx,
                     "first_divergence": diverge,
                     # the fit's fast path: scarcelab with it off / with it on (paired)
                     "ratio_fastfit_wall": (_median([g / o for o, g in zip(
                         d["ours_wall_s"], d["ours_autograd_wall_s"], strict=True)])
                         if "ours_autograd_wall_s" in d else None),
                     "autograd_wall_s": (_median(d["ours_autograd_wall_s"])
                                         if "ours_autograd_wall_s" in d else None),
                     "auc_ours": float(np.mean(d["ours_accuracies"][0][:-1])),
                     "auc_theirs": float(np.mean(d["skactiveml_accuracies"][0][:-1]))})
    print("\n| q | ours wall / CPU (s) | skactiveml wall / CPU (s) | queries ours / theirs (s) "
          "| ratio wall | ratio CPU | process CPU ours / theirs (s) | same labeled rows, "
          "same indices, same accuracies |")
    print("|---|---|---|---|---|---|---|---|")
    for t in rows:
        print(f"| {t['q']} | {t['ours_wall_s']:.1f} / {t['ours_cpu_s']:.1f} | "
              f"{t['theirs_wall_s']:.1f} / {t['theirs_cpu_s']:.1f} | "
              f"{t['ours_query_s']:.2f} / {t['theirs_query_s']:.2f} | "
              f"{t['ratio_wall']:.2f}x | {t['ratio_cpu']:.2f}x | "
              f"{t['ours_proc_cpu_s']:.1f} / {t['theirs_proc_cpu_s']:.1f} | "
              f"{'yes' if t['same_labeled'] else 'NO'}, "
              f"{'yes' if t['same_indices'] else 'no'}, "
              f"{'yes' if t['same_accuracies'] else 'NO'} |")
    for t in rows:
        if t["ratio_fastfit_wall"] is not None:
            print(f"q={t['q']}: scarcelab with the fit's fast path off (autograd + torch.optim,"
                  f" SCARCELAB_AL_FASTFIT=0): {t['autograd_wall_s']:.1f} s wall, "
                  f"{t['ratio_fastfit_wall']:.2f}x the fast path's")
    for t in rows:
        if not t["same_accuracies"]:
            print(f"q={t['q']}: first curve point differing from scarcelab's round 1, per "
                  f"system and round: {t['first_divergence']}")
    return {"rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", nargs="?", const="", default=None, help=argparse.SUPPRESS)
    p.add_argument("--part", choices=("query", "rep", "all"), default="all")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pools", type=int, nargs="+", default=[10_000, 50_000])
    p.add_argument("--dims", type=int, nargs="+", default=[64, 512])
    p.add_argument("--qs", type=int, nargs="+", default=[1, 10])
    p.add_argument("--labeled", type=int, default=100,
                   help="labeled points beside the pool (core-set's GEMM is N x |L| x d)")
    p.add_argument("--strategies", nargs="+", default=list(QUERY_STRATEGIES),
                   choices=QUERY_STRATEGIES)
    p.add_argument("--repeat", type=int, default=7,
                   help="calls per timed query (median), while their CPU sum is short")
    p.add_argument("--repeat-under-s", type=float, default=0.5,
                   help="stop repeating once the calls' CPU seconds reach this")
    p.add_argument("--typiclust-max-pool", type=int, default=10_000,
                   help="TypiClust only on pools up to this size (sklearn's KMeans, the "
                        "same call on both sides, is its whole cost: minutes at 50k x 512)")
    p.add_argument("--rep-qs", type=int, nargs="+", default=[1, 5])
    p.add_argument("--rep-strategy", default="margin")
    p.add_argument("--budget", type=int, default=400)
    p.add_argument("--no-autograd", dest="autograd", action="store_false",
                   help="leave out the third system of the repetition part: scarcelab with "
                        "its fit's fast path off (SCARCELAB_AL_FASTFIT=0)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--fixture-dir", default=None,
                   help="where the query fixtures go (default: a temporary folder)")
    p.add_argument("--out", default="", help="write every number as JSON here")
    # worker-only
    p.add_argument("--system", choices=("ours", "skactiveml", "ours_autograd"))
    p.add_argument("--fixtures", nargs="*", default=[])
    p.add_argument("--q", type=int, default=1)
    p.add_argument("--json", default="")
    a = p.parse_args()
    if a.worker is not None:
        res = query_worker(a) if a.worker == "query" else rep_worker(a)
        Path(a.json).write_text(json.dumps(res))
        return

    load0 = os.getloadavg()[0]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    result: dict[str, Any] = {"started": started, "args": vars(a)}
    summary: dict[str, Any] = {}
    tmp = None
    if a.part in ("query", "all"):
        if a.fixture_dir:
            fdir = Path(a.fixture_dir)
        else:
            tmp = tempfile.TemporaryDirectory(prefix="al_peers_")
            fdir = Path(tmp.name)
        fixtures = []
        for pool in a.pools:
            for dim in a.dims:
                _FIXTURES[(pool, dim)] = make_fixture(fdir, pool, dim, a.labeled)
                fixtures.append(_FIXTURES[(pool, dim)])
        result["query"] = run_query_part(a, fixtures)
        by: dict[str, list[float]] = {}
        for t in result["query"]["table"]:
            by.setdefault(t["strategy"], []).append(t["ratio_cpu"])
        for name, rs in by.items():
            summary[f"q_{name}_cpu_ratio_min"] = min(rs)
        summary["q_cpu_ratio_min"] = min(t["ratio_cpu"] for t in result["query"]["table"])
        summary["q_wall_ratio_min"] = min(t["ratio_wall"] for t in result["query"]["table"])
        summary["q_same_picks"] = all(t["same"] for t in result["query"]["table"])
    if a.part in ("rep", "all"):
        result["rep"] = run_rep_part(a)
        for t in result["rep"]["rows"]:
            summary[f"rep_q{t['q']}_wall_ratio"] = t["ratio_wall"]
            summary[f"rep_q{t['q']}_cpu_ratio"] = t["ratio_cpu"]
            summary[f"rep_q{t['q']}_process_cpu_ratio"] = t["ratio_proc_cpu"]
            summary[f"rep_q{t['q']}_ours_s"] = t["ours_wall_s"]
            summary[f"rep_q{t['q']}_identical"] = t["same_accuracies"] and t["same_labeled"]
            if t["ratio_fastfit_wall"] is not None:
                summary[f"rep_q{t['q']}_fastfit_ratio"] = t["ratio_fastfit_wall"]
    if tmp is not None:
        tmp.cleanup()
    summary["rounds"] = a.rounds
    summary["load"] = round((load0 + os.getloadavg()[0]) / 2, 1)
    result["summary"] = summary
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))
    print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                   for k, v in summary.items()))


if __name__ == "__main__":
    main()
