#!/usr/bin/env bash
# Which plans of the GPU suite a planner change alters, without a GPU: the
# specs bench/gpu/bench_cases.cc builds (its defaults: every worker on node0,
# NVLink 368 GB/s, copy 2071 GB/s, 256 MiB buckets, 2 GiB staging, 32 MiB
# zero-copy minimum), planned by `wsyncctl plan`; per model and mode the md5
# of the plan without its summary, the rounds and the predicted time. Run it
# with two builds and diff the outputs:
#   bench/gpu_suite_plans.sh build-before/wsyncctl > before.txt
#   bench/gpu_suite_plans.sh build/tools/wsyncctl > after.txt
set -euo pipefail
bin="$1"
spec=$(mktemp)
trap 'rm -f "$spec"' EXIT
for m in llama3-8b qwen3-30b-a3b; do
  while read -r mode src dst colo; do
    flags=(--model "$m" --source "$src" --destination "$dst")
    [ "$colo" = 1 ] && flags+=(--colocated)
    "$bin" catalog "${flags[@]}" | python3 -c "
import json, sys
d = json.load(sys.stdin)
for side in ('source', 'destination'):
    for r in d[side]['ranks']:
        r['node'] = 'node0'
o = d.setdefault('options', {})
lm = o.setdefault('linkModel', {})
lm['nvlinkBytesPerSecond'] = 368e9
lm['localCopyBytesPerSecond'] = 2071e9
o['bucketBytes'] = str(256 << 20)
o['stagingCapBytes'] = str(2048 << 20)
o['zeroCopyMinBytes'] = str(32 << 20)
json.dump(d, open(sys.argv[1], 'w'))" "$spec"
    sum=$("$bin" plan "$spec" --json | python3 -c "
import hashlib, json, sys
d = json.load(sys.stdin)
s = d.pop('summary')
d.pop('planSeconds', None)
for b in d.get('buckets', []):
    if b.get('step') == 0:
        del b['step']  # printed by builds with Bucket.step only
print(hashlib.md5(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12],
      'rounds', s.get('numRounds'), 'predicted %.4f ms' % (s.get('predictedSeconds', 0) * 1e3))")
    echo "$m $mode: $sum"
  done <<'CASES'
tp1 fsdp:1 vllm-tp:1 0
colocated fsdp:2 vllm-tp:2 1
colocated1 fsdp:1 vllm-tp:1 1
fanout_tp2 megatron:tp2 vllm-tp:1x2 0
fanout_dp2 megatron:tp1,dp2 vllm-tp:1x2 0
colocated4 fsdp:4 vllm-tp:2x2 1
CASES
done
