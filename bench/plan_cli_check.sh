#!/usr/bin/env bash
# md5 of `wsyncctl plan --json` (planSeconds removed: wall time) for the
# catalog cases a planner change must leave byte-identical; run it with two
# builds and diff the outputs:
#   bench/plan_cli_check.sh build-before/wsyncctl > before.txt
#   bench/plan_cli_check.sh build/tools/wsyncctl > after.txt && diff before.txt after.txt
# KIMI=0 skips the Kimi-K2 Megatron case (0.3 GB of JSON). The empty `runs`
# list --json prints in every bucket (Bucket.runs, docs/plan-compact.md) is
# removed, so builds from before that field compare equal.
set -euo pipefail
bin="$1"
cases=(
  "--model llama3-8b --source fsdp:8 --destination vllm-tp:2x4"
  "--model tiny-llama --source fsdp:4 --destination vllm-tp:2x2 --colocated"
  "--model tiny-llama --source hsdp:2x4 --destination vllm-tp:2x2"
  "--model tiny-qwen3-moe --source fsdp:4 --destination vllm-tp:2x2,ep"
  "--model tiny-qwen3-moe --source megatron:tp2,pp2,dp2,ep2 --destination vllm-tp:4x1,ep"
  "--model tiny-mla --source fsdp:3 --destination vllm-tp:2x1 --fp8-block"
  "--model tiny-mla --source megatron:tp2,pp1,dp2,ep2 --destination vllm-tp:2x2,ep --fp8-block"
  "--model tiny-mla --source hsdp:2x2 --destination vllm-tp:2x2 --fp8-block --colocated"
  "--model qwen3-30b-a3b --source megatron:tp2,pp2,dp2,ep2 --destination vllm-tp:2x2,ep"
)
if [ "${KIMI:-1}" != 0 ]; then
  cases+=("--model kimi-k2 --source megatron:tp8,pp4,dp8,ep8 --destination vllm-tp:16x8,ep --fp8-block")
fi
for c in "${cases[@]}"; do
  # shellcheck disable=SC2086
  sum=$("$bin" plan $c --json | sed -E 's/"planSeconds": ?[0-9.e+-]+,? ?//; s/,? ?"runs": ?\[\]//g' | md5sum | cut -d' ' -f1)
  echo "$sum  $c"
done
