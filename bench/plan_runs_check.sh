#!/usr/bin/env bash
# The piece-run oracle over the catalog cases of bench/plan_cases.sh (KIMI=0
# leaves out Kimi-K2): for each, plan_runs_check plans it with and without
# piece runs and checks the plan with runs, written out, equals the other
# (bench/plan_runs_check.cc); then, given main's wsyncctl, the plan without
# runs is checked byte-identical (md5 of --json) to main's plan without runs
# (MAIN_PLAN_FLAGS, default --no-piece-runs; set it empty for a main from
# before piece runs, which has no such flag):
#   bench/plan_runs_check.sh build [/tmp/wsyncctl-main]
set -euo pipefail
build="$1"
main_bin="${2:-}"
. "$(dirname "$0")/plan_cases.sh"
fail=0
for c in "${cases[@]}"; do
  # shellcheck disable=SC2086
  if ! line=$("$build/bench/plan_runs_check" $c); then fail=1; fi
  echo "$c: $line"
done
if [ -n "$main_bin" ]; then
  here=$(mktemp) there=$(mktemp)
  PLAN_FLAGS=--no-piece-runs bash "$(dirname "$0")/plan_cli_check.sh" "$build/tools/wsyncctl" > "$here"
  PLAN_FLAGS="${MAIN_PLAN_FLAGS---no-piece-runs}" bash "$(dirname "$0")/plan_cli_check.sh" "$main_bin" > "$there"
  if diff "$there" "$here"; then
    echo "without runs: byte-identical to $main_bin on ${#cases[@]} cases"
  else
    echo "without runs: DIFFERS from $main_bin"
    fail=1
  fi
  rm -f "$here" "$there"
fi
exit $fail
