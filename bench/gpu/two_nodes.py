#!/usr/bin/env python3
"""Parsing and comparison for bench/gpu/run_two_nodes.sh (no third-party imports).

  two_nodes.py rates --net LOG --nvlink LOG [--ipc LOG]   -> rates.json on stdout
  two_nodes.py compare --case C --demo LOG --plan TXT --rates JSON  -> one JSON line
  two_nodes.py shared --rates JSON --case C               -> C's shared NIC rate, or nothing
  two_nodes.py summary JSONL                               -> a table

rates: the NIC rate is NCCL send/recv between the two nodes at 256 MiB (the
planner's default bucket size; 16 MiB and 1 GiB are kept too); the NVLink rate
is the direct writes' (wsync_bench_ipc_put's fastest peer-only push case,
bytes / median time), or NCCL send/recv over NVLink at 256 MiB when that bench did not
run; the copy rate is the slowest GPU's cudaMemcpy device-to-device.

compare: "measured" is the median over versions >= 2 of the slowest worker's
execute time (SyncStatus.max_execute_seconds, from the demo's RESULT lines;
version 1 alone when only one ran); "simulated" is `wsyncctl plan --nccl-net
--sim-json`'s makespan for the same spec and rates. ratio = measured /
simulated; a gap over 10 % either way is flagged for explanation.
"""
import argparse
import json
import statistics
import sys


def results(path, prefix="RESULT "):
    out = []
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(prefix):
                    try:
                        out.append(json.loads(line[len(prefix):]))
                    except json.JSONDecodeError:
                        pass
    except OSError:
        pass
    return out


def ceiling_rates(path):
    r = {}
    for j in results(path):
        # Every rate by case: sendrecv_* (one send), bidirectional_*, group_*
        # (many pieces in one group) and the 4-GPU patterns (busiest GPU).
        if j.get("bench") == "nccl_ceiling" and "gbps" in j:
            r[j["case"]] = j["gbps"]
        if j.get("bench") == "device_copy":
            r["copy"] = min(r.get("copy", 1e12), j["memcpy_gbps"])
    return r


def cmd_rates(a):
    net = ceiling_rates(a.net)
    if "sendrecv_256MiB" not in net:
        print(f"two_nodes: no sendrecv_256MiB result in {a.net}", file=sys.stderr)
        return 1
    nvl = ceiling_rates(a.nvlink)
    out = {"nic_gbps": net["sendrecv_256MiB"], "nic_source": "nccl sendrecv_256MiB GPU0->2 forced "
           "onto NET/Socket", "nic_gbps_16MiB": net.get("sendrecv_16MiB"),
           "nic_gbps_1GiB": net.get("sendrecv_1GiB"),
           "nccl_nvlink_gbps_256MiB": nvl.get("sendrecv_256MiB"),
           # Per GPU when the host's socket transport carries several flows at
           # once, as each case's cross-node traffic does: fanout_dp2 two flows
           # (the "pairs" pattern), colocated4 each GPU to and from the other
           # node's two (all-to-all is the nearest pattern).
           "nic_gbps_shared": {"fanout_dp2": net.get("pairs_0to2_1to3_1GiB"),
                               "colocated4": net.get("all_to_all_1GiB_per_gpu")},
           # Grouped pieces (a plan's zero-copy sends) and the 4-GPU patterns.
           "nic_patterns": {k: v for k, v in net.items()
                            if k != "copy" and not k.startswith("sendrecv")}}
    best = None
    for j in results(a.ipc) if a.ipc else []:
        # wsync's direct writes push (the writer's copy engines or kernel).
        if j.get("bench") == "ipc_put" and j.get("local_bytes") == 0 and j.get("peer_bytes", 0) > 0 \
                and j.get("median_s", 0) > 0 and j.get("case", "").startswith("push"):
            gbps = j["peer_bytes"] / j["median_s"] / 1e9
            if best is None or gbps > best[0]:
                best = (gbps, j["case"])
    if best is not None:
        out["nvlink_gbps"], out["nvlink_source"] = round(best[0], 1), f"ipc_put {best[1]} GPU0->1"
    elif nvl.get("sendrecv_256MiB"):
        out["nvlink_gbps"], out["nvlink_source"] = nvl["sendrecv_256MiB"], "nccl sendrecv_256MiB GPU0->1"
    else:
        print("two_nodes: no NVLink rate measured", file=sys.stderr)
        return 1
    out["copy_gbps"] = net.get("copy") or nvl.get("copy") or 2000.0
    print(json.dumps(out))
    return 0


