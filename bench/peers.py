"""scarcelab's training step side by side with the libraries users know (issue 18).

Systems, each timed in its own fresh process, in alternating rounds (A B C A B C ...) so
that a load change on the shared machine hits every system alike:

* ``fixmatch-usb``: USB's FixMatch (``semilearn`` 0.3.2) through its programmatic API
  (``get_config`` -> ``get_algorithm``) and its own ``train_step`` plus its
  ``ParamUpdateHook`` (backward, optimiser, scheduler). Run-time shims only: no dataset
  download (``set_dataset``/``set_data_loader`` return nothing: batches are handed in),
  and the model stays on the CPU unless ``--device cuda``. USB's EMA-model hook is not
  run (scarcelab's FixMatch keeps no EMA copy), so both do the same work.
* ``fixmatch-ours``: ``scarcelab.methods`` ``fixmatch`` on ``wrn28_2`` through the
  training loop's own code (``BatchSource.next`` -> ``optimizer_step``), *including*
  sampling and augmentation of uint8 images (the peers get ready-made float batches).
* ``fixmatch-model``: the plain model limit: WRN-28-2 forward + cross-entropy + backward
  + Adam on the same 64 + 448 + 448 images, nothing else.
* ``simclr-lightly``: lightly's SimCLR loop as its documentation writes it (backbone ->
  ``SimCLRProjectionHead`` -> ``NTXentLoss``, one forward per view), on the same
  small-image ResNet-18 backbone scarcelab uses.
* ``simclr-ours`` / ``simclr-model``: as above for SimCLR (2 x 256 views).

All get 28x28x3 images, seed 0, the same batch composition (``--scale`` shrinks every
batch by the same factor for a CPU run). Prints steps/s per system (median over rounds),
the ratios ours / peer, the model-only share (model-limit step time / system step time)
and a final ``key=value`` line.

    bash bench/install_peers.sh                     # once: .peers-venv/ with the peers
    .venv/bin/python bench/peers.py --scale 0.125 --rounds 3
    .venv/bin/python bench/peers.py --device cuda   # papers' batch sizes on a GPU

Levers of scarcelab's step can be switched per system for A/B runs, e.g.
``--systems fixmatch-ours,fixmatch-ours+cl`` (``+cl`` channels_last, ``+fused`` fused Adam,
``+bf16`` bf16 autocast, ``+nogradweak`` FixMatch's weak view under no_grad, ``+compile``
``torch.compile`` of the backbone: its compile time is in the warm-up, printed per round).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PEERS_PY = REPO / ".peers-venv" / "bin" / "python"
INSTALL_HINT = ("peers missing: run `bash bench/install_peers.sh` (creates .peers-venv/ with "
                "semilearn==0.3.2 and lightly==1.6.0 installed --no-deps), or pass "
                "--peers-python PATH, or leave them out with --systems")
ALL = ("fixmatch-usb", "fixmatch-ours", "fixmatch-model",
       "simclr-lightly", "simclr-ours", "simclr-model")


def sizes(scale: float) -> dict[str, int]:
    def s(n: int) -> int:
        return max(2, round(n * scale))
    return {"labeled": s(64), "unlabeled": s(448), "views": s(256)}


# --------------------------------------------------------------------------- workers
def _synthetic(n: int, seed: int):  # type: ignore[no-untyped-def]
    import torch
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, 28, 28), generator=g, dtype=torch.uint8)


def _float_batches(shapes: list[int], device: str, n_batches: int = 4):  # type: ignore[no-untyped-def]
    """Ready-made normalised float batches for the peers (their data pipeline is not timed)."""
    import torch
    g = torch.Generator().manual_seed(0)
    return [[torch.randn(n, 3, 28, 28, generator=g).to(device) for n in shapes]
            for _ in range(n_batches)]


def _sync(device: str) -> None:
    import torch
    if device.startswith("cuda"):
        torch.cuda.synchronize()


CPU_SPS: list[float] = []  # steps per CPU-second of the worker, set by _time
WARMUP_S: list[float] = []  # wall time of the warm-up steps (compile time lands here)


def _time(step, warmup: int, steps: int, device: str) -> float:  # type: ignore[no-untyped-def]
    """Wall-clock steps/s; steps per CPU-second of this process go to ``CPU_SPS`` (on an
    oversubscribed machine CPU time is the steadier measure of the work a step does)."""
    t = time.perf_counter()
    for i in range(warmup):
        step(i)
    _sync(device)
    WARMUP_S.append(time.perf_counter() - t)
    t, c = time.perf_counter(), time.process_time()
    for i in range(steps):
        step(warmup + i)
    _sync(device)
    CPU_SPS.append(steps / max(time.process_time() - c, 1e-9))
    return steps / (time.perf_counter() - t)


def worker_ours(method: str, arch: str, a: argparse.Namespace, levers: set[str]) -> float:
    import numpy as np
    import torch

    from scarcelab.data.bundle import DatasetBundle
    from scarcelab.methods import Progress, get_method
    from scarcelab.models import create_model
    from scarcelab.train import BatchSource, make_optimizer, optimizer_step

    sz = sizes(a.scale)
    x = _synthetic(4096, 1).numpy()
    y = np.random.default_rng(0).integers(0, 10, len(x))
    b = DatasetBundle(x[:512], y[:512], x, x[:64], y[:64], x[:64], y[:64],
                      meta={"num_classes": 10, "name": "noise"})
    cls = get_method(method)
    torch.manual_seed(0)
    hp = {"weak_no_grad": True} if "nogradweak" in levers else {}
    m = cls(create_model(arch, in_channels=3), 10, hp).to(a.device)
    bl = sz["labeled"] if method != "simclr" else 0
    bu = sz["unlabeled"] if method != "simclr" else sz["views"]
    src = BatchSource(b, cls, bl, bu, torch.device(a.device), torch.Generator().manual_seed(0))
    opt, sched = make_optimizer(m, a.warmup + a.steps)
    if "fused" in levers:
        opt, sched = make_optimizer(m, a.warmup + a.steps, fused=True)
    if "cl" in levers:
        m.to(memory_format=torch.channels_last)
    if "compile" in levers:  # the backbone's forward and backward through inductor
        m.backbone.compile()
    m.train()
    amp = "bf16" in levers

    def step(i: int) -> None:
        batch = src.next()
        if "cl" in levers:
            batch.x = [v.contiguous(memory_format=torch.channels_last) for v in batch.x]
            batch.u = [v.contiguous(memory_format=torch.channels_last) for v in batch.u]
        with torch.autocast(device_type=torch.device(a.device).type, dtype=torch.bfloat16,
                            enabled=amp):
            optimizer_step(m, opt, sched, batch, Progress(i, a.warmup + a.steps, 0))

    return _time(step, a.warmup, a.steps, a.device)


def worker_model(kind: str, a: argparse.Namespace) -> float:
    """Forward + loss + backward + Adam of the bare network on one step's images."""
    import torch
    import torch.nn.functional as F

    from scarcelab.models import create_model

    sz = sizes(a.scale)
    torch.manual_seed(0)
    if kind == "fixmatch":
        net = create_model("wrn28_2", in_channels=3)
        head = torch.nn.Linear(net.num_features, 10)
        n = sz["labeled"] + 2 * sz["unlabeled"]
    else:
        net = create_model("resnet18", in_channels=3)
        head = torch.nn.Linear(net.num_features, 128)
        n = 2 * sz["views"]
    model = torch.nn.Sequential(net, head).to(a.device).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    (xb,), = _float_batches([n], a.device, 1)
    yb = torch.randint(0, 10, (n,), generator=torch.Generator().manual_seed(0)).to(a.device)

    def step(i: int) -> None:
        out = model(xb)
        loss = F.cross_entropy(out, yb) if kind == "fixmatch" else out.square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return _time(step, a.warmup, a.steps, a.device)


