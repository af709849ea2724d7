"""One GPU for a day: where scarcelab's GPU time goes, beside the model-only limit and the
peers users know (issue 40 item 6). One command, sized to fit one 10-minute call on a
fresh GPU machine; ``--dry-run`` runs every section at toy sizes on the CPU (CI's smoke).

Sections, each in a fresh process (a crash or a hang costs one section, not the run; GPU
memory is returned between them), in this order:

``env``        the card, torch, and two ceilings measured here: a bf16 matrix product
               (TFLOP/s) and a device-to-device copy (GB/s).
``model``      the model-only limit of one FixMatch step (WRN-28-2, 64 + 448 + 448 images
               of 28x28x3) and one SimCLR step (ResNet-18, 2 x 256): forward, loss,
               backward, Adam on ready device tensors — fp32; bf16 autocast +
               channels_last; the bf16 step captured whole in a CUDA graph and replayed.
``ours``       scarcelab's production step, the training loop's own code
               (``_EpochLoop._steps``: batch draw, augmentation of uint8 images on the
               device, the method's step, the optimiser) for FixMatch / WRN-28-2 and
               SimCLR / ResNet-18 on real PneumoniaMNIST images (as 3 channels, like the
               peers), at the CPU defaults (fp32) and at the CUDA defaults; the number of
               synchronising CUDA calls per step (``torch.cuda.set_sync_debug_mode``).
``usb``        USB's FixMatch ``train_step`` + its parameter-update hook on ready device
               batches (``bench/peers.py``'s worker): USB's model speed.
``usb_loader`` USB as its users run it: its MedMNIST transforms (PIL weak / RandAugment
               strong views) in ``BasicDataset`` through its ``get_data_loader`` with
               ``--usb-workers`` DataLoader workers, ``process_batch`` to the device, then
               the same ``train_step`` + hook: what USB delivers end to end.
``lightly``    lightly's SimCLR loop (``bench/peers.py``'s worker) on ready batches.
``study``      real studies through ``run_study`` — FixMatch on PneumoniaMNIST and on
               BreastMNIST, SimCLR on PneumoniaMNIST — for ``--study-s`` seconds each:
               the per-epoch split (train / eval / probe / diagnostics / tracking / rest,
               from the trial's own ``time/*`` metrics and a timer around every tracker
               call) and the GPU's busy share (NVML ``utilization.gpu`` sampled at 20 Hz).
               The tracker is MLflow's (a local sqlite store) when mlflow imports, else
               the in-memory one (then "tracking" is ~0 and the report says which).
``pack``       1 vs ``--pack`` concurrent FixMatch training processes on one GPU
               (PneumoniaMNIST, WRN-28-2, CUDA defaults, each capped at 1/n of the
               memory): aggregate steps/s over the same window and the GPU's busy share.
``syncs``      every registered method's synchronising CUDA calls per step and per epoch
               through the loop (small batches), and the CPU transfer counter's rules
               checked against CUDA's own report: the GPU side of
               tests/core/methods/test_step_transfers.py.
``compile``    our FixMatch step again with ``--compile reduce-overhead`` (inductor + CUDA
               graphs; compilation in the warm-up): whether compiling pays for a long
               study. Last, so that the deadline cuts it first; not in ``--dry-run``.

Ratios printed at the end: ours / model-only bf16 limit (target: our step within 1.5x of
it), ours / USB end to end (target >= 2x), pack throughput / one study's (target >= 4x),
GPU busy in the PneumoniaMNIST FixMatch study (target >= 70 %). The last line is
``key=value`` pairs (DESIGN §5). Results also go to ``--out``/gpu.json as each section
ends, so a run cut short keeps what it measured.

    .venv/bin/python bench/gpu.py --dry-run                    # CPU, toy sizes, ~1-2 min
    python3 bench/gpu.py --data DIR --out $OUT                 # on the GPU machine
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from scarcelab.tracker import DelegatingTracker

REPO = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
SECTIONS = ("env", "model", "ours", "usb", "usb_loader", "lightly", "study", "pack",
            "syncs", "compile")
RESULT = "RESULT "


# --------------------------------------------------------------------------- sizes
def sizes(a: argparse.Namespace) -> dict[str, int]:
    """The peers' batch composition (bench/peers.py), shrunk by ``--scale``."""
    def s(n: int) -> int:
        return max(2, round(n * a.scale))
    return {"labeled": s(64), "unlabeled": s(448), "views": s(256)}


def _sync(device: str) -> None:
    import torch
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(step: Callable[[int], Any], warmup: int, steps: int, device: str) -> dict[str, float]:
    """Steps/s of ``step`` after ``warmup`` calls (compilation, cuDNN autotuning and the
    allocator's first growth stay out of the figure); the device is synchronised before
    each clock read, never inside the timed loop."""
    t = time.perf_counter()
    for i in range(warmup):
        step(i)
    _sync(device)
    warm = time.perf_counter() - t
    t = time.perf_counter()
    for i in range(steps):
        step(warmup + i)
    _sync(device)
    dt = time.perf_counter() - t
    return {"steps_per_s": steps / dt, "ms_per_step": 1e3 * dt / steps, "warmup_s": warm}


# --------------------------------------------------------------------------- data
def medmnist(name: str, a: argparse.Namespace) -> Any:
    """The real dataset through scarcelab's own loader (``--data``: a folder holding the
    npz files)."""
    from scarcelab.data import load_raw
    return load_raw(name, a.data)


