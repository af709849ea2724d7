"""A training step makes at most one host<->device transfer (issue 40), counted on the CPU.

Every registered method runs through the epoch loop's own code (``_EpochLoop._steps``:
``BatchSource.next`` and ``optimizer_step``) under ``scarcelab.devsync.TransferCounter``,
which tags as "device" what a CUDA run keeps on the GPU and counts what would cross (see
its docstring). The one transfer a step may make is the packed copy of its random numbers
(``augment.upload``); the finite check is read once per epoch. The counter's own tests
plant each kind of transfer in a real step and see it counted.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from scarcelab import devsync
from scarcelab.data import augment as A
from scarcelab.data.bundle import DatasetBundle
from scarcelab.devsync import count_step_transfers
from scarcelab.errors import TrialFailed
from scarcelab.methods import METHODS, get_method
from scarcelab.methods._parts import DistributionAlignment, FeatureQueue, LearningStatus
from scarcelab.models import create_model
from scarcelab.train import (
    BatchSource,
    Budget,
    NonFiniteWatch,
    TrainConfig,
    _EpochLoop,
    deferred_finite_check,
    optimizer_step,
)

#: the one method whose step cannot avoid reading the device, and why: OLÉ's loss takes
#: the nuclear norm of each class's rows of the batch; torch.linalg.svdvals synchronises
#: with the host on CUDA (torch documents it: cuSOLVER's status is checked on the host),
#: and the classes present and their rows (torch.unique, a boolean selection) are sized
#: on the host too. Only those ops may add to its count.
KNOWN_SYNCS = {"ole": ("aten::_unique2", "aten::_linalg_svd", "boolean mask")}

#: settings that take other branches of a step (CoMatch's memory smoothing once its bank
#: is full, FixMatch's separate weak pass, SoftMatch without alignment ...)
VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("comatch", {"memory_size": 48}),
    ("fixmatch", {"weak_no_grad": True}),
    ("flexmatch", {"threshold_warmup": False}),
    ("softmatch", {"uniform_alignment": False}),
    ("moco", {"queue_size": 40}),
]


def _method(name: str, channels: int, num_classes: int, **hp: Any) -> Any:
    cls = get_method(name)
    torch.manual_seed(0)
    return cls(create_model("small_cnn", in_channels=channels), num_classes,
               {**cls.defaults, **hp})


def _counts(method: Any, bundle: Any, **cfg: Any) -> devsync.StepTransfers:
    return count_step_transfers(method, bundle, TrainConfig(
        **{"batch_labeled": 8, "batch_unlabeled": 16, **cfg}), steps=2, warmup=2)


def _assert_one_per_step(name: str, r: devsync.StepTransfers) -> None:
    allowed = KNOWN_SYNCS.get(name, ())
    extra = [e for e in r.events if e.phase.startswith("step")
             and not any(a in e.what for a in allowed)]
    per_step = [sum(1 for e in extra if e.phase == f"step {i}") for i in range(len(r.per_step))]
    # exactly one: the step's packed copy (a count of 0 would mean the counter saw nothing)
    assert per_step == [1] * len(r.per_step), r.describe()
    assert all(e.kind == "h2d" for e in extra), r.describe()
    assert r.epoch_end == 1, r.describe()  # the finite check's one read


def _bundle(channels: int, side: int, geometry: bool = False, n: int = 300) -> DatasetBundle:
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (n, channels, side, side), dtype=np.uint8)
    y = np.arange(n) % 3
    meta: dict[str, Any] = {"num_classes": 3, "name": "noise"}
    if geometry:  # labeled images stored whole, cropped to half the side (tune protocol)
        meta["labeled_geometry"] = {"sizes": rng.integers(side, 3 * side, (60, 2)),
                                    "out_size": side // 2}
    return DatasetBundle(x[:60], y[:60], x[120:], x[60:120], y[60:120], x[60:120],
                         y[60:120], meta=meta)


# -- every method, through the loop ---------------------------------------------------------


@pytest.mark.parametrize("name", METHODS.names())
def test_every_method_makes_one_transfer_per_step(name: str, tiny_bundle: Any) -> None:
    m = _method(name, tiny_bundle.channels, tiny_bundle.num_classes)
    _assert_one_per_step(name, _counts(m, tiny_bundle))


@pytest.mark.parametrize(("name", "hp"), VARIANTS, ids=[v[0] for v in VARIANTS])
def test_other_branches_of_the_steps(name: str, hp: dict[str, Any], tiny_bundle: Any) -> None:
    m = _method(name, tiny_bundle.channels, tiny_bundle.num_classes, **hp)
    _assert_one_per_step(name, _counts(m, tiny_bundle))


@pytest.mark.parametrize("name", ["fixmatch", "simclr", "comatch"])
def test_rgb_views_make_one_transfer_per_step(name: str) -> None:
    """RandAugment's colour op and SimCLR's saturation, hue and grayscale exist for RGB
    only (and the luma weights are a device constant)."""
    b = _bundle(3, 32)
    _assert_one_per_step(name, _counts(_method(name, 3, 3), b))


@pytest.mark.parametrize(("views", "geometry"), [
    (("deic_shift_hvflip",), False), (("deic_rrc10_hflip",), False),
    (("deic_rrc40_hvflip",), True), (("deic_rrc20",), True)])
def test_the_tune_protocols_views_make_one_transfer_per_step(views: tuple[str, ...],
                                                             geometry: bool) -> None:
    """The RandomResizedCrop views on whole stored images (sizes and output side: the crop
    boxes and the supersampling factor are decided on the host) and the shift+flips."""
    b = _bundle(3, 32, geometry=geometry)
    r = _counts(_method("ce", 3, 3), b, labeled_views=views, batch_unlabeled=0)
    _assert_one_per_step("ce", r)


def test_ole_reads_the_device_only_in_its_svds(tiny_bundle: Any) -> None:
    """The known exception is as narrow as stated: without its allowance OLÉ counts more,
    and only the ops named there."""
    r = _counts(_method("ole", 1, tiny_bundle.num_classes), tiny_bundle)
    assert r.max_per_step > 1
    others = [e for e in r.events if e.phase.startswith("step") and e.kind != "h2d"]
    assert others and all(any(a in e.what for a in KNOWN_SYNCS["ole"]) for e in others)


# -- the counter sees each kind of transfer --------------------------------------------------


class _Planted:
    """A supervised step with one transfer planted in it (``kind``)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __call__(self, method: Any, batch: Any, progress: Any) -> Any:
        out = type(method).step(method, batch, progress)
        loss, x = out["loss"], batch.x[0]
        if self.kind == "item":
            out["logged"] = loss.new_full((), loss.item())
        elif self.kind == "bool":
            if loss > 100:  # host control flow on device data
                loss = loss * 1.0
        elif self.kind == "tolist":
            out["n"] = loss.new_full((), len(batch.y.tolist()))
        elif self.kind == "cpu_draw_to_device":  # the old augmentation draws
            g = torch.Generator().manual_seed(0)
            noise = torch.rand(x.shape[0], generator=g, device=g.device).to(x.device)
            loss = loss + 0.0 * (x.mean((1, 2, 3)) * noise).sum()
        elif self.kind == "host_constant":
            w = torch.tensor([0.299, 0.587, 0.114])[: x.shape[1]]
            loss = loss + 0.0 * (x * w.view(1, -1, 1, 1)).sum()
        elif self.kind == "new_tensor":
            loss = loss + 0.0 * x.new_tensor([1.0, 2.0]).sum()
        elif self.kind == "bool_mask":
            loss = loss + 0.0 * x[x > 0.5].sum()
        elif self.kind == "host_index":
            loss = loss + 0.0 * x[torch.randperm(x.shape[0])].sum()
        elif self.kind == "new_tensor_scalar":
            out["ramp"] = loss.new_tensor(0.5)
        out["loss"] = loss
        return out


