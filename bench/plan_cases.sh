# The catalog cases bench/plan_cli_check.sh and bench/plan_runs_check.sh
# run (sourced; sets `cases`). KIMI=0 leaves out the Kimi-K2 Megatron case.
# shellcheck shell=bash
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