def rgb_bundle(a: argparse.Namespace) -> Any:
    """PneumoniaMNIST's train images as three identical channels (the peers' 28x28x3,
    USB's ``as_rgb=True``) in a bundle: 512 labeled, the rest unlabeled."""
    import numpy as np

    from scarcelab.data.bundle import DatasetBundle
    raw = medmnist("pneumoniamnist", a)
    x = np.repeat(raw.train_x, 3, axis=1) if raw.train_x.shape[1] == 1 else raw.train_x
    y = raw.train_y.astype(np.int64)
    return DatasetBundle(x[:512], y[:512], x[512:], x[:64], y[:64], x[:64], y[:64],
                         meta={"num_classes": 2, "name": "pneumoniamnist-rgb"})


# --------------------------------------------------------------------------- sections
def section_env(a: argparse.Namespace) -> dict[str, Any]:
    import torch
    out: dict[str, Any] = {"torch": torch.__version__, "python": sys.version.split()[0],
                           "cpus": os.cpu_count()}
    if not a.device.startswith("cuda"):
        return {**out, "device": "cpu"}
    p = torch.cuda.get_device_properties(0)
    out.update(device=p.name, sms=p.multi_processor_count,
               memory_gib=round(p.total_memory / 2**30, 1),
               capability=f"{p.major}.{p.minor}", cuda=torch.version.cuda,
               cudnn=torch.backends.cudnn.version())
    n = 8192
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)
    for _ in range(3):
        x @ w
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(10):
        x @ w
    e1.record()
    torch.cuda.synchronize()
    out["bf16_matmul_tflops"] = 10 * 2 * n**3 / (e0.elapsed_time(e1) / 1e3) / 1e12
    buf = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(buf)
    dst.copy_(buf)
    torch.cuda.synchronize()
    e0.record()
    for _ in range(10):
        dst.copy_(buf)
    e1.record()
    torch.cuda.synchronize()
    out["copy_gbps"] = 10 * 2 * buf.numel() / (e0.elapsed_time(e1) / 1e3) / 1e9
    return out


def _model_parts(kind: str, a: argparse.Namespace) -> tuple[Any, int, int]:
    """The bare network of a FixMatch (WRN-28-2) or SimCLR (ResNet-18) step and its
    images per step."""
    import torch

    from scarcelab.models import create_model
    sz = sizes(a)
    torch.manual_seed(0)
    if kind == "fixmatch":
        net = create_model("wrn28_2", in_channels=3)
        head, n = torch.nn.Linear(net.num_features, 10), sz["labeled"] + 2 * sz["unlabeled"]
    else:
        net = create_model("resnet18", in_channels=3)
        head, n = torch.nn.Linear(net.num_features, 128), 2 * sz["views"]
    return torch.nn.Sequential(net, head), n, 10


def section_model(a: argparse.Namespace) -> dict[str, Any]:
    """fp32, bf16 + channels_last, and the bf16 step as one CUDA graph."""
    import torch
    import torch.nn.functional as F
    out: dict[str, Any] = {}
    cuda = a.device.startswith("cuda")
    for kind in ("fixmatch", "simclr"):
        for variant in ("fp32", "bf16_cl", "graph"):
            if variant == "graph" and not cuda:
                continue
            model, n, k = _model_parts(kind, a)
            model = model.to(a.device).train()
            cl = variant != "fp32"
            if cl:
                model = model.to(memory_format=torch.channels_last)
            opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=variant == "graph",
                                   fused=True if cuda else None)
            g = torch.Generator().manual_seed(0)
            xb = torch.randn(n, 3, 28, 28, generator=g).to(a.device)
            if cl:
                xb = xb.contiguous(memory_format=torch.channels_last)
            yb = torch.randint(0, k, (n,), generator=g).to(a.device)
            amp = variant != "fp32"

            def loss_fn(model: Any = model, xb: Any = xb, yb: Any = yb, amp: bool = amp,
                        kind: str = kind) -> Any:
                with torch.autocast(a.device.split(":")[0], torch.bfloat16, enabled=amp):
                    o = model(xb)
                    if kind == "fixmatch":
                        return F.cross_entropy(o, yb)
                    return o.float().square().mean()

            def step(i: int, model: Any = model, opt: Any = opt, loss_fn: Any = loss_fn
                     ) -> None:
                opt.zero_grad(set_to_none=True)
                loss_fn().backward()
                opt.step()

            if variant == "graph":
                torch.backends.cudnn.benchmark = True
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for i in range(3):
                        step(i)
                torch.cuda.current_stream().wait_stream(s)
                graph = torch.cuda.CUDAGraph()
                # grads set to None before capture: backward inside the graph then writes
                # them (from the graph's pool) instead of accumulating across replays
                opt.zero_grad(set_to_none=True)
                with torch.cuda.graph(graph):
                    loss_fn().backward()
                    opt.step()

                def step(i: int, graph: Any = graph) -> None:  # noqa: F811 - the replay
                    graph.replay()

            out[f"{kind}_{variant}"] = timed(step, a.warmup, a.steps, a.device)
            del model, opt
            if cuda:
                torch.cuda.empty_cache()
    return out


