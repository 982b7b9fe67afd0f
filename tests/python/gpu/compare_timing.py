"""The Python path against the data-plane benchmark, for the same tensors:
the timing stage's sync().wait() (trainer side, through controller, workers,
CUDA IPC registration) against wsync_bench_gpu_sync --spec on the same spec
(the executor alone, on buffers of its own), both steady state. Run by
run_gpu_proof.sh:  python3 compare_timing.py $OUT <stage>"""
import json
import os
import statistics
import sys


def proof_records(out, stage):
    path = os.path.join(out, stage, "proof0.jsonl")
    recs = [json.loads(line) for line in open(path) if line.strip()]
    return [r for r in recs if r["version"] >= 2 and "sync_wait_s" in r]


def bench_median(out, stage, suffix=""):
    """The slowest worker's median sync of the bench (a sync ends with its
    last worker)."""
    medians = []
    for line in open(os.path.join(out, f"bench_{stage}{suffix}.log")):
        i = line.find("{")
        if "RESULT" not in line or i < 0:
            continue
        r = json.loads(line[i:])
        if r.get("bench") == "wsync_sync":
            medians.append(r["median_s"])
    if not medians:
        raise SystemExit(f"no wsync_sync RESULT in bench_{stage}.log")
    return max(medians)


def main(out, stage):
    recs = proof_records(out, stage)
    if not recs:
        raise SystemExit("no steady-state proof records (versions >= 2)")
    wait = statistics.median(r["sync_wait_s"] for r in recs)
    step = statistics.median(r["step_to_synced_s"] for r in recs)
    execute = statistics.median(r["max_execute_s"] for r in recs)
    bench = bench_median(out, stage)
    # Where the Python path's time goes (medians; control path = the rest).
    parts = {k: round(statistics.median(r[k] for r in recs if r.get(k) is not None), 6)
             for k in ("controller_elapsed_s", "plan_s", "dispatch_s", "max_deliver_s",
                       "max_queue_s", "max_bind_s", "max_run_s", "max_report_s",
                       "request_s", "answer_s", "rpc_ping_s", "rpc_ping_grpcio_s")
             if any(k in r and r[k] is not None for r in recs)}
    summary = {"stage": stage, "model": recs[0]["model"], "size": recs[0]["size"],
               "bytes": recs[0]["bytes"], "versions": len(recs),
               "python_sync_wait_s": round(wait, 6), "step_to_synced_s": round(step, 6),
               "worker_execute_s": round(execute, 6), "bench_median_s": round(bench, 6),
               "wait_over_bench": round(wait / bench, 4),
               "execute_over_bench": round(execute / bench, 4), "breakdown": parts}
    # Each client mode's own medians, when the run cycled through several
    # (WSYNC_PROOF_CLIENT_MODES): same run, same spec, same bench.
    modes = sorted({r.get("client_mode") for r in recs if r.get("client_mode")})
    if len(modes) > 1:
        summary["by_client_mode"] = {
            m: {"versions": len(rs), "python_sync_wait_s": round(statistics.median(
                    r["sync_wait_s"] for r in rs), 6),
                "wait_over_bench": round(statistics.median(r["sync_wait_s"] for r in rs) / bench, 4),
                "answer_s": round(statistics.median(r["answer_s"] for r in rs), 6),
                "request_s": round(statistics.median(r["request_s"] for r in rs), 6)}
            for m in modes for rs in [[r for r in recs if r.get("client_mode") == m]]}
    # Against the bench idling before each sync as the trainer does
    # (run_gpu_proof.sh, WSYNC_TIMING_BENCH_PAUSE_MS), when it ran.
    if os.path.exists(os.path.join(out, f"bench_{stage}_pause.log")):
        idle = bench_median(out, stage, "_pause")
        summary["bench_after_idle_median_s"] = round(idle, 6)
        summary["wait_over_bench_after_idle"] = round(wait / idle, 4)
        print(f"Python path sync().wait() {wait * 1e3:.2f} ms vs data-plane bench idling "
              f"before each sync {idle * 1e3:.2f} ms: {wait / idle:.3f}x")
    print("TIMING " + json.dumps(summary))
    ok = wait <= 1.05 * bench
    print(f"Python path sync().wait() {wait * 1e3:.2f} ms vs data-plane bench {bench * 1e3:.2f} ms"
          f" for {summary['bytes']} bytes: {summary['wait_over_bench']:.3f}x "
          f"({'within' if ok else 'OVER'} the 5 % target)")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
