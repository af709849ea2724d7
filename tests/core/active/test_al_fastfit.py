"""The AL fit's fast path (scarcelab/active/fastfit.py) against the generic autograd +
``torch.optim`` path: bit for bit, over whole fits, continued fits, a mix of the two paths,
and whole repetitions; and the cases it must leave to the generic path."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
import torch

from scarcelab.active import fastfit
from scarcelab.active.classifier import ALNet, FitConfig, _optimizer, build_net, fit
from scarcelab.active.datasets import dataset_config, load_al_dataset
from scarcelab.active.loop import make_strategy, run_repetition


def _setup(hidden: tuple[int, ...], opt_name: str, wd: float, restore: bool, drop_last: bool,
           bs: int = 43) -> tuple[ALNet, FitConfig, torch.optim.Optimizer]:
    net = ALNet(60, 3, hidden, 0.0)
    net.seeded_init(torch.Generator().manual_seed(0))
    cfg = FitConfig(optimizer=opt_name, lr=1.2e-3, weight_decay=wd, batch_size=bs,
                    max_epochs=12, patience=2, restore_best=restore, drop_last=drop_last)
    return net, cfg, _optimizer(cfg, list(net.parameters()))


def _data(n: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(3)
    return (torch.rand(n, 60, generator=g), torch.randint(0, 3, (n,), generator=g),
            torch.rand(150, 60, generator=g), torch.randint(0, 3, (150,), generator=g))


def _fits(paths: list[bool], monkeypatch: pytest.MonkeyPatch, hidden: tuple[int, ...],
          opt_name: str, wd: float, restore: bool, drop_last: bool, n: int) -> dict[str, Any]:
    """Successive fits on a growing labeled set with one kept optimiser (CDALBench's
    finetune mode); fit i takes the fast path when ``paths[i]``."""
    net, cfg, opt = _setup(hidden, opt_name, wd, restore, drop_last)
    x, y, xv, yv = _data(n + 7 * len(paths))
    dg, mg = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
    epochs = []
    for i, fast in enumerate(paths):
        monkeypatch.setenv("SCARCELAB_AL_FASTFIT", "1" if fast else "0")
        m = n + 7 * i
        epochs.append(fit(net, x[:m], y[:m], xv, yv, cfg, dg, mg, opt))
    return {"weights": net.state_dict(), "opt": opt.state_dict(), "epochs": epochs,
            "data_gen": dg.get_state(), "training": net.training}


def _assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["epochs"] == b["epochs"]
    assert a["training"] is b["training"] is False
    assert torch.equal(a["data_gen"], b["data_gen"])
    assert a["weights"].keys() == b["weights"].keys()
    for k in a["weights"]:
        assert torch.equal(a["weights"][k], b["weights"][k]), k
    sa, sb = a["opt"]["state"], b["opt"]["state"]
    assert sa.keys() == sb.keys()
    for i in sa:
        assert sa[i].keys() == sb[i].keys(), i
        for k in sa[i]:
            assert sa[i][k].dtype == sb[i][k].dtype and sa[i][k].shape == sb[i][k].shape
            assert torch.equal(sa[i][k], sb[i][k]), (i, k)
    assert a["opt"]["param_groups"] == b["opt"]["param_groups"]


CASES = list(itertools.product([(24, 24, 12), ()], ["nadam", "adam"], [0.0, 6e-5],
                               [True, False], [True, False], [87, 44]))


@pytest.mark.parametrize(("hidden", "opt_name", "wd", "restore", "drop_last", "n"), CASES)
def test_fast_fits_equal_generic_fits_bit_for_bit(monkeypatch, hidden, opt_name, wd,  # type: ignore[no-untyped-def]
                                                  restore, drop_last, n) -> None:
    calls: list[int] = []
    real = fastfit.fast_fit

    def spy(*a: Any, **k: Any) -> int:
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(fastfit, "fast_fit", spy)
    fast = _fits([True] * 3, monkeypatch, hidden, opt_name, wd, restore, drop_last, n)
    assert len(calls) == 3  # the fast path really ran
    generic = _fits([False] * 3, monkeypatch, hidden, opt_name, wd, restore, drop_last, n)
    assert len(calls) == 3
    _assert_same(fast, generic)


@pytest.mark.parametrize("opt_name", ["nadam", "adam"])
def test_the_two_paths_hand_over_the_optimiser_state(monkeypatch, opt_name) -> None:  # type: ignore[no-untyped-def]
    """A fast fit leaves the optimiser as torch.optim would (layout, dtypes, step), so a
    generic fit can continue it, and the other way round."""
    args = ((24, 12), opt_name, 1e-4, False, True, 50)
    mixed = _fits([True, False, True, False], monkeypatch, *args)
    _assert_same(mixed, _fits([False] * 4, monkeypatch, *args))
    _assert_same(_fits([False, True, True], monkeypatch, *args),
                 _fits([False] * 3, monkeypatch, *args))


def test_a_batch_of_one_row_at_the_end_of_an_epoch(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    args = ((8,), "nadam", 0.0, True, False, 44)  # 44 = 43 + 1: a last batch of one
    _assert_same(_fits([True] * 2, monkeypatch, *args), _fits([False] * 2, monkeypatch, *args))


def _never(net: ALNet, opt: torch.optim.Optimizer) -> None:
    assert not fastfit.eligible(net, opt)


def test_what_the_fast_path_leaves_to_the_generic_one(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    net, cfg, opt = _setup((8,), "nadam", 0.0, True, False)
    assert fastfit.eligible(net, opt)
    params = list(net.parameters())
    monkeypatch.setenv("SCARCELAB_AL_FASTFIT", "0")
    _never(net, opt)
    monkeypatch.delenv("SCARCELAB_AL_FASTFIT")
    drop = ALNet(60, 3, (8,), 0.2)
    _never(drop, torch.optim.NAdam(drop.parameters(), foreach=True))
    for other in (torch.optim.SGD(params, lr=0.1), torch.optim.AdamW(params),
                  torch.optim.Adam(params, amsgrad=True),
                  torch.optim.NAdam(params, decoupled_weight_decay=True),
                  torch.optim.Adam(params, maximize=True),
                  torch.optim.Adam(params, lr=torch.tensor(1e-3)),
                  torch.optim.NAdam(params[:2]),  # not over the whole net
                  torch.optim.NAdam([{"params": params[:2]}, {"params": params[2:]}])):
        _never(net, other)
    img = build_net("resnet18", (4, 3, 32, 32), 3, (), 0.0, torch.Generator().manual_seed(0))
    _never(img, torch.optim.NAdam(img.parameters()))  # type: ignore[arg-type]


def test_parameters_at_different_steps_go_the_generic_way() -> None:
    net, cfg, opt = _setup((8,), "nadam", 0.0, True, False)
    x, y, xv, yv = _data(40)
    fit(net, x, y, xv, yv, cfg, torch.Generator(), torch.Generator(), opt)
    assert fastfit.eligible(net, opt)
    first = next(iter(net.parameters()))
    opt.state[first]["step"] += 1
    _never(net, opt)
    del opt.state[first]
    _never(net, opt)  # partly initialised


@pytest.mark.parametrize(("strategy", "over"), [
    ("margin", {"budget": 12, "max_epochs": 6, "patience": 2, "keep_optimizer": False,
                "restore_best": True, "drop_last": False, "first_fit_epochs": 0,
                "fitting": "scratch"}),
    ("margin", {"budget": 12, "max_epochs": 6, "patience": 1, "fit_per_label": True,
                "first_fit_epochs": 4}),  # CDALBench's tabular fitting, as for splice
    ("oracle", {"budget": 4, "max_epochs": 4, "first_fit_epochs": 4}),  # optimiser copies
])
def test_a_whole_repetition_is_the_same_on_either_path(monkeypatch, strategy, over) -> None:  # type: ignore[no-untyped-def]
    def rep() -> tuple[list[float], list[int]]:
        cfg = dataset_config("honeypot").replace(**over)
        rng = np.random.default_rng(0)
        data = load_al_dataset("honeypot", None, rng)
        r = run_repetition(data, cfg, make_strategy(strategy), 3, 0, 0, 0, 0, data_rng=rng)
        return r.accuracies, r.labeled

    monkeypatch.setenv("SCARCELAB_AL_FASTFIT", "1")
    fast = rep()
    monkeypatch.setenv("SCARCELAB_AL_FASTFIT", "0")
    assert fast == rep()
