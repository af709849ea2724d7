"""Issue 12, active learning: the AUC window (item 11), the oracle's candidate pool (item 13),
CDALBench's synthetic generators and fitting details (item 15), and the AL-loop gaps the
constant-accuracy fixture left open (the strategy seed, which seed orders mini-batches)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from scarcelab.active.base import QueryState
from scarcelab.active.classifier import ALNet, FitConfig, _optimizer, fit
from scarcelab.active.datasets import ALData, dataset_config, load_al_dataset
from scarcelab.active.loop import make_strategy, run_repetition
from scarcelab.active.strategies.margin import margin_scores
from scarcelab.active.strategies.oracle import GreedyOracle

# A setting whose accuracy moves from query to query (the old fixture's stayed at 0.5).
MOVING = {"budget": 8, "max_epochs": 20, "lr": 0.02, "batch_size": 3, "first_fit_epochs": 0,
          "patience": 2}


def _rep(strategy: str = "random", k: int = 0, s_o: int = 0, s_d: int = 0, s_t: int = 0,
         q: int = 1, data_seed: int | None = None, **over: object):  # type: ignore[no-untyped-def]
    cfg = dataset_config("diverging_sine").replace(**{**MOVING, **over})
    rng_d = np.random.default_rng(s_d + k if data_seed is None else data_seed)
    data = load_al_dataset("diverging_sine", None, rng_d)
    return run_repetition(data, cfg, make_strategy(strategy), q, k, s_o, s_d, s_t,
                          data_rng=rng_d)


# -- item 11: the AUC window ---------------------------------------------------------------

def test_auc_includes_the_seed_set_model_and_excludes_the_last_one() -> None:
    r = _rep("margin", q=2)
    accs = r.accuracies
    assert len(set(accs)) > 2, "the curve must move for this test to mean anything"
    assert r.sizes == [2, 4, 6, 8, 10]
    # CDALBench Alg. 1: one accuracy per query, recorded before it: seed set .. last-but-one
    assert r.auc == pytest.approx(np.mean(accs[:-1]))
    assert r.auc != pytest.approx(np.mean(accs[1:]))
    assert r.auc != pytest.approx(np.mean(accs))


# -- AL loop gaps: the strategy seed and the mini-batch seed ---------------------------------

def test_strategy_seed_is_the_same_in_every_repetition() -> None:
    """Repetition 1 of seeds (0, 0) and repetition 0 of seeds (1, 1) share s_D and s_θ; with
    one fixed s_Ω they must query the same points (a per-repetition s_Ω + k would not)."""
    via_k = _rep("random", k=1, s_o=7)
    via_seeds = _rep("random", k=0, s_o=7, s_d=1, s_t=1)
    assert via_k.labeled == via_seeds.labeled
    assert via_k.accuracies == via_seeds.accuracies
    assert len(set(via_k.accuracies)) > 1
    other = _rep("random", k=1, s_o=8)
    assert other.labeled[:2] == via_k.labeled[:2] and other.labeled != via_k.labeled


def test_mini_batch_order_comes_from_the_data_seed() -> None:
    """Same data draw and split (``data_rng``), same s_θ, another s_D: only the batch order
    changes, and with it the curve; another s_θ with no dropout changes the initial
    weights only, so the split and the seed set stay."""
    a = _rep("random", data_seed=3, s_d=0)
    b = _rep("random", data_seed=3, s_d=10)
    assert a.split_hash == b.split_hash and a.labeled == b.labeled  # same data, same picks
    assert a.accuracies != b.accuracies  # ... trained in another order


def test_fit_orders_batches_with_data_gen_and_ignores_model_gen_without_dropout() -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 3, generator=g), torch.randint(0, 2, (40,), generator=g)
    cfg = FitConfig("adam", 0.05, 0.0, batch_size=8, max_epochs=3, patience=5)

    def run(d: int, m: int) -> torch.Tensor:
        net = ALNet(3, 2, (4,))
        net.seeded_init(torch.Generator().manual_seed(1))
        fit(net, x, y, x, y, cfg, torch.Generator().manual_seed(d),
            torch.Generator().manual_seed(m))
        return net.head.weight.detach().clone()

    assert torch.equal(run(0, 0), run(0, 5))
    assert not torch.equal(run(0, 0), run(5, 0))


# -- item 13: the oracle sees the whole unlabeled pool ----------------------------------------

def _big_pool(n: int = 7000) -> ALData:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 2)).astype(np.float32)
    y = (x[:, 0] + 0.3 * rng.normal(size=n) > 0).astype(np.int64)
    return ALData("big", x, y, x[:200], y[:200], 2, "synthetic:test")


def test_oracle_candidates_and_fallback_cover_the_whole_unlabeled_pool() -> None:
    seen: list[int] = []

    class Spy(GreedyOracle):
        def select(self, state, q, rng):  # type: ignore[no-untyped-def]
            seen.append(len(state.candidates))
            return super().select(state, q, rng)

    data = _big_pool()
    cfg = dataset_config("honeypot").replace(budget=1, max_epochs=1)
    r = run_repetition(data, cfg, Spy(tau=2), 1, 0, 0, 0, 0)
    n_pool = len(data.y_train) - int(round(0.2 * len(data.y_train)))
    assert seen == [n_pool - 2] and n_pool - 2 > 5000
    assert len(r.labeled) == 3


class _Model:
    def __init__(self, p: np.ndarray) -> None:
        self.p = p

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        return self.p[x[:, 0].astype(int)]


def test_oracle_margin_fallback_picks_the_pool_wide_smallest_margin() -> None:
    rng = np.random.default_rng(1)
    n = 6000
    p1 = rng.uniform(0.0, 1.0, n)
    p = np.column_stack([1 - p1, p1])
    x = np.arange(n, dtype=np.float32)[:, None]
    state = QueryState(x=x, labeled=np.empty(0, np.int64), y_labeled=np.empty(0, np.int64),
                       candidates=np.arange(n), model=_Model(p),  # type: ignore[arg-type]
                       num_classes=2, oracle_score=lambda e: 0.0,
                       oracle_scores=lambda sets: [0.0] * len(sets), current_accuracy=0.9)
    picked = GreedyOracle(tau=3).query(state, 2, np.random.default_rng(0))
    order = np.argsort(margin_scores(p), kind="stable")
    assert picked.tolist() == order[:2].tolist()
    assert GreedyOracle.max_candidates is None


# -- item 15: CDALBench's synthetic layout and fitting details ------------------------------

def test_synthetic_sets_are_one_draw_split_80_20() -> None:
    d = load_al_dataset("diverging_sine", None, np.random.default_rng(0))
    assert len(d.y_train) == 1600 and len(d.y_test) == 400  # 2 x 1000 points, 20 % test
    h = load_al_dataset("honeypot", None, np.random.default_rng(0))
    assert len(h.y_train) == 480 and len(h.y_test) == 120  # 4 x 150 points, 20 % test
    # the x coordinate is CDALBench's even grid: 1000 distinct values shared by both classes
    raw_x = np.concatenate([d.x_train[:, 0], d.x_test[:, 0]])
    assert len(np.unique(np.round(raw_x, 5))) == 1000


def test_fit_without_restore_keeps_the_last_epoch_and_drop_last_skips_the_tail() -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(20, 3, generator=g), torch.randint(0, 2, (20,), generator=g)
    xv, yv = torch.randn(30, 3, generator=g), torch.randint(0, 2, (30,), generator=g)

    def net() -> ALNet:
        n = ALNet(3, 2, (4,))
        n.seeded_init(torch.Generator().manual_seed(2))
        return n

    base = FitConfig("adam", 0.5, 0.0, batch_size=8, max_epochs=30, patience=1)
    keep, last = net(), net()
    e1 = fit(keep, x, y, xv, yv, base, torch.Generator().manual_seed(0), g)
    e2 = fit(last, x, y, xv, yv, FitConfig(**{**base.__dict__, "restore_best": False}),
             torch.Generator().manual_seed(0), g)
    assert e1 == e2 >= 2  # the same epochs run; patience 1 stops at the first non-improvement
    with torch.no_grad():
        lk = float(torch.nn.functional.cross_entropy(keep(xv), yv))
        ll = float(torch.nn.functional.cross_entropy(last(xv), yv))
    assert ll > lk  # the last epoch was the worse one, and it was kept
    # drop_last: 20 samples in batches of 8 -> 2 steps per epoch instead of 3
    # (counted as optimiser steps: the fast path of scarcelab/active/fastfit.py runs no
    # module hooks)
    for drop, want in ((True, 2), (False, 3)):
        a = net()
        cfg = FitConfig("adam", 0.0, 0.0, batch_size=8, max_epochs=1, drop_last=drop)
        opt = _optimizer(cfg, list(a.parameters()))
        fit(a, x, y, xv, yv, cfg, torch.Generator(), g, opt)
        assert {float(s["step"]) for s in opt.state.values()} == {want}


def test_kept_optimizer_state_carries_across_fits() -> None:
    r_keep = _rep("random", keep_optimizer=True, restore_best=False)
    r_fresh = _rep("random", keep_optimizer=False, restore_best=False)
    assert r_keep.labeled == r_fresh.labeled and r_keep.accuracies[0] == r_fresh.accuracies[0]
    assert r_keep.accuracies != r_fresh.accuracies


def test_cdalbench_fitting_oracle_runs_sequential_candidates() -> None:
    r = _rep("oracle", keep_optimizer=True, restore_best=False, drop_last=True,
             first_fit_epochs=3, budget=3)
    assert len(r.labeled) == 5


def test_fitting_switches_must_be_booleans() -> None:
    from scarcelab.errors import ConfigError

    with pytest.raises(ConfigError, match="restore_best must be true or false"):
        dataset_config("splice").replace(restore_best="no")
    assert dataset_config("splice").replace(drop_last=1).drop_last == 1


# -- issue 23: CDALBench's USPS budget, one fit per new label, the test-set stopping flag -----

def test_usps_budget_is_cdalbench_configs_900() -> None:
    """Their configs/usps.yaml: ``budget: 900``; scarcelab's 400 put USPS ~0.06 under Table 8
    (docs/active.md, issue 23)."""
    assert dataset_config("usps").budget == 900


def _fit_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Records the labeled-set size of every classifier fit the loop makes."""
    import scarcelab.active.loop as loop_mod

    sizes: list[int] = []
    real = loop_mod.fit

    def counting(net, x, *a, **k):  # type: ignore[no-untyped-def]
        sizes.append(int(x.shape[0]))
        return real(net, x, *a, **k)

    monkeypatch.setattr(loop_mod, "fit", counting)
    return sizes


