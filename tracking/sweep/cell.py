"""What a sweep cell runs: ``python -m scarcelab.tracking.sweep.cell <entry> --opt value …``.

It is ``scarcelab <entry> …`` (the entry point's own command line, unchanged) with the
cell's share of a GPU applied first: when the driver packs several cells on one GPU
(``gpus_per_cell`` below 1, or an explicit ``gpu_memory_fraction``) it passes the fraction
in ``SCARCELAB_GPU_MEMORY_FRACTION``, and this process caps its CUDA caching allocator at
that fraction of each visible device's memory
(``torch.cuda.set_per_process_memory_fraction``) before the study allocates anything. One
cell that grows (a larger batch, a leak) then fails with CUDA's out-of-memory error in its
own run instead of starving the cells it shares the card with. The cap covers what the
allocator hands out; each process's CUDA context (a few hundred MB) comes on top.

Why here and not in the entry points: this is where a cell's study process starts, and it
is the sweep that knows the share; the studies stay the commands a user types by hand.
The cap is queued with torch's lazy CUDA initialisation (``torch.cuda._lazy_call``, as
``torch.cuda.manual_seed`` does), so a cell that never touches CUDA (``--device cpu``)
creates no CUDA context for it. torch is imported only when a fraction is given: without
one this module adds nothing to a cell's start.

Threads need nothing here: the driver sets ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` in the
cell's environment from its CPU share, and torch sizes its intra-op pool from
``OMP_NUM_THREADS`` when it starts (capped at the cores the process may use).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

#: the fraction of each visible GPU's memory a cell's allocator may take (driver -> cell)
MEMORY_FRACTION_ENV = "SCARCELAB_GPU_MEMORY_FRACTION"


def memory_fraction(env: Mapping[str, str]) -> float | None:
    """The cap the driver asked for, None when none; a value that is not a fraction in
    (0, 1] is an error naming the variable (the driver never writes one)."""
    raw = env.get(MEMORY_FRACTION_ENV, "").strip()
    if not raw:
        return None
    try:
        f = float(raw)
    except ValueError:
        f = -1.0
    if not 0.0 < f <= 1.0:
        raise SystemExit(f"Error: {MEMORY_FRACTION_ENV}={raw!r} must be a fraction in (0, 1]")
    return f


def cap_gpu_memory(fraction: float) -> None:
    """Cap every visible CUDA device's caching allocator at ``fraction`` of its memory,
    at CUDA's first use in this process (at once if CUDA is already initialised)."""
    import torch

    def apply() -> None:
        for i in range(torch.cuda.device_count()):
            torch.cuda.set_per_process_memory_fraction(fraction, device=i)

    lazy = getattr(torch.cuda, "_lazy_call", None)
    if lazy is not None:
        lazy(apply)
    elif torch.cuda.is_available():  # an older torch without the hook: now
        apply()


def main(argv: list[str] | None = None) -> int:
    fraction = memory_fraction(os.environ)
    if fraction is not None and fraction < 1.0:
        cap_gpu_memory(fraction)
    from scarcelab.entrypoints.cli import main as cli

    # click exits with the command's status (SystemExit), as `scarcelab <entry> …` does
    cli.main(args=list(sys.argv[1:] if argv is None else argv), prog_name="scarcelab")
    return 0


if __name__ == "__main__":
    sys.exit(main())