# Modules ``import semilearn`` pulls in only for its audio/NLP datasets and experiment
# loggers; none is on the FixMatch path. Where one is not installed, an inert stand-in is
# put in ``sys.modules`` for the worker process (a run-time shim, nothing of USB patched).
USB_OPTIONAL = ("torchaudio", "transformers", "wandb", "aim", "progress", "progress.bar")


def _stub_missing(names: tuple[str, ...]) -> list[str]:
    import importlib.util
    import types

    class _Inert(types.ModuleType):
        def __getattr__(self, attr: str) -> object:
            if attr.startswith("__"):
                raise AttributeError(attr)
            return type(attr, (), {"__init__": lambda self, *a, **k: None,
                                   "from_pretrained": classmethod(lambda c, *a, **k: c())})

    stubbed = []
    for n in names:
        parent = n.split(".")[0]
        if parent in sys.modules and n in sys.modules:
            continue
        if n == parent and importlib.util.find_spec(n) is not None:
            continue
        if n != parent and not isinstance(sys.modules.get(parent), _Inert):
            continue
        mod = _Inert(n)
        mod.__path__ = []  # type: ignore[attr-defined]  # lets "from x.y import z" resolve
        sys.modules[n] = mod
        stubbed.append(n)
    return stubbed


def usb_fixmatch(a: argparse.Namespace, over: dict[str, object]):  # type: ignore[no-untyped-def]
    """USB's FixMatch through its programmatic API (``get_config`` -> ``get_algorithm``):
    WRN-28-2 at 28 px, its paper's SGD settings, no EMA evaluation, logging or
    checkpoints; ``over`` sets the data's part (classes, labels, batch sizes, iterations,
    loader workers). The model on ``a.device``, in training mode."""
    import torch
    from semilearn import get_algorithm, get_config, get_net_builder

    cuda = a.device.startswith("cuda")
    cfg = get_config({
        "algorithm": "fixmatch", "net": "wrn_28_2", "use_pretrain": False,
        "img_size": 28, "crop_ratio": 0.875, "data_dir": "/nonexistent",
        "eval_batch_size": 64, "epoch": 1, "num_eval_iter": 10**9, "num_log_iter": 10**9,
        "optim": "SGD", "lr": 0.03, "momentum": 0.9, "weight_decay": 5e-4,
        "layer_decay": 1.0, "ema_m": 0.999, "hard_label": True, "T": 0.5, "p_cutoff": 0.95,
        "ulb_loss_ratio": 1.0, "amp": False, "use_cat": True, "seed": 0,
        "gpu": 0 if cuda else None, "distributed": False,
        "multiprocessing_distributed": False, "world_size": 1, "rank": 0, "num_workers": 0,
        "save_dir": "/tmp/usb-bench", "save_name": "bench", "resume": False,
        "overwrite": True, "use_tensorboard": False, "use_wandb": False, "use_aim": False,
        **over})
    torch.manual_seed(0)
    algo = get_algorithm(cfg, get_net_builder(cfg.net, from_name=False), tb_log=None,
                         logger=None)
    algo.model = algo.model.to(a.device)
    algo.ema_model = algo.ema_model.to(a.device)
    algo.model.train()
    return algo