#: the precision/kernel profiles the bench compares (scarcelab.accel): ``cpu`` = what
#: scarcelab does on a CPU (fp32, channels-last weights only, no fused kernel, no TF32), run
#: on the GPU as the "before" of the CUDA defaults; ``cuda`` = ``auto`` on CUDA (bf16,
#: channels-last weights and inputs, cuDNN benchmark, fused Adam, TF32); ``compile`` = the
#: CUDA defaults plus ``torch.compile(mode="reduce-overhead")`` (CUDA graphs)
PROFILES = {
    "cpu": {"precision": "fp32", "channels_last": "weights", "cudnn_benchmark": "off",
            "fused_optimizer": "off", "tf32": "off", "compile": "off"},
    "cuda": {},
    "compile": {"compile": "reduce-overhead"},
}


def _accel(profile: str, device: str) -> Any:
    """The :class:`scarcelab.accel.Accel` of a profile (unresolved: the loop resolves it
    for its device, as a study does); None for a checkout older than the settings (then
    its only behaviour, the ``cpu`` profile, runs: ``--code`` measures such a "before")."""
    import dataclasses

    from scarcelab.train import TrainConfig
    if "accel" not in {f.name for f in dataclasses.fields(TrainConfig)}:
        return None
    from scarcelab.accel import Accel
    return Accel(**PROFILES[profile])


def production_loop(method: str, arch: str, bundle: Any, device: str, profile: str,
                    bl: int, bu: int, steps: int) -> Any:
    """The training loop's own objects for ``method`` on ``bundle`` (what a study trial
    builds), capped at ``steps`` steps per call of ``_steps``."""
    import numpy as np
    import torch

    from scarcelab.methods import get_method
    from scarcelab.models import create_model
    from scarcelab.train import Budget, TrainConfig, _EpochLoop
    cls = get_method(method)
    torch.manual_seed(0)
    m = cls(create_model(arch, in_channels=bundle.channels), bundle.num_classes, {})
    accel = _accel(profile, device)
    cfg = TrainConfig(max_epochs=10**6, patience=10**6, device=device,
                      max_steps_per_epoch=steps, batch_labeled=bl, batch_unlabeled=bu,
                      **({} if accel is None else {"accel": accel}))
    return _EpochLoop(m, bundle, cfg, Budget(1e9), torch.Generator().manual_seed(0),
                      np.random.default_rng(0))


def count_syncs(fn: Callable[[], Any], device: str) -> int | None:
    """Synchronising CUDA calls made by ``fn`` (scarcelab.devsync's count, CUDA's own
    report); None on the CPU."""
    if not device.startswith("cuda"):
        return None
    from scarcelab.devsync import count_cuda_syncs
    return count_cuda_syncs(fn)[0]


