#!/usr/bin/env bash
# Session 22 run F (2 GPUs): the checksum's cost with direct writes on, Llama-3-8B TP1, alternating.
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.devbundle/lib:/usr/local/cuda/lib64
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
b=.devbundle/bin
for i in 1 2 3; do
  for v in "--direct 1" "--direct 1 --checksums 1" "--direct 0 --checksums 1"; do
    echo "=== $i $v" >>"$OUT/sync.log"
    timeout 100 $b/wsync_bench_gpu_sync --model llama3-8b --mode tp1 --iters 9 $v >>"$OUT/sync.log" 2>&1 || echo "FAILED $v" >>"$OUT/sync.log"
  done
done
grep -E '^===|RESULT|FAILED' "$OUT/sync.log" | grep -v wsync_plan | grep -oE '^===.*|FAILED.*|"bench":"wsync_sync"|"worker":[0-9]|"median_s":[0-9.]+|"direct":[0-9]|"buckets_verified":-?[0-9]+|"direct_hashes_as_landed":[0-9]+|"checksum_match":[a-z]+' | paste -sd' ' | sed 's/===/\n===/g'