def test_cdalbench_sets_fit_once_per_new_label(monkeypatch: pytest.MonkeyPatch) -> None:
    """CDALBench's ``ALGame.step`` (finetuning) calls ``fit_classifier`` once per added
    sample: a query of q = 3 is three fits on 1, 2, 3 more labels. The old loop fitted once
    per query (seed fit, then sizes 5 and 8 here)."""
    sizes = _fit_sizes(monkeypatch)
    r = _rep("random", q=3, budget=6, fit_per_label=True)
    assert sizes == [2, 3, 4, 5, 6, 7, 8]
    assert r.sizes == [2, 5, 8]  # the curve still records one accuracy per query
    sizes.clear()
    _rep("random", q=3, budget=6, fit_per_label=False)
    assert sizes == [2, 5, 8]
    # their finetuning sets (configs/splice.yaml: classifier_fitting_mode: finetuning) fit
    # per label; the synthetic sets are `from_scratch` there, one fit after the q samples
    for name in ("splice", "dna", "usps"):
        assert dataset_config(name).fit_per_label is True, name
    for name in ("honeypot", "diverging_sine"):
        assert dataset_config(name).fit_per_label is False, name
    # a set fitted from scratch here keeps one fit per query whatever the switch says
    sizes.clear()
    _rep("random", q=3, budget=6, fitting="scratch", fit_per_label=True)
    assert sizes == [2, 5, 8]