def section_syncs(a: argparse.Namespace) -> dict[str, Any]:
    """Every registered method's syncs per step and per epoch on the real device, at small
    batches (``scarcelab.devsync.cuda_syncs_per_step``: the loop's own ``_steps``), and
    the CPU counter's rules checked against CUDA (``cuda_rule_check``): the GPU side of
    tests/core/methods/test_step_transfers.py."""
    import numpy as np
    import torch

    from scarcelab.data.bundle import DatasetBundle
    from scarcelab.devsync import cuda_rule_check, cuda_syncs_per_step
    from scarcelab.methods import METHODS, get_method
    from scarcelab.models import create_model
    from scarcelab.train import TrainConfig
    raw = medmnist("pneumoniamnist", a)  # on a CPU (dry run): every count is None
    x, y = raw.train_x[:600], raw.train_y[:600].astype(np.int64)
    bundle = DatasetBundle(x[:100], y[:100], x[100:], x[:50], y[:50], x[:50], y[:50],
                           meta={"num_classes": 2, "name": "pneumoniamnist"})
    out: dict[str, Any] = {}
    for name in METHODS.names():
        cls = get_method(name)
        try:
            torch.manual_seed(0)
            m = cls(create_model("small_cnn", in_channels=1), 2, {})
            cfg = TrainConfig(device=a.device, batch_labeled=8, batch_unlabeled=16,
                              max_epochs=10**6, patience=10**6)
            got = cuda_syncs_per_step(m, bundle, cfg)
            out[name] = {"per_step": got.per_step, "per_epoch": got.per_epoch,
                         "sources": got.sources[:4]}
        except Exception as e:  # noqa: BLE001 - one method's failure is reported, not fatal
            out[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
    out["rules"] = {k: {"cuda": n, "counted": c} for k, (n, c) in cuda_rule_check(
        a.device).items()}
    return out


def section_ours(a: argparse.Namespace, profiles: tuple[str, ...] = ("cpu", "cuda"),
                 methods: tuple[str, ...] = ("fixmatch", "simclr")) -> dict[str, Any]:
    bundle = rgb_bundle(a)
    sz = sizes(a)
    out: dict[str, Any] = {}
    plan = {"fixmatch": ("wrn28_2", sz["labeled"], sz["unlabeled"]),
            "simclr": ("resnet18", 0, sz["views"])}
    for method in methods:
        arch, bl, bu = plan[method]
        for profile in profiles:
            loop = production_loop(method, arch, bundle, a.device, profile, bl, bu, a.steps)
            loop.spe = a.warmup  # the loop's steps per call of _steps
            t0 = time.perf_counter()
            loop._steps(0)
            _sync(a.device)
            warm_s = time.perf_counter() - t0
            loop.spe = a.steps
            t0 = time.perf_counter()
            got = loop._steps(1)
            _sync(a.device)
            dt = time.perf_counter() - t0
            k = max(1, min(5, a.steps))
            loop.spe = k
            syncs = count_syncs(lambda loop=loop: loop._steps(2), a.device)
            out[f"{method}_{profile}"] = {
                "steps_per_s": got.n / dt, "ms_per_step": 1e3 * dt / max(got.n, 1),
                "warmup_s": warm_s, "data_share": got.t_data / dt,
                "syncs_per_step": None if syncs is None else syncs / k,
                "accel": _accel_params(loop)}
    return out


def section_compile(a: argparse.Namespace) -> dict[str, Any]:
    """Our FixMatch step with the network compiled in CUDA-graph mode (its compilation is
    in the warm-up): whether ``compile`` pays for a long study."""
    a.warmup = max(a.warmup, 3)
    return section_ours(a, profiles=("compile",), methods=("fixmatch",))


def _accel_params(loop: Any) -> dict[str, str]:
    """The settings the loop resolved and ran with (what a study logs as params)."""
    resolved = getattr(loop.cfg, "resolved_accel", None)
    return resolved().params() if resolved else {"code": "before the settings: fp32"}


def _peers(module: str) -> Any:
    """bench/peers.py (the workers its CPU comparison runs), once ``module`` (the peer
    library) is importable; else :class:`Skip`."""
    import importlib.util
    if importlib.util.find_spec(module) is None:
        raise Skip(f"{module} is not installed (bash bench/install_peers.sh, or carry its "
                   "wheels: docs/performance.md)")
    sys.path.insert(0, str(BENCH))
    import peers
    return peers


class Skip(Exception):  # noqa: N818 - a section that cannot run here, with the reason
    """A section that cannot run on this machine; its reason is reported, not a failure."""


def _peer_args(a: argparse.Namespace) -> argparse.Namespace:
    return argparse.Namespace(scale=a.scale, device=a.device, warmup=a.warmup, steps=a.steps,
                              threads=a.threads)


def section_usb(a: argparse.Namespace) -> dict[str, Any]:
    p = _peers("semilearn")
    sps = p.worker_usb(_peer_args(a))
    return {"fixmatch_usb_step": {"steps_per_s": sps, "ms_per_step": 1e3 / sps,
                                  "warmup_s": p.WARMUP_S[-1] if p.WARMUP_S else None}}


def section_lightly(a: argparse.Namespace) -> dict[str, Any]:
    p = _peers("lightly")
    sps = p.worker_lightly(_peer_args(a))
    return {"simclr_lightly_step": {"steps_per_s": sps, "ms_per_step": 1e3 / sps,
                                    "warmup_s": p.WARMUP_S[-1] if p.WARMUP_S else None}}


def section_usb_loader(a: argparse.Namespace) -> dict[str, Any]:
    """USB end to end: its own datasets, transforms and DataLoader feed its train step."""
    p = _peers("semilearn")
    p._stub_missing(p.USB_OPTIONAL)
    import numpy as np
    import torchvision.transforms as transforms
    from semilearn.core.algorithmbase import AlgorithmBase
    from semilearn.core.utils import get_data_loader
    from semilearn.datasets.augmentation import RandAugment
    from semilearn.datasets.cv_datasets.datasetbase import BasicDataset

    sz = sizes(a)
    raw = medmnist("pneumoniamnist", a)
    imgs = np.repeat(raw.train_x, 3, axis=1).transpose(0, 2, 3, 1)  # HWC, as USB stores them
    imgs = np.ascontiguousarray(imgs)
    y = raw.train_y.astype(np.int64)
    # USB's MedMNIST recipe (semilearn/datasets/cv_datasets/medmnist.py get_medmnist):
    # weak = resize, h/v flips, reflect-padded crop; strong = weak + RandAugment(3, 5,
    # exclude_color_aug=True); normalised with mean = std = 0.5
    size, crop = 28, 0.875
    norm = transforms.Normalize((0.5,) * 3, (0.5,) * 3)
    base = [transforms.Resize(size), transforms.RandomHorizontalFlip(),
            transforms.RandomVerticalFlip(),
            transforms.RandomCrop(size, padding=int(size * (1 - crop)), padding_mode="reflect")]
    weak = transforms.Compose([*base, transforms.ToTensor(), norm])
    strong = transforms.Compose([*base, RandAugment(3, 5, exclude_color_aug=True),
                                 transforms.ToTensor(), norm])
    lb = BasicDataset("fixmatch", imgs[:512], y[:512], 2, weak, False, None)
    ulb = BasicDataset("fixmatch", imgs[512:], None, 2, weak, True, strong)
    AlgorithmBase.set_dataset = lambda self: None  # type: ignore[method-assign]
    AlgorithmBase.set_data_loader = lambda self: None  # type: ignore[method-assign]
    cuda = a.device.startswith("cuda")
    total = a.warmup + a.steps
    algo = p.usb_fixmatch(a, {"num_classes": 2, "num_labels": 512, "img_size": size,
                              "crop_ratio": crop, "dataset": "pneumoniamnist",
                              "batch_size": sz["labeled"],
                              "uratio": sz["unlabeled"] / sz["labeled"],
                              "num_train_iter": total, "num_workers": a.usb_workers})
    cfg = algo.args
    # USB's own loaders (RandomSampler with replacement over num_train_iter batches)
    dl_lb = get_data_loader(cfg, lb, cfg.batch_size, data_sampler=cfg.train_sampler,
                            num_iters=total, num_epochs=1, num_workers=a.usb_workers,
                            distributed=False)
    dl_ulb = get_data_loader(cfg, ulb, int(cfg.batch_size * cfg.uratio),
                             data_sampler=cfg.train_sampler, num_iters=total, num_epochs=1,
                             num_workers=a.usb_workers, distributed=False)
    it = zip(dl_lb, dl_ulb, strict=False)

    def to_cpu(**kw: Any) -> dict[str, Any]:
        """``process_batch`` for a CPU dry run (USB's own calls ``.cuda``): the same
        filtering of the batch's keys by ``train_step``'s arguments."""
        import inspect
        names = inspect.signature(algo.train_step).parameters
        return {k: v for k, v in kw.items() if k in names and v is not None}

    process = algo.process_batch if cuda else to_cpu

    def step(i: int) -> None:
        data_lb, data_ulb = next(it)
        # AlgorithmBase.train's loop body: process_batch moves the batch to the GPU
        algo.out_dict, algo.log_dict = algo.train_step(**process(**data_lb, **data_ulb))
        algo.call_hook("after_train_step", "ParamUpdateHook")
        algo.it += 1

    c0 = time.process_time()
    r = timed(step, a.warmup, a.steps, a.device)
    r["main_cpu_s_per_step"] = (time.process_time() - c0) / total
    r["workers"] = a.usb_workers
    return {"fixmatch_usb_loader": r}


# --------------------------------------------------------------------------- study
class GpuBusy:
    """NVML's ``utilization.gpu`` (the share of time a kernel ran) sampled on a thread,
    and the peak memory in use; nothing where NVML is absent (CPU, dry run)."""

    def __init__(self, hz: float = 20.0) -> None:
        self.hz, self.samples, self.mem = hz, [], 0
        self._stop = threading.Event()
        try:
            import pynvml
            pynvml.nvmlInit()
            self._nvml: Any = pynvml
            self._h = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # noqa: BLE001 - no NVML: the figure is reported as absent
            self._nvml = None

    def _run(self) -> None:
        while not self._stop.is_set():
            u = self._nvml.nvmlDeviceGetUtilizationRates(self._h)
            self.samples.append((time.perf_counter(), u.gpu))
            self.mem = max(self.mem, self._nvml.nvmlDeviceGetMemoryInfo(self._h).used)
            self._stop.wait(1.0 / self.hz)

    @contextlib.contextmanager
    def sampling(self) -> Iterator[GpuBusy]:
        t = None
        if self._nvml is not None:
            t = threading.Thread(target=self._run, daemon=True)
            t.start()
        try:
            yield self
        finally:
            self._stop.set()
            if t is not None:
                t.join()

    def result(self, window: tuple[float, float] | None = None) -> dict[str, Any]:
        """The mean busy share over the samples (those inside ``window``, two
        ``time.perf_counter`` values, when given)."""
        got = [u for t, u in self.samples if window is None or window[0] <= t <= window[1]]
        if not got:
            return {"gpu_busy": None, "gpu_mem_gib": None}
        return {"gpu_busy": statistics.mean(got) / 100.0, "gpu_mem_gib": self.mem / 2**30,
                "samples": len(got)}


class TimedTracker(DelegatingTracker):
    """Times the calls a training epoch makes (metrics, checkpoints, tags) and the
    trial's span, from its ``start_trial`` to its ``end_trial``."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.track_s, self.trial_s, self._t0 = 0.0, 0.0, 0.0
        self.window = (0.0, 0.0)  # the last trial's span, perf_counter seconds

    @contextlib.contextmanager
    def _timing(self) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.track_s += time.perf_counter() - t

    def start_trial(self, number: int, tags: dict[str, str], params: dict[str, Any]
                    ) -> None:
        super().start_trial(number, tags, params)
        self._t0 = time.perf_counter()

    def end_trial(self, status: str, error: str | None = None) -> None:
        self.trial_s += time.perf_counter() - self._t0
        self.window = (self._t0, time.perf_counter())
        super().end_trial(status, error)

    def log_metrics(self, metrics: dict[str, float], step: int, scope: str = "trial"
                    ) -> None:
        with self._timing():
            super().log_metrics(metrics, step, scope)

    def log_checkpoint(self, checkpoint: dict[str, Any], name: str = "best.pt") -> None:
        with self._timing():
            super().log_checkpoint(checkpoint, name)

    def set_tags(self, tags: dict[str, str], scope: str = "study") -> None:
        with self._timing():
            super().set_tags(tags, scope)


def _tracker(tmp: Path) -> tuple[Any, str]:
    """MLflow's tracker on a local sqlite store where mlflow imports, else in-memory;
    wrapped so that the trial's wall time and every tracking call inside it are timed."""
    from scarcelab.tracker import InMemoryTracker
    try:
        from scarcelab.tracking.mlflow_tracker import MlflowTracker
        inner: Any = MlflowTracker(experiment="gpu-bench",
                                   tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}")
        kind = "mlflow-sqlite"
    except Exception as e:  # noqa: BLE001 - no (working) mlflow here: say so, go on
        inner, kind = InMemoryTracker(), f"in-memory ({type(e).__name__}: {e})"

    return TimedTracker(inner), kind


def one_study(a: argparse.Namespace, method: str, dataset: str, seconds: float,
              tmp: Path) -> dict[str, Any]:
    """A real study for ``seconds`` (one trial, the paper's batch sizes, WRN-28-2 or
    ResNet-18 as on a GPU) and where each epoch's time went."""
    from scarcelab.protocols.search import StudyConfig, run_study
    tracker, kind = _tracker(tmp)
    cfg_kw: dict[str, Any] = dict(
        method=method, dataset=dataset, data_dir=a.data, budget_minutes=seconds / 60.0,
        device=a.device, max_trials=1, arch=a.study_arch or "auto", patience=10**6,
        final_reserve_s=0.0)
    if a.dry_run:
        cfg_kw.update(batch_size=8, unlabeled_batch_size=16, max_steps_per_epoch=2,
                      max_epochs=3, diag_samples=32, arch="small_cnn")
    cfg = StudyConfig(**cfg_kw)  # accel: auto, resolved for the device as a study does
    busy = GpuBusy()
    t0 = time.perf_counter()
    with busy.sampling():
        res = run_study(cfg, tracker)
    wall = time.perf_counter() - t0
    metrics = _trial_metrics(tracker.inner)
    n_ep = max(1, len(metrics.get("time/epoch_s", [])))
    s = {k: sum(v) for k, v in metrics.items() if k.startswith("time/")}
    probe = s.get("time/probe_s", 0.0)
    evals = s.get("time/eval_s", 0.0) - probe
    train = s.get("time/epoch_s", 0.0) - s.get("time/eval_s", 0.0)
    diag = s.get("time/diag_s", 0.0)
    trial = tracker.trial_s
    rest = max(0.0, trial - train - evals - probe - diag - tracker.track_s)
    per = {"train": train, "eval": evals, "probe": probe, "diag": diag,
           "track": tracker.track_s, "rest": rest}
    return {"tracker": kind, "wall_s": wall, "trial_s": trial, "epochs": n_ep,
            "steps": int(sum(metrics.get("time/steps", []))),
            "per_epoch_s": {k: v / n_ep for k, v in per.items()},
            "share": {k: v / trial for k, v in per.items()} if trial else {},
            "best_val": res.best_val, **busy.result(tracker.window)}


def _trial_metrics(inner: Any) -> dict[str, list[float]]:
    """The trial's per-epoch ``time/*`` values from either tracker."""
    out: dict[str, list[float]] = {}
    trials = getattr(inner, "trials", None)
    if trials:  # the in-memory tracker
        for key, value, _ in trials[-1].metrics:
            out.setdefault(key, []).append(value)
        return out
    from mlflow import MlflowClient  # the MLflow tracker: read the trial run back
    c = MlflowClient()
    runs = c.search_runs([c.get_experiment_by_name("gpu-bench").experiment_id],
                         "tags.`scarcelab.role` = 'trial'", max_results=1,
                         order_by=["attributes.start_time DESC"])
    for key in ("time/epoch_s", "time/eval_s", "time/probe_s", "time/diag_s",
                "time/data_s", "time/steps"):
        hist = c.get_metric_history(runs[0].info.run_id, key) if runs else []
        out[key] = [m.value for m in hist]
    return out


def section_study(a: argparse.Namespace) -> dict[str, Any]:
    import tempfile
    out: dict[str, Any] = {}
    plan = (("fixmatch", "pneumoniamnist", a.study_s), ("fixmatch", "breastmnist",
                                                        a.study_s / 2),
            ("simclr", "pneumoniamnist", a.study_s / 2))
    for method, dataset, seconds in plan:
        with tempfile.TemporaryDirectory() as tmp:
            out[f"{method}_{dataset}"] = one_study(a, method, dataset, seconds, Path(tmp))
    return out


# --------------------------------------------------------------------------- pack
def section_packworker(a: argparse.Namespace) -> dict[str, Any]:
    """One of n packed processes: FixMatch on PneumoniaMNIST (its own channel count) for
    ``--pack-s`` seconds from a common start time."""
    import torch
    if a.device.startswith("cuda") and a.pack > 1:
        torch.cuda.set_per_process_memory_fraction(0.9 / a.pack)
    from scarcelab.data.splits import apply_split, make_split
    raw = medmnist("pneumoniamnist", a)
    bundle = apply_split(raw, make_split(raw, 400, 400, seed=a.worker_id))
    sz = sizes(a)
    loop = production_loop("fixmatch", a.study_arch or "wrn28_2", bundle, a.device,
                           "cuda" if a.device.startswith("cuda") else "cpu",
                           sz["labeled"], sz["unlabeled"], a.warmup)
    loop._steps(0)
    _sync(a.device)
    while time.time() < a.start_at:  # every process starts its window together
        time.sleep(0.01)
    n, t0, epoch = 0, time.perf_counter(), 1
    loop.spe = 1
    while time.perf_counter() - t0 < a.pack_s:
        n += loop._steps(epoch).n
        epoch += 1
    _sync(a.device)
    return {"steps": n, "seconds": time.perf_counter() - t0}


def section_pack(a: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in sorted({1, a.pack}):
        start_at = time.time() + a.pack_start_s
        procs = [_spawn("packworker", a, ["--pack", str(n), "--worker-id", str(i),
                                          "--start-at", str(start_at)],
                        threads=max(1, (os.cpu_count() or 2) // n)) for i in range(n)]
        busy = GpuBusy()
        time.sleep(max(0.0, start_at - time.time()))
        with busy.sampling():
            got = [_collect(p, a.pack_s + a.pack_start_s + 120) for p in procs]
        ok = [g for g in got if g and "steps" in g]
        agg = sum(g["steps"] / g["seconds"] for g in ok)
        out[f"n{n}"] = {"processes": n, "ok": len(ok), "steps_per_s": agg,
                        "per_process": [round(g["steps"] / g["seconds"], 3) for g in ok],
                        **busy.result()}
    one = out["n1"]["steps_per_s"]
    many = out[f"n{a.pack}"]["steps_per_s"]
    out["speedup"] = many / one if one else None
    return out


# --------------------------------------------------------------------------- driver
def _argv(a: argparse.Namespace) -> list[str]:
    keep = ("device", "scale", "steps", "warmup", "threads", "data", "usb_workers",
            "study_s", "study_arch", "pack", "pack_s", "pack_start_s", "code")
    out = []
    for k in keep:
        v = getattr(a, k)
        if v is not None and v != "":
            out += [f"--{k.replace('_', '-')}", str(v)]
    return out + (["--dry-run"] if a.dry_run else [])


def _spawn(section: str, a: argparse.Namespace, extra: list[str] | None = None,
           threads: int | None = None) -> subprocess.Popen[str]:
    code = str(Path(a.code).resolve()) if a.code else str(REPO)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [code, *([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])]),
        "PYTHONWARNINGS": "ignore", "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": str(threads or a.threads)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--section", section,
           *_argv(a), *(extra or [])]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=code)


def _collect(p: subprocess.Popen[str], timeout: float) -> dict[str, Any] | None:
    try:
        text, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        text, _ = p.communicate()
        print(f"    timed out after {timeout:.0f} s; last output:\n{text[-1500:]}", flush=True)
        return None
    for line in text.splitlines():
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT):])
    print(f"    failed (rc {p.returncode}):\n{text[-2500:]}", flush=True)
    return None


