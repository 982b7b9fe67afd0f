#!/usr/bin/env bash
# GPU tests and benchmarks in two steps:
#   scripts/gpu_run.sh build     here: Release build with CUDA into build-gpu
#                                (WSYNC_BUILD_DIR overrides), then bundle the GPU
#                                binaries and the libraries the GPU machine lacks
#                                into .devbundle (/work/shared/gpu/bundle.sh).
#   scripts/gpu_run.sh device    on the GPU machine, from the repo root: every GPU
#                                test, then every GPU benchmark; logs and results
#                                go to $OUT (default ./gpu-out).
# One device call (the `run` tool), carrying .devbundle:
#   bash scripts/gpu_run.sh device
# The service check runs the real controller and wsync-worker --device processes
# (wsync-demo --gpus 2: owners register device tensors by CUDA IPC, NCCL moves
# them, every destination byte is verified).
# Environment: WSYNC_GPU_SKIP_TESTS=1 / WSYNC_GPU_SKIP_SERVICE=1 / WSYNC_GPU_SKIP_BENCH=1 /
# WSYNC_GPU_SKIP_PEERS=1,
# WSYNC_GPU_SKIP_MICRO=1 (skips the p2p / IPC / checksum-kernel micro-benchmarks),
# WSYNC_SYNC_BASELINE=<path> (a sync-bench binary built from an earlier commit: every
# sync variant also runs through it, right after the current build's run, and its
# RESULT lines carry "build":"baseline" — an A/B in one call),
# WSYNC_BENCH_MODELS (default "llama3-8b qwen3-30b-a3b"), WSYNC_BENCH_ITERS (5),
# WSYNC_SYNC_MODES (default: tp1,colocated, plus fanout_tp2,fanout_dp2,colocated4
# on 4 or more GPUs), WSYNC_SYNC_FLAGS (extra sync-bench flags).
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
bundle=.devbundle
gpu_bins="wsync_gpu_piece_table_test wsync_gpu_put_list_test wsync_gpu_data_ops_test wsync_gpu_nccl_transport_test
  wsync_gpu_nccl_conformance_test wsync_gpu_ipc_registry_test wsync_gpu_vmm_import_test wsync_gpu_executor_test
  wsync_gpu_data_ops_put_test wsync_gpu_plane_conformance_test wsync_gpu_checksum_kernel_test
  wsync_gpu_shadow_set_test wsync_gpu_shadow_swap_test wsync_gpu_reserved_sms_test
  wsync_bench_nccl_ceiling wsync_bench_gpu_sync wsync_bench_ipc_open wsync_bench_p2p_overlap
  wsync_bench_ipc_put wsync_bench_vmm_swap wsync_bench_wire_hash wsync_bench_step_latency
  wsync-controller wsync-worker wsync-demo wsyncctl"

case "$mode" in
build)
  set -e
  build=${WSYNC_BUILD_DIR:-build-gpu}
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DWSYNC_WITH_CUDA=ON \
    "${launcher[@]}" >/dev/null
  targets=()
  all_targets=$(ninja -C "$build" -t targets all 2>/dev/null)
  for b in $gpu_bins; do
    grep -q "^$b:" <<<"$all_targets" && targets+=("$b")
  done
  ninja -C "$build" -j"${JOBS:-2}" "${targets[@]}"
  rm -rf "$bundle"
  exes=()
  for b in "${targets[@]}"; do exes+=("$(find "$build" -type f -name "$b" -perm -u+x | head -1)"); done
  bash /work/shared/gpu/bundle.sh "$bundle" "${exes[@]}"
  ;;
