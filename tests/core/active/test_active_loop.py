"""The AL loop: seeds, reproducibility, curve bookkeeping, Alg. 2 fitting, synthetic data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from scarcelab.active.classifier import ALNet, FitConfig, fit
from scarcelab.active.datasets import (
    dataset_config,
    diverging_sine,
    honeypot,
    load_al_dataset,
)
from scarcelab.active.loop import ALRunConfig, make_strategy, run_al, run_repetition
from scarcelab.errors import ConfigError
from scarcelab.tracker import InMemoryTracker

TINY = {"budget": 6, "max_epochs": 5}


def _rep(strategy: str = "margin", k: int = 0, s_o: int = 0, s_d: int = 0, s_t: int = 0,
         q: int = 2, **over: object):  # type: ignore[no-untyped-def]
    cfg = dataset_config("honeypot").replace(**{**TINY, **over})
    rng_d = np.random.default_rng(s_d + k)
    data = load_al_dataset("honeypot", None, rng_d)
    return run_repetition(data, cfg, make_strategy(strategy), q, k, s_o, s_d, s_t,
                          data_rng=rng_d)


def test_honeypot_generator_layout() -> None:
    x, y = honeypot(np.random.default_rng(0))
    assert x.shape == (600, 2) and np.bincount(y).tolist() == [300, 300]
    # cluster order: class 1 at (0,0), class 1 at (4,3), class 0 at (0,6), class 0 at (4,3)
    means = x.reshape(4, 150, 2).mean(1)
    np.testing.assert_allclose(means, [[0, 0], [4, 3], [0, 6], [4, 3]], atol=0.25)
    np.testing.assert_allclose(x.reshape(4, 150, 2).std(1), 1.0, atol=0.15)


def test_diverging_sine_follows_its_curves() -> None:
    x, y = diverging_sine(np.random.default_rng(0))
    assert x[:, 0].min() >= 0 and x[:, 0].max() <= 10
    for lab, slope in ((0, 0.5), (1, -0.5)):
        t, v = x[y == lab, 0], x[y == lab, 1]
        resid = v - np.sin(2 * t) - slope * t
        assert abs(resid.mean()) < 0.05 and abs(resid.std() - 0.3) < 0.05


def test_synthetic_sets_are_regenerated_per_data_seed_and_minmax_scaled() -> None:
    a = load_al_dataset("honeypot", None, np.random.default_rng(0))
    b = load_al_dataset("honeypot", None, np.random.default_rng(1))
    c = load_al_dataset("honeypot", None, np.random.default_rng(0))
    assert not np.allclose(a.x_train, b.x_train)
    np.testing.assert_array_equal(a.x_train, c.x_train)
    assert a.x_train.min() == 0.0 and a.x_train.max() == 1.0
    assert len(a.x_test) == 120 and len(a.x_train) == 480  # one draw, 20 % held out


def test_repetition_is_reproducible_from_its_seeds_alone() -> None:
    torch.manual_seed(1)
    np.random.seed(1)
    a = _rep("badge")
    torch.manual_seed(2)
    np.random.seed(2)
    b = _rep("badge")
    assert a.accuracies == b.accuracies and a.split_hash == b.split_hash
    assert a.labeled == b.labeled and len(set(a.labeled)) == len(a.labeled) == 8


def test_repetition_k_uses_data_and_model_seed_plus_k() -> None:
    via_k = _rep("random", k=1, s_d=0, s_t=0)
    via_seeds = _rep("random", k=0, s_d=1, s_t=1)
    assert via_k.accuracies == via_seeds.accuracies
    assert via_k.split_hash == via_seeds.split_hash
    assert via_k.seeds == {"strategy": 0, "data": 1, "model": 1}


def test_each_seed_moves_only_its_own_part() -> None:
    base = _rep("random")
    other_data = _rep("random", s_d=5)
    assert other_data.split_hash != base.split_hash
    # the model seed changes the classifier, hence margin's picks, not the data
    m_base, m_other = _rep("margin"), _rep("margin", s_t=5)
    assert m_other.split_hash == m_base.split_hash
    assert m_other.labeled[:2] == m_base.labeled[:2]  # same seed set
    assert m_other.labeled != m_base.labeled
    other_strategy = _rep("random", s_o=5)
    assert other_strategy.split_hash == base.split_hash
    assert other_strategy.labeled[:2] == base.labeled[:2]
    assert other_strategy.labeled != base.labeled  # different queries


def test_curve_bookkeeping_and_auc() -> None:
    r = _rep("margin", q=4, budget=10)
    assert r.sizes == [2, 6, 10, 12]  # 1 seed per class, then q=4, 4, and the rest (2)
    assert len(r.query_times) == 3
    assert r.auc == pytest.approx(np.mean(r.accuracies[:-1]))  # Alg. 1: seed set .. last query


def test_scratch_fitting_restarts_from_the_initial_weights() -> None:
    a = _rep("margin", fitting="scratch")
    b = _rep("margin", fitting="finetune")
    assert a.labeled[:3] == b.labeled[:3]  # the first fit starts from the init either way
    assert a.labeled != b.labeled


def test_fit_runs_one_epoch_then_stops_after_patience() -> None:
    g = torch.Generator().manual_seed(0)
    net = ALNet(3, 2, (4,))
    net.seeded_init(g)
    x, y = torch.randn(20, 3, generator=g), torch.randint(0, 2, (20,), generator=g)
    # lr = 0: the validation loss never improves after the first epoch
    cfg = FitConfig("sgd", 0.0, 0.0, batch_size=8, max_epochs=50, patience=2)
    assert fit(net, x, y, x, y, cfg, torch.Generator(), torch.Generator()) == 3
    cfg = FitConfig("adam", 0.05, 0.0, batch_size=8, max_epochs=4, patience=2)
    assert fit(net, x, y, x, y, cfg, torch.Generator(), torch.Generator()) == 4


def test_fit_keeps_the_best_validation_weights() -> None:
    g = torch.Generator().manual_seed(0)
    net = ALNet(3, 2, (8,))
    net.seeded_init(g)
    x, y = torch.randn(40, 3, generator=g), torch.randint(0, 2, (40,), generator=g)
    xv, yv = torch.randn(40, 3, generator=g), torch.randint(0, 2, (40,), generator=g)
    cfg = FitConfig("adam", 0.3, 0.0, batch_size=8, max_epochs=30, patience=2)
    fit(net, x, y, xv, yv, cfg, torch.Generator().manual_seed(0), g)
    with torch.no_grad():
        final = float(torch.nn.functional.cross_entropy(net(xv), yv))
    net2 = ALNet(3, 2, (8,))
    net2.seeded_init(torch.Generator().manual_seed(0))
    # replay epoch by epoch: the kept weights match the minimum validation loss seen
    opt = torch.optim.Adam(net2.parameters(), lr=0.3, foreach=True)
    dg = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(30):
        perm = torch.randperm(40, generator=dg)
        net2.train()
        for s in range(0, 40, 8):
            i = perm[s:s + 8]
            loss = torch.nn.functional.cross_entropy(net2(x[i]), y[i])
            opt.zero_grad()
            loss.backward()
            opt.step()
        net2.eval()
        with torch.no_grad():
            losses.append(float(torch.nn.functional.cross_entropy(net2(xv), yv)))
    best_prefix = []
    for v in losses:  # stop rule: two epochs without improvement
        best_prefix.append(v)
        if len(best_prefix) > 2 and min(best_prefix[-2:]) >= min(best_prefix[:-2]):
            break
    assert final == pytest.approx(min(best_prefix), rel=1e-5)


def test_run_al_reports_one_trial_per_repetition() -> None:
    tr = InMemoryTracker()
    rc = ALRunConfig("margin", "honeypot", query_size=3, repetitions=2, seed_strategy=4,
                     seed_data=10, seed_model=20, overrides=TINY)
    res = run_al(rc, tr)
    assert tr.study is not None and tr.study.tags["scarcelab.role"] == "al_sweep"
    assert tr.study.status == "FINISHED" and len(tr.trials) == 2
    for k, t in enumerate(tr.trials):
        assert t.tags["scarcelab.role"] == "al" and t.tags["scarcelab.family"] == "active"
        assert t.tags["scarcelab.method"] == "margin"
        assert t.tags["scarcelab.query_size"] == "3"
        assert t.tags["scarcelab.repetition"] == str(k)
        assert t.tags["scarcelab.seed_data"] == str(10 + k)
        assert t.tags["scarcelab.seed_model"] == str(20 + k)
        assert t.tags["scarcelab.seed_strategy"] == "4"
        steps = [s for s, _ in t.history("al/test_accuracy")]
        assert steps == [2, 5, 8]
        assert t.last("al/auc") == pytest.approx(res.repetitions[k].auc)
        assert len(t.history("al/query_time_s")) == 2
    assert tr.study.last("al/auc_mean") == pytest.approx(res.aucs.mean())


def test_bad_config_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="valid"):
        dataset_config("honeypot").replace(budgett=3)
    with pytest.raises(ConfigError, match="fitting"):
        dataset_config("honeypot").replace(fitting="warm")
    with pytest.raises(ConfigError, match="unknown AL dataset"):
        run_al(ALRunConfig("margin", "nope"), InMemoryTracker())
    with pytest.raises(ConfigError, match="unknown strategy"):
        run_al(ALRunConfig("nope", "honeypot"), InMemoryTracker())


@pytest.mark.parametrize("name,shape,test_rows,classes", [
    ("splice", (1000, 60), 2079, 2), ("usps", (7291, 256), 2007, 10),
    ("sms", (3902, 384), 1672, 2)])
def test_real_al_datasets_load(name: str, shape: tuple[int, int], test_rows: int,
                               classes: int) -> None:
    from conftest import SHARED_DATA

    from scarcelab.errors import DataError

    try:
        d = load_al_dataset(name, SHARED_DATA, np.random.default_rng(0))
    except DataError as e:
        pytest.skip(f"real data for {name} not found under {SHARED_DATA}: {e}")
    assert d.x_train.shape == shape and len(d.x_test) == test_rows
    assert d.num_classes == classes and set(np.unique(d.y_train)) == set(range(classes))
    assert d.x_train.dtype == np.float32 and np.isfinite(d.x_train).all()
    if name == "usps":  # LibSVM's scaling of the 0..255 pixels
        assert d.x_train.min() == -1.0 and d.x_train.max() == 1.0


@pytest.mark.parametrize("hidden,seed,noise,n_val,cfg", [
    ((8, 4), 0, 0.5, 20, FitConfig("nadam", 0.05, 1e-4, batch_size=4, max_epochs=40,
                                   patience=2)),
    ((), 0, 0.5, 20, FitConfig("nadam", 0.05, 1e-4, batch_size=4, max_epochs=40, patience=2)),
    # noisy 4-sample validation, patience 1: copies stop at different epochs and a stopped
    # copy would still improve later — its later epochs must be ignored, as if it had stopped
    ((8, 4), 3, 1.0, 4, FitConfig("adam", 0.1, 0.0, batch_size=3, max_epochs=30, patience=1)),
])
def test_batched_oracle_fits_equal_sequential_fits(hidden, seed, noise, n_val, cfg) -> None:  # type: ignore[no-untyped-def]
    """The oracle's τ candidate fits as one stacked fit give what τ separate fits give:
    same batch order, own early stopping, own best weights, own test accuracy."""
    import copy

    from scarcelab.active.batched import fit_many, supports
    from scarcelab.active.classifier import accuracy

    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.normal(size=(120, 5)).astype(np.float32))
    y = torch.from_numpy((x[:, 0].numpy() + noise * rng.normal(size=120) > 0).astype(np.int64))
    xv, yv, xt, yt = x[80:80 + n_val], y[80:80 + n_val], x[100:], y[100:]
    net = ALNet(5, 2, hidden)
    net.seeded_init(torch.Generator().manual_seed(seed or 3))
    assert supports(net, 0.0) and not supports(net, 0.1)
    sets = [torch.tensor(list(range(10)) + [20 + i]) for i in range(6)]
    g = torch.Generator().manual_seed(11)
    seq = []
    for idx in sets:
        m = copy.deepcopy(net)
        dg = torch.Generator()
        dg.set_state(g.get_state())
        fit(m, x[idx], y[idx], xv, yv, cfg, dg, torch.Generator())
        seq.append(accuracy(m, xt, yt))
    dg = torch.Generator()
    dg.set_state(g.get_state())
    batched = fit_many(net, net.state_dict(), sets, x, y, xv, yv, xt, yt, cfg, dg)
    np.testing.assert_allclose(batched, seq, atol=1e-6)
    assert len(set(seq)) > 1  # the candidates do differ: the check is not vacuous


def test_oracle_picks_the_same_with_batched_and_sequential_fits() -> None:
    from scarcelab.active.datasets import load_al_dataset

    data = load_al_dataset("honeypot", None, np.random.default_rng(0))
    # the stacked fit mirrors the default fitting (fresh optimiser, best weights kept)
    cfg = dataset_config("honeypot").replace(budget=10, max_epochs=50, patience=2,
                                             restore_best=True, drop_last=False,
                                             keep_optimizer=False, first_fit_epochs=0)
    runs = [run_repetition(data, cfg, make_strategy("oracle", {"tau": 5}), 2, 0, 0, 0, 0,
                           batched_oracle=b) for b in (True, False)]
    assert runs[0].labeled == runs[1].labeled
    assert runs[0].accuracies == pytest.approx(runs[1].accuracies, abs=1e-6)


# -- a real set's sweep record, registration, MC dropout (mutation sample, docs/mutation.md) --
def _toy_real(monkeypatch, name: str = "toy_real"):  # type: ignore[no-untyped-def]
    """A small non-synthetic dataset registered for the test only (loaded once per sweep,
    like every real set)."""
    from scarcelab.active import datasets as ds

    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(-2, 1, (40, 2)), rng.normal(2, 1, (40, 2))])
    y = np.repeat([0, 1], 40)
    data = ds.ALData(name, x[::2].astype(np.float32), y[::2], x[1::2].astype(np.float32),
                     y[1::2], 2, "toy:source", "a note for the run",
                     {"scarcelab.encoding_key": "k0"})
    monkeypatch.setitem(ds.AL_DATASETS._entries, name, ds.ALDatasetSpec(
        lambda d, r, c: data, ds.dataset_config("honeypot").replace(budget=4, max_epochs=3)))
    return data


def test_real_dataset_sweep_records_its_params_digest_note_and_tags(monkeypatch):
    from scarcelab.active.loop import ALRunConfig, _digest, run_al
    from scarcelab.tracker import InMemoryTracker

    data = _toy_real(monkeypatch)
    tr = InMemoryTracker()
    run_al(ALRunConfig("random", "toy_real", query_size=2), tr)
    assert tr.study is not None and tr.study.params["query_size"] == 2
    assert tr.dataset.source == "toy:source" and tr.dataset.digest == _digest(data)
    assert len(tr.dataset.digest) == 16
    assert tr.artifacts["al_config.json"]["note"] == "a note for the run"
    assert tr.study.tags["scarcelab.encoding_key"] == "k0"


def test_registered_kinds_follow_the_registration():
    from scarcelab.active.datasets import AL_DATASETS

    splice = AL_DATASETS.get("splice")
    assert splice.synthetic is False and splice.kind == "tabular"
    assert AL_DATASETS.get("mnist_5k").kind == "image"
    assert AL_DATASETS.get("honeypot").synthetic is True
    assert AL_DATASETS.get("honeypot").kind == "synthetic"


def test_shared_data_fallback_notes_the_folder_that_lacked_the_file(tmp_path, monkeypatch):
    from scarcelab.active import datasets as ds
    from scarcelab.data import provenance

    empty, shared = tmp_path / "default", tmp_path / "shared"
    empty.mkdir()
    shared.mkdir()
    (shared / "toy.csv").write_text("a,b\n1,2\n")
    monkeypatch.setenv("SCARCELAB_DATA", str(empty))
    monkeypatch.setattr(ds, "SHARED_DATA", shared)
    provenance.reset()
    [p] = ds._locate(empty, "toy", ("toy.csv",))
    assert p == shared / "toy.csv"
    [rec] = [r for r in provenance.used() if r["path"] == str(p.resolve())]
    assert rec["note"] == f"fallback: not found in {empty}"


def test_mc_dropout_of_a_linear_classifier_acts_on_its_input():
    """With no hidden layer the only dropout is the input's, so MC strategies (BALD) still
    see model uncertainty; with hidden layers it is the layers' own."""
    from scarcelab.active.classifier import ALNet

    lin = ALNet(4, 3, hidden=(), dropout=0.5)
    assert len(lin.mc_dropouts()) == 1 and lin.mc_dropouts()[0] is lin.in_drop
    mlp = ALNet(4, 3, hidden=(5, 6), dropout=0.5)
    assert [id(d) for d in mlp.mc_dropouts()] == [id(d) for d in mlp.drops]


