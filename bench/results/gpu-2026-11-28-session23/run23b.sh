#!/usr/bin/env bash
# Session 23 run B (4 GPUs): what is left between colocated4 with put phases and its link bound:
# put streams, the copy-engine row minimum, local copies dropped, checksums, for Llama and Qwen.
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.devbundle/lib:/usr/local/cuda/lib64
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
b=.devbundle/bin
run() {
  local tag=$1 m=$2; shift 2
  echo "=== $tag x $m $*" >>"$OUT/sync.log"
  timeout 100 $b/wsync_bench_gpu_sync --model "$m" --iters 7 --mode colocated4 --direct 1 "$@" >>"$OUT/sync.log" 2>&1 || echo "FAILED $tag $m $*" >>"$OUT/sync.log"
}
m=llama3-8b
run base $m
run streams1 $m --put-copy-streams 1
run streams2 $m --put-copy-streams 2
run streams8 $m --put-copy-streams 8
run row4k $m --put-copy-engine-row-bytes 4096
run droplocal $m --diagnose-drop local
run base $m
run ce1m $m --put-copy-engine-kib 1024
run parts $m --put-interleave-mib 0 --landing-parts 1
run checksums $m --checksums 1
m=qwen3-30b-a3b
run base $m
run streams2 $m --put-copy-streams 2
run row4k $m --put-copy-engine-row-bytes 4096
run droplocal $m --diagnose-drop local
python3 - "$OUT/sync.log" <<'PY' | tee "$OUT/table.txt"
import json, re, sys
tag = None
for line in open(sys.argv[1]):
    if line.startswith('==='):
        p = line.split(); tag = p[1] + ' ' + p[3]; ws = []
    m = re.search(r'RESULT (\{.*\})', line)
    if m:
        r = json.loads(m.group(1))
        if r.get('bench') == 'wsync_sync':
            ws.append(r)
            if len(ws) == 4:
                w = max(ws, key=lambda r: r['median_s'])
                print(f"{tag:28s} slowest {w['median_s']*1e3:.2f} ms putwait {w['put_wait_s']*1e3:.2f} issue {w['put_issue_s']*1e3:.2f} ce {w['put_copy_engine_copies']} match {all(x.get('checksum_match') for x in ws)}")
PY
