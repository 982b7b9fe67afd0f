#!/usr/bin/env bash
# bench/gpu/run_two_nodes.sh on CPU (WSYNC_TWO_NODES_HOST=1): the real
# controller and wsync-worker processes with the host backend, nodes n0 =
# slots {0,1} and n1 = slots {2,3}, tiny-llama, 3 versions per case, every
# byte verified; then wsyncctl plan of each demo's spec and the comparison.
# Checks the script's flags, placement and parsing, and that direct writes
# stay inside a node: the fan-out writes only the replica on the trainer's
# node directly, and each case's direct-write pairs are exactly the
# same-node pairs the simulator put on NVLink.
#   run_two_nodes_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
repo=$(cd "$(dirname "$0")/../../.." && pwd)
# A build that has not built the service's tools (the sanitized subset of
# scripts/sanitize.sh builds the controller and worker, not wsync-demo):
# skipped, saying so (exit 77: SKIP_RETURN_CODE).
for b in tools/demo/wsync-demo tools/wsyncctl controller/server/wsync-controller \
    worker/agent/wsync-worker; do
  [ -x "$build/$b" ] || { echo "SKIP: $build/$b is not built"; exit 77; }
done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$out"/*.log "$out"/*.txt "$out"/*.jsonl; do
    [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; } >&2
  done
  exit 1
}
OUT=$out WSYNC_TWO_NODES_HOST=1 WSYNC_BUILD_DIR=$build WSYNC_TWO_NODES_VERSIONS=3 \
  timeout 280 bash "$repo/bench/gpu/run_two_nodes.sh" >"$out/run.txt" 2>&1 ||
  fail "run_two_nodes.sh exited $?"
cat "$out/run.txt"
python3 - "$out" <<'PY' || fail "results"
import json, sys
out = sys.argv[1]
rows = {r["case"]: r for r in map(json.loads, open(f"{out}/two_nodes.jsonl"))}
assert sorted(rows) == ["colocated4", "fanout", "fanout_dp2"], sorted(rows)
# Same-node pairs written directly: trainer 0 -> replica on worker 1 only (worker 2 is
# on n1); FSDP2 on slots 0,2 -> replicas on 1,3: 0->2 and 1->3 (workers); colocated4:
# both directions inside each node.
want_pairs = {"fanout": "0->1", "fanout_dp2": "0->2,1->3", "colocated4": "0->1,1->0,2->3,3->2"}
for case, r in rows.items():
    assert r["ok"] and r["verified"] and r["wrong"] == 0, r
    assert r["versions"] == 3, r
    assert r["simulated_s"] > 0 and r["bound_s"] > 0 and r["ratio"] > 0, r
    assert r["sim_nvlink_pairs"] == want_pairs[case], (case, r["sim_nvlink_pairs"])
    assert r["direct_pairs"] == len(want_pairs[case].split(",")), r
    # Every byte between two workers of one node goes by direct writes.
    assert r["same_node_transport_pairs"] == "", r
    assert "pairs" not in r["note"], r
    assert (r["nvlink_gbps"], r["nic_gbps"], r["copy_gbps"]) == (2, 1, 5), r
    spec = json.load(open(f"{out}/spec_{case}.json"))
    nodes = {rk["worker"] if "worker" in rk else 0: rk["node"]
             for side in ("source", "destination") for rk in spec[side]["ranks"]}
    assert set(nodes.values()) == {"n0", "n1"}, nodes
    assert spec["options"]["linkModel"]["nicBytesPerSecond"] == 1e9, spec["options"]
print("two nodes on one host (CPU): OK")
PY
grep -q "^fanout " "$out/two_nodes_summary.txt" || fail "summary table"
