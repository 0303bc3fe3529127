#!/usr/bin/env bash
# The measurements of docs/performance_speed.md, in one go:
#
#   benchmarks/speed.sh [OUTDIR]          (default benchmarks/results)
#
# Writes OUTDIR/NAME.txt (the table) and OUTDIR/NAME.json for every run, and
# OUTDIR/limits.txt. On a shared machine it first waits (up to MAX_WAIT seconds, default
# 600) for the 1-minute load average to fall under MAX_LOAD (default 1.5) before each run,
# and records the load in each table's header either way. Set VS="gloo" to skip MPI,
# ITERS / WARMUP to change the timed calls per size (default 50 / 5).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-benchmarks/results}
MAX_LOAD=${MAX_LOAD:-1.5}
MAX_WAIT=${MAX_WAIT:-600}
ITERS=${ITERS:-50}
WARMUP=${WARMUP:-5}
if [[ -z ${VS:-} ]]; then
  if python -c "import mpi4py" 2>/dev/null && command -v mpirun >/dev/null; then VS=gloo,mpi
  else VS=gloo; fi
fi
mkdir -p "$OUT"

quiet() {
  local waited=0
  while awk -v max="$MAX_LOAD" '{exit !($1 >= max)}' /proc/loadavg && ((waited < MAX_WAIT)); do
    sleep 5; waited=$((waited + 5))
  done
  echo "# load average before $1: $(cut -d' ' -f1-3 /proc/loadavg) (waited ${waited}s)" >&2
}

bench() {  # NAME ARGS...
  local name=$1; shift
  quiet "$name"
  echo "\$ python -m minidist bench $*" | tee "$OUT/$name.txt"
  python -m minidist bench "$@" --json "$OUT/$name.json" | tee -a "$OUT/$name.txt"
}

quiet limits
python benchmarks/limits.py --json "$OUT/limits.json" | tee "$OUT/limits.txt"
for n in 2 4 8; do
  bench "all_reduce_n$n" all_reduce -n "$n" --min-bytes 4 --max-bytes 64M --factor 4 \
    --iters "$ITERS" --warmup "$WARMUP" --vs "$VS"
done
bench broadcast_16M_n8 broadcast -n 8 --min-bytes 16M --max-bytes 16M \
  --iters "$ITERS" --warmup "$WARMUP" --vs "$VS"
bench barrier_n64 barrier -n 64 --iters 200 --warmup 20 --vs "$VS"
