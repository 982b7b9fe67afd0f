#!/usr/bin/env bash
# Issue 21 item 1 on a 4-GPU machine, in one device call (at most ~540 s), from
# the repo root, carrying .devbundle (scripts/gpu_run.sh build) and, for the
# A/B against an earlier commit, that commit's sync bench in
# .devbundle/base/wsync_bench_gpu_sync (same libraries):
#   bash bench/gpu/run_4gpu_ab.sh
# Alternates, per model, the variants below (ABAB: the list twice, model by
# model as the budget allows), every destination checksum checked by the bench:
#   cur        this build, direct writes (the default put order)
#   il<N>      this build, direct writes, puts interleaved by peer in N MiB parts
#   base       the earlier commit's bench, direct writes
#   nccl       this build, direct writes off
# Settings: WSYNC_AB_MODELS ("llama3-8b qwen3-30b-a3b"), WSYNC_AB_MODES_<model
# with - as _> (llama: tp1,colocated,fanout_tp2,fanout_dp2,colocated4; qwen:
# fanout_tp2,colocated4), WSYNC_AB_VARIANTS ("cur il64 base nccl"),
# WSYNC_AB_REPS (2), WSYNC_BENCH_ITERS (5), WSYNC_AB_BUDGET_S (530).
# Results: $OUT/ab.log (every bench's output), $OUT/summary.txt (one line per
# run: variant, model, each mode's slowest-worker median in ms, checks).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
. bench/gpu/device_env.sh
wsync_gpu_out
wsync_device_env
wsync_budget_start "${WSYNC_AB_BUDGET_S:-530}"
wsync_env_lines topo nccl >"$OUT/env.txt" 2>&1
head -8 "$OUT/env.txt"
B=$PWD/.devbundle/bin
BASE=$PWD/.devbundle/base/wsync_bench_gpu_sync
iters=${WSYNC_BENCH_ITERS:-5}

bench_for() {  # variant -> "binary flags..."
  case "$1" in
    cur) echo "$B/wsync_bench_gpu_sync --direct 1" ;;
    il*) echo "$B/wsync_bench_gpu_sync --direct 1 --put-interleave-mib ${1#il}" ;;
    base) echo "$BASE --direct 1" ;;
    nccl) echo "$B/wsync_bench_gpu_sync --direct 0" ;;
    *) return 1 ;;
  esac
}

# The slowest worker's median per mode, and whether every check held.
summarize() {
  python3 - "$1" <<'EOF'
import json, re, sys
med, bound, checks = {}, {}, []
for line in open(sys.argv[1], errors="replace"):
    m = re.search(r'\{"bench":"wsync_sync(_check)?".*\}', line)
    if not m:
        continue
    r = json.loads(m.group(0))
    if m.group(1):
        checks.append(r["checksum_match"])
        bound[r["mode"]] = max(r["lower_bound_s"], r["hbm_floor_s"]) * 1e3
    else:
        med[r["mode"]] = max(med.get(r["mode"], 0), r["median_s"] * 1e3)
print(" ".join(f"{k} {v:.3f} ms ({100 * bound[k] / v:.1f} % of {bound[k]:.2f})"
               if bound.get(k) else f"{k} {v:.3f} ms" for k, v in med.items()),
      "| checks", len(checks), "all match" if checks and all(checks) else "NOT ALL MATCH")
EOF
}

for rep in $(seq "${WSYNC_AB_REPS:-2}"); do
  for m in ${WSYNC_AB_MODELS:-llama3-8b qwen3-30b-a3b}; do
    var=WSYNC_AB_MODES_${m//-/_}
    default=tp1,colocated,fanout_tp2,fanout_dp2,colocated4
    [[ $m == qwen* ]] && default=fanout_tp2,colocated4
    modes=${!var:-$default}
    for v in ${WSYNC_AB_VARIANTS:-cur il64 base nccl}; do
      cmd=$(bench_for "$v") || { echo "unknown variant $v"; continue; }
      [[ $v == base && ! -x $BASE ]] && { echo "no $BASE"; continue; }
      t=$(wsync_budget_timeout 200) || { echo "budget spent"; break 3; }
      one=$OUT/run_${rep}_${m}_${v}.log
      timeout "$t" $cmd --model "$m" --mode "$modes" --iters "$iters" >"$one" 2>&1 ||
        echo "FAILED (rc $?)" >>"$one"
      { echo "=== rep $rep $m $v ($SECONDS s)"; summarize "$one"; grep -m3 -E 'FAILED|rror' "$one"; } |
        tee -a "$OUT/summary.txt"
      cat "$one" >>"$OUT/ab.log"
    done
  done
done
