#!/usr/bin/env bash
# Finish the final retraining of the CPU-scale tune studies (bench/tune_cpu.py) with
# `scarcelab tune --resume` (docs/tune.md, "CPU-scale measurement"), on copies of their
# MLflow stores: two worker queues at a time, one torch thread each.
#
#   bench/tune_cpu_resume.sh [SRC_DIR=/tmp] [DST_DIR=/tmp/tune_cpu_resume] [NICE=5]
#
# Logs: DST_DIR/<method>.log (per-study output), DST_DIR/load.log (load average per minute).
set -euo pipefail
SRC=${1:-/tmp}
DST=${2:-/tmp/tune_cpu_resume}
NICE=${3:-5}
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY="$REPO/.venv/bin/python"
mkdir -p "$DST"
for m in ce ole cosine_ce tvmf; do
  [ -e "$DST/tune_cpu_$m.db" ] || cp "$SRC/tune_cpu_$m.db" "$DST/tune_cpu_$m.db"
done

study_id() {  # the tune study run of a store
  sqlite3 -readonly "$DST/tune_cpu_$1.db" "select r.run_uuid from runs r join tags t on \
    t.run_uuid = r.run_uuid where t.key = 'scarcelab.role' and t.value = 'study'"
}

resume() {  # resume the studies of the given methods one after the other
  for m in "$@"; do
    local id; id=$(study_id "$m")
    echo "$(date -u +%FT%TZ) start $m $id" >> "$DST/$m.log"
    (cd "$REPO" && OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH="$REPO" \
      MLFLOW_TRACKING_URI="sqlite:///$DST/tune_cpu_$m.db" \
      nice -n "$NICE" "$PY" -m scarcelab.entrypoints.cli tune --resume "$id" --device cpu) \
      >> "$DST/$m.log" 2>&1 || echo "$(date -u +%FT%TZ) FAILED $m rc=$?" >> "$DST/$m.log"
    echo "$(date -u +%FT%TZ) end $m" >> "$DST/$m.log"
  done
}

(while true; do echo "$(date -u +%FT%TZ) $(cut -d' ' -f1-3 /proc/loadavg)" >> "$DST/load.log"
   sleep 60; done) &
LOAD=$!
trap 'kill $LOAD 2>/dev/null' EXIT
resume ce cosine_ce &
A=$!
resume ole tvmf &
B=$!
wait $A $B