device)
  . bench/gpu/device_env.sh  # $bundle is .devbundle, as it assumes
  wsync_gpu_out
  wsync_device_env
  export PYTHONUNBUFFERED=1
  wsync_env_lines topo nccl torch >"$OUT/env.txt" 2>&1
  ngpu=$(nvidia-smi -L | wc -l)
  rc=0
  if [ "${WSYNC_GPU_SKIP_TESTS:-0}" != 1 ]; then
    for t in $bundle/bin/wsync_gpu_*_test; do
      filter='*'
      # The shared suite's silent-peer case needs 3 ranks: NCCL needs one GPU each.
      [ "$ngpu" -lt 3 ] && filter='-*SilentPeerGivesDeadlineExceededNamingPeer*'
      echo "=== $t" >>"$OUT/tests.log"
      timeout 240 "$t" --gtest_filter="$filter" >>"$OUT/tests.log" 2>&1 || { rc=1; echo "FAILED: $t" >>"$OUT/tests.log"; }
    done
    grep -E '^(=== |\[  (PASSED|FAILED|SKIPPED) |FAILED:)' "$OUT/tests.log"
  fi
  if [ "${WSYNC_GPU_SKIP_SERVICE:-0}" != 1 ] && [ -x $bundle/bin/wsync-demo ]; then
    demo=($bundle/bin/wsync-demo --gpus 2 --controller_bin=$bundle/bin/wsync-controller
      --worker_bin=$bundle/bin/wsync-worker --versions 3)
    # The last two kill a worker in the middle of version 2's sync (its NCCL
    # peers must abort and stay alive), restart it, and sync version 2 again.
    for c in "tiny-llama fsdp:1 vllm-tp:1" "tiny-llama fsdp:2 vllm-tp:2 --colocated" \
        "tiny-qwen3-moe fsdp:2 vllm-tp:2 --colocated" "tiny-mla fsdp:1 vllm-tp:1" \
        "tiny-llama fsdp:1 vllm-tp:1 --kill_in_version=2" \
        "tiny-qwen3-moe fsdp:2 vllm-tp:2 --colocated --kill_in_version=2"; do
      set -- $c
      model=$1 src=$2 dst=$3
      shift 3
      echo "=== wsync-demo --model $model --source $src --destination $dst $*" >>"$OUT/service.log"
      # Logs stay out of $OUT (too many files to bring back) unless it fails.
      wd="/tmp/wsync-service-$model-$(echo "$*" | tr -dc 'a-z0-9')"
      timeout 180 "${demo[@]}" --model "$model" --source "$src" --destination "$dst" "$@" \
        --work_dir "$wd" >>"$OUT/service.log" 2>&1 ||
        { rc=1; echo "FAILED: service $c" >>"$OUT/service.log"; cp -r "$wd" "$OUT/"; }
    done
    grep -E '^(===|OK|FAILED|demo:)|killed mid-sync|restarted' "$OUT/service.log"
    grep -oE '^v3 .*direct-write pairs [0-9]+' "$OUT/service.log" | sed -E 's/ \|.*,//'

  fi
  if [ "${WSYNC_GPU_SKIP_BENCH:-0}" != 1 ]; then
    gpus=2
    [ "$ngpu" -ge 4 ] && gpus=4
    modes=${WSYNC_SYNC_MODES:-tp1,colocated}
    [ -z "${WSYNC_SYNC_MODES:-}" ] && [ "$gpus" -ge 4 ] && modes="$modes,fanout_tp2,fanout_dp2,colocated4"
    timeout 200 $bundle/bin/wsync_bench_nccl_ceiling --iters "${WSYNC_BENCH_ITERS:-10}" --gpus "$gpus" \
      >"$OUT/ceiling.log" 2>&1 || rc=1
    grep RESULT "$OUT/ceiling.log"
    micro=1
    [ "${WSYNC_GPU_SKIP_MICRO:-0}" = 1 ] && micro=0
    if [ $micro = 1 ] && [ -x $bundle/bin/wsync_bench_p2p_overlap ]; then
      timeout 120 $bundle/bin/wsync_bench_p2p_overlap --iters "${WSYNC_BENCH_ITERS:-10}" \
        >"$OUT/p2p.log" 2>&1 || rc=1
      grep RESULT "$OUT/p2p.log"
    fi
    if [ $micro = 1 ] && [ -x $bundle/bin/wsync_bench_wire_hash ]; then
      timeout 120 $bundle/bin/wsync_bench_wire_hash --iters "${WSYNC_BENCH_ITERS:-10}" \
        >"$OUT/wire_hash.log" 2>&1 || rc=1
      grep RESULT "$OUT/wire_hash.log"
    fi
    if [ $micro = 1 ] && [ -x $bundle/bin/wsync_bench_step_latency ]; then
      timeout 120 $bundle/bin/wsync_bench_step_latency --iters "${WSYNC_BENCH_ITERS:-10}" \
        >"$OUT/step_latency.log" 2>&1 || rc=1
      grep RESULT "$OUT/step_latency.log"
    fi
    if [ $micro = 1 ] && [ -x $bundle/bin/wsync_bench_ipc_put ] && [ "$ngpu" -ge 2 ]; then
      timeout 120 $bundle/bin/wsync_bench_ipc_put --iters "${WSYNC_BENCH_ITERS:-10}" \
        >"$OUT/ipc_put.log" 2>&1 || rc=1
      grep RESULT "$OUT/ipc_put.log"
    fi
    # This run's own ceilings feed the sync bench's lower bounds.
    rates=$(python3 - "$OUT/ceiling.log" <<'PY'
import json, sys
r = {}
for line in open(sys.argv[1]):
    if line.startswith("RESULT "):
        j = json.loads(line[7:])
        if j.get("case") == "sendrecv_1GiB": r["nv"] = j["gbps"]
        if j.get("case") == "bidirectional_1GiB": r["bi"] = j["gbps"]
        if j.get("bench") == "device_copy": r["cp"] = min(r.get("cp", 1e9), j["memcpy_gbps"])
print(f"--nvlink-gbps {r.get('nv', 368)} --bidir-gbps {r.get('bi', 354)} --copy-gbps {r.get('cp', 2071)}")
PY
)
    if [ $micro = 1 ] && [ -x $bundle/bin/wsync_bench_ipc_open ]; then
      for m in ${WSYNC_BENCH_MODELS:-llama3-8b qwen3-30b-a3b}; do
        timeout 120 $bundle/bin/wsync_bench_ipc_open --model "$m" >>"$OUT/ipc.log" 2>&1 || { rc=1; echo "FAILED: ipc $m" >>"$OUT/ipc.log"; }
      done
      grep -E 'RESULT|FAILED' "$OUT/ipc.log"
    fi
    if [ -x $bundle/bin/wsync_bench_gpu_sync ]; then
      # WSYNC_SYNC_VARIANTS: ';'-separated flag sets, each run in turn per
      # model (A/B in one call), e.g. "--direct 0;--direct 1;--direct 0;--direct 1".
      IFS=';' read -ra variants <<<"${WSYNC_SYNC_VARIANTS:---direct 0;--direct 1}"
      for m in ${WSYNC_BENCH_MODELS:-llama3-8b qwen3-30b-a3b}; do
        for v in "${variants[@]}"; do
          timeout 400 $bundle/bin/wsync_bench_gpu_sync --model "$m" --mode "$modes" --iters "${WSYNC_BENCH_ITERS:-5}" $rates ${WSYNC_SYNC_FLAGS:-} $v \
            >>"$OUT/sync.log" 2>&1 || { rc=1; echo "FAILED: sync $m $v" >>"$OUT/sync.log"; }
          if [ -n "${WSYNC_SYNC_BASELINE:-}" ]; then
            timeout 400 "$WSYNC_SYNC_BASELINE" --model "$m" --mode "$modes" --iters "${WSYNC_BENCH_ITERS:-5}" $rates ${WSYNC_SYNC_FLAGS:-} $v 2>&1 |
              sed 's/^RESULT {/RESULT {"build":"baseline",/' >>"$OUT/sync.log" ||
              { rc=1; echo "FAILED: baseline sync $m $v" >>"$OUT/sync.log"; }
          fi
        done
      done
      # Fewer, larger rounds for the many-expert model (staging cap 8 GiB).
      if [ "${WSYNC_SYNC_SWEEP:-1}" != 0 ]; then
        timeout 200 $bundle/bin/wsync_bench_gpu_sync --model qwen3-30b-a3b --mode tp1 \
          --bucket-mib 1024 --staging-mib 8192 --iters "${WSYNC_BENCH_ITERS:-5}" $rates \
          >>"$OUT/sync.log" 2>&1 || { rc=1; echo "FAILED: sync sweep" >>"$OUT/sync.log"; }
      fi
      grep -E 'RESULT|FAILED|rror' "$OUT/sync.log"
    fi
    if [ "${WSYNC_GPU_SKIP_PEERS:-0}" != 1 ] && [ -f bench/gpu/peers.py ]; then
      for m in ${WSYNC_BENCH_MODELS:-llama3-8b qwen3-30b-a3b}; do
        timeout 200 torchrun --standalone --nproc_per_node=2 bench/gpu/peers.py --model "$m" \
          --iters "${WSYNC_BENCH_ITERS:-5}" >>"$OUT/peers.log" 2>&1 || { rc=1; echo "FAILED: peers $m" >>"$OUT/peers.log"; }
      done
      if [ "$gpus" -ge 4 ]; then
        for m in ${WSYNC_BENCH_MODELS:-llama3-8b qwen3-30b-a3b}; do
          timeout 400 torchrun --standalone --nproc_per_node=4 bench/gpu/peers.py --model "$m" \
            --iters "${WSYNC_BENCH_ITERS:-5}" >>"$OUT/peers.log" 2>&1 || { rc=1; echo "FAILED: peers4 $m" >>"$OUT/peers.log"; }
        done
      fi
      grep -E 'RESULT|FAILED|Error' "$OUT/peers.log"
    fi
  fi
  grep -h RESULT "$OUT"/*.log 2>/dev/null | sed 's/^RESULT //' >"$OUT/results.jsonl"
  exit $rc
  ;;
*)
  echo "usage: $0 build|device" >&2
  exit 2
  ;;
esac
