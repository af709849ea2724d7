"""Counting what a training step makes the host wait for (issue 40: a step without a sync).

On a GPU a step should be queued by the host and run by the device without the host ever
waiting: every blocking host-to-device copy (a pageable ``.to(device)``, a tensor built
from Python numbers on the device) and every read of device data on the host
(``.item()``, ``.tolist()``, ``bool(t)``, a boolean selection whose size the host needs)
drains the GPU's queue first. Two ways to count them:

- :class:`TransferCounter` counts them **on the CPU**, where there is no second device: a
  ``TorchDispatchMode`` (plus Python-level patches for what never reaches the dispatcher:
  ``.to``, ``.tolist``, ``.numpy``, ``torch.tensor``, factory functions) follows which
  tensors *would* live on the training device — those marked so at the start (model
  parameters and buffers, the data held on the device), the results of every op with such
  an input, factories given a device — and counts (a) a host tensor entering an op on
  device tensors (what on CUDA is a copy), (b) a device tensor read on the host, (c) the
  ops that read the device internally on CUDA (``nonzero``, ``bincount``, boolean
  indexing, ``unique``, the cuSOLVER decompositions…). ``tests/core/methods/test_step_transfers.py``
  runs every registered method through the epoch loop under it.
- :func:`cuda_syncs_per_step` counts what CUDA itself reports
  (``torch.cuda.set_sync_debug_mode("warn")``) on a real GPU, for the GPU bench; on a CPU
  it measures nothing and says so.
"""

from __future__ import annotations

import functools
import itertools
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

DEVICE = "device"
HOST = "host"

#: aten ops that read device data back to the host on CUDA (to size an output or check
#: an error), whatever Python does with the result
_SYNCING = {
    "aten::_local_scalar_dense", "aten::item", "aten::is_nonzero", "aten::equal",
    "aten::nonzero", "aten::nonzero_numpy", "aten::argwhere", "aten::masked_select",
    "aten::bincount", "aten::_unique", "aten::_unique2", "aten::unique_dim",
    "aten::unique_consecutive", "aten::unique_dim_consecutive", "aten::allclose",
    # cuSOLVER's status is checked on the host (PyTorch's docs: "synchronizes that
    # device with the CPU")
    "aten::_linalg_svd", "aten::linalg_svd", "aten::_linalg_eigh", "aten::linalg_eig",
    "aten::linalg_eigvals",
}
#: ops whose index tensors are copied to the device even when 0-dimensional
_INDEXING = {
    "aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_",
    "aten::index_select", "aten::gather", "aten::scatter", "aten::scatter_",
    "aten::scatter_add", "aten::scatter_add_", "aten::take", "aten::embedding",
    "aten::index_add", "aten::index_add_", "aten::index_copy", "aten::index_copy_",
}
_FACTORIES = ("arange", "empty", "eye", "full", "linspace", "logspace", "ones", "rand",
              "randint", "randn", "randperm", "zeros", "scalar_tensor")


@dataclass
class Event:
    """One counted transfer: ``kind`` is ``h2d`` (a host tensor reaches the device),
    ``d2h`` (device data read on the host) or ``sync`` (an op that reads the device
    internally on CUDA); ``what`` names the op, ``where`` the innermost scarcelab frame."""

    kind: str
    what: str
    where: str
    phase: str = ""


@dataclass(frozen=True)
class _Moved:
    """Data explicitly sent to the device (``.to(device)``, ``torch.tensor(...,
    device=)``) and what is computed from it alone: on CUDA each send is a copy, counted
    once, when its data first meets device data (a tensor sent to the host's own device
    and used there is no transfer). ``ids``: the sends it derives from."""

    ids: frozenset[int]


def _host_literal(device: Any) -> bool:
    """A device written as the string ``"cpu"``: code that means the host (torch's own
    optimisers keep their step counters there), as opposed to a ``torch.device`` taken
    from the training configuration or from a tensor — which on a CPU-only run is the
    CPU too, and stands for the training device."""
    return isinstance(device, str) and device == "cpu"


