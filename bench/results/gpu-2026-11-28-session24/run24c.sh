#!/usr/bin/env bash
# Session 24 run C (2-GPU modes, Qwen3-30B-A3B): run B's +1 % on colocated. This build as is, with
# --piece-runs 0 (the planner writes every piece plain, as session 23's bench build did), with
# --put-gates 0, and session 23's build, alternating, three repetitions.
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.devbundle/lib:/usr/local/cuda/lib64
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
b=.devbundle/bin
{ nvidia-smi -L; date -u; } | tee "$OUT/env.txt"
run() {
  local tag=$1 bin=$2 m=$3; shift 3
  echo "=== $tag $bin $m $*" >>"$OUT/sync.log"
  local t0=$SECONDS
  timeout 120 $b/$bin --model "$m" --iters 7 --mode tp1,colocated "$@" >>"$OUT/sync.log" 2>&1 || echo "FAILED $tag $bin $m $*" >>"$OUT/sync.log"
  echo "took $((SECONDS - t0)) s" >>"$OUT/sync.log"
}
for rep in 1 2 3; do
  run gates wsync_bench_gpu_sync qwen3-30b-a3b --direct 1
  run noruns wsync_bench_gpu_sync qwen3-30b-a3b --direct 1 --piece-runs 0
  run nogates wsync_bench_gpu_sync qwen3-30b-a3b --direct 1 --put-gates 0
  run before wsync_bench_gpu_sync_before qwen3-30b-a3b --direct 1
done
sed -n '/^python3 - /,/^PY$/p' .exp/run24a.sh | sed '1d;$d' > "$OUT/table.py"
python3 "$OUT/table.py" "$OUT/sync.log" | tee "$OUT/table.txt"