def run_sections(a: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"args": vars(a).copy()}
    out = Path(a.out) if a.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    for name in [s for s in a.sections.split(",") if s]:
        left = a.deadline_s - (time.time() - t_start)
        if left < 20:
            print(f"[gpu] {name}: skipped, {left:.0f} s left of --deadline-s", flush=True)
            results[name] = {"skipped": "deadline"}
            continue
        t0 = time.time()
        print(f"[gpu] {name} ...", flush=True)
        got = _collect(_spawn(name, a), timeout=min(left, a.section_timeout_s))
        results[name] = got if got is not None else {"failed": True}
        print(f"[gpu] {name}: {time.time() - t0:.1f} s {json.dumps(got)[:1500]}", flush=True)
        if out:
            (out / "gpu.json").write_text(json.dumps(results, indent=1, default=str))
    return results


def _get(d: dict[str, Any], *path: str) -> Any:
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d


def summary(r: dict[str, Any]) -> dict[str, Any]:
    """The headline ratios (issue 40's targets) from the sections' results."""
    s: dict[str, Any] = {}
    sps = {
        "model_fixmatch_fp32": _get(r, "model", "fixmatch_fp32", "steps_per_s"),
        "model_fixmatch_bf16": _get(r, "model", "fixmatch_bf16_cl", "steps_per_s"),
        "model_fixmatch_graph": _get(r, "model", "fixmatch_graph", "steps_per_s"),
        "model_simclr_bf16": _get(r, "model", "simclr_bf16_cl", "steps_per_s"),
        "ours_fixmatch_fp32": _get(r, "ours", "fixmatch_cpu", "steps_per_s"),
        "ours_fixmatch": _get(r, "ours", "fixmatch_cuda", "steps_per_s"),
        "ours_simclr": _get(r, "ours", "simclr_cuda", "steps_per_s"),
        "ours_fixmatch_compiled": _get(r, "compile", "fixmatch_compile", "steps_per_s"),
        "usb_step": _get(r, "usb", "fixmatch_usb_step", "steps_per_s"),
        "usb_loader": _get(r, "usb_loader", "fixmatch_usb_loader", "steps_per_s"),
        "lightly": _get(r, "lightly", "simclr_lightly_step", "steps_per_s"),
    }
    s.update({f"{k}_sps": v for k, v in sps.items() if v is not None})

    def ratio(key: str, num: str, den: str) -> None:
        if sps.get(num) and sps.get(den):
            s[key] = sps[num] / sps[den]
    ratio("ours_vs_model_bf16", "ours_fixmatch", "model_fixmatch_bf16")  # target >= 1/1.5
    ratio("ours_vs_usb_loader", "ours_fixmatch", "usb_loader")  # target >= 2
    ratio("ours_vs_usb_step", "ours_fixmatch", "usb_step")
    ratio("ours_simclr_vs_lightly", "ours_simclr", "lightly")
    ratio("compiled_vs_eager", "ours_fixmatch_compiled", "ours_fixmatch")
    syncs = _get(r, "ours", "fixmatch_cuda", "syncs_per_step")
    if syncs is not None:
        s["ours_syncs_per_step"] = syncs
    per = [v.get("per_step") for k, v in (r.get("syncs") or {}).items()
           if isinstance(v, dict) and k != "rules" and v.get("per_step") is not None]
    if per:
        s["methods_max_syncs_per_step"] = max(per)
    busy = _get(r, "study", "fixmatch_pneumoniamnist", "gpu_busy")
    if busy is not None:
        s["study_gpu_busy"] = busy  # target >= 0.70
    share = _get(r, "study", "fixmatch_pneumoniamnist", "share", "train")
    if share is not None:
        s["study_train_share"] = share
    sp = _get(r, "pack", "speedup")
    if sp is not None:
        s["pack_speedup"] = sp  # target >= 4
    return s