def worker_usb(a: argparse.Namespace) -> float:
    """USB FixMatch via get_config -> get_algorithm -> train_step + ParamUpdateHook."""
    _stub_missing(USB_OPTIONAL)
    import torch
    from semilearn.core.algorithmbase import AlgorithmBase

    sz = sizes(a.scale)
    # run-time shims: batches are handed in, so no dataset (download) and no loaders
    AlgorithmBase.set_dataset = lambda self: None  # type: ignore[method-assign]
    AlgorithmBase.set_data_loader = lambda self: None  # type: ignore[method-assign]
    algo = usb_fixmatch(a, {"num_classes": 10, "num_labels": 40, "dataset": "cifar10",
                            "batch_size": sz["labeled"],
                            "uratio": sz["unlabeled"] / sz["labeled"],
                            "num_train_iter": a.warmup + a.steps})
    batches = _float_batches([sz["labeled"], sz["unlabeled"], sz["unlabeled"]], a.device)
    y = torch.randint(0, 10, (sz["labeled"],),
                      generator=torch.Generator().manual_seed(0)).to(a.device)

    def step(i: int) -> None:
        xl, xw, xs = batches[i % len(batches)]
        algo.out_dict, algo.log_dict = algo.train_step(x_lb=xl, y_lb=y, x_ulb_w=xw,
                                                       x_ulb_s=xs)
        algo.call_hook("after_train_step", "ParamUpdateHook")
        algo.it += 1

    return _time(step, a.warmup, a.steps, a.device)


