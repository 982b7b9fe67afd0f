#!/usr/bin/env bash
# Issue 21 item 6: the 2-GPU headline figures on 2 x H100 (same bench as the H200 runs).
set -uo pipefail
cd "$(dirname "$0")/../.."
nvidia-smi -L | grep -q H100 || { echo "not H100"; nvidia-smi -L; exit 3; }
. bench/gpu/device_env.sh
wsync_gpu_out
wsync_device_env
wsync_env_lines topo nccl >"$OUT/env.txt" 2>&1; cat "$OUT/env.txt"
B=$PWD/.devbundle/bin
timeout 150 $B/wsync_bench_nccl_ceiling --iters 10 --gpus 2 >"$OUT/ceiling.log" 2>&1; grep RESULT "$OUT/ceiling.log" | cut -c1-200
for m in llama3-8b qwen3-30b-a3b; do for v in "--direct 0" "--direct 1" "--direct 0" "--direct 1"; do
  echo "=== $m $v" >>"$OUT/sync.log"
  timeout 150 $B/wsync_bench_gpu_sync --model $m --mode tp1,colocated --iters 5 $v >>"$OUT/sync.log" 2>&1 || echo "FAILED $m $v" >>"$OUT/sync.log"
done; done
grep -E '^===|FAILED|wsync_sync"|checksum_match' "$OUT/sync.log" | grep -oE '^===.*|FAILED.*|"mode":"[a-z0-9]+"|"worker":[0-9]|"median_s":[0-9.]+|"checksum_match":[a-z]+' | paste -sd' ' | sed 's/===/\n===/g'
