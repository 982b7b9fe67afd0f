#!/usr/bin/env bash
# The GPU proof of issue 16, in one call from the repo root on the 2-GPU
# machine (4 GPUs for every stage; carry .devbundle and build/python; Python 3.12 with torch,
# transformers, grpcio, protobuf there):
#   bash tests/python/gpu/run_gpu_proof.sh
# 1. export checks of wsync.cuda_ipc (legacy handle fields; expandable
#    segments refused by name) and of the vLLM proof's no-handle allocator,
# 2. sync_proof.py under torchrun, stage by stage (WSYNC_PROOF_STAGES, default
#    all): FSDP2 transformers trainers (Llama- and Qwen3-MoE-shaped) -> vLLM
#    TP=2 receivers through the bundle's wsync-controller / wsync-worker
#    --device, bit-exact checks, sync times:
#      colocated    2 GPUs, receivers on the trainers' GPUs
#      expandable   the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
#                   (trainer and receivers in cuMem memory, SCM_RIGHTS export)
#      disjoint     4 GPUs: trainers on 0-1, receivers on 2-3
#      disjoint_expandable  (not in the default list) the same, expandable
#      tpfsdp       4 GPUs: Llama TP=2 x FSDP2 dp=2 (2-D DTensors)
#      timing       2 GPUs, a 0.5 B-parameter Llama; then the data-plane
#                   benchmark (wsync_bench_gpu_sync --spec) on the same spec,
#                   compared by compare_timing.py
#      timing_transport  the same with the workers' direct writes off (NCCL);
#                   WSYNC_TIMING_BENCH_PAUSE_MS=N also runs the bench with
#                   N ms of idle before each sync (bench_<stage>_pause.log)
#      vllm_colocated  issue 17 (vllm_engine_proof.py): FSDP2 trainers on GPUs 0-1,
#                   vLLM TP=2 ranks (one spawned process each, wsync's vLLM engine
#                   with the embedded CUDA worker, weights in cuMem memory without a
#                   shareable handle) on the same GPUs; versions, then a trainer
#                   sidecar frozen and killed mid-sync. Unrun: a sidecar and an
#                   embedded worker on one GPU are two ranks of one NCCL
#                   communicator on one device, which upstream NCCL refuses
#                   ("Duplicate GPU detected", shown with NCCL_DEBUG=WARN)
#      vllm_disjoint   the same on 4 GPUs: trainers on 0-1, vLLM ranks on 2-3
#    The vllm_* stages load wsync._native built for this machine's Python 3.12
#    (python/README.md, "Building wsync._native for the GPU machine"; carry
#    build-gpu312/pybundle) from $WSYNC_NATIVE_PYTHONPATH (default
#    build-gpu312/pybundle/python; its libraries from ../lib), e.g.
#      WSYNC_PROOF_STAGES=vllm_colocated,vllm_disjoint \
#        WSYNC_NATIVE_PYTHONPATH=build-gpu312/pybundle/python \
#        bash tests/python/gpu/run_gpu_proof.sh
# Results in $OUT (default ./gpu-out): proof_<stage>.log, <stage>/proof0.jsonl
# (one record per model and version), <stage>/spec_*.json, bench_*.log,
# timing.txt, export_*.log, the services' logs. Exit status 0 only if every
# check held. WSYNC_PROOF_VERSIONS (default 3), WSYNC_PROOF_MODELS;
# WSYNC_PROOF_STAGING=host_shadow|device_shadow defines staged transfers with
# checksums (docs/staging.md): every version then goes through the shadows, the
# CUDA bucket checksums and the two-phase commit, and is checked bit for bit.
# The low-latency mode (docs/performance-notes.md): WSYNC_BUSY_POLL_MS=-1 (or a
# window in ms) reaches the controller, the workers and the embedded workers this
# starts; WSYNC_CLIENT_BUSY_WAIT=1 the trainers' clients. Unset: off.
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
timeout 60 python3 $gpu/export_check.py nohandle 2>&1 | tee "$OUT/export_nohandle.log"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
# One torchrun: proof NAME NPROC [VAR=VALUE...] -- sync_proof.py args.
port=29571
proof() {
  local name=$1 nproc=$2; shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local run_dir; run_dir=$(mktemp -d /tmp/wsync-proof-XXXXXX)
  port=$((port + 1))
  # wsync._native for this Python, when built (build-gpu312/pybundle): the
  # trainer's client then makes its calls through gRPC C++ (docs/api.md).
  local native=${WSYNC_NATIVE_PYTHONPATH:-build-gpu312/pybundle/python}
  if native=$(cd "$native" 2>/dev/null && pwd); then
    envs+=("PYTHONPATH=$native:$PYTHONPATH"
           "LD_LIBRARY_PATH=$(dirname "$native")/lib:$LD_LIBRARY_PATH")
  fi
  echo "=== proof $name ($nproc GPUs${envs[*]:+, ${envs[*]}})"
  env "${envs[@]}" timeout "${WSYNC_PROOF_TIMEOUT:-300}" torchrun --nproc_per_node "$nproc" --master_port $port \
    $gpu/sync_proof.py --run-dir "$run_dir" --bin-dir "$bundle/bin" --out "$OUT/$name" \
    --versions "${WSYNC_PROOF_VERSIONS:-3}" "$@" 2>&1 | tee "$OUT/proof_$name.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  mkdir -p "$OUT/$name" && cp "$run_dir"/*.log "$OUT/$name"/ 2>/dev/null
}
# One torchrun of vllm_engine_proof.py: vproof NAME NPROC -- args. The vLLM
# ranks' embedded worker needs wsync._native for this Python, first on the path.
vproof() {
  local name=$1 nproc=$2; shift 3
  local native=${WSYNC_NATIVE_PYTHONPATH:-build-gpu312/pybundle/python}
  native=$(cd "$native" 2>/dev/null && pwd) || {
    echo "=== $name: no wsync._native directory ${WSYNC_NATIVE_PYTHONPATH:-build-gpu312/pybundle/python}"
    rc=1; return; }
  local run_dir; run_dir=$(mktemp -d /tmp/wsync-vproof-XXXXXX)
  port=$((port + 1))
  echo "=== vllm proof $name ($nproc GPUs, wsync._native from $native)"
  # The embedded workers run torch's libnccl (one per process); the sidecars
  # must run the same version (NCCL ranks of one communicator must agree: the
  # controller refuses a mix), so torch's comes first on their library path.
  local torch_nccl; torch_nccl=$(python3 -c "import torch.cuda.nccl as n; n.version()
print(next(l.split()[-1] for l in open('/proc/self/maps') if 'libnccl' in l))" 2>/dev/null)
  echo "=== torch's NCCL: ${torch_nccl:-not found}"
  # NCCL_DEBUG=WARN: an NCCL refusal is then named in the logs.
  PYTHONPATH=$PWD/python:$native:$PWD/build/python${PYTHONPATH:+:$PYTHONPATH} \
    NCCL_DEBUG=${NCCL_DEBUG:-WARN} \
    LD_LIBRARY_PATH=${torch_nccl:+$(dirname "$torch_nccl"):}$(dirname "$native")/lib:$LD_LIBRARY_PATH \
    timeout 600 torchrun --nproc_per_node "$nproc" --master_port $port \
    $gpu/vllm_engine_proof.py --run-dir "$run_dir" --bin-dir "$bundle/bin" --out "$OUT/$name" \
    --versions "${WSYNC_PROOF_VERSIONS:-3}" --models "$models" "$@" 2>&1 | tee "$OUT/proof_$name.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  mkdir -p "$OUT/$name" && cp "$run_dir"/*.log "$OUT/$name"/ 2>/dev/null
}
# The data-plane benchmark on the spec a proof synced: same tensors, same
# plan, buffers of its own (bench NAME SPEC_TAG NWORKERS).
bench() {
  local name=$1 tag=$2 direct=$3
  echo "=== bench $name ($tag, --direct $direct)"
  timeout 300 "$bundle/bin/wsync_bench_gpu_sync" --spec "$OUT/$name/spec_$tag.json" \
    --mode spec --iters 10 --direct "$direct" 2>&1 | tee "$OUT/bench_$name.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  # The same with every worker idle before each sync, as between training
  # steps (WSYNC_TIMING_BENCH_PAUSE_MS): the executor's own cold start then
  # counts on both sides of the comparison.
  if [ -n "${WSYNC_TIMING_BENCH_PAUSE_MS:-}" ]; then
    timeout 300 "$bundle/bin/wsync_bench_gpu_sync" --spec "$OUT/$name/spec_$tag.json" \
      --mode spec --iters 10 --direct "$direct" --pause-ms "$WSYNC_TIMING_BENCH_PAUSE_MS" 2>&1 |
      tee "$OUT/bench_${name}_pause.log"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  fi
  python3 $gpu/compare_timing.py "$OUT" "$name" 2>&1 | tee -a "$OUT/timing.txt"
}
ngpu=$(nvidia-smi -L | wc -l)
stages=${WSYNC_PROOF_STAGES:-colocated,expandable,disjoint,tpfsdp,timing,timing_transport,vllm_colocated,vllm_disjoint}
models=${WSYNC_PROOF_MODELS:-llama,qwen3_moe}
for stage in ${stages//,/ }; do
  case $stage in
    colocated) proof colocated 2 CUDA_VISIBLE_DEVICES=0,1 -- --models "$models" ;;
    expandable) proof expandable 2 CUDA_VISIBLE_DEVICES=0,1 \
        PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True -- --models "$models" ;;
    disjoint|disjoint_expandable|tpfsdp)
      if [ "$ngpu" -lt 4 ]; then echo "=== $stage skipped: $ngpu GPUs, needs 4"; continue; fi
      case $stage in
        disjoint) proof disjoint 4 -- --placement disjoint --models "$models" ;;
        disjoint_expandable) proof disjoint_expandable 4 \
            PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True -- --placement disjoint \
            --models "$models" ;;
        tpfsdp) proof tpfsdp 4 -- --placement tpfsdp --models llama ;;
      esac ;;
    timing|timing_transport)
      # timing: direct writes between the colocated workers (the default);
      # timing_transport: workers without them (--direct_writes=false, NCCL).
      flags=""; direct=1
      if [ $stage = timing_transport ]; then flags=--direct_writes=false; direct=0; fi
      WSYNC_PROOF_VERSIONS=${WSYNC_TIMING_VERSIONS:-8} proof $stage 2 CUDA_VISIBLE_DEVICES=0,1 \
        WSYNC_PROOF_WORKER_FLAGS=$flags -- --models "${WSYNC_TIMING_MODELS:-llama}" \
        --size "${WSYNC_TIMING_SIZE:-large}"
      for m in ${WSYNC_TIMING_MODELS:-llama}; do
        bench $stage ${m}_${WSYNC_TIMING_SIZE:-large}_colocated $direct
      done ;;
    vllm_colocated) CUDA_VISIBLE_DEVICES=0,1 vproof vllm_colocated 2 -- --placement colocated ;;
    vllm_disjoint)
      if [ "$ngpu" -lt 4 ]; then echo "=== $stage skipped: $ngpu GPUs, needs 4"; continue; fi
      vproof vllm_disjoint 4 -- --placement disjoint ;;
    *) echo "unknown stage $stage"; rc=1 ;;
  esac
done
echo "=== summary"
grep -h '^PROOF \|^VLLM_PROOF ' "$OUT"/proof_*.log | cut -c1-300
grep -h 'PROOF PASSED\|PROOF FAILED\|allocations refused\|export OK\|refused:\|steady-state' "$OUT"/*.log | cut -c1-240
cat "$OUT/timing.txt" 2>/dev/null
echo "rc=$rc"
exit $rc
