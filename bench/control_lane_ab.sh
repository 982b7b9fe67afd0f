#!/usr/bin/env bash
# A/B of the control fast lane with bench/control_overhead_bench (real
# controller and host workers, empty syncs): gRPC vs the lane, each with and
# without the low-latency mode (--busy_poll_ms=-1 --busy_wait), modes
# alternating, for each --pause_ms. Prints one line per run: mode, pause,
# the client p50 and the per-hop p50s.
#   bench/control_lane_ab.sh [BUILD_DIR] [ROUNDS] [PAUSES...]
# e.g. bench/control_lane_ab.sh build 2 0 200
# Only the bench binary and the controller / worker binaries are needed
# (BIN_DIR=<folder with all three> overrides the build tree's paths).
set -euo pipefail
build=${1:-build}
rounds=${2:-2}
shift $(( $# > 2 ? 2 : $# )) || true
pauses=("$@")
[ ${#pauses[@]} -eq 0 ] && pauses=(0 200)
if [ -n "${BIN_DIR:-}" ]; then
  bench=$BIN_DIR/control_overhead_bench
  bins=(--controller_bin="$BIN_DIR/wsync-controller" --worker_bin="$BIN_DIR/wsync-worker")
else
  bench=$build/bench/control_overhead_bench
  bins=(--controller_bin="$build/controller/server/wsync-controller"
        --worker_bin="$build/worker/agent/wsync-worker")
fi
common=(--workers="${WORKERS:-2}" --syncs="${SYNCS:-25}" --warmup="${WARMUP:-3}"
        --work_dir="${WORK_DIR:-/dev/shm}" "${bins[@]}")
declare -A flags=(
  [grpc]=""
  [grpc+spin]="--busy_poll_ms=-1 --busy_wait"
  [lane]="--lane"
  [lane+spin]="--lane --busy_poll_ms=-1 --busy_wait"
)
echo "# $(date -u +%FT%TZ) $(nproc) cpus, load $(cut -d' ' -f1-3 /proc/loadavg)"
for pause in "${pauses[@]}"; do
  for ((r = 1; r <= rounds; r++)); do
    for mode in grpc lane grpc+spin lane+spin; do
      # shellcheck disable=SC2086
      out=$("$bench" "${common[@]}" --pause_ms="$pause" ${flags[$mode]} 2>/dev/null)
      client=$(grep -o 'WaitSync returned (ms): p50 [0-9.]*' <<<"$out" | awk '{print $NF}')
      phases=$(grep '^phases' <<<"$out" | sed 's/.*worker.s for deliver..report)://')
      cpu=$(grep '^cpu' <<<"$out" | sed 's/.*wall s over [0-9.]* s)://')
      printf '%-9s pause %4s  round %d  p50 %s ms | %s | cpu%s | load %s\n' "$mode" "$pause" "$r" \
        "$client" "$phases" "$cpu" "$(cut -d' ' -f1 /proc/loadavg)"
    done
  done
done
