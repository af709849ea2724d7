#!/usr/bin/env bash
# bench/gpu.py on a fresh GPU machine, from source (issue 40 item 6): install the carried
# wheels (bench/gpu_prepare.sh) into a private folder, then run every section within the
# call's limit. Output: $OUT/gpu.json and $OUT/gpu.log (or ./gpu-out without $OUT).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-out}"
mkdir -p "$OUT"
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/gpu-site .whl/*.whl 2>&1 | tail -3
export PYTHONPATH="/tmp/gpu-site:$PWD" PYTHONUNBUFFERED=1
echo "[gpu_device] wheels installed in $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
python3 bench/gpu.py --data .gpudata --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu.log"
