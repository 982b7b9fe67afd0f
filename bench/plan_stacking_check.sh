#!/usr/bin/env bash
# `wsyncctl plan` with tensor stacking (auto, the default) against the commit
# before (OLD), alternating, three times: CPU, max RSS, records, simulated
# makespan. Usage: NEW=build/tools/wsyncctl OLD=/tmp/wsyncctl-before bench/plan_stacking_check.sh
new=${NEW:-build/tools/wsyncctl}
old=${OLD:-build-before/wsyncctl}
cases=(
  "--model kimi-k2 --source fsdp:256 --destination vllm-tp:16x8,ep"
  "--model kimi-k2 --source fsdp:128 --destination vllm-tp:16x8,ep"
  "--model kimi-k2 --source fsdp:64 --destination vllm-tp:16x8,ep"
  "--model kimi-k2 --source megatron:tp8,pp4,dp8,ep8 --destination vllm-tp:16x8,ep --fp8-block"
  "--model deepseek-v3 --source fsdp:256 --destination vllm-tp:16x8,ep"
  "--model qwen3-235b-a22b --source fsdp:256 --destination vllm-tp:8x8,ep"
)
for rep in 1 2 3; do
for c in "${cases[@]}"; do
  for b in new old; do
    bin=$new; [ $b = old ] && bin=$old
    out=$( { /usr/bin/time -f "TIME maxrss_kb %M user %U sys %S wall %e" $bin plan $c --top 0 ; } 2>&1 )
    t=$(echo "$out" | grep TIME | sed 's/TIME //')
    rec=$(echo "$out" | grep -E "piece runs" | sed 's/.*(\(.*\) records)/\1/')
    pcs=$(echo "$out" | grep -E "^  ops" | sed 's/.*buckets, //;s/ (.*//')
    sim=$(echo "$out" | grep -E "^  simulator" | sed 's/  simulator *//;s/ (worker[^)]*)//')
    err=$(echo "$out" | grep -E " E " | head -1 | sed 's/.*plan: //' | cut -c1-120)
    echo "$rep | $b | $c | $t | load $(cut -d' ' -f1 /proc/loadavg) | records $rec | $pcs | $sim $err"
  done
done
done