def worker_lightly(a: argparse.Namespace) -> float:
    """The SimCLR loop of lightly's documentation, on scarcelab's small-image ResNet-18."""
    import torch
    from lightly.loss import NTXentLoss
    from lightly.models.modules import SimCLRProjectionHead
    from torch import nn

    from scarcelab.models import create_model

    sz = sizes(a.scale)

    class SimCLR(nn.Module):
        def __init__(self, backbone: nn.Module) -> None:
            super().__init__()
            self.backbone = backbone
            self.projection_head = SimCLRProjectionHead(512, 512, 128)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.backbone(x).flatten(start_dim=1)
            return self.projection_head(x)

    torch.manual_seed(0)
    model = SimCLR(create_model("resnet18", in_channels=3)).to(a.device).train()
    criterion = NTXentLoss(temperature=0.1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-6)
    batches = _float_batches([sz["views"], sz["views"]], a.device)

    def step(i: int) -> None:
        x0, x1 = batches[i % len(batches)]
        z0 = model(x0)
        z1 = model(x1)
        loss = criterion(z0, z1)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    return _time(step, a.warmup, a.steps, a.device)


def worker(system: str, a: argparse.Namespace) -> float:
    import torch
    torch.set_num_threads(a.threads)
    base, *lev = system.split("+")
    levers = set(lev)
    if base == "fixmatch-usb":
        return worker_usb(a)
    if base == "simclr-lightly":
        return worker_lightly(a)
    if base.endswith("-model"):
        return worker_model(base.split("-")[0], a)
    if base == "fixmatch-ours":
        return worker_ours("fixmatch", "wrn28_2", a, levers)
    if base == "simclr-ours":
        return worker_ours("simclr", "resnet18", a, levers)
    raise SystemExit(f"unknown system {system!r}; known: {', '.join(ALL)} (+cl, +fused, "
                     "+bf16, +nogradweak on the -ours systems)")


# --------------------------------------------------------------------------- driver
def peers_python(a: argparse.Namespace) -> str | None:
    if a.peers_python:
        return a.peers_python
    if PEERS_PY.exists():
        return str(PEERS_PY)
    return None


