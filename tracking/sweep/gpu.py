"""A cell's share of the machine when cells are packed: its environment, and CUDA MPS.

Several small studies fit on one big GPU (a 28-px study uses a few GB of a 141 GB H200
and a fraction of its SMs), so a sweep may give each cell a fraction of a GPU
(``gpus_per_cell: 0.125``: Ray places eight cells per card). What each packed cell gets:

* ``CUDA_VISIBLE_DEVICES`` from Ray: the card (or cards) its task was placed on; cells that
  share a card see the same id. With ``gpus_per_cell: 0`` a cell is given no card.
* ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS``: its CPU share, ``max(1, floor(cpus_per_cell))``
  — torch sizes its intra-op pool from ``OMP_NUM_THREADS`` — unless the spec's ``env:`` or
  the driver's environment sets ``OMP_NUM_THREADS`` (then that value, as before).
* ``SCARCELAB_GPU_MEMORY_FRACTION``: the cap of its CUDA allocator, a fraction of the card
  (``gpu_memory_fraction``, else its GPU share when that is below 1), applied by the cell
  process itself before the study starts (``tracking/sweep/cell.py``).

CUDA MPS (``mps: true``): without it, processes that share a GPU take turns (time slicing,
one context at a time); MPS lets their kernels run at once, which is what packing small
studies needs to pay. The driver starts the daemon (``nvidia-cuda-mps-control -d``) on its
machine for an embedded sweep when it is not running yet, stops it at the end if it started
it, and says in one line when it cannot (no such program, or it failed): the cells then
share the GPU by time slicing. On a Ray cluster the daemon belongs to each GPU node (start
it with the node); the driver says so.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from scarcelab.tracking.sweep.cell import MEMORY_FRACTION_ENV

MPS_CONTROL = "nvidia-cuda-mps-control"
#: where the MPS daemon's pipes live; cells must see the same value as the daemon
MPS_ENV = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def threads(cpus_per_cell: float) -> int:
    """Intra-op threads of a cell with ``cpus_per_cell`` CPUs (at least one)."""
    return max(1, int(math.floor(cpus_per_cell + 1e-9)))


def share_env(cpus_per_cell: float, memory_fraction: float | None,
              spec_env: Mapping[str, str], driver_env: Mapping[str, str]) -> dict[str, str]:
    """The variables that give a cell its share (module docstring); the caller applies the
    spec's ``env:`` and the forwarded driver variables over them."""
    out: dict[str, str] = {}
    if "OMP_NUM_THREADS" not in spec_env and "OMP_NUM_THREADS" not in driver_env:
        n = str(threads(cpus_per_cell))
        out = {k: n for k in THREAD_ENV if k not in spec_env}
    if memory_fraction is not None:
        out[MEMORY_FRACTION_ENV] = f"{memory_fraction:.6g}"
    return out


def slots_per_gpu(gpus_per_cell: float) -> int:
    """Cells one GPU holds at ``gpus_per_cell`` (Ray counts fractions to 1e-4: 10 cells of
    0.1 fit, although ``1 // 0.1`` is 9 in floating point)."""
    return int(math.floor(1.0 / gpus_per_cell + 1e-6)) if 0 < gpus_per_cell < 1 else 1


@dataclass
class Mps:
    """The MPS daemon as the driver found or started it."""

    started: bool = False  # by this driver: it stops it at the end
    running: bool = False

    def stop(self, echo: Callable[[str], None]) -> None:
        if not self.started:
            return
        try:
            subprocess.run([MPS_CONTROL], input="quit\n", text=True, capture_output=True,
                           timeout=60, check=False)
            echo(f"CUDA MPS: stopped the daemon this sweep started ({MPS_CONTROL} quit)")
        except (OSError, subprocess.SubprocessError) as e:
            echo(f"CUDA MPS: could not stop the daemon ({e}); stop it with "
                 f"`echo quit | {MPS_CONTROL}`")
        self.started = self.running = False


def _mps_answers(control: str) -> bool:
    """Whether an MPS daemon answers on this machine's (or $CUDA_MPS_PIPE_DIRECTORY's)
    pipe: ``get_server_list`` fails without one."""
    try:
        out = subprocess.run([control], input="get_server_list\n", text=True,
                             capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0


def start_mps(echo: Callable[[str], None], embedded: bool) -> Mps:
    """Make sure CUDA MPS runs for the cells (``mps: true``); every outcome is one line."""
    if not embedded:
        echo(f"CUDA MPS (mps: true): on a Ray cluster start the daemon on every GPU node "
             f"({MPS_CONTROL} -d, as the user the workers run as) before the sweep; the "
             "driver starts it only on its own machine for embedded Ray")
        return Mps()
    control = shutil.which(MPS_CONTROL)
    if control is None:
        echo(f"CUDA MPS (mps: true) is NOT on: {MPS_CONTROL} is not installed here (it "
             "comes with the NVIDIA driver); cells that share a GPU take turns on it (time "
             "slicing) instead of running at once")
        return Mps()
    if _mps_answers(control):
        echo("CUDA MPS: a daemon is already running; the cells use it")
        return Mps(running=True)
    try:
        out = subprocess.run([control, "-d"], capture_output=True, text=True, timeout=60,
                             check=False)
    except (OSError, subprocess.SubprocessError) as e:
        echo(f"CUDA MPS (mps: true) is NOT on: {MPS_CONTROL} -d failed ({e}); cells that "
             "share a GPU take turns on it")
        return Mps()
    if out.returncode != 0:
        why = (out.stderr or out.stdout).strip().splitlines()
        echo(f"CUDA MPS (mps: true) is NOT on: {MPS_CONTROL} -d exited {out.returncode}"
             + (f" ({why[-1][:200]})" if why else "") + "; cells that share a GPU take turns "
             "on it")
        return Mps()
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    echo(f"CUDA MPS: started the daemon ({MPS_CONTROL} -d, pipes in {pipe}); it is stopped "
         "when the sweep ends")
    return Mps(started=True, running=True)
