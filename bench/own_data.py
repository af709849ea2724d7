"""Decode and cache times of a user's own image folder (issue 39, items 2-3).

The folder is what the issue's user has: 300 labeled PNGs in class folders and 3,000
unlabeled PNGs, made from real PneumoniaMNIST chest X-rays (../shared/data), once at 28 px
and once upscaled to 224 px (Pillow bilinear). For each size:

    first     load_images of the labeled and the unlabeled files into an empty cache
              (hashing, header check, decoding in worker processes, writing the .npy)
    second    the same two calls again in this process: the cache hit
    start     a fresh Python process that imports scarcelab.data.imagefiles and opens both
              cached sets (what a second run pays before training starts)

and at 224 px, on one core (``workers=1``, nothing else in the process):

    rate      files per second of the whole first load (hash + header + decode + resize
              check + write), per wall second and per CPU second of this process
    pil       files per second of Pillow alone on the same files (open, load, asarray): the
              floor of any PNG decoder built on Pillow

The files' mtimes are set a minute back, as in a folder that existed before the run (a file
changed within 2 s of its hashing is hashed again on the next load: the stat index's
racy-file rule). Targets (issue 39): start under 3 s; rate at least 500 images/s per core.

    nice -n 5 .venv/bin/python bench/own_data.py            # ~1 minute on 2 cores

Ends with one key=value line.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scarcelab.data import imagefiles as m  # noqa: E402

SHARED = Path(os.environ.get("SCARCELAB_SHARED_DATA", REPO.parent / "shared" / "data"))

START = """
import sys, time
t0 = time.perf_counter()
from scarcelab.data import imagefiles as m
files = open(sys.argv[1]).read().split("\\n")
n_lab = int(sys.argv[3])
for part in (files[:n_lab], files[n_lab:]):
    r = m.load_images(part, m.Transform(int(sys.argv[4])), cache_dir=sys.argv[2],
                      progress=False)
    assert r.from_cache, "not a cache hit"
    r.x[-1].sum()  # touch the last row: the data is reachable
print(f"{time.perf_counter() - t0:.3f}")
"""


def make_folder(root: Path, size: int, n_lab: int, n_unl: int) -> tuple[list[Path], list[Path]]:
    with np.load(SHARED / "medmnist" / "pneumoniamnist.npz", allow_pickle=False) as d:
        x, y = d["train_images"], np.asarray(d["train_labels"]).reshape(-1)
    labeled, unlabeled = [], []
    for i in range(n_lab + n_unl):
        im = Image.fromarray(x[i])
        if size != im.width:
            im = im.resize((size, size), Image.Resampling.BILINEAR)
        if i < n_lab:
            p = root / "labeled" / f"class{int(y[i])}" / f"{i:05d}.png"
            labeled.append(p)
        else:
            p = root / "unlabeled" / f"{i // 1000:02d}" / f"{i:05d}.png"
            unlabeled.append(p)
        p.parent.mkdir(parents=True, exist_ok=True)
        im.save(p)
    t = time.time() - 60
    for p in labeled + unlabeled:
        os.utime(p, (t, t))
    return labeled, unlabeled


def load_both(labeled: list[Path], unlabeled: list[Path], size: int, cache: Path,
              workers: int | None = None) -> tuple[float, float, list[m.DecodedImages]]:
    w0, c0 = time.perf_counter(), time.process_time()
    out = [m.load_images(part, m.Transform(size), cache_dir=cache, workers=workers,
                         progress=False) for part in (labeled, unlabeled)]
    return time.perf_counter() - w0, time.process_time() - c0, out


def fresh_start(files: list[Path], n_lab: int, size: int, cache: Path, tmp: Path) -> float:
    lst = tmp / f"files{size}.txt"
    lst.write_text("\n".join(map(str, files)))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    w0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", START, str(lst), str(cache), str(n_lab),
                          str(size)], env=env, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - w0
    print(f"  start: fresh process {wall:.2f} s (imports + both cache opens "
          f"{float(out.stdout.strip()):.2f} s)")
    return wall


def pil_only(files: list[Path]) -> float:
    c0 = time.process_time()
    for p in files:
        with Image.open(p) as im:
            im.load()
            np.asarray(im)
    return len(files) / (time.process_time() - c0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--labeled", type=int, default=300)
    ap.add_argument("--unlabeled", type=int, default=3000)
    ap.add_argument("--sizes", default="28,224")
    args = ap.parse_args()
    if not (SHARED / "medmnist" / "pneumoniamnist.npz").exists():
        sys.exit(f"real PneumoniaMNIST not found under {SHARED} (set SCARCELAB_SHARED_DATA)")
    load0 = os.getloadavg()[0]
    cpus = len(os.sched_getaffinity(0))
    print(f"{cpus} CPUs, load average {load0:.2f} at start; default workers for "
          f"{args.unlabeled} files: {m.default_workers(args.unlabeled)}")
    summary: dict[str, str] = {"n": str(args.labeled + args.unlabeled)}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for size in map(int, args.sizes.split(",")):
            t0 = time.perf_counter()
            lab, unl = make_folder(tmp / f"data{size}", size, args.labeled, args.unlabeled)
            print(f"{size} px: wrote {len(lab)} + {len(unl)} PNGs in "
                  f"{time.perf_counter() - t0:.1f} s")
            cache = tmp / f"cache{size}"
            first, _, res = load_both(lab, unl, size, cache)
            assert not any(r.from_cache for r in res)
            assert res[1].x.shape == (len(unl), 1, size, size)
            second, _, res2 = load_both(lab, unl, size, cache)
            assert all(r.from_cache for r in res2)
            print(f"  first {first:.2f} s ({(len(lab) + len(unl)) / first:.0f} img/s), "
                  f"second {second:.3f} s (in this process)")
            start = fresh_start(lab + unl, len(lab), size, cache, tmp)
            summary |= {f"first_{size}_s": f"{first:.2f}", f"second_{size}_s": f"{second:.3f}",
                        f"start_{size}_s": f"{start:.2f}"}
            if size == 224:
                wall, cpu, _ = load_both(lab, unl, size, tmp / "cache224-1core", workers=1)
                n = len(lab) + len(unl)
                pil = pil_only(lab + unl)
                print(f"  one core: {n / wall:.0f} img/s per wall second, {n / cpu:.0f} per "
                      f"CPU second; Pillow alone {pil:.0f} img/s per CPU second")
                summary |= {"rate_224_per_core": f"{n / cpu:.0f}",
                            "rate_224_per_core_wall": f"{n / wall:.0f}",
                            "pil_only_224": f"{pil:.0f}"}
    summary["load"] = f"{load0:.2f}-{os.getloadavg()[0]:.2f}"
    print(" ".join(f"{k}={v}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