# -- fit's batch-of-one guard, split without validation, float64 features (mutation sample 2) --
def test_a_batch_of_one_trains_a_net_without_batchnorm():
    """Only BatchNorm needs two samples per batch: a linear net fitted on one labeled
    sample must still take its step (the seed set of a 1-per-class start can be tiny)."""
    torch.manual_seed(0)
    net = ALNet(2, 2)
    before = [p.detach().clone() for p in net.parameters()]
    x, y = torch.tensor([[1.0, -1.0]]), torch.tensor([1])
    cfg = FitConfig(max_epochs=1, batch_size=4, restore_best=False)
    fit(net, x, y, x, y, cfg, torch.Generator().manual_seed(0), torch.Generator().manual_seed(0))
    assert any(not torch.equal(b, p) for b, p in zip(before, net.parameters(), strict=True))


def test_no_validation_fraction_puts_every_training_sample_in_the_pool():
    """val_fraction = 0 (allowed with test-set stopping) means no validation split at all:
    the pool is the whole training set."""
    from scarcelab.active.datasets import ALData
    from scarcelab.active.loop import _split

    y = np.array([0, 1] * 5)
    data = ALData("t", np.zeros((10, 2), np.float32), y, np.zeros((2, 2), np.float32),
                  y[:2], 2, "t")
    cfg = dataset_config("honeypot").replace(val_fraction=0.0, stop_on="test")
    val, pool, seed = _split(data, cfg, np.random.default_rng(0))
    assert val.size == 0 and pool.tolist() == list(range(10))
    assert np.isin(seed, pool).all() and sorted(y[seed].tolist()) == [0, 1]


def test_float64_features_run_as_float32(monkeypatch):
    """A loader may hand over float64 arrays; the loop casts them to the net's float32, so
    the repetition runs and matches the float32 copy of the same data."""
    from scarcelab.active import datasets as ds

    data = _toy_real(monkeypatch, "toy_f64")
    cfg = ds.dataset_config("honeypot").replace(budget=4, max_epochs=3)
    wide = ds.ALData(data.name, data.x_train.astype(np.float64), data.y_train,
                     data.x_test.astype(np.float64), data.y_test, 2, data.source)
    runs = [run_repetition(d, cfg, make_strategy("margin"), 2, 0, 0, 0, 0)
            for d in (data, wide)]
    assert runs[0].labeled == runs[1].labeled
    assert runs[0].accuracies == runs[1].accuracies
