#!/usr/bin/env bash
# Session 23 run D (2 GPUs): put copy streams 1 against 4 (the default) on the 2-GPU modes (tp1,
# colocated), and session 22's build, alternating, two repetitions per model.
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.devbundle/lib:/usr/local/cuda/lib64
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
b=.devbundle/bin
run() {
  local tag=$1 m=$2; shift 2
  echo "=== $tag x $m $*" >>"$OUT/sync.log"
  local bin=wsync_bench_gpu_sync; [ "$tag" = before ] && bin=wsync_bench_gpu_sync_before
  timeout 100 $b/$bin --model "$m" --iters 7 --mode tp1,colocated --direct 1 "$@" >>"$OUT/sync.log" 2>&1 || echo "FAILED $tag $m $*" >>"$OUT/sync.log"
}
for m in llama3-8b qwen3-30b-a3b; do
  for rep in 1 2; do
    run streams4 $m --put-copy-streams 4
    run streams1 $m --put-copy-streams 1
    run before $m
  done
done
python3 - "$OUT/sync.log" <<'PY' | tee "$OUT/table.txt"
import json, re, sys, collections
tag = None; res = collections.defaultdict(list); ws = collections.defaultdict(list)
for line in open(sys.argv[1]):
    if line.startswith('==='):
        p = line.split(); tag = (p[3], p[1]); ws = collections.defaultdict(list)
    m = re.search(r'RESULT (\{.*\})', line)
    if m:
        r = json.loads(m.group(1))
        if r.get('bench') == 'wsync_sync':
            ws[r['mode']].append(r)
            if len(ws[r["mode"]]) == 2:
                res[(tag[0], r['mode'], tag[1])].append(max(x['median_s'] for x in ws[r['mode']]) * 1e3)
        if 'checksum_match' in r: res[('match',)].append(r['checksum_match'])
for k, v in sorted(res.items()):
    if k[0] == 'match': print('checksums matched:', all(v), len(v)); continue
    print(*k, ' '.join(f'{x:.2f}' for x in v))
PY