@pytest.mark.parametrize(("kind", "expected"), [
    ("item", "d2h"), ("bool", "d2h"), ("tolist", "d2h"), ("cpu_draw_to_device", "h2d"),
    ("host_constant", "h2d"), ("new_tensor", "h2d"), ("bool_mask", "sync"),
    ("host_index", "h2d"), ("new_tensor_scalar", "h2d")])
def test_the_counter_counts_a_planted_transfer(kind: str, expected: str,
                                                tiny_bundle: Any) -> None:
    m = _method("sup", 1, tiny_bundle.num_classes)
    planted = _Planted(kind)
    m.step = lambda batch, progress: planted(m, batch, progress)  # type: ignore[method-assign]
    r = _counts(m, tiny_bundle)
    assert r.per_step == [2, 2], r.describe()
    kinds = sorted(e.kind for e in r.events if e.phase == "step 0")
    assert kinds == sorted(["h2d", expected]), r.describe()


def test_the_counter_counts_one_copy_per_tensor_when_they_are_not_packed(
        monkeypatch: pytest.MonkeyPatch, tiny_bundle: Any) -> None:
    """The old way, each random-parameter tensor moved by its own ``.to(device)``: the
    counter sees one transfer per tensor that reaches the device (FixMatch's weak and
    strong views, indices: more than a dozen), not one."""

    def one_by_one(tree: Any, device: torch.device, pack: bool | None = None) -> Any:
        leaves: list[torch.Tensor] = []
        skeleton = A._leaves(tree, leaves)
        return A._fill(skeleton, [t.to(device) for t in leaves])

    monkeypatch.setattr("scarcelab.train.upload", one_by_one)
    r = _counts(_method("fixmatch", 1, tiny_bundle.num_classes), tiny_bundle)
    assert min(r.per_step) > 12, r.describe()
    assert {e.kind for e in r.events if e.phase == "step 0"} == {"h2d"}


