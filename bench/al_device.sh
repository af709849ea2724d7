#!/usr/bin/env bash
# The AL figures that need many cores or a GPU, in one go (used on a rented 16-core + H200
# box, where only torch/numpy/scipy/sklearn are installed: no MLflow needed).
#   DATA=<folder laid out like ../shared/data> OUT=<results folder> bench/al_device.sh
# CPU part (background, $CPU_JOBS processes): the tabular/synthetic grid, oracle included.
# GPU part: resnet18 on mnist_5k and cifar10_5k; SimCLR resnet18 encoders for the encoded
# sets (trained on the GPU, cached), then linear-classifier AL on their embeddings (CPU).
set -u
DATA=${DATA:-../shared/data}
OUT=${OUT:-bench/out}
CPU_JOBS=${CPU_JOBS:-11}
DEADLINE=${DEADLINE:-380}
GPU_DEADLINE=${GPU_DEADLINE:-200}
ENC_EPOCHS=${ENC_EPOCHS:-100}
export PYTHONPATH=${PYTHONPATH:-.}:. PYTHONUNBUFFERED=1
mkdir -p "$OUT"
S="python bench/al_sweeps.py --data-dir $DATA --cache-dir ${CACHE:-$OUT/encoded}"

# Same grid as the closing note: random, margin, badge, coreset and the greedy oracle.
$S --jobs "$CPU_JOBS" --reps 10 --deadline-s "$DEADLINE" \
   --problem splice:1 --problem honeypot:1 --problem honeypot:5 \
   --problem diverging_sine:1 --problem diverging_sine:5 \
   --strategies oracle random margin badge coreset \
   --out "$OUT/al_tabular.jsonl" > "$OUT/al_tabular.log" 2>&1 &
CPU_PID=$!

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
$S --device cuda --jobs 4 --reps 3 --deadline-s "$GPU_DEADLINE" \
   --problem mnist_5k:20 --problem cifar10_5k:200 \
   --strategies random margin badge coreset \
   --out "$OUT/al_images.jsonl" > "$OUT/al_images.log" 2>&1
tail -12 "$OUT/al_images.log"

ENC="method=simclr,arch=resnet18,epochs=$ENC_EPOCHS,batch_size=512"
$S --device cuda --jobs 1 --reps 0 --encoder "$ENC" \
   --problem encoded_mnist_5k:5 --problem encoded_cifar10_5k:5 \
   --out "$OUT/al_encoded.jsonl" > "$OUT/al_encoding.log" 2>&1
cat "$OUT/al_encoding.log"
$S --device cpu --jobs 6 --reps 5 --deadline-s 150 --encoder "$ENC" \
   --problem encoded_mnist_5k:5 --problem encoded_cifar10_5k:5 \
   --strategies random margin badge coreset \
   --out "$OUT/al_encoded.jsonl" > "$OUT/al_encoded.log" 2>&1
tail -12 "$OUT/al_encoded.log"

wait "$CPU_PID"
tail -40 "$OUT/al_tabular.log"
