#!/usr/bin/env bash
# Plan quality of round assignment on the catalog (bench/plan_cases.sh) and
# FSDP2 -> replica cases: per case, the simulated makespan, its ratio to the
# plan's own bound and to the routing-independent bound. Run it with two
# builds and compare (bench/results/plan-rounds-2026-11-29.md):
#   bench/plan_rounds_quality.sh build-before/wsyncctl > before.txt
#   bench/plan_rounds_quality.sh build/tools/wsyncctl > after.txt
set -euo pipefail
bin=${1:-build/tools/wsyncctl}
. "$(dirname "$0")/plan_cases.sh"
cases+=(
  "--model llama3-70b --source fsdp:64 --destination vllm-tp:8x4 --trainer-dtype fp32"
  "--model llama3-70b --source megatron:tp8,pp4,dp2 --destination vllm-tp:8x8 --colocated"
  "--model qwen3-30b-a3b --source fsdp:8 --destination vllm-tp:2x4"
  "--model qwen3-30b-a3b --source fsdp:8 --destination vllm-tp:4x2,ep --colocated --trainer-dtype fp32"
  "--model llama3-8b --source fsdp:8 --destination vllm-tp:1x8 --colocated --trainer-dtype fp32"
  "--model qwen3-235b-a22b --source fsdp:8 --destination vllm-tp:8x1,ep"
  "--model qwen3-235b-a22b --source megatron:tp4,pp4,dp4,ep4 --destination vllm-tp:8x4,ep"
  "--model deepseek-v3 --source megatron:tp8,pp4,dp8,ep8 --destination vllm-tp:16x8,ep"
  "--model kimi-k2 --source megatron:tp8,pp4,dp8,ep8 --destination vllm-tp:16x8,ep"
  "--model deepseek-v3 --source megatron:tp8,pp4,dp8,ep8 --destination vllm-tp:16x8,ep --fp8-block"
  "--model deepseek-v3 --source fsdp:32 --destination vllm-tp:16x4,ep"
  "--model qwen3-235b-a22b --source fsdp:32 --destination vllm-tp:8x4,ep"
  "--model kimi-k2 --source fsdp:64 --destination vllm-tp:16x8,ep"
  "--model deepseek-v3 --source fsdp:256 --destination vllm-tp:16x8,ep"
  "--model llama3-8b --source fsdp:8 --destination vllm-tp:1x16"
  "--model llama3-8b --source fsdp:8 --destination vllm-tp:1x32"
  "--model llama3-8b --source fsdp:16 --destination vllm-tp:2x8"
  "--model qwen3-30b-a3b --source fsdp:16 --destination vllm-tp:2x16"
  "--model qwen3-30b-a3b --source fsdp:4 --destination vllm-tp:4x8,ep"
  "--model kimi-k2 --source fsdp:16 --destination vllm-tp:16x8,ep"
  "--model kimi-k2 --source fsdp:256 --destination vllm-tp:16x8,ep"
)
for c in "${cases[@]}"; do
  # shellcheck disable=SC2086
  sim=$("$bin" plan $c --top 0 2>&1 | grep -E "^  simulator" |
    sed -E "s/.*makespan ([0-9.]+ [a-z]+),.*, ([0-9.]+) x the plan.s bound, ([0-9.]+) x the routing.*/\1 | \2 | \3/")
  echo "$c | $sim"
done
