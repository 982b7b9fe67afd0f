#!/usr/bin/env bash
# Issue 21 item 5, "two nodes on one host", in one device call on a 4-GPU
# machine (about 3 min expected), from the repo root, carrying .devbundle
# (built by `bash scripts/gpu_run.sh build`):
#   bash bench/gpu/run_two_nodes.sh
# GPUs {0,1} are node n0 and {2,3} node n1 (wsync-worker --node, and the
# spec's ranks name the same nodes). Every process gets NCCL forced onto its
# network transport (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket,
# NCCL_SOCKET_NTHREADS / NCCL_NSOCKS_PERTHREAD), so all NCCL traffic, inside a
# node too, crosses sockets; the controller lets workers write each other
# directly (CUDA IPC over NVLink) only inside a node. Steps:
#  (a) rates: NCCL send/recv GPU 0 -> 2 under that environment (the NIC
#      rate, at 256 MiB, the plan's bucket size; also two pairs of GPUs at
#      once, the per-GPU rate when flows share the host's sockets), direct
#      writes GPU 0 -> 1 (wsync_bench_ipc_put's peer puts; NVLink NCCL as a
#      fallback) and the local copy rate;
#  (b) wsync-demo through the real controller and wsync-worker processes,
#      every destination byte verified, WSYNC_TWO_NODES_VERSIONS versions:
#        fanout      trainer TP1 on GPU 0 -> two replicas, GPU 1 (n0) and GPU 2 (n1)
#        fanout_dp2  trainer FSDP2 on GPUs 0, 2 -> two replicas on GPUs 1, 3
#        colocated4  FSDP over 4 GPUs -> 2 x TP2 (replica per node), colocated
#  (c) wsyncctl plan of the very spec each demo defined, fed those rates, with
#      --nccl-net (only the pairs direct writes take move at the NVLink rate):
#      simulated vs measured (median execute time of versions >= 2) and ratio,
#      and the simulation again at the shared (concurrent flows) NIC rate;
#  (d) everything under $OUT: rates.json, *.log, spec_*.json, plan_*.txt,
#      two_nodes.jsonl (one RESULT per case), two_nodes_summary.txt.
# WSYNC_TWO_NODES_HOST=1 runs the same steps on CPU (tests/bench/gpu): host
# backend (shared memory, Gloo on loopback) with the build tree's binaries
# (WSYNC_BUILD_DIR, default build), step (a) replaced by the rates in
# WSYNC_TWO_NODES_RATES ("nvlink nic copy" GB/s).
# Other settings: WSYNC_TWO_NODES_MODEL (small-llama; host: tiny-llama),
# WSYNC_TWO_NODES_CASES (all three), WSYNC_NCCL_SOCKET_NTHREADS (8),
# WSYNC_NCCL_NSOCKS_PERTHREAD (4), WSYNC_NCCL_SOCKET_IFNAME (NCCL's choice).
# Time: every step runs under `timeout` min(its own limit, what is left of
# WSYNC_TWO_NODES_BUDGET_S, default 510 s; bench/gpu/device_env.sh), a step
# with no budget left fails at once, and the summary has 20 s of its own: at
# most 530 s in all, under the device tool's 10 minutes a command.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
. bench/gpu/device_env.sh
wsync_gpu_out
wsync_budget_start "${WSYNC_TWO_NODES_BUDGET_S:-510}"
# `step N CMD...`: CMD under `timeout` min(N, the budget left); none left:
# fails (124, as a timeout) without running it.
step() {
  local t
  t=$(wsync_budget_timeout "$1") ||
    { echo "run_two_nodes: WSYNC_TWO_NODES_BUDGET_S spent before: ${*:2}" >&2; return 124; }
  shift
  timeout "$t" "$@"
}
host=${WSYNC_TWO_NODES_HOST:-0}
versions=${WSYNC_TWO_NODES_VERSIONS:-4}
cases=${WSYNC_TWO_NODES_CASES:-fanout fanout_dp2 colocated4}
rc=0
net_env=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket
  "NCCL_SOCKET_NTHREADS=${WSYNC_NCCL_SOCKET_NTHREADS:-8}"
  "NCCL_NSOCKS_PERTHREAD=${WSYNC_NCCL_NSOCKS_PERTHREAD:-4}")
[ -n "${WSYNC_NCCL_SOCKET_IFNAME:-}" ] && net_env+=("NCCL_SOCKET_IFNAME=$WSYNC_NCCL_SOCKET_IFNAME")

if [ "$host" = 1 ]; then
  b=${WSYNC_BUILD_DIR:-build}
  demo=$b/tools/demo/wsync-demo ctl=$b/tools/wsyncctl
  controller=$b/controller/server/wsync-controller worker=$b/worker/agent/wsync-worker
  model=${WSYNC_TWO_NODES_MODEL:-tiny-llama}
  gpus=0
  read -r nv nic cp <<<"${WSYNC_TWO_NODES_RATES:-2 1 5}"
  printf '{"nvlink_gbps":%s,"nic_gbps":%s,"copy_gbps":%s,"source":"WSYNC_TWO_NODES_RATES"}\n' \
    "$nv" "$nic" "$cp" >"$OUT/rates.json"