def test_test_set_stopping_watches_the_test_loss_and_is_tagged(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import scarcelab.active.loop as loop_mod
    from scarcelab.active.loop import ALRunConfig, run_al
    from scarcelab.errors import ConfigError
    from scarcelab.tracker import InMemoryTracker

    stop_sets: list[int] = []
    real = loop_mod.fit

    def spy(net, x, y, x_val, *a, **k):  # type: ignore[no-untyped-def]
        stop_sets.append(int(x_val.shape[0]))
        return real(net, x, y, x_val, *a, **k)

    monkeypatch.setattr(loop_mod, "fit", spy)
    honest = _rep("random", budget=2)
    assert set(stop_sets) == {320}  # 20 % of the 1,600 training points
    stop_sets.clear()
    leaky = _rep("random", budget=2, stop_on="test", val_fraction=0.0)
    assert set(stop_sets) == {400}  # the 400 test points
    # no validation split: the whole training split is the pool, so the draw differs
    assert honest.split_hash != leaky.split_hash
    with pytest.raises(ConfigError, match="val_fraction=0"):
        _rep("random", budget=2, val_fraction=0.0)
    with pytest.raises(ConfigError, match="stop_on must be"):
        dataset_config("splice").replace(stop_on="train")
    tr = InMemoryTracker()
    run_al(ALRunConfig("random", "honeypot", overrides={**MOVING, "budget": 2,
                                                         "stop_on": "test"}), tr)
    assert "test-set early stopping" in tr.study.tags["scarcelab.leak"]  # type: ignore[union-attr]
    assert all("scarcelab.leak" in t.tags for t in tr.trials)
    tr = InMemoryTracker()
    run_al(ALRunConfig("random", "honeypot", overrides={**MOVING, "budget": 2}), tr)
    assert "scarcelab.leak" not in tr.study.tags  # type: ignore[union-attr]


# -- issue 41: a collapsed classifier is counted, not hidden in the AUC ----------------------

def test_collapsed_counts_a_single_class_network_and_nothing_else() -> None:
    """``_Learner.collapsed`` by hand: a head with zero weights and a bias favouring class 0
    predicts class 0 everywhere (collapsed); the same net with a head that reads its input
    does not; a labeled set of one class never counts (one class is all it could learn)."""
    from scarcelab.active.loop import _Learner, _on_device, _split

    cfg = dataset_config("diverging_sine").replace(**MOVING)
    rng = np.random.default_rng(0)
    data = load_al_dataset("diverging_sine", None, rng)
    val, _, seed = _split(data, cfg, rng)
    dev = torch.device("cpu")
    lr_ = _Learner(data, cfg, dev, _on_device(data, cfg, val, dev), torch.Generator(),
                   torch.Generator(), batched_oracle=False)
    two = seed  # one sample per class
    assert len(np.unique(data.y_train[two])) == 2
    with torch.no_grad():
        lr_.net.head.weight.zero_()
        lr_.net.head.bias.copy_(torch.tensor([1.0, 0.0]))
    assert lr_.collapsed(two)
    one = two[data.y_train[two] == data.y_train[two][0]]
    assert not lr_.collapsed(one)
    with torch.no_grad():  # class 0 where one varying embedding unit is above its median
        e = lr_.net.embed(lr_.arrays.x_val)
        j = int(e.std(0).argmax())
        assert float(e[:, j].std()) > 0
        lr_.net.head.weight.zero_()
        lr_.net.head.weight[0, j] = 1.0
        lr_.net.head.bias.copy_(torch.tensor([-float(e[:, j].median()), 0.0]))
    assert not lr_.collapsed(two)


def test_a_high_learning_rate_collapse_is_counted_and_logged() -> None:
    """NAdam at lr 30 with its state carried across fits kills the ReLUs of the [24, 12]
    MLP; the repetition says so (``collapsed_fits``, logged as ``al/collapsed_fits``) while
    a sane learning rate reports none. Counting reads no RNG: the curve is the same."""
    from scarcelab.active.loop import _repetition_rows

    bad = _rep("random", lr=30.0, keep_optimizer=True, restore_best=False)
    good = _rep("random")
    assert bad.collapsed_fits > 0 and good.collapsed_fits == 0
    assert bad.collapsed_fits <= len(bad.accuracies)
    summary = _repetition_rows(bad)[-1][0]
    assert summary["al/collapsed_fits"] == float(bad.collapsed_fits)


def test_the_sweep_summary_says_when_fits_collapsed() -> None:
    from scarcelab.active.loop import ALResult, ALRunConfig, RepetitionResult, sweep_summary

    def rep(k: int, auc: float, c: int) -> RepetitionResult:
        return RepetitionResult(k, {}, [2, 3], [auc, auc], [0.1], auc, "h", [], c)

    rc = ALRunConfig("margin", "splice")
    assert sweep_summary(ALResult(rc, [rep(0, 0.7, 0), rep(1, 0.8, 0)], [])) == (
        "margin on splice q=1: AUC 0.7500 ± 0.0707 over 2 repetitions")
    assert sweep_summary(ALResult(rc, [rep(0, 0.5, 280), rep(1, 0.8, 0), rep(2, 0.7, 3)],
                                  [])).endswith(
        "; 2 of 3 repetitions had fits that left a one-class classifier (283 fits, "
        "al/collapsed_fits)")
