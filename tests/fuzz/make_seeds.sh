#!/usr/bin/env bash
# Regenerates the seed corpora in tests/fuzz/corpus/ from a built tree
# (BUILD, default build/): hand-written specs and requests (tests/fuzz/seeds/)
# and scaled-down catalog cases (wsyncctl catalog), as JSON for the layout
# target and in binary (wsync_fuzz_seed_tool) for the others; plans come from
# `wsyncctl plan --json`. Inputs that once crashed a target are added to its
# corpus by hand (named crash-*), never regenerated.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
ctl=$build/tools/wsyncctl
tool=$build/tests/fuzz/wsync_fuzz_seed_tool
out=tests/fuzz/corpus
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"/{layout_json_fuzzer,transfer_spec_fuzzer,plan_part_fuzzer,register_tensors_fuzzer,controller_state_fuzzer}
cases=(
  "tiny_llama_fsdp|--model tiny-llama --source fsdp:2 --destination vllm-tp:2 --gpus-per-node 2"
  "tiny_llama_colocated|--model tiny-llama --source fsdp:2 --destination vllm-tp:2 --colocated --trainer-dtype fp32"
  "tiny_moe_megatron|--model tiny-qwen3-moe --source megatron:tp1,pp1,dp2,ep2 --destination vllm-tp:2,ep"
  "tiny_mla_fp8|--model tiny-mla --source fsdp:2 --destination vllm-tp:2 --fp8-block"
)
for c in "${cases[@]}"; do
  name=${c%%|*}
  # shellcheck disable=SC2086
  "$ctl" catalog ${c#*|} --out "$tmp/$name.json"
done
cp tests/fuzz/seeds/spec_*.json "$tmp/"
for f in "$tmp"/*.json; do
  name=$(basename "$f" .json)
  cp "$f" "$out/layout_json_fuzzer/$name.json"
  "$tool" TransferSpec "$f" "$out/transfer_spec_fuzzer/$name.bin"
  "$ctl" plan "$f" --json > "$tmp/$name.plan"
  "$tool" Plan "$tmp/$name.plan" "$out/plan_part_fuzzer/$name.bin"
done
# Hand-written plan parts with piece runs (valid ones, huge counts and steps).
for f in tests/fuzz/seeds/plan_*.json; do
  "$tool" Plan "$f" "$out/plan_part_fuzzer/$(basename "$f" .json).bin"
done
for f in tests/fuzz/seeds/register_*.json; do
  "$tool" RegisterTensorsRequest "$f" "$out/register_tensors_fuzzer/$(basename "$f" .json).bin"
done
for f in tests/fuzz/seeds/state_*.json; do
  "$tool" StateFuzzInput "$f" "$out/controller_state_fuzzer/$(basename "$f" .json).bin"
done
du -sh "$out"/*
