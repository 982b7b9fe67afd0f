#!/usr/bin/env bash
# Issue 21 item 4: what one more step inside a round costs, and the NCCL
# transport's steps, on a machine of 2 or more GPUs, in one device call
# (about 2 min), from the repo root:
#   bash bench/gpu/run_step_latency.sh
# (a) bench/gpu/step_latency.cu (built here by nvcc) as a relay chain over
#     GPUs 0 -> 1, 32 and 4 MiB: over NVLink, then with NCCL forced onto its
#     network transport (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
#     NCCL_NET=Socket: two "nodes" on one host, sockets over the host's
#     interface), and on one GPU alone (self sends, the GPU-side cost);
#     each once as steps (one stream, no host wait) and once as rounds (the
#     host waits for both GPUs after each step): l against L;
# (b) if .devbundle holds wsync_gpu_nccl_conformance_test (bash
#     scripts/gpu_run.sh build, or bundle.sh on that one binary): the NCCL
#     transport's conformance suite over NVLink, and its step tests again
#     over the network transport.
# Results: $OUT/step_latency.jsonl (the RESULT lines, each with "link"),
# $OUT/*.log, $OUT/env.txt.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
. bench/gpu/device_env.sh
wsync_gpu_out
wsync_device_env
wsync_env_lines topo nccl >"$OUT/env.txt" 2>&1
rc=0
bin=/tmp/wsync_step_latency
nvcc -O2 -std=c++17 -gencode arch=compute_90,code=sm_90 -o "$bin" bench/gpu/step_latency.cu \
  -lnccl -L/usr/local/cuda/lib64 || exit 1
net_env=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket
  NCCL_SOCKET_NTHREADS=${WSYNC_NCCL_SOCKET_NTHREADS:-8}
  NCCL_NSOCKS_PERTHREAD=${WSYNC_NCCL_NSOCKS_PERTHREAD:-4}
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET)  # the log shows the transport taken
# One probe: $1 link label, $2 GPUs, $3 MiB, $4 barrier (1: the host waits
# after each step, so steps are rounds), the rest an env prefix.
probe() {
  local link=$1 gpus=$2 mib=$3 barrier=$4
  shift 4
  echo "=== $link gpus=$gpus mib=$mib barrier=$barrier" >>"$OUT/step_latency.log"
  env "$@" timeout 120 "$bin" --gpus "$gpus" --mib "$mib" --iters "${WSYNC_STEP_ITERS:-20}" \
    --barrier "$barrier" \
    >"$OUT/probe.tmp" 2>>"$OUT/step_latency.log" || { rc=1; echo "FAILED: $link" >>"$OUT/step_latency.log"; }
  cat "$OUT/probe.tmp" >>"$OUT/step_latency.log"
  grep '^RESULT ' "$OUT/probe.tmp" | sed "s/^RESULT {/RESULT {\"link\":\"$link\",/" >>"$OUT/step_latency.jsonl"
}
for mib in 32 4; do
  for barrier in 0 1; do
    probe nvlink 2 "$mib" "$barrier"
    probe net_socket 2 "$mib" "$barrier" "${net_env[@]}"
    probe self 1 "$mib" "$barrier"
  done
done
rm -f "$OUT/probe.tmp"
conf=.devbundle/bin/wsync_gpu_nccl_conformance_test
if [ -x "$conf" ]; then
  timeout 240 "$conf" >"$OUT/conformance_nvlink.log" 2>&1 || rc=1
  env "${net_env[@]}" timeout 240 "$conf" --gtest_filter='*Steps*' \
    >"$OUT/conformance_net.log" 2>&1 || rc=1
  grep -hE '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]' "$OUT"/conformance_*.log
fi
grep -m3 -E 'via NET/Socket|Using network Socket' "$OUT/step_latency.log"
grep -h '"chunks":' "$OUT/step_latency.jsonl" | cut -c1-200
exit $rc
