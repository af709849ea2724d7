"""RandomResizedCrop from the whole stored image vs gem's path on the original.

gem crops the decoded original with PIL (torchvision ``RandomResizedCrop``:
``img.crop(box).resize((224, 224), BILINEAR)``); the tune protocol cuts the same box from
the whole image stored at ``train_side``² (aspect not kept, ``scarcelab.data.sources._deic``)
with one batched ``grid_sample`` (``scarcelab.data.augment.crop_resize``). On real images —
the CPM-15 H&E tiles of ``../shared/data/nuclei_cpm15`` (439–1032 px), and the same tiles
resized to CUB's typical 500×375 — this prints the mean absolute difference (grey levels of
255) for supersampling k = 1, 2 and the default choice, and the CPU time of one batch.

    PYTHONPATH=. OMP_NUM_THREADS=1 python -P bench/tune_rrc.py
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from scarcelab.data.augment import crop_resize, rrc_boxes

OUT = 224
SETTINGS = ((352, 0.4), (512, 0.2))  # (train_side, A_min): CUB / ISIC, CLaMM


def mae(im, side: int, min_area: float, n: int = 32) -> dict[str, float]:
    from PIL import Image

    w, h = im.size
    store = np.array(im.resize((side, side), Image.Resampling.BILINEAR)).transpose(2, 0, 1)
    x = torch.as_tensor(store[None]).float().div(255).expand(n, -1, -1, -1).contiguous()
    hw = torch.tensor([[h, w]] * n)
    boxes = rrc_boxes(torch.Generator().manual_seed(0), hw, min_area)
    ref = np.stack([np.asarray(im.crop((left, top, left + bw, top + bh)).resize(
        (OUT, OUT), Image.Resampling.BILINEAR)) for top, left, bh, bw in boxes.long().tolist()])
    ref = ref.transpose(0, 3, 1, 2).astype(np.float64)
    out = {}
    for k in (1, 2, None):
        y = crop_resize(x, boxes, hw, OUT, supersample=k)
        out["auto" if k is None else f"k{k}"] = float(np.abs(y.double().numpy() * 255 - ref).mean())
    return out


def main() -> None:
    from PIL import Image

    p = argparse.ArgumentParser()
    p.add_argument("--tiles", default=str(Path(__file__).resolve().parents[2] / "shared" /
                                          "data" / "nuclei_cpm15"))
    a = p.parse_args()
    paths = sorted(Path(a.tiles).glob("image*.png"))
    if not paths:
        raise SystemExit(f"no CPM-15 tiles under {a.tiles} (pass --tiles)")
    summary = {}
    for variant in ("original", "cub500x375"):
        for side, amin in SETTINGS:
            rows = []
            for path in paths:
                im = Image.open(path).convert("RGB")
                if variant == "cub500x375":
                    im = im.resize((500, 375), Image.Resampling.BILINEAR)
                rows.append(mae(im, side, amin))
            m = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}
            print(f"{variant:11s} side={side} A_min={amin}: " +
                  " ".join(f"{k}={v:.2f}" for k, v in m.items()), flush=True)
            summary[f"mae_{variant}_{side}"] = m["auto"]
    torch.set_num_threads(1)
    x = torch.rand(32, 3, 352, 352)
    hw = torch.tensor([[375, 500]] * 32)
    for k in (1, 2):
        t0 = time.process_time()
        for _ in range(5):
            crop_resize(x, rrc_boxes(torch.Generator().manual_seed(0), hw, 0.4), hw, OUT,
                        supersample=k)
        summary[f"cpu_ms_k{k}"] = (time.process_time() - t0) / 5 * 1000
    print(" ".join(f"{k}={v:.2f}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
