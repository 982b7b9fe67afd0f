#!/usr/bin/env bash
# `wsyncctl plan --stacking off` against `on`, one build, back to back, no piece
# limit: CPU, max RSS, records, simulated makespan (plan quality of stacking).
# Usage: BIN=build/tools/wsyncctl bench/plan_stacking_quality.sh
bin=${BIN:-build/tools/wsyncctl}
cases=(
  "--model llama3-8b --source fsdp:8 --destination vllm-tp:2x4"
  "--model llama3-70b --source fsdp:64 --destination vllm-tp:8x8"
  "--model qwen3-30b-a3b --source fsdp:8 --destination vllm-tp:4x2,ep"
  "--model qwen3-235b-a22b --source fsdp:32 --destination vllm-tp:8x4,ep"
  "--model deepseek-v3 --source fsdp:32 --destination vllm-tp:16x4,ep"
  "--model kimi-k2 --source megatron:tp8,pp4,dp8,ep8 --destination vllm-tp:16x8,ep --fp8-block"
  "--model kimi-k2 --source fsdp:16 --destination vllm-tp:16x8,ep"
  "--model kimi-k2 --source fsdp:32 --destination vllm-tp:16x8,ep"
  "--model kimi-k2 --source fsdp:64 --destination vllm-tp:16x8,ep"
)
for c in "${cases[@]}"; do
  for m in off on; do
    out=$( { /usr/bin/time -f "TIME maxrss_kb %M user %U sys %S wall %e" $bin plan $c --stacking $m --max-pieces 0 --max-buckets 0 --top 0 ; } 2>&1 )
    t=$(echo "$out" | grep TIME | sed 's/TIME //')
    rec=$(echo "$out" | grep -E "piece runs" | sed 's/.*(\(.*\) records)/\1/')
    pcs=$(echo "$out" | grep -E "^  ops" | sed 's/.*buckets, //')
    sim=$(echo "$out" | grep -E "^  simulator" | sed 's/  simulator *//')
    err=$(echo "$out" | grep -E " E " | head -1)
    echo "$m | $c | $t | records $rec | $pcs | $sim $err"
  done
done