def run_one(system: str, a: argparse.Namespace, python: str
            ) -> tuple[float, float, float] | None:
    cmd = [python, str(Path(__file__).resolve()), "--worker", system,
           "--scale", str(a.scale), "--steps", str(a.steps), "--warmup", str(a.warmup),
           "--device", a.device, "--threads", str(a.threads)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(a.threads),
           "PYTHONWARNINGS": "ignore"}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, check=False)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            return (float(r["steps_per_s"]), float(r["cpu_steps_per_s"]),
                    float(r.get("warmup_s", float("nan"))))
    print(f"  {system}: failed (rc {p.returncode}): {p.stderr.strip()[-600:]}", flush=True)
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--systems", default=",".join(ALL))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per process")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--scale", type=float, default=1.0,
                    help="batch-size factor (1 = 64+448+448 and 2x256; e.g. 0.125 on a CPU)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--peers-python", default="", help="python with semilearn and lightly")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        sps = worker(a.worker, a)
        print("RESULT " + json.dumps({"steps_per_s": sps, "cpu_steps_per_s": CPU_SPS[-1],
                                     "warmup_s": WARMUP_S[-1] if WARMUP_S else None}))
        return
    systems = [s for s in a.systems.split(",") if s]
    ppy = peers_python(a)
    peers = [s for s in systems if s.split("+")[0] in ("fixmatch-usb", "simclr-lightly")]
    if peers and ppy is None:
        print(INSTALL_HINT)
        systems = [s for s in systems if s not in peers]
    sz = sizes(a.scale)
    print(f"device={a.device} threads={a.threads} scale={a.scale}: FixMatch {sz['labeled']}"
          f"+{sz['unlabeled']}+{sz['unlabeled']}, SimCLR 2x{sz['views']}, 28x28x3; "
          f"{a.warmup} warm-up + {a.steps} timed steps per process; load "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    res: dict[str, list[float]] = {s: [] for s in systems}
    resc: dict[str, list[float]] = {s: [] for s in systems}
    for r in range(a.rounds):
        order = systems if r % 2 == 0 else systems[::-1]  # A B C / C B A: no fixed position
        for s in order:
            py = ppy if s in peers else sys.executable
            got = run_one(s, a, py or sys.executable)
            if got is not None:
                res[s].append(got[0])
                resc[s].append(got[1])
                print(f"  round {r + 1} {s:<24} {got[0]:8.3f} steps/s  {got[1]:8.3f} steps/"
                      f"CPU-s  warm-up {got[2]:6.1f} s  (load {os.getloadavg()[0]:.1f})",
                      flush=True)
    med = {s: statistics.median(v) for s, v in res.items() if v}
    medc = {s: statistics.median(v) for s, v in resc.items() if v}
    print(f"\n{'system':<26}{'steps/s':>9}{'steps/CPU-s':>12}{'rounds':>8}"
          f"{'model share wall/CPU':>22}")
    for s, v in med.items():
        fam = s.split("-")[0]
        lim = med.get(f"{fam}-model")
        limc = medc.get(f"{fam}-model")
        share = f"{v / lim:6.0%} /{medc[s] / limc:4.0%}" if lim and limc else f"{'-':>12}"
        print(f"{s:<26}{v:9.3f}{medc[s]:12.3f}{len(res[s]):>8} {share}")
    summary = {f"{s.replace('-', '_').replace('+', '_')}_sps": v for s, v in med.items()}
    def paired(s: str, other: str, suffix: str) -> None:
        """Median of per-round ratios s / other (the paired estimate), wall and CPU."""
        pr = [x / y for x, y in zip(res[s], res[other], strict=False)]
        pc = [x / y for x, y in zip(resc[s], resc[other], strict=False)]
        key = f"{s.replace('-', '_').replace('+', '_')}_vs_{suffix}"
        summary[key], summary[f"{key}_cpu"] = statistics.median(pr), statistics.median(pc)
        print(f"{s} / {other}: {summary[key]:.3f}x wall, {summary[key + '_cpu']:.3f}x CPU "
              f"(median of per-round ratios; wall {', '.join(f'{x:.2f}' for x in pr)})")

    for ours, peer in (("fixmatch-ours", "fixmatch-usb"), ("simclr-ours", "simclr-lightly")):
        for s in med:
            if s.split("+")[0] == ours and peer in med:
                paired(s, peer, peer.split("-")[1])
    for s in med:
        base = s.split("+")[0]
        if "+" in s and base in med:
            paired(s, base, "base")
    summary["load"] = os.getloadavg()[0]
    print(" ".join(f"{k}={v:.3f}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
