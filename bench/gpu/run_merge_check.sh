#!/usr/bin/env bash
# One GPU call after a merge (session 18): the GPU tests of the merge, the swap commit end to
# end (colocated), checksums with direct writes (Llama TP1), the lane's
# control path on this VM's free cores.
set -uo pipefail
cd "$(dirname "$0")/../.."
. bench/gpu/device_env.sh
wsync_gpu_out
wsync_device_env
B=$PWD/.devbundle/bin
nvidia-smi -L
for t in put_list reserved_sms shadow_swap plane_conformance executor data_ops_put; do
  echo "=== $t" >>"$OUT/tests.log"
  timeout 200 "$B/wsync_gpu_${t}_test" >>"$OUT/tests.log" 2>&1 || echo "FAILED: $t" >>"$OUT/tests.log"
done
grep -E '^(=== |\[  (PASSED|FAILED) |FAILED:)' "$OUT/tests.log"
export WSYNC_BENCH_ITERS=5
WSYNC_BENCH_MODELS="llama3-8b qwen3-30b-a3b" WSYNC_SYNC_MODES=colocated \
  WSYNC_SYNC_VARIANTS="--direct 1;--staging device_shadow --commit swap;--direct 1;--staging device_shadow --commit swap" \
  timeout 240 bash bench/gpu/run_staged.sh sync
WSYNC_SYNC_MODES=tp1 WSYNC_AB_REPS=1 WSYNC_BENCH_ITERS=7 timeout 200 bash bench/gpu/run_checksum_ab.sh
C="--controller_bin=$B/wsync-controller --worker_bin=$B/wsync-worker --workers=2 --work_dir=/dev/shm --syncs=25 --warmup=3"
for p in 0 200; do
  for m in "" "--lane" "--busy_poll_ms=-1 --busy_wait" "--lane --busy_poll_ms=-1 --busy_wait"; do
    echo "=== pause $p $m" >>"$OUT/lane.log"
    timeout 60 "$B/control_overhead_bench" $C --pause_ms=$p $m >>"$OUT/lane.log" 2>&1 || echo "FAILED: lane $p $m" >>"$OUT/lane.log"
  done
done
grep -E "^===|RESULT|p50|FAILED" "$OUT/lane.log" | cut -c1-300
