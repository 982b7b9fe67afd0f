#!/usr/bin/env bash
# md5 of `wsyncctl plan --json` (planSeconds removed: wall time) for the
# catalog cases a planner change must leave byte-identical; run it with two
# builds and diff the outputs:
#   bench/plan_cli_check.sh build-before/wsyncctl > before.txt
#   bench/plan_cli_check.sh build/tools/wsyncctl > after.txt && diff before.txt after.txt
# KIMI=0 skips the Kimi-K2 Megatron case (0.3 GB of JSON). The empty `runs`
# list and the zero `putPhase` --json prints in every bucket (Bucket.runs,
# docs/plan-compact.md; Bucket.put_phase, set only in routed worker parts),
# the zero `step` (Bucket.step: steps inside rounds) and the zero row
# fields of a run (PieceRun.outer_*, rows of runs: stacked plans) are
# removed, so builds from before those fields compare equal. PLAN_FLAGS is
# added to every case: PLAN_FLAGS=--no-piece-runs gives the plan as builds
# before piece runs emitted it (bench/plan_runs_check.sh compares the plan
# with runs to that one).
set -euo pipefail
bin="$1"
. "$(dirname "$0")/plan_cases.sh"
for c in "${cases[@]}"; do
  # shellcheck disable=SC2086
  sum=$("$bin" plan $c ${PLAN_FLAGS:-} --json | sed -E 's/"planSeconds": ?[0-9.e+-]+,? ?//; s/,? ?"runs": ?\[\]//g; s/,? ?"putPhase": ?0//g; s/,? ?"step": ?0//g; s/,? ?"outer[A-Za-z]*": ?"?0"?//g' | md5sum | cut -d' ' -f1)
  echo "$sum  $c"
done