def _where() -> str:
    for fr in reversed(traceback.extract_stack()[:-3]):
        if "/scarcelab/" in fr.filename and not fr.filename.endswith("devsync.py"):
            return f"{fr.filename.split('/scarcelab/')[-1]}:{fr.lineno} {fr.name}"
    return "?"


class TransferCounter(TorchDispatchMode):
    """Counts, on the CPU, the host<->device transfers a CUDA run of the same code makes.

    ``with TransferCounter(device_tensors) as c:`` marks ``device_tensors`` (and, given
    modules, their parameters, buffers and tensor attributes) as living on the device,
    then tags every tensor made inside as device or host by where it came from. Only
    events while :attr:`counting` is true are kept (warm-up steps run with it false, so
    lazily made state and constants are tagged without being counted); :attr:`phase`
    labels them. See the module docstring for what counts."""

    def __init__(self, device_tensors: Iterable[Any] = ()) -> None:
        super().__init__()
        self.tags: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.events: list[Event] = []
        self.counting = False
        self.phase = ""
        self._ids = itertools.count()
        self._counted_moves: set[int] = set()
        self._patches: list[tuple[Any, str, Any, bool]] = []
        self._quiet = 0  # inside a call whose reads only the CPU kernel makes
        for obj in device_tensors:
            self.mark_device(obj)

    # -- tags ------------------------------------------------------------------------------
    def mark_device(self, obj: Any) -> None:
        """Tag a tensor, or every tensor a module holds, as living on the device."""
        if isinstance(obj, torch.Tensor):
            self.tags[obj] = DEVICE
        elif isinstance(obj, torch.nn.Module):
            for m in obj.modules():
                for t in itertools.chain(m.parameters(recurse=False), m.buffers(recurse=False),
                                         (v for v in vars(m).values()
                                          if isinstance(v, torch.Tensor))):
                    self.tags[t] = DEVICE
        elif isinstance(obj, torch.optim.Optimizer):
            for state in obj.state.values():
                for v in state.values():
                    if isinstance(v, torch.Tensor) and v.dim() > 0:
                        self.tags[v] = DEVICE

    def tag(self, t: torch.Tensor) -> Any:
        return self.tags.get(t)

    def _record(self, kind: str, what: str) -> None:
        if self.counting and not self._quiet:
            self.events.append(Event(kind, what, _where(), self.phase))

    def _moved(self) -> _Moved:
        return _Moved(frozenset((next(self._ids),)))

    # -- the dispatcher --------------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = func._schema.name
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        tags = [self.tag(t) for t in inputs]
        on_device = DEVICE in tags
        if on_device or any(isinstance(tg, _Moved) for tg in tags):
            # an op on data sent to the device runs there: these read it back
            self._syncs(name, args)
        if on_device:
            for t, tg in zip(inputs, tags, strict=True):
                if tg == HOST and (t.dim() > 0 or name in _INDEXING):
                    self._record("h2d", f"{name}: a host tensor {tuple(t.shape)}")
                elif isinstance(tg, _Moved):
                    for i in sorted(tg.ids - self._counted_moves):
                        self._counted_moves.add(i)
                        self._record("h2d", f"{name}: a tensor moved to the device "
                                            f"{tuple(t.shape)}")
        out = func(*args, **kwargs)
        self._tag_outputs(out, args, tags, on_device, name)
        return out

    def _syncs(self, name: str, args: Any) -> None:
        if name in _SYNCING:
            self._record("d2h" if name == "aten::_local_scalar_dense" else "sync", name)
        elif name in ("aten::index", "aten::index_put", "aten::index_put_",
                      "aten::_index_put_impl_") and any(
                isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
                for i in tree_flatten(args[1])[0]):
            self._record("sync", f"{name} with a boolean mask (nonzero)")

    def _tag_outputs(self, out: Any, args: Any, tags: list[Any], on_device: bool,
                     name: str) -> None:
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if on_device:
            new: Any = DEVICE
            mutated = args[0] if args and isinstance(args[0], torch.Tensor) else None
            if mutated is not None and any(o is mutated for o in outs) \
                    and self.tag(mutated) not in (DEVICE, None) and name.endswith("_"):
                self._record("d2h", f"{name}: device data written into a host tensor")
                new = self.tag(mutated)
        elif HOST in tags:
            new = HOST
        else:
            moved = [tg for tg in tags if isinstance(tg, _Moved)]
            new = _Moved(frozenset().union(*(m.ids for m in moved))) if moved else None
        if new is None:
            return
        for o in outs:
            if self.tag(o) != DEVICE or new == DEVICE:
                self.tags[o] = new

    # -- what never reaches the dispatcher -------------------------------------------------
    def __enter__(self) -> TransferCounter:
        super().__enter__()
        counter = self
        T = torch.Tensor

        def target(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            """The device a ``.to`` call names (a device, a string, or a tensor's), or
            None when it names only a dtype."""
            if kwargs.get("device") is not None:
                return kwargs["device"]
            for a in args:
                if isinstance(a, (torch.device, str, int)) and not isinstance(a, bool):
                    return a
                if isinstance(a, torch.Tensor):
                    return a
            return None

        def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            out = orig_to(self, *args, **kwargs)
            dest = target(args, kwargs)
            src = counter.tag(self)
            if dest is None:
                return out
            if _host_literal(dest):  # .to("cpu"): to the host
                if src == DEVICE or isinstance(src, _Moved):
                    counter._record("d2h", "Tensor.to('cpu')")
                new: Any = HOST
            elif src == DEVICE or isinstance(src, _Moved):
                return out  # already there (or on its way)
            elif isinstance(dest, torch.Tensor) and counter.tag(dest) != DEVICE:
                return out
            else:
                new = counter._moved()
            if out is self:  # same device on the CPU: an alias of its own for the tag
                out = out.view_as(out)
            counter.tags[out] = new
            return out

        def cpu(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            if counter.tag(self) == DEVICE:
                counter._record("d2h", "Tensor.cpu")
            out = orig_cpu(self, *args, **kwargs)
            if out is self:
                out = out.detach()
            counter.tags[out] = HOST
            return out

        def reader(orig: Callable[..., Any], what: str) -> Callable[..., Any]:
            @functools.wraps(orig)
            def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
                if counter.tag(self) == DEVICE or isinstance(counter.tag(self), _Moved):
                    counter._record("d2h", what)
                return orig(self, *args, **kwargs)
            return read

        def new_tensor(self: torch.Tensor, data: Any, *args: Any, **kwargs: Any) -> Any:
            out = orig_new_tensor(self, data, *args, **kwargs)
            if (kwargs.get("device") is not None
                    or counter.tag(self) == DEVICE) and not isinstance(data, torch.Tensor):
                counter._record("h2d", "Tensor.new_tensor from host data")
                counter.tags[out] = DEVICE
            else:
                counter.tags[out] = HOST
            return out

        def creator(orig: Callable[..., Any], from_data: bool) -> Callable[..., Any]:
            @functools.wraps(orig)
            def create(*args: Any, **kwargs: Any) -> Any:
                out = orig(*args, **kwargs)
                if not isinstance(out, torch.Tensor):
                    return out
                g = kwargs.get("generator")
                data = args[0] if args else kwargs.get("data")
                if from_data and isinstance(data, torch.Tensor) and out is data:
                    return out  # as_tensor of a tensor: itself, its tag kept
                if g is not None and g.device.type == "cpu":
                    counter.tags[out] = HOST  # a CPU generator draws on the host
                elif kwargs.get("device") is not None and not _host_literal(kwargs["device"]):
                    counter.tags[out] = counter._moved() if from_data else DEVICE
                else:
                    counter.tags[out] = HOST
                return out
            return create

        def one_hot(tensor: torch.Tensor, num_classes: int = -1) -> torch.Tensor:
            # the CPU kernel reads min and max back to check the labels; the CUDA one does
            # not when the number of classes is given, relying on scatter's device-side
            # assert (pytorch aten/src/ATen/native/Onehot.cpp)
            counter._quiet += num_classes >= 0
            try:
                return orig_one_hot(tensor, num_classes)
            finally:
                counter._quiet -= num_classes >= 0

        orig_one_hot = torch.nn.functional.one_hot
        self._patch(torch.nn.functional, "one_hot", one_hot)
        orig_to, orig_cpu, orig_new_tensor = T.to, T.cpu, T.new_tensor
        self._patch(T, "to", to)
        self._patch(T, "cpu", cpu)
        self._patch(T, "new_tensor", new_tensor)
        for meth in ("tolist", "numpy", "__array__"):
            self._patch(T, meth, reader(getattr(T, meth), f"Tensor.{meth}"))
        for fname in _FACTORIES:
            self._patch(torch, fname, creator(getattr(torch, fname), False))
        for fname in ("tensor", "as_tensor"):
            self._patch(torch, fname, creator(getattr(torch, fname), True))
        return self

    def _patch(self, owner: Any, name: str, new: Any) -> None:
        had = name in vars(owner)
        self._patches.append((owner, name, vars(owner).get(name), had))
        setattr(owner, name, new)

    def __exit__(self, *exc: Any) -> None:
        for owner, name, old, had in reversed(self._patches):
            if had:
                setattr(owner, name, old)
            else:
                delattr(owner, name)
        self._patches.clear()
        super().__exit__(*exc)

    # -- results ---------------------------------------------------------------------------
    def count(self, phase: str | None = None) -> int:
        return sum(1 for e in self.events if phase is None or e.phase == phase)

    def summary(self, phase: str | None = None) -> str:
        lines = [f"{e.kind} {e.what} at {e.where}" for e in self.events
                 if phase is None or e.phase == phase]
        return "\n".join(lines) or "(none)"

    @contextmanager
    def counting_as(self, phase: str) -> Iterator[None]:
        old = self.counting, self.phase
        self.counting, self.phase = True, phase
        try:
            yield
        finally:
            self.counting, self.phase = old


# ---------------------------------------------------------------------------------------
# the step through the epoch loop's own code, counted on the CPU


@dataclass
class StepTransfers:
    """What :func:`count_step_transfers` saw: per step (the most, and the mean) and at the
    epoch's end (the loop's one read of the finite check)."""

    per_step: list[int]
    epoch_end: int
    events: list[Event] = field(default_factory=list)

    @property
    def max_per_step(self) -> int:
        return max(self.per_step) if self.per_step else 0

    def describe(self) -> str:
        return "\n".join(f"[{e.phase}] {e.kind} {e.what} at {e.where}"
                         for e in self.events) or "(none)"


def count_step_transfers(method: Any, bundle: Any, cfg: Any, steps: int = 3,
                         warmup: int = 2, seed: int = 0) -> StepTransfers:
    """Run ``warmup`` then ``steps`` optimiser steps of ``method`` on ``bundle`` through
    the epoch loop (``scarcelab.train._EpochLoop._steps``: ``BatchSource.next`` and
    ``optimizer_step`` in the finite-check context) under a :class:`TransferCounter`, on
    the CPU, with the host parameters packed as on CUDA (``augment.PACK_ON_CPU``).
    ``cfg`` is a ``TrainConfig`` on the CPU; its ``max_steps_per_epoch`` is overridden."""
    import dataclasses

    import numpy as np

    from scarcelab import train as T
    from scarcelab.data import augment as A

    if torch.device(cfg.device).type != "cpu":
        raise ValueError("count_step_transfers emulates a device on the CPU; on CUDA use "
                         "cuda_syncs_per_step")
    cfg = dataclasses.replace(cfg, max_steps_per_epoch=max(steps, warmup, 1))
    old_pack = getattr(A, "PACK_ON_CPU", False)
    A.PACK_ON_CPU = True
    getattr(A, "_CONSTANTS", {}).clear()  # device constants are made (and tagged) anew
    try:
        loop = T._EpochLoop(method, bundle, cfg, T.Budget(1e12),
                            torch.Generator().manual_seed(seed), np.random.default_rng(seed))
        src = loop.source
        counter = TransferCounter([method, src.xl, src.yl, src.xu, loop.opt])
        if getattr(method, "class_weights", None) is not None:
            counter.mark_device(method.class_weights)
        if not hasattr(src, "draw") and getattr(src, "sizes", None) is not None:
            counter.mark_device(src.sizes)  # kept on the device before the split
        per_step: list[int] = []
        orig_next, orig_step = src.next, T.optimizer_step

        def next_batch() -> Any:  # a step's events: from its batch to its update's end
            if counter.counting:
                counter.phase = f"step {len(per_step)}"
                per_step.append(0)
            return orig_next()

        def step(*args: Any, **kwargs: Any) -> Any:
            out = orig_step(*args, **kwargs)
            if counter.counting:
                counter.phase = f"after step {len(per_step) - 1}"
            return out

        src.next = next_batch  # type: ignore[method-assign]
        T.optimizer_step = step
        try:
            with counter:
                loop.spe = warmup
                loop._steps(0)
                loop.spe = steps
                counter.counting = True
                try:
                    loop._steps(1)
                finally:
                    counter.counting = False
        finally:
            T.optimizer_step = orig_step
        # what follows the last step's update is the epoch's end (the finite check);
        # what follows an earlier one is that step's (the loss sums)
        last = f"after step {len(per_step) - 1}"
        for e in counter.events:
            if e.phase == last:
                e.phase = "epoch end"
            elif e.phase.startswith(("step ", "after step ")):
                per_step[int(e.phase.split()[-1])] += 1
        end = sum(1 for e in counter.events if e.phase == "epoch end")
        return StepTransfers(per_step, end, list(counter.events))
    finally:
        A.PACK_ON_CPU = old_pack


# ---------------------------------------------------------------------------------------
# on a real GPU


@dataclass
class SyncCount:
    """CUDA's own count of synchronising calls (``set_sync_debug_mode``) per optimiser
    step and per epoch (the loop's epoch-end read), or ``None`` where nothing was
    measured (then ``note`` says why)."""

    device: str
    per_step: float | None
    per_epoch: float | None
    note: str = ""
    sources: list[str] = field(default_factory=list)


def count_cuda_syncs(fn: Callable[[], Any]) -> tuple[int, list[str]]:
    """The synchronising CUDA calls ``fn`` makes, as CUDA reports them
    (``set_sync_debug_mode("warn")``), and where each came from."""
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    hits = [w for w in rec if "synchroniz" in str(w.message)]
    return len(hits), [f"{w.filename}:{w.lineno}" for w in hits]


def cuda_syncs_per_step(method: Any, bundle: Any, cfg: Any, steps: tuple[int, int] = (2, 6),
                        warmup: int = 2, seed: int = 0) -> SyncCount:
    """Synchronising CUDA calls per optimiser step of ``method`` on ``bundle`` through the
    epoch loop's own ``_steps``, on ``cfg.device``, as CUDA reports them under
    ``torch.cuda.set_sync_debug_mode("warn")``.

    Two epochs of ``steps[0]`` and ``steps[1]`` steps (after ``warmup`` steps) separate
    the per-step count from the per-epoch one (the finite check's read): syncs =
    steps·per_step + per_epoch. Not a CUDA device: nothing is measured (``per_step`` is
    None; the CPU count is :func:`count_step_transfers`)."""
    import numpy as np

    from scarcelab import train as T

    device = torch.device(cfg.device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return SyncCount(str(device), None, None,
                         note="not measured: CUDA reports syncs only on a CUDA device "
                              "(on the CPU, count_step_transfers counts them)")
    loop = T._EpochLoop(method, bundle, cfg, T.Budget(1e12),
                        torch.Generator().manual_seed(seed), np.random.default_rng(seed))
    loop.spe = warmup
    loop._steps(0)
    totals, sources = [], []
    for i, n in enumerate(steps):
        loop.spe = n
        c, where = count_cuda_syncs(lambda e=i + 1: loop._steps(e))
        totals.append(c)
        sources += where
    a, b = steps
    per_step = (totals[1] - totals[0]) / (b - a)
    per_epoch = totals[0] - a * per_step
    return SyncCount(str(device), per_step, per_epoch,
                     note=f"{totals[0]} syncs in {a} steps, {totals[1]} in {b}",
                     sources=sorted(set(sources)))


def cuda_rule_check(device: str = "cuda") -> dict[str, tuple[int | None, bool]]:
    """The :class:`TransferCounter`'s rules against CUDA itself: per case, the syncs CUDA
    reports (``set_sync_debug_mode``) and whether the counter counts that case. A case
    where CUDA reports a sync the counter does not count is a hole in the CPU test. On a
    machine without CUDA every count is None."""
    cases: dict[str, tuple[Callable[[torch.Tensor, torch.Tensor], Any], bool]] = {
        "pageable .to(device)": (lambda x, y: torch.rand(64).to(x.device), True),
        "pinned .to(device, non_blocking=True), once": (
            lambda x, y: torch.rand(64).pin_memory().to(x.device, non_blocking=True), True),
        ".item()": (lambda x, y: x.sum().item(), True),
        "bool(t)": (lambda x, y: bool(x.sum() > 0), True),
        ".tolist()": (lambda x, y: y.tolist(), True),
        "bincount": (lambda x, y: torch.bincount(y, minlength=4), True),
        "boolean mask": (lambda x, y: x[x > 0.5], True),
        "unique": (lambda x, y: torch.unique(y), True),
        "linalg.svdvals": (lambda x, y: torch.linalg.svdvals(x.view(8, 8)), True),
        "new_tensor(0.5)": (lambda x, y: x.new_tensor(0.5), True),
        "torch.tensor([...], device=)": (lambda x, y: torch.tensor([1.0, 2.0], device=x.device),
                                         True),
        "one_hot(y, num_classes)": (lambda x, y: torch.nn.functional.one_hot(y, 4), False),
        "where(c, python float, t)": (lambda x, y: torch.where(x > 0.5, 1.0, x), False),
        "t * 0-dim CPU tensor": (lambda x, y: x * torch.tensor(2.0), False),
        "t[i] = python float": (lambda x, y: x.clone().__setitem__(1, 5.0), False),
        "new_full((), 0.5)": (lambda x, y: x.new_full((), 0.5), False),
        "index_put_ with long indices": (
            lambda x, y: x.clone().index_put_((y,), x[: len(y)]), False),
        "argsort(stable) of uint8": (
            lambda x, y: torch.argsort((x > 0.5).to(torch.uint8), stable=True), False),
        "scatter_add_": (lambda x, y: torch.zeros(4, dtype=torch.long, device=x.device)
                         .scatter_add_(0, y, torch.ones_like(y)), False),
    }
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return {k: (None, c) for k, (_, c) in cases.items()}
    x = torch.rand(64, device=device)
    y = torch.randint(0, 4, (16,), device=device)
    out = {}
    for name, (fn, counted) in cases.items():
        fn(x, y)  # warm-up: first-call allocations and library loads are not the case
        n, _ = count_cuda_syncs(lambda f=fn: f(x, y))
        out[name] = (n, counted)
    return out


__all__ = ["DEVICE", "HOST", "Event", "StepTransfers", "SyncCount", "TransferCounter",
           "count_cuda_syncs", "count_step_transfers", "cuda_rule_check",
           "cuda_syncs_per_step"]
