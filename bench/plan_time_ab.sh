#!/usr/bin/env bash
# Plan time of two plan_bench builds, alternated in one invocation (the only
# fair comparison on a shared, noisy host):
#   bench/plan_time_ab.sh BEFORE/plan_bench AFTER/plan_bench "kimi-k2 megatron" [runs]
# Prints one line per (build, run, case): wall seconds and peak RSS MiB.
set -euo pipefail
before="$1" after="$2" filter="$3" runs="${4:-3}"
for rep in $(seq 1 "$runs"); do
  for build in before after; do
    bin="$before"; [ "$build" = after ] && bin="$after"
    "$bin" --filter "$filter" 2>/dev/null | grep "^| " | grep -v "^| case" |
      awk -F'|' -v b="$build" -v r="$rep" '{printf "%s rep%d %-75s wall %s rss %s\n", b, r, $2, $6, $8}'
  done
done
