#!/usr/bin/env bash
# Session 24 run A (4 GPUs): phase gates (worker/exec/phase_gates.h) on the 4-GPU modes with direct
# writes and put phases: this build with --put-gates 1 and 0, and session 23's build (the commit
# before, no gates), alternating; then the CUDA plane conformance suite (the gate cases).
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.devbundle/lib:/usr/local/cuda/lib64
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
b=.devbundle/bin
MODELS=${MODELS:-llama3-8b qwen3-30b-a3b}
REPS=${REPS:-3}
{ nvidia-smi -L; nvidia-smi topo -m | head -6; date -u; } | tee "$OUT/env.txt"
if [ -x $b/wsync_gpu_plane_conformance_test ]; then
  timeout 120 $b/wsync_gpu_plane_conformance_test --gtest_filter='*Gate*:*Signal*:*Mailbox*:*Mark*' \
    >"$OUT/conformance.log" 2>&1; echo "conformance rc=$?" | tee -a "$OUT/env.txt"
  grep -E "OK \]|FAILED|Failure" "$OUT/conformance.log" | tail -20
fi
run() {
  local tag=$1 bin=$2 m=$3; shift 3
  echo "=== $tag $bin $m $*" >>"$OUT/sync.log"
  local t0=$SECONDS
  timeout 150 $b/$bin --model "$m" --iters 7 --mode fanout_tp2,colocated4,fanout_dp2 "$@" >>"$OUT/sync.log" 2>&1 || echo "FAILED $tag $bin $m $*" >>"$OUT/sync.log"
  echo "took $((SECONDS - t0)) s" >>"$OUT/sync.log"
}
for m in $MODELS; do
  for rep in $(seq 1 "$REPS"); do
    run gates wsync_bench_gpu_sync $m --direct 1 --put-gates 1
    run nogates wsync_bench_gpu_sync $m --direct 1 --put-gates 0
    run before wsync_bench_gpu_sync_before $m --direct 1
  done
done
python3 - "$OUT/sync.log" <<'PY' | tee "$OUT/table.txt"
# Per run (=== block) and mode: the slowest worker's median (ms); gates timed out (all workers).
import json, re, sys, collections
runs = []; cur = None; match = []
for line in open(sys.argv[1]):
    if line.startswith('==='):
        p = line.split(); cur = {'tag': p[1], 'model': p[3], 'modes': collections.defaultdict(list)}; runs.append(cur)
    m = re.search(r'RESULT (\{.*\})', line)
    if m and cur is not None:
        r = json.loads(m.group(1))
        if r.get('bench') == 'wsync_sync': cur['modes'][r['mode']].append(r)
        if 'checksum_match' in r: match.append(r['checksum_match'])
table = collections.defaultdict(list)
for run in runs:
    for mode, rs in run['modes'].items():
        slow = max(x['median_s'] for x in rs) * 1e3
        gates = sum(x.get('put_gates', 0) for x in rs); to = sum(x.get('put_gates_timed_out', 0) for x in rs)
        table[(run['model'], mode, run['tag'])].append(f"{slow:.2f}" + (f" (gates {gates}, timed out {to})" if run['tag'] == 'gates' else ''))
for k in sorted(table): print(*k, ' | '.join(table[k]))
print('checksums matched:', all(match), len(match))
PY
