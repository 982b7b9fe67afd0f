#!/usr/bin/env bash
# The GPU proof of issue 16, in one call from the repo root on the 2-GPU
# machine (carry .devbundle and build/python; Python 3.12 with torch,
# transformers, grpcio, protobuf there):
#   bash tests/python/gpu/run_gpu_proof.sh
# 1. export checks of wsync.cuda_ipc (legacy handle fields; expandable
#    segments refused by name),
# 2. sync_proof.py under torchrun on 2 GPUs: FSDP2 transformers trainers
#    (Llama- and Qwen3-MoE-shaped) -> colocated vLLM TP=2 receivers through
#    the bundle's wsync-controller / wsync-worker --device, bit-exact checks,
#    sync times.
# Results in $OUT (default ./gpu-out): proof.log, proof0.jsonl (one record per
# model and version), export_*.log, the services' logs. Exit status 0 only if
# every check held. WSYNC_PROOF_VERSIONS (default 3), WSYNC_PROOF_MODELS.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
bundle=$PWD/.devbundle
export LD_LIBRARY_PATH=$bundle/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# NVLink multicast must stay off on the shared GPU hosts.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python:$PWD/build/python${PYTHONPATH:+:$PYTHONPATH}
unset PYTORCH_CUDA_ALLOC_CONF PYTORCH_ALLOC_CONF
gpu=tests/python/gpu
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv
  python3 -c 'import sys, torch, google.protobuf as p, grpc
print("python", sys.version.split()[0], "torch", torch.__version__, "protobuf", p.__version__, "grpcio", grpc.__version__)
import transformers; print("transformers", transformers.__version__)' 2>&1
  ls -l "$bundle/bin/wsync-controller" "$bundle/bin/wsync-worker" 2>&1
} | tee "$OUT/env.txt"
rc=0
timeout 60 python3 $gpu/export_check.py legacy 2>&1 | tee "$OUT/export_legacy.log"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 60 python3 $gpu/export_check.py expandable \
  2>&1 | tee "$OUT/export_expandable.log"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
run_dir=$(mktemp -d /tmp/wsync-proof-XXXXXX)
timeout 240 torchrun --nproc_per_node 2 --master_port 29571 $gpu/sync_proof.py \
  --run-dir "$run_dir" --bin-dir "$bundle/bin" --out "$OUT" \
  --versions "${WSYNC_PROOF_VERSIONS:-3}" --models "${WSYNC_PROOF_MODELS:-llama,qwen3_moe}" \
  2>&1 | tee "$OUT/proof.log"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
cp "$run_dir"/*.log "$OUT"/ 2>/dev/null
echo "=== summary"
grep -h '^PROOF ' "$OUT/proof.log" | cut -c1-400
grep -h 'PROOF PASSED\|PROOF FAILED\|export OK\|refused:' "$OUT"/*.log | cut -c1-200
echo "rc=$rc"
exit $rc
