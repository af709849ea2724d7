"""Issue 40 item 3 on a GPU: what the CPU tests cannot see (skipped without CUDA). Imports
only the core (no MLflow, no Optuna), so that it runs on a bare GPU machine too."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from scarcelab.methods import get_method
from scarcelab.metrics.diagnostics import DiagnosticsConfig, EpochDiagnostics
from scarcelab.models import create_model
from scarcelab.probe import TorchLinearProbe
from scarcelab.train import (
    EvalSets,
    TrainConfig,
    checkpoint_to_host,
    evaluate,
    snapshot,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = torch.device("cuda")


class _Copies(TorchFunctionMode):
    """Every device-to-host copy or read (``.cpu()``, ``.item()``, ``bool()`` …)."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.n += getattr(func, "__name__", "") in {"cpu", "item", "tolist", "__bool__",
                                                     "__float__", "__int__"}
        return func(*args, **(kwargs or {}))


def _method(name: str, bundle, device: torch.device, arch: str = "small_cnn"):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    cls = get_method(name)
    m = cls(create_model(arch, in_channels=1), bundle.num_classes, dict(cls.defaults))
    return m.to(device)


def test_a_snapshot_costs_one_copy_of_the_weights_on_the_device(tiny_bundle):
    m = _method("sup", tiny_bundle, CUDA, "resnet18")
    nbytes = sum(v.numel() * v.element_size() for v in m.state_dict().values())
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with _Copies() as reads:
        s = snapshot(m, None, {"epoch": 0})
    torch.cuda.synchronize()
    grown = torch.cuda.memory_allocated() - before
    assert reads.n == 0
    assert all(t.is_cuda for t in s["state_dict"].values())
    assert nbytes <= grown <= nbytes + 512 * len(s["state_dict"])  # allocator rounding
    h = checkpoint_to_host(s)
    assert all(t.device.type == "cpu" for t in h["state_dict"].values())
    assert all(torch.equal(h["state_dict"][k], v.cpu()) for k, v in m.state_dict().items())
    del s
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before  # held by the snapshot only


@pytest.mark.parametrize("name,solver,reads", [("sup", "sklearn", 1), ("simclr", "sklearn", 1)])
def test_evaluation_on_the_gpu_reads_once_and_agrees_with_the_cpu(tiny_bundle, name, solver,
                                                                    reads):
    m = _method(name, tiny_bundle, CUDA)
    cfg = TrainConfig(device="cuda", eval_batch_size=7, probe_solver=solver)
    sets = EvalSets(tiny_bundle, CUDA, m.linear_probe)
    assert sets.val.is_cuda and sets.test.is_cuda
    with _Copies() as c:
        ev = evaluate(m, tiny_bundle, cfg, np.random.default_rng(0), sets)
    assert c.n == reads
    m_cpu = copy.deepcopy(m).cpu()
    ref = evaluate(m_cpu, tiny_bundle, TrainConfig(eval_batch_size=7, probe_solver=solver),
                   np.random.default_rng(0))
    np.testing.assert_allclose(ev.test_proba, ref.test_proba, atol=1e-4)


def test_the_torch_probe_on_the_gpu_chooses_what_it_chooses_on_the_cpu():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 600)
    x = (rng.normal(0, 0.4, (2, 64))[y] + rng.normal(0, 1, (600, 64))).astype(np.float32)
    for seed in range(3):
        a = TorchLinearProbe(2, balanced=True).fit(x[:200], y[:200], x[200:400], y[200:400],
                                                   np.random.default_rng(seed))
        xg = torch.as_tensor(x, device=CUDA)
        b = TorchLinearProbe(2, balanced=True).fit(xg[:200], y[:200], xg[200:400],
                                                   y[200:400], np.random.default_rng(seed))
        assert a.C == b.C and a.val_balanced_accuracy == b.val_balanced_accuracy
        assert b.coef is not None and b.coef.is_cuda
        np.testing.assert_allclose(b.predict_proba(xg[400:]), a.predict_proba(x[400:]),
                                   atol=1e-9)


def test_the_diagnostics_scratch_on_the_gpu_matches_a_fresh_copy(tiny_bundle):
    from scarcelab.methods.base import Progress
    from scarcelab.metrics.diagnostics import gradient_alignment

    m = _method("fixmatch", tiny_bundle, CUDA)
    diag = EpochDiagnostics(tiny_bundle, "cuda", DiagnosticsConfig(n_unlabeled=64))
    for epoch in range(2):
        new = diag.grad_align(m, epoch)
        probe = copy.deepcopy(m)
        probe.train()
        with torch.random.fork_rng(devices=[0]):
            losses = probe.step(diag._batch(probe), Progress(0, 1, epoch))
        old = gradient_alignment(losses["loss_labeled"], losses["loss_unlabeled"],
                                 probe.head.weight)
        assert (math.isnan(old) and math.isnan(new)) or abs(old - new) <= 1e-6
        with torch.no_grad():
            m.head.weight.mul_(1.5)  # the model moves between epochs
