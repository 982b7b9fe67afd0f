#!/usr/bin/env bash
# Session 23 run A (4 GPUs): put phases (controller/plan/put_phases.h) on the 4-GPU modes with
# direct writes: this build with --put-phases 1 and 0, and session 22's build (the commit before),
# alternating; NCCL (--direct 0) once for reference.
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.devbundle/lib:/usr/local/cuda/lib64
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
b=.devbundle/bin
MODELS=${MODELS:-llama3-8b qwen3-30b-a3b}
REPS=${REPS:-2}
{ nvidia-smi -L; nvidia-smi topo -m | head -6; date -u; } | tee "$OUT/env.txt"
run() {
  local tag=$1 bin=$2 m=$3; shift 3
  echo "=== $tag $bin $m $*" >>"$OUT/sync.log"
  local t0=$SECONDS
  timeout 150 $b/$bin --model "$m" --iters 7 --mode fanout_tp2,colocated4,fanout_dp2 "$@" >>"$OUT/sync.log" 2>&1 || echo "FAILED $tag $bin $m $*" >>"$OUT/sync.log"
  echo "took $((SECONDS - t0)) s" >>"$OUT/sync.log"
}
for m in $MODELS; do
  for rep in $(seq 1 "$REPS"); do
    run phases wsync_bench_gpu_sync $m --direct 1 --put-phases 1
    run nophases wsync_bench_gpu_sync $m --direct 1 --put-phases 0
    run before wsync_bench_gpu_sync_before $m --direct 1
  done
  [ "${NCCL:-1}" = 1 ] && run nccl wsync_bench_gpu_sync $m --direct 0
done
grep -E '^===|RESULT|FAILED|took|put phases' "$OUT/sync.log" | grep -v wsync_plan | grep -oE '^===.*|FAILED.*|took.*|put phases.*|"mode":"[a-z0-9_]+"|"worker":[0-9]|"median_s":[0-9.]+|"checksum_match":[a-z]+' | paste -sd' ' | sed 's/===/\n===/g; s/"mode"/\n  "mode"/g' > "$OUT/summary.txt"
python3 - "$OUT/sync.log" <<'PY' | tee "$OUT/table.txt"
import json, re, sys, collections
tag = None; rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    if line.startswith('==='):
        parts = line.split(); tag = parts[1]; model = parts[3]
    m = re.search(r'RESULT (\{.*\})', line)
    if m:
        r = json.loads(m.group(1))
        if r.get('bench') == 'wsync_sync':
            rows[(model, r['mode'], tag)].append(r['median_s'])
# slowest worker per run: group by consecutive workers: take max over workers of each run
agg = collections.defaultdict(list)
for (model, mode, tag), v in rows.items():
    agg[(model, mode)].append((tag, v))
for (model, mode), lst in sorted(agg.items()):
    print(model, mode, ' | '.join(f"{t}: {sorted(set(round(x*1e3,2) for x in v))}" for t, v in lst))
PY
