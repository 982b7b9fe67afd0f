#!/usr/bin/env bash
# Steps inside a round on the fan-out specs (bench/results/plan-steps-2026-11-29.md):
# one bf16 tensor [4096, 4096] (32 MiB) on trainer 0, replicated on N
# inference ranks (100..), every worker on a node of its own ("own") or the
# receivers 8 to a node ("8/node"); NIC 50e9 B/s, round latency 50 us. Per
# case and step latency (us; 0 = no steps): rounds, the simulated makespan
# and its ratio to the routing-independent bound.
#   bench/plan_steps_fanout.sh [build/tools/wsyncctl] [step latencies, default "0 5 10 20"]
# Environment (defaults in brackets): FAN_N ["2 4 8 16"], FAN_PER_NODE ["0 8"],
# FAN_ROWS [4096: 32 MiB; 512: 4 MiB], FAN_NIC [50e9 B/s], FAN_ROUND_US [50]
# (bench/results/step-latency-2026-11-29-2xh200.md: the socket rate and
# round latency measured on 2 x H200).
set -euo pipefail
bin=${1:-build/tools/wsyncctl}
steps=${2:-0 5 10 20}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for n in ${FAN_N:-2 4 8 16}; do
  for per_node in ${FAN_PER_NODE:-0 8}; do
    spec="$dir/f${n}_${per_node}.json"
    python3 - "$n" "$per_node" "$spec" "${FAN_ROWS:-4096}" "${FAN_NIC:-50e9}" \
      "${FAN_ROUND_US:-50}" <<'PY'
import json, sys
n, per_node, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rows, nic, round_us = sys.argv[4], float(sys.argv[5]), float(sys.argv[6])
def tensor(ranks):
    return {"name": "w", "dtype": "BF16", "shape": [rows, "4096"],
            "mesh": {"meshShape": [str(ranks)], "ranks": list(range(ranks)),
                     "placements": [{"replicate": {}}]}}
dst = [{"worker": 100 + i, "node": f"n{100 + i}" if per_node == 0 else f"n{12 + i // per_node}"}
       for i in range(n)]
json.dump({"source": {"name": "trainer", "ranks": [{"worker": 0, "node": "n0"}],
                      "tensors": [tensor(1)]},
           "destination": {"name": "infer", "ranks": dst, "tensors": [tensor(n)]},
           "options": {"linkModel": {"roundLatencySeconds": round_us * 1e-6,
                                     "nicBytesPerSecond": nic}}}, open(out, "w"))
PY
    for l in $steps; do
      out=$("$bin" plan "$spec" --step-latency-us "$l" --top 0 2>&1)
      rounds=$(grep -oE '[0-9]+ rounds' <<<"$out")
      sim=$(grep -E "^  simulator" <<<"$out" |
        sed -E "s/.*makespan ([0-9.]+ [a-z]+),.*, ([0-9.]+) x the routing.*/\1 | \2/")
      bound=$(grep -E "^  routing bound" <<<"$out" | sed -E 's/ +routing bound +([0-9.]+ [a-z]+).*/\1/')
      placement=$([ "$per_node" = 0 ] && echo "own node each" || echo "$per_node per node")
      echo "1 -> $n, $placement | l=$l us | $rounds | $sim | bound $bound"
    done
  done
done