else
  bin=$PWD/.devbundle/bin
  demo=$bin/wsync-demo ctl=$bin/wsyncctl controller=$bin/wsync-controller worker=$bin/wsync-worker
  model=${WSYNC_TWO_NODES_MODEL:-small-llama}
  gpus=4
  wsync_device_env
  {
    wsync_env_lines topo
    echo "forced for every process: ${net_env[*]}"
  } >"$OUT/env.txt" 2>&1
  cat "$OUT/env.txt"
  if [ "$(nvidia-smi -L | wc -l)" -lt 4 ]; then
    echo "run_two_nodes: needs 4 GPUs" >&2
    exit 2
  fi
  # (a) The NIC: NCCL as the workers run it. Ranks 0,1,2,3 = GPUs 0,2,1,3, so
  # the two-GPU cases go GPU 0 -> 2 (across the nodes); the 4-GPU patterns
  # (two pairs at once, fan-in, fan-out, all-to-all) show what concurrent
  # socket flows of one host share.
  step 120 env "${net_env[@]}" CUDA_VISIBLE_DEVICES=0,2,1,3 "$bin/wsync_bench_nccl_ceiling" \
    --iters 3 --gpus 4 >"$OUT/net_ceiling.log" 2>&1 || { rc=1; echo "FAILED: net ceiling"; }
  grep RESULT "$OUT/net_ceiling.log" | cut -c1-220
  # Inside a node: direct writes GPU 0 -> 1 (NCCL's own env plays no part).
  if [ -x "$bin/wsync_bench_ipc_put" ]; then
    step 60 env CUDA_VISIBLE_DEVICES=0,1 "$bin/wsync_bench_ipc_put" --iters 5 \
      >"$OUT/ipc_put.log" 2>&1 || { rc=1; echo "FAILED: ipc_put"; }
  fi
  step 60 env CUDA_VISIBLE_DEVICES=0,1 "$bin/wsync_bench_nccl_ceiling" --iters 3 --gpus 2 \
    >"$OUT/nvlink_ceiling.log" 2>&1 || { rc=1; echo "FAILED: nvlink ceiling"; }
  step 30 python3 bench/gpu/two_nodes.py rates --net "$OUT/net_ceiling.log" \
    --nvlink "$OUT/nvlink_ceiling.log" --ipc "$OUT/ipc_put.log" >"$OUT/rates.json" ||
    { echo "run_two_nodes: no rates measured" >&2; exit 1; }
  read -r nv nic cp < <(step 30 python3 -c 'import json,sys; r=json.load(open(sys.argv[1]));
print(r["nvlink_gbps"], r["nic_gbps"], r["copy_gbps"])' "$OUT/rates.json")
fi
cat "$OUT/rates.json"

# (b) Through the service, (c) the simulator on the same spec.
for c in $cases; do
  case $c in
    fanout) args=(--source fsdp:1 --destination vllm-tp:1x2 --placement "0,1,2") ;;
    fanout_dp2) args=(--source fsdp:2 --destination vllm-tp:1x2 --placement "0,2,1,3") ;;
    colocated4) args=(--source fsdp:4 --destination vllm-tp:2x2 --colocated) ;;
    *) echo "run_two_nodes: unknown case '$c'" >&2; exit 2 ;;
  esac
  wd=/tmp/wsync-two-nodes-$c-$$
  echo "=== $c: wsync-demo --model $model ${args[*]}"
  step 90 env "${net_env[@]}" "$demo" --model "$model" "${args[@]}" --gpus $gpus \
    --slots_per_node 2 --result_lines --versions "$versions" --nvlink_gbps "$nv" --nic_gbps "$nic" \
    --copy_gbps "$cp" --spec_out "$OUT/spec_$c.json" --work_dir "$wd" \
    --controller_bin "$controller" --worker_bin "$worker" >"$OUT/demo_$c.log" 2>&1 ||
    { rc=1; echo "FAILED: demo $c"; cp -r "$wd" "$OUT/" 2>/dev/null; }
  grep -E '^(v[0-9]+ |OK|FAILED|demo:)' "$OUT/demo_$c.log" | cut -c1-300
  rm -rf "$wd"
  if [ -f "$OUT/spec_$c.json" ]; then
    step 30 "$ctl" plan "$OUT/spec_$c.json" --nccl-net --sim-json >"$OUT/plan_$c.txt" 2>&1 ||
      { rc=1; echo "FAILED: wsyncctl plan $c"; }
    # The same plan with the NIC rate of concurrent flows (one host's sockets
    # are shared; the simulator gives every GPU a NIC of its own).
    shared=$(step 30 python3 bench/gpu/two_nodes.py shared --rates "$OUT/rates.json" --case "$c")
    if [ -n "$shared" ]; then
      step 30 "$ctl" plan "$OUT/spec_$c.json" --nccl-net --sim-json --sim-rates-only \
        --nic-gbps "$shared" \
        >"$OUT/plan_${c}_shared.txt" 2>&1 || { rc=1; echo "FAILED: wsyncctl plan $c shared"; }
    fi
  fi
  step 30 python3 bench/gpu/two_nodes.py compare --case "$c" --demo "$OUT/demo_$c.log" \
    --plan "$OUT/plan_$c.txt" --shared-plan "$OUT/plan_${c}_shared.txt" \
    --rates "$OUT/rates.json" >>"$OUT/two_nodes.jsonl" ||
    { rc=1; echo "FAILED: compare $c"; }
done
timeout 20 python3 bench/gpu/two_nodes.py summary "$OUT/two_nodes.jsonl" | tee "$OUT/two_nodes_summary.txt"
exit $rc