def cmd_compare(a):
    with open(a.rates) as f:
        rates = json.load(f)
    demo = [j for j in results(a.demo) if j.get("bench") == "wsync_demo"]
    sims = results(a.plan, prefix="SIM ")
    with open(a.demo, errors="replace") as f:
        verified = "OK: every destination byte verified" in f.read()
    row = {"bench": "two_nodes", "case": a.case, "versions": len(demo), "verified": verified,
           "nvlink_gbps": rates.get("nvlink_gbps"), "nic_gbps": rates.get("nic_gbps"),
           "copy_gbps": rates.get("copy_gbps")}
    ok = verified and bool(demo) and bool(sims)
    if demo:
        steady = [j for j in demo if j["version"] >= 2] or demo
        row["measured_execute_s"] = statistics.median(j["execute_s"] for j in steady)
        row["measured_elapsed_s"] = statistics.median(j["elapsed_s"] for j in steady)
        row["first_execute_s"] = demo[0]["execute_s"]
        row["bytes"] = demo[-1]["bytes"]
        row["direct_pairs"] = demo[-1]["direct_pairs"]
        row["wrong"] = sum(j["wrong"] for j in demo)
    shared = results(a.shared_plan, prefix="SIM ") if a.shared_plan else []
    if shared:
        row["simulated_shared_nic_s"] = shared[-1]["makespan_s"]
        if demo and shared[-1]["makespan_s"] > 0:
            row["ratio_shared_nic"] = row["measured_execute_s"] / shared[-1]["makespan_s"]
    if sims:
        s = sims[-1]
        row["simulated_s"], row["bound_s"] = s["makespan_s"], s["bound_s"]
        row["bound_link"] = s["bound_link"]
        pairs = [p for p in s["nvlink_pairs"].split(",") if p]
        row["sim_nvlink_pairs"] = s["nvlink_pairs"]
        row["same_node_transport_pairs"] = s.get("same_node_transport_pairs", "")
        notes = []
        if row["same_node_transport_pairs"]:
            notes.append(f"same-node pairs on NCCL sockets: {row['same_node_transport_pairs']}")
        if demo and len(pairs) != row["direct_pairs"]:
            notes.append(f"the run wrote {row['direct_pairs']} pairs directly, the simulator "
                         f"put {len(pairs)} on NVLink")
        if demo and s["makespan_s"] > 0:
            row["ratio"] = row["measured_execute_s"] / s["makespan_s"]
            if abs(row["ratio"] - 1) > 0.10:
                notes.append("GAP > 10 %: explain")
        row["note"] = "; ".join(notes)
    row["ok"] = ok
    print(json.dumps(row))
    return 0 if ok else 1


def cmd_summary(a):
    rows = []
    try:
        with open(a.jsonl) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, TypeError):
        pass
    if rows:
        r0 = rows[0]
        print(f"rates fed to the simulator: NVLink (direct writes) {r0.get('nvlink_gbps')} GB/s, "
              f"NIC (NCCL forced onto sockets) {r0.get('nic_gbps')} GB/s, "
              f"local copy {r0.get('copy_gbps')} GB/s")
    print(f"{'case':<12} {'MB':>8} {'measured ms':>12} {'elapsed ms':>11} {'simulated ms':>13} "
          f"{'bound ms':>9} {'ratio':>6} {'shared-NIC ms':>13} {'ratio':>6} {'direct':>7}  "
          f"verified  note")
    ms = lambda v: f"{v * 1e3:.2f}" if isinstance(v, (int, float)) else "-"
    for r in rows:
        ratio = f"{r['ratio']:.3f}" if "ratio" in r else "-"
        ratio_sh = f"{r['ratio_shared_nic']:.3f}" if "ratio_shared_nic" in r else "-"
        mb = f"{r['bytes'] / 1e6:.1f}" if "bytes" in r else "-"
        print(f"{r['case']:<12} {mb:>8} {ms(r.get('measured_execute_s')):>12} "
              f"{ms(r.get('measured_elapsed_s')):>11} {ms(r.get('simulated_s')):>13} "
              f"{ms(r.get('bound_s')):>9} {ratio:>6} {ms(r.get('simulated_shared_nic_s')):>13} "
              f"{ratio_sh:>6} {str(r.get('direct_pairs', '-')):>7}  "
              f"{'yes' if r.get('verified') else 'NO':<8}  {r.get('note', '')}")
    return 0


def cmd_shared(a):
    with open(a.rates) as f:
        rate = (json.load(f).get("nic_gbps_shared") or {}).get(a.case)
    if rate:
        print(rate)
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("rates")
    r.add_argument("--net", required=True)
    r.add_argument("--nvlink", required=True)
    r.add_argument("--ipc")
    c = sub.add_parser("compare")
    for f in ("--case", "--demo", "--plan", "--rates"):
        c.add_argument(f, required=True)
    c.add_argument("--shared-plan")
    sh = sub.add_parser("shared")
    sh.add_argument("--rates", required=True)
    sh.add_argument("--case", required=True)
    s = sub.add_parser("summary")
    s.add_argument("jsonl", nargs="?")
    a = p.parse_args()
    return {"rates": cmd_rates, "compare": cmd_compare, "shared": cmd_shared,
            "summary": cmd_summary}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
