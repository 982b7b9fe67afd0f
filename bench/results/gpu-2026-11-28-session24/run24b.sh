#!/usr/bin/env bash
# Session 24 run B: the CUDA plane conformance suite and the GPU executor tests with the gate
# kernels loaded eagerly; then the 2-GPU modes (tp1, colocated) of this build against session 23's,
# alternating, to show the gates' signals cost nothing where there is one phase.
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.devbundle/lib:/usr/local/cuda/lib64
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
b=.devbundle/bin
{ nvidia-smi -L; date -u; } | tee "$OUT/env.txt"
for t in wsync_gpu_plane_conformance_test wsync_gpu_executor_test; do
  timeout 150 $b/$t >"$OUT/$t.log" 2>&1; echo "$t rc=$?" | tee -a "$OUT/env.txt"
  grep -E "FAILED|Failure|PASSED|tests ran" "$OUT/$t.log" | tail -6
done
run() {
  local tag=$1 bin=$2 m=$3; shift 3
  echo "=== $tag $bin $m $*" >>"$OUT/sync.log"
  local t0=$SECONDS
  timeout 120 $b/$bin --model "$m" --iters 7 --mode tp1,colocated "$@" >>"$OUT/sync.log" 2>&1 || echo "FAILED $tag $bin $m $*" >>"$OUT/sync.log"
  echo "took $((SECONDS - t0)) s" >>"$OUT/sync.log"
}
for m in llama3-8b qwen3-30b-a3b; do
  for rep in 1 2; do
    run gates wsync_bench_gpu_sync $m --direct 1
    run before wsync_bench_gpu_sync_before $m --direct 1
  done
done
sed -n '/^python3 - /,/^PY$/p' .exp/run24a.sh | sed '1d;$d' > "$OUT/table.py"
python3 "$OUT/table.py" "$OUT/sync.log" | tee "$OUT/table.txt"
