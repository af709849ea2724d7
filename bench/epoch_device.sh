#!/bin/bash
# The GPU checks of issue 40 item 3 (per-epoch work off the critical path) as one command
# for a device machine, which may have another Python and torch and no MLflow / Optuna:
#
#   here:   bash bench/epoch_device.sh [BEFORE_COMMIT]   # fills bench/out/device (ignored)
#   there:  bash bench/out/device/run.sh                  # run(carry=["bench/out/device"])
#
# It carries the real data, this checkout's core and a BEFORE_COMMIT one (default: the
# commit before issue 40 item 3) and runs: the CUDA tests (tests/core/test_epoch_offload_cuda.py),
# bench/epoch_split.py before / after / torch probe / eval cadence, and
# bench/probe_solver.py on the GPU. Results land in $OUT there (tests, split, probe logs).
set -euo pipefail
cd "$(dirname "$0")/.."
BEFORE=${1:-311c91f}
D=bench/out/device
rm -rf "$D" && mkdir -p "$D"/data "$D"/old "$D"/new/bench "$D"/new/tests/core
cp ../shared/data/medmnist/{breastmnist,pneumoniamnist}.npz "$D"/data/
git archive "$BEFORE" scarcelab | tar -x -C "$D"/old
cp -r scarcelab "$D"/new/
cp bench/epoch_split.py bench/probe_solver.py "$D"/new/bench/
cp tests/conftest.py "$D"/new/tests/ && cp tests/core/test_epoch_offload_cuda.py "$D"/new/tests/core/
find "$D" -name __pycache__ -prune -exec rm -rf {} +
cat > "$D"/run.sh <<'EOF'
#!/bin/bash
cd "$(dirname "$0")"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
DEV=${DEV:-cuda}; EP=${EP:-40}; SEEDS=${SEEDS:-5}; OUTD=${OUT:-/tmp/devout}; mkdir -p "$OUTD"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
python3 -c "import torch, sklearn, numpy, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'sklearn', sklearn.__version__, 'numpy', numpy.__version__, 'cuda', torch.cuda.is_available())"
(cd new && timeout 150 python3 -m pytest -q -p no:cacheprovider tests/core/test_epoch_offload_cuda.py 2>&1 | tail -8) | tee "$OUTD"/tests.log
ES="timeout 100 python3 new/bench/epoch_split.py --device $DEV --data-dir data --epochs $EP"
{ $ES --code old --label before
  $ES --code new --label after
  $ES --code new --label after_torchprobe --methods simclr --set probe_solver=torch
  $ES --code new --label after_every10 --set eval_every_steps=10
  $ES --code new --label after_every10_torchprobe --methods simclr --set probe_solver=torch,eval_every_steps=10
} 2>&1 | grep -v -i warn | tee "$OUTD"/split.log
timeout 220 python3 new/bench/probe_solver.py --device "$DEV" --archs "${ARCHS:-small_cnn,resnet18}" --seeds "$SEEDS" --data-dir data 2>&1 | grep -v -i warn | tee "$OUTD"/probe.log
echo done
EOF
chmod +x "$D"/run.sh
du -sh "$D"