def table(r: dict[str, Any]) -> str:
    """A short human table, printed before the key=value line."""
    lines = [f"{'section/system':<36}{'steps/s':>10}{'ms/step':>10}  notes"]
    for sec in ("model", "ours", "compile", "usb", "usb_loader", "lightly"):
        for k, v in (r.get(sec) or {}).items():
            if isinstance(v, dict) and "steps_per_s" in v:
                note = ""
                if v.get("syncs_per_step") is not None:
                    note = f"syncs/step {v['syncs_per_step']:.1f}"
                lines.append(f"{sec + '/' + k:<36}{v['steps_per_s']:>10.2f}"
                             f"{v['ms_per_step']:>10.2f}  {note}")
    for k, v in (r.get("study") or {}).items():
        if isinstance(v, dict) and "per_epoch_s" in v:
            per = " ".join(f"{p}={x * 1e3:.0f}ms" for p, x in v["per_epoch_s"].items())
            busy = "-" if v.get("gpu_busy") is None else f"{v['gpu_busy']:.0%}"
            lines.append(f"study/{k:<30} {v['epochs']} epochs, busy {busy}, per epoch: {per}"
                         f" [{v['tracker'].split(' ')[0]}]")
    for k, v in (r.get("pack") or {}).items():
        if isinstance(v, dict):
            busy = "-" if v.get("gpu_busy") is None else f"{v['gpu_busy']:.0%}"
            lines.append(f"pack/{k:<31}{v['steps_per_s']:>10.2f}{'':>10}  "
                         f"{v['ok']}/{v['processes']} ok, busy {busy}")
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true",
                    help="every section at toy sizes on the CPU (CI's smoke)")
    ap.add_argument("--device", default="")
    ap.add_argument("--sections", default="",
                    help=f"comma-separated, of {', '.join(SECTIONS)} (default: all; "
                    "--dry-run leaves out compile, minutes of CPU compilation)")
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "medmnist"),
                    help="folder with pneumoniamnist.npz and breastmnist.npz")
    ap.add_argument("--out", default="", help="folder for gpu.json")
    ap.add_argument("--scale", type=float, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--usb-workers", type=int, default=None)
    ap.add_argument("--study-s", type=float, default=None)
    ap.add_argument("--study-arch", default="")
    ap.add_argument("--pack", type=int, default=None)
    ap.add_argument("--pack-s", type=float, default=None)
    ap.add_argument("--pack-start-s", type=float, default=None)
    ap.add_argument("--deadline-s", type=float, default=None,
                    help="sections not started by then are skipped (default 480; with "
                    "--dry-run 1800: a loaded 2-core CI machine runs the toy sizes slowly, "
                    "and no device minutes are at stake)")
    ap.add_argument("--section-timeout-s", type=float, default=None,
                    help="default 300 (--dry-run 900)")
    ap.add_argument("--code", default="",
                    help="run the sections against another checkout's scarcelab (e.g. the "
                    "commit before a change: git archive REV | tar -x -C DIR); the bench "
                    "itself stays this one")
    ap.add_argument("--section", default="", help=argparse.SUPPRESS)
    ap.add_argument("--worker-id", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    cpus = os.cpu_count() or 2
    full = {"device": "cuda", "scale": 1.0, "steps": 30, "warmup": 5, "threads": 4,
            "usb_workers": max(1, cpus - 2), "study_s": 45.0, "pack": 8, "pack_s": 15.0,
            "pack_start_s": 30.0, "deadline_s": 480.0, "section_timeout_s": 300.0}
    # one timed step: the dry run checks that every section runs, not how fast (bf16
    # autocast of a conv net takes ~17 s a step on this CPU)
    toy = {"device": "cpu", "scale": 1 / 16, "steps": 1, "warmup": 1, "threads": 1,
           "usb_workers": 1, "study_s": 6.0, "pack": 2, "pack_s": 2.0, "pack_start_s": 12.0,
           "deadline_s": 1800.0, "section_timeout_s": 900.0}
    for k, v in (toy if a.dry_run else full).items():
        if getattr(a, k) in (None, ""):
            setattr(a, k, v)
    a.data = str(Path(a.data).resolve())  # sections may run from another checkout (--code)
    if not a.sections:
        a.sections = ",".join(s for s in SECTIONS if not (a.dry_run and s == "compile"))
    return a


SECTION_FUNCS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "env": section_env, "model": section_model, "ours": section_ours, "usb": section_usb,
    "usb_loader": section_usb_loader, "lightly": section_lightly, "study": section_study,
    "pack": section_pack, "packworker": section_packworker, "syncs": section_syncs,
    "compile": section_compile}


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.section:
        import torch
        torch.set_num_threads(a.threads)
        try:
            got = SECTION_FUNCS[a.section](a)
        except Skip as e:
            got = {"skipped": str(e)}
        print(RESULT + json.dumps(got, default=str), flush=True)
        return 0
    print(f"[gpu] device={a.device} scale={a.scale} steps={a.steps}+{a.warmup} "
          f"sections={a.sections} data={a.data}", flush=True)
    r = run_sections(a)
    s = summary(r)
    r["summary"] = s
    if a.out:
        (Path(a.out) / "gpu.json").write_text(json.dumps(r, indent=1, default=str))
    print("\n" + table(r))
    failed = [k for k, v in r.items() if isinstance(v, dict) and v.get("failed")]
    s["failed_sections"] = len(failed)
    print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                   for k, v in s.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