def test_the_finite_check_is_counted_once_per_epoch_not_per_step(
        monkeypatch: pytest.MonkeyPatch, tiny_bundle: Any) -> None:
    """With the per-step check back (no deferred context), each step reads the loss."""
    import scarcelab.train as T

    monkeypatch.setattr(T, "deferred_finite_check", lambda watch: _NoWatch(watch))
    r = _counts(_method("sup", 1, tiny_bundle.num_classes), tiny_bundle)
    assert r.per_step == [2, 2] and r.epoch_end == 0, r.describe()


class _NoWatch:
    def __init__(self, watch: NonFiniteWatch) -> None:
        self.watch = watch

    def __enter__(self) -> NonFiniteWatch:
        return self.watch

    def __exit__(self, *exc: Any) -> None:
        return None


# -- the one copy ----------------------------------------------------------------------------


def test_upload_packs_every_tensor_into_one_buffer_bit_for_bit() -> None:
    g = torch.Generator().manual_seed(0)
    tree = {"a": torch.rand(5, generator=g), "b": (torch.randint(-9, 9, (3, 2), generator=g),
                                                  torch.rand(7, generator=g) < 0.5),
            "c": [torch.rand(2, 3, dtype=torch.float64, generator=g).t(),  # not contiguous
                  torch.zeros(0), torch.tensor(3.5), 7, None, [1, 2]],
            "d": torch.arange(4, dtype=torch.uint8)}
    out = A.upload(tree, torch.device("cpu"), pack=True)
    leaves: list[torch.Tensor] = []
    A._leaves(out, leaves)
    originals: list[torch.Tensor] = []
    A._leaves(tree, originals)
    for got, want in zip(leaves, originals, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    # all of them views of one buffer: one copy moves them
    assert len({t.untyped_storage().data_ptr() for t in leaves}) == 1
    assert out["c"][3:] == [7, None, [1, 2]]
    assert A.upload(tree, torch.device("cpu")) is tree  # on the CPU, nothing is copied


def test_packed_batches_equal_the_unpacked_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """The packed path (CUDA's) gives the same batches as the CPU's direct one."""
    def batches(pack: bool, method: str, b: DatasetBundle, **kw: Any) -> list[Any]:
        monkeypatch.setattr(A, "PACK_ON_CPU", pack)
        src = BatchSource(b, get_method(method), 8, 16, torch.device("cpu"),
                          torch.Generator().manual_seed(3), **kw)
        return [src.next() for _ in range(2)]

    for method, b, kw in (("comatch", _bundle(3, 32), {}),
                          ("ce", _bundle(3, 32, geometry=True),
                           {"labeled_views": ("deic_rrc40_hvflip",)})):
        for p, q in zip(batches(False, method, b, **kw), batches(True, method, b, **kw),
                        strict=True):
            for s, t in zip(p.x + p.u + [p.y], q.x + q.u + [q.y], strict=True):
                assert torch.equal(s, t)


@pytest.mark.parametrize("name", sorted(A.AUGMENTATIONS.names()))
def test_a_view_called_is_its_draw_then_its_apply(name: str) -> None:
    view = A.AUGMENTATIONS.get(name)
    x = torch.rand(9, 3, 20, 20, generator=torch.Generator().manual_seed(1))
    g1, g2 = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    called = view(x, g1)
    params = view.draw(g2, 9, x.shape[1:])
    assert torch.equal(g1.get_state(), g2.get_state())  # the same draws, in the same order
    assert torch.equal(view.apply(x, A.upload(params, x.device, pack=True)), called)


def test_a_plain_function_augmentation_still_works_in_the_batch_source(
        monkeypatch: pytest.MonkeyPatch, tiny_bundle: Any) -> None:
    def darker(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        return x * torch.rand(x.shape[0], 1, 1, 1, generator=g)

    monkeypatch.setitem(A.AUGMENTATIONS._entries, "darker", darker)
    src = BatchSource(tiny_bundle, get_method("sup"), 8, 0, torch.device("cpu"),
                      torch.Generator().manual_seed(0), labeled_views=("darker",))
    assert src.next().x[0].shape == (8, *tiny_bundle.labeled_x.shape[1:])


def test_device_constants_are_made_once() -> None:
    A._CONSTANTS.clear()
    x = torch.rand(4, 3, 8, 8)
    A._gray(x)
    A._gray(x)
    A._warp(x, torch.eye(3).expand(4, 3, 3), 0.5, "nearest")
    A._warp(x, torch.eye(3).expand(4, 3, 3), 0.5, "nearest")
    assert len(A._CONSTANTS) == 3  # luma weights, the two normalisation diagonals


# -- the finite check, once per epoch --------------------------------------------------------


def _nan_from(step: int, value: float = float("nan")) -> Any:
    def wrap(m: Any) -> Any:
        real = m.step

        def step_fn(batch: Any, progress: Any) -> Any:
            out = real(batch, progress)
            if progress.step >= step:
                out["loss"] = out["loss"] * value
            return out

        m.step = step_fn
        return m
    return wrap


def test_a_non_finite_loss_fails_the_trial_at_the_end_of_its_epoch(tiny_bundle: Any) -> None:
    """NaN from step 3 (epoch 1 of 4-step epochs): steps 4 and 5 still run, then the same
    TrialFailed as the per-step check raised, naming the first bad step."""
    m = _nan_from(3)(_method("sup", 1, tiny_bundle.num_classes))
    loop = _EpochLoop(m, tiny_bundle, TrainConfig(max_steps_per_epoch=3, batch_labeled=8),
                      Budget(1e9), torch.Generator().manual_seed(0), np.random.default_rng(0))
    loop._steps(0)
    with pytest.raises(TrialFailed, match=r"^non-finite loss \(nan\) at epoch 1, step 3$"):
        loop._steps(1)
    assert loop.step == 6  # the epoch's remaining steps ran
    assert not all(torch.isfinite(p).all() for p in m.parameters())


def test_the_first_non_finite_value_is_reported(tiny_bundle: Any) -> None:
    watch = NonFiniteWatch()
    for step, v in enumerate([1.0, float("inf"), float("nan"), 2.0]):
        watch.observe(torch.tensor(v), step)
    with pytest.raises(TrialFailed, match=r"non-finite loss \(inf\) at epoch 7, step 1"):
        watch.check(7)
    fine = NonFiniteWatch()
    fine.observe(torch.tensor(1.0), 0)
    fine.check(0)
    NonFiniteWatch().check(0)  # no step: nothing to read


def test_outside_the_loop_the_check_still_stops_the_update(tiny_bundle: Any) -> None:
    """``optimizer_step`` called on its own (the AL encoder, benches) raises before the
    update, as it always did; inside ``deferred_finite_check`` it records instead."""
    m = _nan_from(0)(_method("sup", 1, tiny_bundle.num_classes))
    src = BatchSource(tiny_bundle, get_method("sup"), 8, 0, torch.device("cpu"),
                      torch.Generator().manual_seed(0))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    before = [p.detach().clone() for p in m.parameters()]
    from scarcelab.methods import Progress

    with pytest.raises(TrialFailed, match=r"non-finite loss \(nan\) at epoch 0, step 0"):
        optimizer_step(m, opt, sched, src.next(), Progress(0, 10, 0))
    assert all(torch.equal(a, b) for a, b in zip(before, m.parameters(), strict=True))
    with deferred_finite_check(NonFiniteWatch()) as watch:
        optimizer_step(m, opt, sched, src.next(), Progress(1, 10, 0))
    with pytest.raises(TrialFailed, match="step 1"):
        watch.check(0)


# -- state followed on the host --------------------------------------------------------------


def _boolean_update(selected: torch.Tensor, index: torch.Tensor, pseudo: torch.Tensor,
                    conf: torch.Tensor, tau: float) -> torch.Tensor:
    out = selected.clone()
    keep = conf >= tau
    out[index[keep]] = pseudo[keep]
    return out


def test_learning_status_update_matches_the_boolean_selection_with_repeated_indices() -> None:
    """A batch spanning two passes over the pool repeats indices: the last confident
    prediction wins and an unconfident repeat never overwrites it, as with the boolean
    selection it replaces (checked on random cases against it)."""
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        st = LearningStatus(4, 10)
        st.selected.copy_(torch.randint(-1, 4, (10,), generator=g))
        index = torch.randint(0, 10, (16,), generator=g)  # repeats
        pseudo = torch.randint(0, 4, (16,), generator=g)
        conf = torch.rand(16, generator=g)
        want = _boolean_update(st.selected, index, pseudo, conf, 0.5)
        st.update(index, pseudo, conf, 0.5)
        assert torch.equal(st.selected, want)


def test_learning_effect_by_hand() -> None:
    st = LearningStatus(3, 6)
    st.selected.copy_(torch.tensor([0, 0, 1, -1, -1, -1]))
    # counts (2, 1, 0); without warm-up / 2, with warm-up / max(2, 3 unused)
    assert torch.allclose(st.learning_effect(False), torch.tensor([1.0, 0.5, 0.0]))
    assert torch.allclose(st.learning_effect(True), torch.tensor([2 / 3, 1 / 3, 0.0]))
    st.selected.fill_(-1)
    assert torch.equal(st.learning_effect(False), torch.zeros(3))  # nothing assigned yet


def test_host_counters_survive_a_checkpoint() -> None:
    q = FeatureQueue(4, 1)
    for v in (1.0, 2.0, 3.0):
        q.push(torch.full((1, 1), v))
    fresh = FeatureQueue(4, 1)
    fresh.load_state_dict(q.state_dict())
    assert fresh.filled == 3
    fresh.push(torch.full((2, 1), 9.0))  # wraps: rows 3 and 0
    assert fresh.filled == 4 and int(fresh.ptr) == 1
    assert fresh.feats.flatten().tolist() == [9.0, 2.0, 3.0, 9.0]
    da = DistributionAlignment(2, window=2)
    da.update(torch.tensor([[1.0, 0.0]]))
    restored = DistributionAlignment(2, window=2)
    restored.load_state_dict(da.state_dict())
    restored.update(torch.tensor([[0.0, 1.0]]))  # slot 1, mean over both
    assert torch.allclose(restored.p_model, torch.tensor([0.5, 0.5]))
    assert int(restored.n_seen) == 2


def test_cuda_sync_count_says_it_measured_nothing_off_cuda(tiny_bundle: Any) -> None:
    r = devsync.cuda_syncs_per_step(_method("sup", 1, tiny_bundle.num_classes), tiny_bundle,
                                    TrainConfig(batch_labeled=8))
    assert r.per_step is None and r.per_epoch is None and "not measured" in r.note
    rules = devsync.cuda_rule_check("cpu")
    assert rules and all(n is None for n, _ in rules.values())
    assert rules[".item()"][1] and not rules["one_hot(y, num_classes)"][1]
